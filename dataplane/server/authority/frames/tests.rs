use super::*;
use crate::server::authority::header_block::{MAX_DECODED_BYTES, encode_integer};

/// A literal field without indexing, new name, raw strings.
fn field(name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(0x00);
    for s in [name, value] {
        encode_integer(s.len(), 7, 0, out);
        out.extend_from_slice(s.as_bytes());
    }
}

fn request_block(authority: &str) -> Vec<u8> {
    let mut block = Vec::new();
    field(":method", "POST", &mut block);
    field(":scheme", "http", &mut block);
    field(":path", "/vxmgr.v1.Dataplane/GetState", &mut block);
    field(":authority", authority, &mut block);
    field("content-type", "application/grpc", &mut block);
    block
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    FrameHeader::write(payload.len(), kind, flags, stream, &mut out);
    out.extend_from_slice(payload);
    out
}

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;
const WINDOW_UPDATE: u8 = 0x8;

/// The frames after the preface: (header, payload).
fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    assert_eq!(&bytes[..24], PREFACE);
    bytes = &bytes[24..];
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::parse(&bytes[..9]);
        frames.push((header, bytes[9..9 + header.length].to_vec()));
        bytes = &bytes[9 + header.length..];
    }
    frames
}

/// The fields of a header block written by the filter.
fn fields(block: &[u8]) -> Vec<(String, String)> {
    loona_hpack::Decoder::new()
        .decode(block)
        .unwrap()
        .into_iter()
        .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

fn authority_of(block: &[u8]) -> String {
    fields(block)
        .into_iter()
        .find(|(n, _)| n == ":authority")
        .unwrap()
        .1
}

fn filtered(input: &[u8]) -> Vec<u8> {
    let mut filter = RequestFilter::default();
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        rest = &rest[filter.feed(rest, &mut out)..];
    }
    out
}

fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    for f in frames {
        bytes.extend_from_slice(f);
    }
    bytes
}

#[test]
fn the_authority_is_replaced_and_every_other_frame_passes_unchanged() {
    let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
    let data = frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 2, 8, 1]);
    let window = frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0x40, 0]);
    let headers = frame(HEADERS, END_HEADERS, 1, &request_block("/tmp/vx.sock"));
    let input = connection(&[settings.clone(), headers, data.clone(), window.clone()]);
    let out = frames(&filtered(&input));
    assert_eq!(out.len(), 4);
    let (header, block) = &out[1];
    assert_eq!(
        (header.kind, header.flags, header.stream),
        (HEADERS, END_HEADERS, 1)
    );
    assert_eq!(authority_of(block), "localhost");
    let bytes = filtered(&input);
    assert!(bytes.starts_with(&connection(&[settings])), "byte for byte");
    assert!(bytes.ends_with(&[data, window].concat()), "byte for byte");
}

#[test]
fn fed_one_byte_at_a_time_the_output_is_the_same() {
    let mut block = request_block("%2Ftmp%2Fvx.sock");
    let continuation = block.split_off(10);
    let input = connection(&[
        frame(SETTINGS, 0, 0, &[]),
        frame(HEADERS, 0, 3, &block),
        frame(CONTINUATION, END_HEADERS, 3, &continuation),
        frame(DATA, 0, 3, &[1, 2, 3]),
    ]);
    let whole = filtered(&input);
    let mut filter = RequestFilter::default();
    let mut bytewise = Vec::new();
    for b in &input {
        filter.feed(std::slice::from_ref(b), &mut bytewise);
    }
    assert_eq!(whole, bytewise);
    let out = frames(&whole);
    assert_eq!(out.len(), 3, "HEADERS + CONTINUATION became one HEADERS");
    assert_eq!(authority_of(&out[1].1), "localhost");
}

#[test]
fn padding_is_dropped_and_priority_and_end_stream_kept() {
    let block = request_block("/run/vxmgr/dataplane.sock");
    let (head, tail) = block.split_at(7);
    let priority = [0x80, 0, 0, 1, 15]; // exclusive, depends on stream 1, weight 16
    let mut payload = vec![4u8]; // pad length
    payload.extend_from_slice(&priority);
    payload.extend_from_slice(head);
    payload.extend_from_slice(&[0; 4]);
    let input = connection(&[
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload),
        frame(CONTINUATION, 0, 5, &tail[..3]),
        frame(CONTINUATION, END_HEADERS, 5, &tail[3..]),
    ]);
    let out = frames(&filtered(&input));
    assert_eq!(out.len(), 1);
    let (header, payload) = &out[0];
    assert_eq!(header.flags, PRIORITY | END_STREAM | END_HEADERS);
    assert_eq!(payload[..5], priority);
    assert_eq!(authority_of(&payload[5..]), "localhost");
    assert_eq!(fields(&payload[5..]).len(), 5);
}

