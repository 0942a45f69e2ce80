//! One HPACK header block from the client, decoded with the client's
//! compression context and encoded again for the server, with an
//! `:authority` the server can parse.

use std::borrow::Cow;

use loona_hpack::Decoder;

/// What replaces an `:authority` that is not a URI authority: a unix
/// socket has no host name, and gRPC clients that send one send this.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// The client's HPACK dynamic table may be at most this big: the server
/// never sends SETTINGS_HEADER_TABLE_SIZE, so the protocol's initial value
/// holds.
const MAX_DYNAMIC_TABLE_SIZE: usize = 4096;

/// Largest decoded header list of one block, counted as HTTP/2 counts a
/// header list's size (RFC 9113 section 6.5.2: each field's name and value
/// plus 32). Far above the server's own header list limit (16 KiB), which
/// it enforces itself; this bounds what a small block referencing table
/// entries many times can make us allocate, and, as no field is written
/// in more than its size, the block written for the server.
pub const MAX_DECODED_BYTES: usize = 256 * 1024;

/// What RFC 9113 adds to a field's name and value in a header list's size.
const FIELD_OVERHEAD: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderBlockError {
    #[error("HPACK decoding failed: {0}")]
    Decode(String),
    #[error("decoded header list over {MAX_DECODED_BYTES} bytes")]
    TooLarge,
}

/// A header block as the server gets it.
#[derive(Debug, PartialEq, Eq)]
pub struct Rewritten {
    pub block: Vec<u8>,
    /// The `:authority` that was replaced, if one was.
    pub replaced: Option<Vec<u8>>,
}

/// The client's side of the connection's HPACK context (RFC 7541), and
/// the encoding of each block for the server.
///
/// The blocks it writes use neither the dynamic table nor Huffman coding
/// (every field a literal without indexing), so the server's decoding
/// context never holds an entry and cannot disagree with anything. Fields
/// the client sent as never-indexed stay out of any table this way too.
pub struct HeaderBlockRewriter {
    decoder: Decoder<'static>,
}

impl Default for HeaderBlockRewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_DYNAMIC_TABLE_SIZE);
        HeaderBlockRewriter { decoder }
    }
}

impl HeaderBlockRewriter {
    /// Decodes a complete header block (every fragment, HEADERS and
    /// CONTINUATION, joined) and encodes it for the server. After an error
    /// the context is no longer the client's: the connection must end.
    pub fn rewrite(&mut self, block: &[u8]) -> Result<Rewritten, HeaderBlockError> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut replaced = None;
        let mut decoded = 0usize;
        let mut too_large = false;
        self.decoder
            .decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                decoded += name.len() + value.len() + FIELD_OVERHEAD;
                if too_large || decoded > MAX_DECODED_BYTES {
                    too_large = true;
                    return;
                }
                let value = if name.as_ref() == b":authority" && !is_authority(&value) {
                    replaced = Some(value.into_owned());
                    Cow::Borrowed(REPLACEMENT_AUTHORITY)
                } else {
                    value
                };
                encode_literal(&name, &value, &mut out);
            })
            .map_err(|e| HeaderBlockError::Decode(e.to_string()))?;
        if too_large {
            return Err(HeaderBlockError::TooLarge);
        }
        Ok(Rewritten {
            block: out,
            replaced,
        })
    }
}

/// Whether the server's HTTP/2 layer takes `value` as an authority.
fn is_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A literal header field without indexing, new name, neither string
/// Huffman-coded (RFC 7541 section 6.2.2).
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

