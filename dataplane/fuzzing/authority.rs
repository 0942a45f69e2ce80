//! The properties of the HTTP/2 filter in front of the socket
//! (`server::authority`), which rewrites what clients send before the
//! server's HTTP/2 layer reads it. The filter's output is checked against a
//! model: the client's bytes parsed whole (no streaming state), each header
//! block decoded by a decoder of the model's own, and the filter's header
//! blocks decoded by a fresh decoder each, as the server would.

use std::borrow::Cow;

use loona_hpack::Decoder;

use crate::server::authority::frames::{
    CONTINUATION, END_HEADERS, END_STREAM, FEED_OUTPUT_LIMIT, FRAME_HEADER_LEN, HEADERS,
    MAX_BLOCK_BYTES, MAX_BUFFERED, MAX_FRAME_PAYLOAD, PADDED, PREFACE, PRIORITY, RequestFilter,
};
use crate::server::authority::header_block::{
    HeaderBlockRewriter, MAX_DECODED_BYTES, REPLACEMENT_AUTHORITY, encode_integer, encode_string,
};

/// The client's table size limit, as the filter's (the protocol's initial
/// value, which the server never changes).
const MAX_TABLE_SIZE: usize = 4096;

/// Frame headers and priority fields around one header block at most.
const FRAMING: usize = 1024;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The filter on a whole connection's bytes from the client, fed in
/// several ways. Data starting with `P` is the connection as it is (so the
/// preface check is fuzzed too); other data follows the preface.
pub fn authority_stream(data: &[u8]) {
    if data.first() == Some(&b'P') {
        check_connection(data);
    } else {
        check_connection(&[&PREFACE[..], data].concat());
    }
}

/// The filter on a connection built from `data` by [`Requests`]: header
/// blocks of fields every way HPACK can send them, split into HEADERS and
/// CONTINUATION frames anywhere, padded, with priority, table size updates,
/// blocks past the limits, other frames and stray bytes between them.
pub fn authority_requests(data: &[u8]) {
    check_connection(&Requests::new(data).connection());
}

/// The HPACK rewriter alone on a series of header blocks, each a 2-byte
/// little-endian length, a repeat count and that many bytes (the block is
/// those bytes repeated, so a short input makes a huge block). Each block
/// the rewriter writes decodes, alone, to the client's fields with only an
/// `:authority` that is not one replaced; it fails exactly when the model
/// says the block is broken or too large, and stops there as a connection
/// would.
pub fn authority_header_blocks(data: &[u8]) {
    let mut rewriter = HeaderBlockRewriter::default();
    let mut model = model_decoder();
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let repeat = usize::from(rest[2]) + 1;
        let bytes = &rest[3..(3 + len).min(rest.len())];
        rest = &rest[3 + bytes.len()..];
        let mut block = bytes.repeat(repeat);
        block.truncate(1 << 20);
        let expected = model_fields(&mut model, &block);
        match (rewriter.rewrite(&block), expected) {
            (Ok(rewritten), Some(fields)) => {
                assert_eq!(server_fields(&rewritten.block), fields);
                assert!(rewritten.block.len() <= MAX_DECODED_BYTES);
            }
            (Err(_), None) => return,
            (got, want) => panic!("rewriter: {got:?}, model: {want:?}"),
        }
    }
}

/// What the server reads, in the terms the filter promises it.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Bytes as the client sent them: the preface, frames other than
    /// header blocks, everything after a break.
    Bytes(Vec<u8>),
    Block {
        stream: u32,
        end_stream: bool,
        priority: Option<Vec<u8>>,
        fields: Fields,
    },
    /// The undecodable block that makes the server end the connection.
    Broken { stream: u32 },
}

fn push(seen: &mut Vec<Seen>, item: Seen) {
    match (seen.last_mut(), item) {
        (Some(Seen::Bytes(last)), Seen::Bytes(more)) => last.extend_from_slice(&more),
        (_, Seen::Bytes(more)) if more.is_empty() => {}
        (_, item) => seen.push(item),
    }
}

