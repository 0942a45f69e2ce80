//! Replay files: `.jsonl` holds one `felix.ToDataplane` per line in proto3
//! JSON; any other extension holds Felix's own framing (8-byte little-endian
//! length, then the protobuf bytes), so a capture of a real Felix stream
//! replays as is.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use super::felix::ToDataplane;
use super::framing::{Frame, FrameError, FrameReader};
use super::{MAX_MESSAGE_BYTES, Received, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayFormat {
    Jsonl,
    Framed,
}

impl ReplayFormat {
    pub fn for_path(path: &Path) -> ReplayFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => ReplayFormat::Jsonl,
            _ => ReplayFormat::Framed,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}:{line}: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Frame { path: PathBuf, source: FrameError },
    #[error("{}: frame at byte {offset} is {len} bytes, over the {MAX_MESSAGE_BYTES}-byte limit", path.display())]
    TooLarge {
        path: PathBuf,
        offset: u64,
        len: u64,
    },
    #[error("{}: message at byte {offset}: {source}", path.display())]
    Decode {
        path: PathBuf,
        offset: u64,
        source: prost::DecodeError,
    },
}

/// Reads every message of a replay file.
pub fn read_file(path: &Path) -> Result<Vec<ToDataplane>, ReplayError> {
    read(path, ReplayFormat::for_path(path), open(path)?)
}

/// A replay file's messages as bytes to send, read one at a time, so that
/// they can be sent while the rest of the file is read: a Felix-framed
/// file's frames as they are (unknown fields and kinds, and messages that
/// do not decode, included), a JSON lines file's messages encoded. The
/// first error ends it.
pub struct MessageBytes {
    path: PathBuf,
    source: Source,
    failed: bool,
}

enum Source {
    Jsonl {
        lines: io::Lines<BufReader<File>>,
        /// The number of the line read last.
        line: usize,
    },
    Framed(FrameReader<BufReader<File>>),
}

/// Read buffer of a replay file: large reads, as the files run to tens of
/// megabytes.
const READ_BUFFER: usize = 1 << 20;

impl MessageBytes {
    pub fn open(path: &Path) -> Result<MessageBytes, ReplayError> {
        let reader = open(path)?;
        let source = match ReplayFormat::for_path(path) {
            ReplayFormat::Jsonl => Source::Jsonl {
                lines: reader.lines(),
                line: 0,
            },
            ReplayFormat::Framed => Source::Framed(FrameReader::new(reader, MAX_MESSAGE_BYTES)),
        };
        Ok(MessageBytes {
            path: path.to_path_buf(),
            source,
            failed: false,
        })
    }

    fn next_message(&mut self) -> Result<Option<Bytes>, ReplayError> {
        match &mut self.source {
            Source::Jsonl { lines, line } => {
                for text in lines {
                    *line += 1;
                    let text = text.map_err(|source| ReplayError::Io {
                        path: self.path.clone(),
                        source,
                    })?;
                    if let Some(msg) =
                        jsonl_message(&self.path, *line, &text, json::to_bytes::<ToDataplane>)?
                    {
                        return Ok(Some(msg.into()));
                    }
                }
                Ok(None)
            }
            Source::Framed(reader) => {
                Ok(next_frame(&self.path, reader)?.map(|(_, body)| body.into()))
            }
        }
    }
}

impl Iterator for MessageBytes {
    type Item = Result<Bytes, ReplayError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_message().transpose();
        self.failed = matches!(next, Some(Err(_)));
        next
    }
}

