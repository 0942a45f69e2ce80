//! The client-to-server half of an HTTP/2 connection, frame by frame:
//! header blocks (HEADERS and their CONTINUATION frames) go through the
//! [`HeaderBlockRewriter`]; every other frame, and the connection preface,
//! passes byte for byte. DATA frames, WINDOW_UPDATE and SETTINGS are not
//! touched, so flow control is the client's and the server's own.

use tracing::{debug, warn};

use super::header_block::{HeaderBlockError, HeaderBlockRewriter};

pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(crate) const FRAME_HEADER_LEN: usize = 9;

pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY: u8 = 0x20;

/// The largest frame payload every HTTP/2 endpoint accepts (the initial
/// SETTINGS_MAX_FRAME_SIZE). The server never raises it, so a larger
/// HEADERS or CONTINUATION frame is the client's error, and the frames
/// written here never exceed it.
pub(crate) const MAX_FRAME_PAYLOAD: usize = 16_384;

/// Most bytes of one header block's fragments, joined.
pub(crate) const MAX_BLOCK_BYTES: usize = 256 * 1024;

/// Most bytes a filter holds between calls: an incomplete frame and a
/// header block's fragments.
pub const MAX_BUFFERED: usize = FRAME_HEADER_LEN + MAX_FRAME_PAYLOAD + MAX_BLOCK_BYTES;

/// [`RequestFilter::feed`] takes no more input once it has written this
/// much: a few bytes of header block can decode to far more, and many
/// such blocks in one read must not all be expanded at once.
pub const FEED_OUTPUT_LIMIT: usize = 64 * 1024;

/// The frame header (RFC 9113 section 4.1).
#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(b: &[u8]) -> FrameHeader {
        FrameHeader {
            length: u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize,
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    fn write(length: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(&(length as u32).to_be_bytes()[1..]);
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
    }
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    /// Stream dependency and weight, when the HEADERS frame had them.
    priority: Option<[u8; 5]>,
    fragments: Vec<u8>,
}

enum State {
    Preface,
    FrameHeader,
    /// Passing `remaining` payload bytes of a frame through.
    PassPayload {
        remaining: usize,
    },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    Collect(FrameHeader),
    /// Not HTTP/2 as we understand it: the server sees the bytes as sent
    /// and answers them with its own error.
    PassAll,
}

/// Filters the bytes a client sends, fed in as they arrive.
pub struct RequestFilter {
    state: State,
    /// The incomplete preface, frame header or collected payload.
    pending: Vec<u8>,
    block: Option<OpenBlock>,
    rewriter: HeaderBlockRewriter,
}

impl Default for RequestFilter {
    fn default() -> Self {
        RequestFilter {
            state: State::Preface,
            pending: Vec::new(),
            block: None,
            rewriter: HeaderBlockRewriter::default(),
        }
    }
}