/// A string literal without Huffman coding: a 7-bit-prefix length, then
/// the octets (RFC 7541 section 5.2).
pub fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// An integer with an N-bit prefix, the first octet's high bits `flags`
/// (RFC 7541 section 5.1).
pub fn encode_integer(mut value: usize, prefix_bits: u8, flags: u8, out: &mut Vec<u8>) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The fields a block the rewriter wrote carries, read back by a fresh
    /// decoder (the server's view).
    fn server_view(block: &[u8]) -> Vec<(String, String)> {
        assert!(
            literal_fields_only(block),
            "every field a literal without indexing: {block:?}"
        );
        Decoder::new()
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    /// Walks the block's representations: each must start with 0x00 (a
    /// literal without indexing, new name) and use no Huffman coding.
    fn literal_fields_only(mut block: &[u8]) -> bool {
        let string = |b: &[u8]| -> Option<usize> {
            let first = *b.first()?;
            if first & 0x80 != 0 {
                return None;
            }
            let (len, used) = if first < 0x7f {
                (first as usize, 1)
            } else {
                let mut len = 0x7f;
                let mut shift = 0;
                let mut used = 1;
                loop {
                    let b = *b.get(used)?;
                    len += ((b & 0x7f) as usize) << shift;
                    shift += 7;
                    used += 1;
                    if b & 0x80 == 0 {
                        break;
                    }
                }
                (len, used)
            };
            Some(used + len)
        };
        while !block.is_empty() {
            if block[0] != 0x00 {
                return false;
            }
            let Some(name) = string(&block[1..]) else {
                return false;
            };
            let Some(value) = string(&block[1 + name..]) else {
                return false;
            };
            block = &block[1 + name + value..];
        }
        true
    }

    fn pairs(fields: &[(&str, &str)]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn integers_use_the_prefix_then_continuation_octets() {
        // RFC 7541 C.1: 10 and 1337 with a 5-bit prefix, 42 with 8 bits.
        let mut out = Vec::new();
        encode_integer(10, 5, 0, &mut out);
        assert_eq!(out, [0x0a]);
        out.clear();
        encode_integer(1337, 5, 0, &mut out);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        encode_integer(42, 8, 0, &mut out);
        assert_eq!(out, [0x2a]);
        out.clear();
        encode_integer(127, 7, 0x80, &mut out);
        assert_eq!(out, [0xff, 0x00]);
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost() {
        let mut rewriter = HeaderBlockRewriter::default();
        let mut block = Vec::new();
        encode_literal(b":method", b"POST", &mut block);
        encode_literal(b":authority", b"/run/vxmgr/dataplane.sock", &mut block);
        encode_literal(b":path", b"/grpc.health.v1.Health/Check", &mut block);
        let out = rewriter.rewrite(&block).unwrap();
        assert_eq!(
            out.replaced.as_deref(),
            Some(&b"/run/vxmgr/dataplane.sock"[..])
        );
        assert_eq!(
            server_view(&out.block),
            pairs(&[
                (":method", "POST"),
                (":authority", "localhost"),
                (":path", "/grpc.health.v1.Health/Check"),
            ])
        );
    }

    #[test]
    fn authorities_the_server_accepts_are_kept() {
        for authority in ["localhost", "vxmgr:50051", "[::1]:80", "unix"] {
            let mut block = Vec::new();
            encode_literal(b":authority", authority.as_bytes(), &mut block);
            let out = HeaderBlockRewriter::default().rewrite(&block).unwrap();
            assert_eq!(out.replaced, None, "{authority}");
            assert_eq!(server_view(&out.block), pairs(&[(":authority", authority)]));
        }
        for authority in ["%2Frun%2Fvxmgr.sock", "/tmp/x.sock", "a b", ""] {
            let mut block = Vec::new();
            encode_literal(b":authority", authority.as_bytes(), &mut block);
            let out = HeaderBlockRewriter::default().rewrite(&block).unwrap();
            assert_eq!(out.replaced.as_deref(), Some(authority.as_bytes()));
        }
    }

    #[test]
    fn huffman_strings_and_the_dynamic_table_follow_the_client() {
        // RFC 7541 C.4: three requests on one connection, Huffman-coded,
        // the later ones referring to entries the earlier ones inserted.
        let mut rewriter = HeaderBlockRewriter::default();
        let first = rewriter
            .rewrite(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            server_view(&first.block),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        let second = rewriter
            .rewrite(&hex("8286 84be 5886 a8eb 1064 9cbf"))
            .unwrap();
        assert_eq!(
            server_view(&second.block),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        let third = rewriter
            .rewrite(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(
            server_view(&third.block),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
    }

    #[test]
    fn an_indexed_socket_path_is_replaced_each_time_it_is_referenced() {
        // grpcio inserts its authority into the dynamic table with the
        // first request and refers to it by index afterwards.
        let mut rewriter = HeaderBlockRewriter::default();
        let mut first = vec![0x41]; // literal with incremental indexing, name 1 (:authority)
        encode_string(b"%2Ftmp%2Fvx.sock", &mut first);
        let out = rewriter.rewrite(&first).unwrap();
        assert_eq!(
            server_view(&out.block),
            pairs(&[(":authority", "localhost")])
        );
        let out = rewriter.rewrite(&[0xbe]).unwrap(); // indexed: dynamic entry 62
        assert_eq!(out.replaced.as_deref(), Some(&b"%2Ftmp%2Fvx.sock"[..]));
        assert_eq!(
            server_view(&out.block),
            pairs(&[(":authority", "localhost")])
        );
    }

    #[test]
    fn table_size_updates_evict_and_are_bounded() {
        let mut rewriter = HeaderBlockRewriter::default();
        let mut insert = vec![0x40]; // literal with incremental indexing, new name
        encode_string(b"x-a", &mut insert);
        encode_string(b"1", &mut insert);
        rewriter.rewrite(&insert).unwrap();
        assert!(rewriter.rewrite(&[0xbe]).is_ok(), "entry 62 exists");
        // Size 0 empties the table; back to 4096 for what follows.
        let mut shrink = Vec::new();
        encode_integer(0, 5, 0x20, &mut shrink);
        encode_integer(4096, 5, 0x20, &mut shrink);
        shrink.push(0x82);
        let out = rewriter.rewrite(&shrink).unwrap();
        assert_eq!(server_view(&out.block), pairs(&[(":method", "GET")]));
        assert!(matches!(
            rewriter.rewrite(&[0xbe]),
            Err(HeaderBlockError::Decode(_))
        ));

        let mut too_big = Vec::new();
        encode_integer(4097, 5, 0x20, &mut too_big);
        too_big.push(0x82);
        assert!(matches!(
            HeaderBlockRewriter::default().rewrite(&too_big),
            Err(HeaderBlockError::Decode(_))
        ));
    }

    #[test]
    fn never_indexed_fields_reach_the_server_as_literals() {
        let mut block = vec![0x10]; // literal never indexed, new name
        encode_string(b"authorization", &mut block);
        encode_string(b"secret", &mut block);
        let out = HeaderBlockRewriter::default().rewrite(&block).unwrap();
        assert_eq!(
            server_view(&out.block),
            pairs(&[("authorization", "secret")])
        );
    }

    #[test]
    fn broken_blocks_are_errors() {
        for (what, block) in [
            ("index 0", vec![0x80]),
            ("index past the tables", vec![0xbe]),
            ("truncated string", vec![0x00, 0x05, b'a']),
            ("truncated integer", vec![0x1f]),
            // EOS padding longer than 7 bits: a Huffman "a" (00011) then 11 ones.
            (
                "bad Huffman padding",
                vec![0x00, 0x81, b'a', 0x82, 0x1f, 0xff],
            ),
        ] {
            assert!(
                matches!(
                    HeaderBlockRewriter::default().rewrite(&block),
                    Err(HeaderBlockError::Decode(_))
                ),
                "{what}"
            );
        }
    }

    #[test]
    fn a_block_that_expands_past_the_limit_is_refused() {
        let mut rewriter = HeaderBlockRewriter::default();
        let mut insert = vec![0x40];
        encode_string(b"x-big", &mut insert);
        encode_string(&[b'v'; 3000], &mut insert);
        rewriter.rewrite(&insert).unwrap();
        // 100 references to a 3 KB entry: 300 KB from 100 bytes.
        let bomb = vec![0xbe; 100];
        assert_eq!(rewriter.rewrite(&bomb), Err(HeaderBlockError::TooLarge));
    }
}