fn open(path: &Path) -> Result<BufReader<File>, ReplayError> {
    let file = File::open(path).map_err(|source| ReplayError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(BufReader::with_capacity(READ_BUFFER, file))
}

/// Reads every message from `reader`; errors name `path`.
pub fn read(
    path: &Path,
    format: ReplayFormat,
    reader: impl BufRead,
) -> Result<Vec<ToDataplane>, ReplayError> {
    match format {
        ReplayFormat::Jsonl => read_jsonl(path, reader),
        ReplayFormat::Framed => read_frames(path, reader)?
            .into_iter()
            .map(|(offset, body)| {
                ToDataplane::decode(body.as_slice()).map_err(|source| ReplayError::Decode {
                    path: path.to_path_buf(),
                    offset,
                    source,
                })
            })
            .collect(),
    }
}

fn read_jsonl(path: &Path, reader: impl BufRead) -> Result<Vec<ToDataplane>, ReplayError> {
    let mut messages = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| ReplayError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        messages.extend(jsonl_message(path, index + 1, &line, json::from_str)?);
    }
    Ok(messages)
}

/// The message on line `number` of a JSON lines file, made by `parse`;
/// `None` for a blank line or a comment.
fn jsonl_message<T>(
    path: &Path,
    number: usize,
    line: &str,
    parse: impl FnOnce(&str) -> Result<T, json::JsonError>,
) -> Result<Option<T>, ReplayError> {
    let text = line.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    parse(text).map(Some).map_err(|e| ReplayError::Json {
        path: path.to_path_buf(),
        line: number,
        message: e.to_string(),
    })
}

/// Every frame's body with its offset in the file.
fn read_frames(path: &Path, reader: impl Read) -> Result<Vec<(u64, Vec<u8>)>, ReplayError> {
    let mut frames = Vec::new();
    let mut reader = FrameReader::new(reader, MAX_MESSAGE_BYTES);
    while let Some(frame) = next_frame(path, &mut reader)? {
        frames.push(frame);
    }
    Ok(frames)
}

/// The next frame's body with its offset in the file; `None` at the end.
fn next_frame(
    path: &Path,
    reader: &mut FrameReader<impl Read>,
) -> Result<Option<(u64, Vec<u8>)>, ReplayError> {
    let offset = reader.offset();
    let frame = reader.next_frame().map_err(|source| ReplayError::Frame {
        path: path.to_path_buf(),
        source,
    })?;
    match frame {
        None => Ok(None),
        Some(Frame::Whole(body)) => Ok(Some((offset, body))),
        // The daemon would refuse it.
        Some(Frame::Oversized(len)) => Err(ReplayError::TooLarge {
            path: path.to_path_buf(),
            offset,
            len,
        }),
    }
}

/// Writes messages in a replay format.
pub struct ReplayWriter<W: Write> {
    out: W,
    format: ReplayFormat,
}

impl ReplayWriter<BufWriter<File>> {
    /// Creates (or truncates) `path`, in the format its extension says.
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(ReplayWriter::new(
            BufWriter::new(File::create(path)?),
            ReplayFormat::for_path(path),
        ))
    }
}

impl<W: Write> ReplayWriter<W> {
    pub fn new(out: W, format: ReplayFormat) -> Self {
        ReplayWriter { out, format }
    }