/// Feeds `input` whole, a byte at a time and in chunks of sizes drawn from
/// the input itself; every way gives the same output, which the model
/// expects, with the filter's buffers and each feed's output bounded.
fn check_connection(input: &[u8]) {
    let whole = filtered(input, std::iter::repeat(input.len().max(1)));
    let bytewise = filtered(input, std::iter::repeat(1));
    assert!(
        whole == bytewise,
        "fed whole and byte by byte, outputs differ"
    );
    let mut sizes = Sizes(fnv(input) | 1);
    let chunked = filtered(input, std::iter::from_fn(|| Some(sizes.next())));
    assert!(whole == chunked, "fed whole and in chunks, outputs differ");
    assert_eq!(seen(&whole), expected(input));
}

/// The filter's output for `input` fed in chunks of `sizes`, each chunk as
/// many times as the filter asks, checking the bounds after each call.
fn filtered(input: &[u8], mut sizes: impl Iterator<Item = usize>) -> Vec<u8> {
    let mut filter = RequestFilter::default();
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let size = sizes.next().unwrap_or(1).clamp(1, rest.len());
        let mut chunk = &rest[..size];
        rest = &rest[size..];
        while !chunk.is_empty() {
            let before = out.len();
            let taken = filter.feed(chunk, &mut out);
            assert!(taken > 0, "a feed took nothing");
            let bound = FEED_OUTPUT_LIMIT + chunk.len() + MAX_DECODED_BYTES + FRAMING;
            assert!(
                out.len() - before < bound,
                "one feed wrote {}",
                out.len() - before
            );
            assert!(filter.buffered() <= MAX_BUFFERED, "{}", filter.buffered());
            chunk = &chunk[taken..];
        }
    }
    out
}

/// Chunk sizes from 1 to 4096, from a xorshift generator.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let size = if self.0 & 0x100 == 0 {
            self.0 % 16
        } else {
            self.0 % 4096
        };
        size as usize + 1
    }
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[derive(Clone, Copy)]
struct Frame<'a> {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
    /// The whole frame, header included; cut short at the end of input.
    bytes: &'a [u8],
    /// The payload, when all of it is there.
    payload: Option<&'a [u8]>,
}

/// The next frame of `bytes`, when its header is complete.
fn next_frame(bytes: &[u8]) -> Option<Frame<'_>> {
    let header = bytes.get(..FRAME_HEADER_LEN)?;
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let end = FRAME_HEADER_LEN + length;
    Some(Frame {
        length,
        kind: header[3],
        flags: header[4],
        stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
        bytes: &bytes[..end.min(bytes.len())],
        payload: bytes.get(FRAME_HEADER_LEN..end),
    })
}

fn model_decoder() -> Decoder<'static> {
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
    decoder
}

/// The fields the server must get for the client's `block`: its fields,
/// an `:authority` that is not a URI authority replaced; `None` when the
/// block is broken or its header list over the limit.
fn model_fields(decoder: &mut Decoder<'static>, block: &[u8]) -> Option<Fields> {
    let mut fields = Vec::new();
    let mut size = 0;
    decoder
        .decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
            size += name.len() + value.len() + 32;
            let value = if name.as_ref() == b":authority"
                && http::uri::Authority::try_from(value.as_ref()).is_err()
            {
                REPLACEMENT_AUTHORITY.to_vec()
            } else {
                value.into_owned()
            };
            fields.push((name.into_owned(), value));
        })
        .ok()?;
    (size <= MAX_DECODED_BYTES).then_some(fields)
}

/// The fields of a block the filter wrote, decoded alone after a table
/// size update to 0: a block that used the dynamic table (the server's
/// context must stay empty) fails to decode.
fn server_fields(block: &[u8]) -> Fields {
    // The decoder refuses a block that ends with a table size update, as
    // the emptying one alone would.
    if block.is_empty() {
        return Fields::new();
    }
    let mut decoder = Decoder::new();
    let mut emptied = Vec::new();
    encode_integer(0, 5, 0x20, &mut emptied);
    emptied.extend_from_slice(block);
    decoder
        .decode(&emptied)
        .unwrap_or_else(|e| panic!("the server cannot decode a block written for it: {e:?}"))
}