impl RequestFilter {
    /// Takes in `input`, appending what the server is to get to `out`,
    /// until it is all taken or [`FEED_OUTPUT_LIMIT`] bytes or more were
    /// appended; how many bytes of `input` it took (at least one). What it
    /// appends stays under `FEED_OUTPUT_LIMIT + input.len() +
    /// MAX_DECODED_BYTES + 1024`: the last step before the limit adds
    /// either input as it is or one header block.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> usize {
        let mut rest = input;
        let limit = out.len() + FEED_OUTPUT_LIMIT;
        while !rest.is_empty() && out.len() < limit {
            self.step(&mut rest, out);
        }
        input.len() - rest.len()
    }

    /// Bytes held for frames and header blocks not complete yet; never
    /// over [`MAX_BUFFERED`].
    pub fn buffered(&self) -> usize {
        self.pending.len() + self.block.as_ref().map_or(0, |b| b.fragments.len())
    }

    /// Takes in some of `input`: a part of the preface or of a frame.
    fn step(&mut self, input: &mut &[u8], out: &mut Vec<u8>) {
        match self.state {
            State::PassAll => {
                out.extend_from_slice(input);
                *input = &[];
            }
            State::PassPayload { remaining } => {
                let n = remaining.min(input.len());
                out.extend_from_slice(&input[..n]);
                *input = &input[n..];
                self.state = if n == remaining {
                    State::FrameHeader
                } else {
                    State::PassPayload {
                        remaining: remaining - n,
                    }
                };
            }
            State::Preface => {
                if self.fill(input, PREFACE.len()) {
                    out.extend_from_slice(&self.pending);
                    self.state = if self.pending == PREFACE {
                        State::FrameHeader
                    } else {
                        State::PassAll
                    };
                    self.pending.clear();
                }
            }
            State::FrameHeader => {
                if self.fill(input, FRAME_HEADER_LEN) {
                    let header = FrameHeader::parse(&self.pending);
                    self.on_frame_header(header, out);
                }
            }
            State::Collect(header) => {
                if self.fill(input, FRAME_HEADER_LEN + header.length) {
                    self.on_header_frame(header, out);
                }
            }
        }
    }

    /// Moves bytes from `input` to `pending` until it holds `len`; whether it does.
    fn fill(&mut self, input: &mut &[u8], len: usize) -> bool {
        let n = (len - self.pending.len()).min(input.len());
        self.pending.extend_from_slice(&input[..n]);
        *input = &input[n..];
        self.pending.len() == len
    }

    fn on_frame_header(&mut self, header: FrameHeader, out: &mut Vec<u8>) {
        let in_block = self.block.is_some();
        let continues_block = self
            .block
            .as_ref()
            .is_some_and(|b| header.kind == CONTINUATION && header.stream == b.stream);
        if in_block && !continues_block {
            // RFC 9113 section 6.10: nothing may come between a HEADERS
            // frame and its CONTINUATION frames.
            self.fail("a frame interrupted a header block", out);
            return;
        }
        let carries_block = header.kind == HEADERS || continues_block;
        if !carries_block {
            out.extend_from_slice(&self.pending);
            self.pending.clear();
            self.state = if header.length == 0 {
                State::FrameHeader
            } else {
                State::PassPayload {
                    remaining: header.length,
                }
            };
            return;
        }
        if header.length > MAX_FRAME_PAYLOAD {
            self.fail("a header frame over the maximum frame size", out);
            return;
        }
        // The frame header stays in `pending`, the payload follows it.
        self.state = State::Collect(header);
        if header.length == 0 {
            self.on_header_frame(header, out);
        }
    }

    /// A complete HEADERS or CONTINUATION frame is in `pending`.
    fn on_header_frame(&mut self, header: FrameHeader, out: &mut Vec<u8>) {
        let payload = &self.pending[FRAME_HEADER_LEN..];
        if header.kind == HEADERS {
            let Some((priority, fragment)) = headers_payload(header.flags, payload) else {
                self.fail("a HEADERS frame with bad padding", out);
                return;
            };
            self.block = Some(OpenBlock {
                stream: header.stream,
                end_stream: header.flags & END_STREAM != 0,
                priority,
                fragments: fragment.to_vec(),
            });
        } else if let Some(block) = &mut self.block {
            block.fragments.extend_from_slice(payload);
        }
        self.pending.clear();
        self.state = State::FrameHeader;
        if self
            .block
            .as_ref()
            .is_some_and(|b| b.fragments.len() > MAX_BLOCK_BYTES)
        {
            self.fail("a header block over 256 KiB", out);
            return;
        }
        if header.flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.on_block(block, out);
        }
    }

    fn on_block(&mut self, block: OpenBlock, out: &mut Vec<u8>) {
        match self.rewriter.rewrite(&block.fragments) {
            Ok(rewritten) => {
                if let Some(authority) = &rewritten.replaced {
                    debug!(
                        stream = block.stream,
                        authority = %String::from_utf8_lossy(authority),
                        "replaced an :authority that is not a host with localhost"
                    );
                }
                write_block(&block, &rewritten.block, out);
            }
            Err(e) => {
                let reason = match e {
                    HeaderBlockError::Decode(_) => "an undecodable header block",
                    HeaderBlockError::TooLarge => "a header block too large decoded",
                };
                warn!(error = %e, stream = block.stream, "closing an HTTP/2 connection");
                self.block = Some(block);
                self.fail(reason, out);
            }
        }
    }

    /// Hands the server a header block it cannot decode (RFC 7541 section
    /// 6.1: index 0 is a decoding error), so the server ends the connection
    /// with its own GOAWAY and the client hears why; the bytes not yet
    /// passed on and everything after go unchanged to a server that has
    /// stopped reading. The client's header frames cannot be passed on
    /// instead: the server's decoding context is not the client's.
    fn fail(&mut self, reason: &str, out: &mut Vec<u8>) {
        debug!(reason, "HTTP/2 connection broken by the client");
        let stream = self.block.take().map_or(1, |b| b.stream.max(1));
        FrameHeader::write(1, HEADERS, END_HEADERS, stream, out);
        out.push(0x80);
        out.append(&mut self.pending);
        self.state = State::PassAll;
    }
}

/// A HEADERS payload's priority fields and header block fragment, without
/// the padding; `None` when the padding is longer than the payload (RFC
/// 9113 section 6.2).
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    if flags & PADDED != 0 {
        let (&pad, after) = rest.split_first()?;
        rest = after.get(..after.len().checked_sub(pad as usize)?)?;
    }
    let priority = if flags & PRIORITY != 0 {
        let fields: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        rest = &rest[5..];
        Some(fields)
    } else {
        None
    };
    Some((priority, rest))
}

/// A HEADERS frame and as many CONTINUATION frames as `encoded` needs, no
/// padding.
fn write_block(block: &OpenBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let priority = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
    let first_len = encoded.len().min(MAX_FRAME_PAYLOAD - priority.len());
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    FrameHeader::write(
        priority.len() + first.len(),
        HEADERS,
        flags,
        block.stream,
        out,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        let flags = if after.is_empty() { END_HEADERS } else { 0 };
        FrameHeader::write(chunk.len(), CONTINUATION, flags, block.stream, out);
        out.extend_from_slice(chunk);
        rest = after;
    }
}

#[cfg(test)]
mod tests;