    /// Felix framing holds the bytes as received; a JSON line holds what
    /// they decode to (kinds and fields vxmgr does not know are left out),
    /// and a message that does not decode is a comment.
    pub fn write(&mut self, received: &Received) -> io::Result<()> {
        match (self.format, &received.message) {
            (ReplayFormat::Jsonl, Ok(msg)) => writeln!(self.out, "{}", json::to_line(msg)),
            (ReplayFormat::Jsonl, Err(e)) => writeln!(
                self.out,
                "# a message of {} bytes that does not decode: {e}",
                received.bytes.len()
            ),
            (ReplayFormat::Framed, _) => {
                let body = &received.bytes;
                self.out.write_all(&(body.len() as u64).to_le_bytes())?;
                self.out.write_all(body)
            }
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::felix::{InSync, RouteRemove, to_dataplane::Payload};

    fn sample() -> Vec<ToDataplane> {
        vec![
            ToDataplane {
                sequence_number: 1,
                payload: Some(Payload::RouteRemove(RouteRemove {
                    dst: "10.0.0.0/26".into(),
                })),
            },
            ToDataplane {
                sequence_number: 2,
                payload: Some(Payload::InSync(InSync {})),
            },
        ]
    }

    fn write_all(format: ReplayFormat) -> Vec<u8> {
        let mut w = ReplayWriter::new(Vec::new(), format);
        for m in sample() {
            w.write(&Received::encode(&m)).unwrap();
        }
        w.out
    }

    fn read_framed(path: &Path, data: &[u8]) -> Result<Vec<ToDataplane>, ReplayError> {
        read(path, ReplayFormat::Framed, data)
    }

    #[test]
    fn both_formats_round_trip() {
        let path = Path::new("mem");
        let framed = write_all(ReplayFormat::Framed);
        assert_eq!(read_framed(path, &framed).unwrap(), sample());
        let jsonl = write_all(ReplayFormat::Jsonl);
        let text = format!("# a comment\n\n{}", String::from_utf8(jsonl).unwrap());
        assert_eq!(read_jsonl(path, text.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn framed_records_and_reads_keep_the_bytes_as_received() {
        // A RouteRemove with a field vxmgr does not know (99), then a frame
        // that does not decode.
        let mut known = ToDataplane {
            sequence_number: 4,
            ..sample()[0].clone()
        }
        .encode_to_vec();
        prost::encoding::string::encode(99, &"later".to_string(), &mut known);
        let received = [
            Received::new(known.clone().into()),
            Received::new(vec![0xff, 0xff].into()),
        ];
        assert!(received[0].message.is_ok() && received[1].message.is_err());
        let mut w = ReplayWriter::new(Vec::new(), ReplayFormat::Framed);
        for r in &received {
            w.write(r).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capture.bin");
        std::fs::write(&path, &w.out).unwrap();
        let bytes: Vec<Bytes> = MessageBytes::open(&path)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(bytes, [known.as_slice(), &[0xff, 0xff]]);
        let mut jsonl = ReplayWriter::new(Vec::new(), ReplayFormat::Jsonl);
        for r in &received {
            jsonl.write(r).unwrap();
        }
        let text = String::from_utf8(jsonl.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("# a message of 2 bytes that does not decode: "),
            "{text}"
        );
        let decoded = received[0].message.clone().unwrap();
        assert_eq!(
            read(&path, ReplayFormat::Jsonl, text.as_bytes()).unwrap(),
            [decoded]
        );
    }

    #[test]
    fn jsonl_errors_name_file_and_line() {
        let text = "# ok\n{\"inSync\": {}}\n{\"routeUpdate\": \n";
        let err = read_jsonl(Path::new("x.jsonl"), text.as_bytes()).unwrap_err();
        assert!(err.to_string().starts_with("x.jsonl:3: "), "{err}");
    }

    #[test]
    fn truncated_and_oversized_frames_are_named() {
        let framed = write_all(ReplayFormat::Framed);
        let cut = &framed[..framed.len() - 1];
        let err = read_framed(Path::new("cap.bin"), cut).unwrap_err();
        assert!(err.to_string().contains("truncated frame at byte"), "{err}");
        let err = read_framed(Path::new("cap.bin"), &framed[..3]).unwrap_err();
        assert!(err.to_string().contains("3 of the 8 length bytes"), "{err}");
        let huge = (MAX_MESSAGE_BYTES as u64 + 1).to_le_bytes();
        let err = read_framed(Path::new("cap.bin"), &huge).unwrap_err();
        assert!(err.to_string().contains("over the"), "{err}");
    }

    #[test]
    fn a_length_prefix_beyond_the_input_is_truncated_not_read() {
        let mut claim = (MAX_MESSAGE_BYTES as u64).to_le_bytes().to_vec();
        claim.extend_from_slice(&[0x7a; 10]);
        let err = read_framed(Path::new("cap.bin"), &claim).unwrap_err();
        assert!(
            err.to_string()
                .contains("truncated frame at byte 0: length says 67108864 bytes, 10 remain"),
            "{err}"
        );
    }
}