/// What the server must read for the client's `input`, parsed whole.
fn expected(input: &[u8]) -> Vec<Seen> {
    let mut seen = Vec::new();
    if input.len() < PREFACE.len() {
        return seen;
    }
    if !input.starts_with(PREFACE) {
        push(&mut seen, Seen::Bytes(input.to_vec()));
        return seen;
    }
    push(&mut seen, Seen::Bytes(PREFACE.to_vec()));
    let mut decoder = model_decoder();
    let mut pos = PREFACE.len();
    let mut open: Option<Collected> = None;
    let broken = |seen: &mut Vec<Seen>, stream: u32, rest: &[u8]| {
        push(seen, Seen::Broken { stream });
        push(seen, Seen::Bytes(rest.to_vec()));
    };
    while let Some(frame) = next_frame(&input[pos..]) {
        let open_stream = open.as_ref().map(|o| o.stream.max(1));
        let continues = open
            .as_ref()
            .is_some_and(|o| frame.kind == CONTINUATION && frame.stream == o.stream);
        if let Some(stream) = open_stream.filter(|_| !continues) {
            broken(&mut seen, stream, &input[pos..]);
            return seen;
        }
        if frame.kind != HEADERS && !continues {
            push(&mut seen, Seen::Bytes(frame.bytes.to_vec()));
            pos += frame.bytes.len();
            continue;
        }
        if frame.length > MAX_FRAME_PAYLOAD {
            broken(&mut seen, open_stream.unwrap_or(1), &input[pos..]);
            return seen;
        }
        let Some(payload) = frame.payload else {
            break;
        };
        if frame.kind == HEADERS {
            let Some((priority, fragment)) = unpadded(frame.flags, payload) else {
                broken(&mut seen, 1, &input[pos..]);
                return seen;
            };
            open = Some(Collected {
                stream: frame.stream,
                end_stream: frame.flags & END_STREAM != 0,
                priority,
                fragments: fragment.to_vec(),
            });
        } else if let Some(o) = &mut open {
            o.fragments.extend_from_slice(payload);
        }
        pos += frame.bytes.len();
        let Some(block) = open.take() else {
            continue;
        };
        if block.fragments.len() > MAX_BLOCK_BYTES {
            broken(&mut seen, block.stream.max(1), &input[pos..]);
            return seen;
        }
        if frame.flags & END_HEADERS == 0 {
            open = Some(block);
            continue;
        }
        let Some(fields) = model_fields(&mut decoder, &block.fragments) else {
            broken(&mut seen, block.stream.max(1), &input[pos..]);
            return seen;
        };
        push(
            &mut seen,
            Seen::Block {
                stream: block.stream,
                end_stream: block.end_stream,
                priority: block.priority,
                fields,
            },
        );
    }
    seen
}

/// A header block the model collects: its HEADERS frame's stream,
/// END_STREAM and priority fields, and the fragments so far.
struct Collected {
    stream: u32,
    end_stream: bool,
    priority: Option<Vec<u8>>,
    fragments: Vec<u8>,
}

/// A HEADERS payload's priority fields and fragment (RFC 9113 section
/// 6.2); `None` when its padding does not fit.
fn unpadded(flags: u8, payload: &[u8]) -> Option<(Option<Vec<u8>>, &[u8])> {
    let mut rest = payload;
    if flags & PADDED != 0 {
        let pad = usize::from(*rest.first()?);
        rest = &rest[1..];
        if pad > rest.len() {
            return None;
        }
        rest = &rest[..rest.len() - pad];
    }
    if flags & PRIORITY == 0 {
        return Some((None, rest));
    }
    if rest.len() < 5 {
        return None;
    }
    Some((Some(rest[..5].to_vec()), &rest[5..]))
}

