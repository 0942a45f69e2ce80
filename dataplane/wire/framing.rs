//! Felix's framing: each message is an 8-byte little-endian length, then
//! that many bytes of protobuf. Replay files and Felix's pipes use it.

use std::io::{self, Read};

/// The `ToDataplane` field holding the sequence number.
const SEQUENCE_NUMBER_FIELD: u64 = 15;

/// Reads frames one at a time.
pub struct FrameReader<R> {
    reader: R,
    /// Bodies larger than this are `Oversized`.
    limit: u64,
    /// Where the next frame starts.
    offset: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A message within the limit: its bytes.
    Whole(Vec<u8>),
    /// A message over the limit, of this many bytes. Only its length has
    /// been read: `skim` reads past it, or the caller stops.
    Oversized(u64),
}

/// What the top level of a message holds, read without holding it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Skimmed {
    pub sequence_number: u64,
    /// The field number of its payload (the last length-delimited field).
    pub payload_field: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("truncated frame at byte {offset}: {message}")]
    Truncated { offset: u64, message: String },
    #[error("reading the frame at byte {offset}: {source}")]
    Io { offset: u64, source: io::Error },
}

impl<R: Read> FrameReader<R> {
    pub fn new(reader: R, limit: usize) -> Self {
        FrameReader {
            reader,
            limit: limit as u64,
            offset: 0,
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Where the next frame starts (after an `Oversized` frame, where it
    /// started until it is skimmed).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next frame; `None` at the end of the input between frames.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let offset = self.offset;
        let io_error = |source| FrameError::Io { offset, source };
        let mut header = [0u8; 8];
        match read_up_to(&mut self.reader, &mut header).map_err(io_error)? {
            0 => return Ok(None),
            8 => {}
            n => {
                return Err(FrameError::Truncated {
                    offset,
                    message: format!("{n} of the 8 length bytes"),
                });
            }
        }
        let len = u64::from_le_bytes(header);
        if len > self.limit {
            return Ok(Some(Frame::Oversized(len)));
        }
        // The body grows as its bytes arrive: a length prefix alone,
        // however large, allocates nothing.
        let mut body = Vec::new();
        let got = (&mut self.reader)
            .take(len)
            .read_to_end(&mut body)
            .map_err(io_error)?;
        if (got as u64) < len {
            return Err(FrameError::Truncated {
                offset,
                message: format!("length says {len} bytes, {got} remain"),
            });
        }
        self.offset += 8 + len;
        Ok(Some(Frame::Whole(body)))
    }

    /// Reads past the body of an `Oversized` frame of `len` bytes, walking
    /// its top-level fields with a small buffer; `Err` inside says what is
    /// malformed about it (the frame is read past all the same).
    pub fn skim(&mut self, len: u64) -> Result<Result<Skimmed, String>, FrameError> {
        let offset = self.offset;
        let mut body = Body {
            reader: &mut self.reader,
            left: len,
        };
        let skimmed = match body.skim() {
            Ok(skimmed) => Ok(skimmed),
            Err(BodyError::Malformed(why)) => Err(why),
            Err(BodyError::Read(e)) => return Err(e.at(offset)),
        };
        // Malformed or not, the next frame starts after this one.
        let rest = body.left;
        body.skip(rest).map_err(|e| e.at(offset))?;
        self.offset += 8 + len;
        Ok(skimmed)
    }
}

/// The unread part of a frame's body.
struct Body<'a, R> {
    reader: &'a mut R,
    left: u64,
}

enum BodyError {
    Malformed(String),
    Read(ReadError),
}

enum ReadError {
    Truncated(String),
    Io(io::Error),
}

impl ReadError {
    fn at(self, offset: u64) -> FrameError {
        match self {
            ReadError::Truncated(message) => FrameError::Truncated { offset, message },
            ReadError::Io(source) => FrameError::Io { offset, source },
        }
    }
}

impl<R: Read> Body<'_, R> {
    fn skim(&mut self) -> Result<Skimmed, BodyError> {
        let mut skimmed = Skimmed::default();
        while self.left > 0 {
            let key = self.varint()?;
            let field = key >> 3;
            match key & 7 {
                0 => {
                    let value = self.varint()?;
                    if field == SEQUENCE_NUMBER_FIELD {
                        skimmed.sequence_number = value;
                    }
                }
                1 => self.skip_field(8)?,
                2 => {
                    let len = self.varint()?;
                    self.skip_field(len)?;
                    skimmed.payload_field = Some(field);
                }
                5 => self.skip_field(4)?,
                wire_type => {
                    return Err(BodyError::Malformed(format!(
                        "field {field} has wire type {wire_type}"
                    )));
                }
            }
        }
        Ok(skimmed)
    }