#[test]
fn a_large_block_is_framed_within_the_maximum_frame_size() {
    let mut block = request_block("/tmp/vx.sock");
    // 40 KB of metadata in three client frames.
    for i in 0..10 {
        field(&format!("x-meta-{i}"), &"v".repeat(4000), &mut block);
    }
    let parts: Vec<&[u8]> = block.chunks(MAX_FRAME_PAYLOAD).collect();
    assert_eq!(parts.len(), 3);
    let input = connection(&[
        frame(HEADERS, 0, 1, parts[0]),
        frame(CONTINUATION, 0, 1, parts[1]),
        frame(CONTINUATION, END_HEADERS, 1, parts[2]),
    ]);
    let out = frames(&filtered(&input));
    assert_eq!(out[0].0.kind, HEADERS);
    let mut joined = Vec::new();
    for (i, (header, payload)) in out.iter().enumerate() {
        assert!(header.length <= MAX_FRAME_PAYLOAD);
        assert_eq!(header.stream, 1);
        if i > 0 {
            assert_eq!(header.kind, CONTINUATION);
        }
        assert_eq!(header.flags & END_HEADERS != 0, i == out.len() - 1);
        joined.extend_from_slice(payload);
    }
    let fields = fields(&joined);
    assert_eq!(fields.len(), 15);
    assert_eq!(fields[3], (":authority".into(), "localhost".into()));
    assert_eq!(fields[14].1.len(), 4000);
}

/// The filter gave up: a one-byte block with index 0, then everything as sent.
fn assert_broken(out: &[u8], stream: u32, rest: &[u8]) {
    let mut want = PREFACE.to_vec();
    want.extend_from_slice(&frame(HEADERS, END_HEADERS, stream, &[0x80]));
    want.extend_from_slice(rest);
    assert!(
        out == want,
        "{} bytes, want {}: {:?}…",
        out.len(),
        want.len(),
        &out[..out.len().min(60)]
    );
}

#[test]
fn a_frame_inside_a_header_block_breaks_the_connection() {
    let block = request_block("localhost");
    let ping = frame(0x6, 0, 0, &[0; 8]);
    let input = connection(&[
        frame(HEADERS, 0, 1, &block[..5]),
        ping.clone(),
        frame(CONTINUATION, END_HEADERS, 1, &block[5..]),
    ]);
    let rest = [ping, frame(CONTINUATION, END_HEADERS, 1, &block[5..])].concat();
    assert_broken(&filtered(&input), 1, &rest);
}

#[test]
fn bad_padding_and_oversized_and_undecodable_blocks_break_the_connection() {
    let padded_past_the_end = frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x82]);
    let out = filtered(&connection(std::slice::from_ref(&padded_past_the_end)));
    assert_broken(&out, 1, &padded_past_the_end);

    let huge = frame(HEADERS, END_HEADERS, 3, &vec![0x82; MAX_FRAME_PAYLOAD + 1]);
    let out = filtered(&connection(std::slice::from_ref(&huge)));
    assert_broken(&out, 1, &huge);

    let bad_index = frame(HEADERS, END_HEADERS, 5, &[0xff, 0x7f]);
    let data = frame(DATA, 0, 5, &[1]);
    let out = filtered(&connection(&[bad_index, data.clone()]));
    assert_broken(&out, 5, &data);
}

#[test]
fn a_connection_that_is_not_http2_passes_as_it_is() {
    let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x00\x05\x01\x04\x00\x00\x00\x01/tmp/";
    assert_eq!(filtered(input), input);
}

#[test]
fn the_dynamic_table_carries_across_blocks_and_streams() {
    // The client indexes its authority once and refers to it afterwards.
    let mut first = vec![0x41];
    encode_integer(12, 7, 0, &mut first);
    first.extend_from_slice(b"/tmp/vx.sock");
    first.extend_from_slice(&[0x83, 0x86, 0x84]); // POST, http, /
    let second = [0x83, 0x86, 0x84, 0xbe];
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS, 3, &second),
    ]);
    let out = frames(&filtered(&input));
    assert_eq!(authority_of(&out[0].1), "localhost");
    assert_eq!(authority_of(&out[1].1), "localhost");
    assert_eq!(fields(&out[1].1).len(), 4);
}

#[test]
fn one_feed_expands_a_bounded_amount_and_leaves_the_rest() {
    // A 4 KB field in the dynamic table, then blocks of 60 references to
    // it: each 60-byte block decodes to 240 KB.
    let mut insert = vec![0x40];
    encode_integer(5, 7, 0, &mut insert);
    insert.extend_from_slice(b"x-big");
    encode_integer(4000, 7, 0, &mut insert);
    insert.extend_from_slice(&[b'v'; 4000]);
    let mut sent = vec![frame(HEADERS, END_HEADERS, 1, &insert)];
    for stream in 0..40 {
        sent.push(frame(HEADERS, END_HEADERS, 3 + 2 * stream, &[0xbe; 60]));
    }
    let input = connection(&sent);
    let mut filter = RequestFilter::default();
    let mut out = Vec::new();
    let taken = filter.feed(&input, &mut out);
    assert!(taken < input.len(), "took all {} bytes", input.len());
    assert!(
        out.len() < FEED_OUTPUT_LIMIT + 2 * MAX_DECODED_BYTES,
        "{}",
        out.len()
    );
    let all = filtered(&input);
    let blocks = frames(&all)
        .iter()
        .filter(|(h, _)| h.kind == HEADERS)
        .count();
    assert_eq!(blocks, 41, "the rest comes with later feeds");
}