/// What the server reads in the filter's `output`. Every header block in
/// it is whole, unpadded, in frames within the maximum size, and decodes
/// on its own.
fn seen(output: &[u8]) -> Vec<Seen> {
    let mut seen = Vec::new();
    if !output.starts_with(PREFACE) {
        push(&mut seen, Seen::Bytes(output.to_vec()));
        return seen;
    }
    push(&mut seen, Seen::Bytes(PREFACE.to_vec()));
    let mut rest = &output[PREFACE.len()..];
    while let Some(frame) = next_frame(rest) {
        if frame.kind != HEADERS {
            push(&mut seen, Seen::Bytes(frame.bytes.to_vec()));
            rest = &rest[frame.bytes.len()..];
            continue;
        }
        if frame.payload == Some(&[0x80]) && frame.flags == END_HEADERS {
            push(
                &mut seen,
                Seen::Broken {
                    stream: frame.stream,
                },
            );
            push(&mut seen, Seen::Bytes(rest[frame.bytes.len()..].to_vec()));
            return seen;
        }
        assert_eq!(frame.flags & PADDED, 0, "a padded block");
        let mut payload = frame.payload.expect("a whole HEADERS frame");
        let priority = (frame.flags & PRIORITY != 0).then(|| {
            let (fields, fragment) = payload.split_at(5);
            payload = fragment;
            fields.to_vec()
        });
        let mut block = payload.to_vec();
        let mut last = frame;
        rest = &rest[last.bytes.len()..];
        loop {
            assert!(last.bytes.len() <= FRAME_HEADER_LEN + MAX_FRAME_PAYLOAD);
            if last.flags & END_HEADERS != 0 {
                break;
            }
            let next = next_frame(rest).expect("the block goes on");
            assert_eq!((next.kind, next.stream), (CONTINUATION, frame.stream));
            block.extend_from_slice(next.payload.expect("a whole CONTINUATION frame"));
            rest = &rest[next.bytes.len()..];
            last = next;
        }
        assert!(
            block.len() <= MAX_DECODED_BYTES,
            "a block of {}",
            block.len()
        );
        push(
            &mut seen,
            Seen::Block {
                stream: frame.stream,
                end_stream: frame.flags & END_STREAM != 0,
                priority,
                fields: server_fields(&block),
            },
        );
    }
    push(&mut seen, Seen::Bytes(rest.to_vec()));
    seen
}

/// Builds a client's connection from fuzz data, a byte at a time (zeros
/// once it runs out).
struct Requests<'a> {
    data: &'a [u8],
}

/// `:authority` values the filter must keep, and ones it must replace.
const AUTHORITIES: [&[u8]; 8] = [
    b"localhost",
    b"vxmgr:50051",
    b"[::1]:80",
    b"/run/vxmgr/dataplane.sock",
    b"%2Frun%2Fvxmgr%2Fdataplane.sock",
    b"",
    b"a b",
    b"unix:/tmp/vx.sock",
];

impl<'a> Requests<'a> {
    fn new(data: &'a [u8]) -> Requests<'a> {
        Requests { data }
    }

    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.data.split_first().unwrap_or((&0, &[]));
        self.data = rest;
        b
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        taken
    }