    fn varint(&mut self) -> Result<u64, BodyError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            if self.left == 0 {
                return Err(BodyError::Malformed("a varint runs past the end".into()));
            }
            let mut byte = [0u8];
            self.reader.read_exact(&mut byte).map_err(|e| {
                BodyError::Read(match e.kind() {
                    io::ErrorKind::UnexpectedEof => ReadError::Truncated("the input ends".into()),
                    _ => ReadError::Io(e),
                })
            })?;
            self.left -= 1;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(BodyError::Malformed(
            "a varint is longer than 10 bytes".into(),
        ))
    }

    fn skip_field(&mut self, len: u64) -> Result<(), BodyError> {
        if len > self.left {
            return Err(BodyError::Malformed(format!(
                "a field of {len} bytes runs past the end"
            )));
        }
        self.skip(len).map_err(BodyError::Read)
    }

    /// Reads and drops `len` bytes.
    fn skip(&mut self, len: u64) -> Result<(), ReadError> {
        let copied =
            io::copy(&mut (&mut *self.reader).take(len), &mut io::sink()).map_err(ReadError::Io)?;
        self.left -= copied;
        if copied < len {
            return Err(ReadError::Truncated(format!(
                "the input ends {} bytes short",
                len - copied
            )));
        }
        Ok(())
    }
}

/// Fills `buf` as far as the input goes; returns how much was read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::wire::felix::{RouteRemove, ToDataplane, to_dataplane::Payload};

    fn framed(bodies: &[&[u8]]) -> Vec<u8> {
        bodies
            .iter()
            .flat_map(|b| (b.len() as u64).to_le_bytes().into_iter().chain(b.to_vec()))
            .collect()
    }

    /// A message with sequence number 42 and a 100-byte payload in field 2
    /// (Felix's IP set update, unknown to vxmgr).
    fn large() -> Vec<u8> {
        let mut bytes = Vec::new();
        prost::encoding::bytes::encode(2, &vec![7u8; 100], &mut bytes);
        prost::encoding::uint64::encode(15, &42, &mut bytes);
        bytes
    }

    fn small() -> Vec<u8> {
        ToDataplane {
            sequence_number: 43,
            payload: Some(Payload::RouteRemove(RouteRemove {
                dst: "10.0.0.0/26".into(),
            })),
        }
        .encode_to_vec()
    }

    #[test]
    fn an_oversized_frame_is_skimmed_and_the_next_one_read() {
        let (large, small) = (large(), small());
        let input = framed(&[&large, &small]);
        let mut reader = FrameReader::new(input.as_slice(), 50);
        assert_eq!(
            reader.next_frame().unwrap(),
            Some(Frame::Oversized(large.len() as u64))
        );
        let skimmed = reader.skim(large.len() as u64).unwrap();
        assert_eq!(
            skimmed,
            Ok(Skimmed {
                sequence_number: 42,
                payload_field: Some(2)
            })
        );
        assert_eq!(reader.offset(), 8 + large.len() as u64);
        assert_eq!(reader.next_frame().unwrap(), Some(Frame::Whole(small)));
        assert_eq!(reader.next_frame().unwrap(), None);
    }

    #[test]
    fn a_malformed_oversized_frame_is_named_and_read_past() {
        let mut bad = large();
        bad.extend_from_slice(&[0x0f, 1, 2, 3]);
        let small = small();
        let input = framed(&[&bad, &small]);
        let mut reader = FrameReader::new(input.as_slice(), 50);
        assert_eq!(
            reader.next_frame().unwrap(),
            Some(Frame::Oversized(bad.len() as u64))
        );
        let skimmed = reader.skim(bad.len() as u64).unwrap();
        assert_eq!(skimmed, Err("field 1 has wire type 7".to_string()));
        assert_eq!(reader.next_frame().unwrap(), Some(Frame::Whole(small)));
    }

    #[test]
    fn an_oversized_frame_cut_short_is_truncated() {
        let large = large();
        let input = framed(&[&large]);
        let cut = &input[..input.len() - 10];
        let mut reader = FrameReader::new(cut, 50);
        reader.next_frame().unwrap();
        let err = reader.skim(large.len() as u64).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("truncated frame at byte 0: the input ends"),
            "{err}"
        );
    }
}