    fn connection(mut self) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        frame(0x4, 0, 0, &[], &mut out);
        while !self.data.is_empty() {
            match self.byte() % 8 {
                0..=3 => {
                    let block = self.block();
                    self.header_frames(&block, &mut out);
                }
                4 => {
                    let kind =
                        [0x0, 0x3, 0x4, 0x6, 0x8, CONTINUATION][usize::from(self.byte() % 6)];
                    let stream = u32::from(self.byte() % 4);
                    let n = usize::from(self.byte());
                    frame(kind, self.byte(), stream, self.bytes(n), &mut out);
                }
                5 => {
                    let n = usize::from(self.byte() % 16);
                    out.extend_from_slice(self.bytes(n));
                }
                6 => {
                    // A field far larger than a frame, or than the limits.
                    let mut block = Vec::new();
                    let len = usize::from(self.byte()) * 1100;
                    literal(0x00, 4, b"x-big", &vec![b'v'; len], &mut block);
                    self.header_frames(&block, &mut out);
                }
                _ => {
                    let n = usize::from(self.byte());
                    frame(
                        HEADERS,
                        END_HEADERS,
                        1,
                        &vec![self.byte(); n * 80],
                        &mut out,
                    );
                }
            }
        }
        out
    }

    /// One header block: up to 8 representations.
    fn block(&mut self) -> Vec<u8> {
        let mut block = Vec::new();
        for _ in 0..self.byte() % 9 {
            match self.byte() % 8 {
                0 => block.push(0x80 | (self.byte() % 70)),
                1 => encode_integer(usize::from(self.byte()) * 20, 5, 0x20, &mut block),
                2 | 3 => {
                    let authority = AUTHORITIES[usize::from(self.byte() % 8)];
                    let how = self.byte();
                    // By name index 1 or by a literal name.
                    let name: &[u8] = if how & 0x10 == 0 { b"" } else { b":authority" };
                    let (flags, prefix) = representation(how);
                    if name.is_empty() {
                        encode_integer(1, prefix, flags, &mut block);
                        encode_string(authority, &mut block);
                    } else {
                        literal(flags, prefix, name, authority, &mut block);
                    }
                }
                4 => {
                    let n = usize::from(self.byte() % 16);
                    block.extend_from_slice(self.bytes(n));
                }
                _ => {
                    let (flags, prefix) = representation(self.byte());
                    let name_len = usize::from(self.byte() % 12);
                    let name = self.bytes(name_len);
                    let value_len = usize::from(self.byte() % 40);
                    let value = self.bytes(value_len);
                    literal(flags, prefix, name, value, &mut block);
                }
            }
        }
        block
    }

    /// `block` in a HEADERS frame and CONTINUATION frames, cut where the
    /// data says, maybe padded, with priority, END_STREAM, or missing its
    /// END_HEADERS.
    fn header_frames(&mut self, block: &[u8], out: &mut Vec<u8>) {
        let stream = u32::from(self.byte() % 4) * 2 + 1;
        let flags = self.byte();
        let mut cuts: Vec<usize> = (0..self.byte() % 4)
            .map(|_| {
                usize::from(u16::from_le_bytes([self.byte(), self.byte()])) % (block.len() + 1)
            })
            .collect();
        cuts.push(0);
        cuts.push(block.len());
        cuts.sort_unstable();
        let fragments: Vec<&[u8]> = cuts.windows(2).map(|w| &block[w[0]..w[1]]).collect();
        for (i, fragment) in fragments.iter().enumerate() {
            let last = i + 1 == fragments.len();
            let end_headers = if last && flags & 0x80 == 0 {
                END_HEADERS
            } else {
                0
            };
            if i > 0 {
                frame(CONTINUATION, end_headers, stream, fragment, out);
                continue;
            }
            let mut payload = Vec::new();
            let frame_flags = end_headers | (flags & (END_STREAM | PADDED | PRIORITY));
            if flags & PADDED != 0 {
                payload.push(self.byte());
            }
            if flags & PRIORITY != 0 {
                payload.extend_from_slice(self.bytes(5));
            }
            payload.extend_from_slice(fragment);
            if flags & PADDED != 0 {
                // As much padding as the length says, or (bit 0x40) less.
                let pad = usize::from(payload[0]);
                let pad = if flags & 0x40 == 0 { pad } else { pad / 2 };
                payload.extend(std::iter::repeat_n(0, pad));
            }
            frame(HEADERS, frame_flags, stream, &payload, out);
        }
    }
}

/// A literal field's first octet's flags and prefix bits: with incremental
/// indexing, without indexing, or never indexed (RFC 7541 section 6.2).
fn representation(how: u8) -> (u8, u8) {
    match how % 3 {
        0 => (0x40, 6),
        1 => (0x00, 4),
        _ => (0x10, 4),
    }
}

/// A literal field with a new name.
fn literal(flags: u8, prefix: u8, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    encode_integer(0, prefix, flags, out);
    encode_string(name, out);
    encode_string(value, out);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}
