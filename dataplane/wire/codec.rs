//! Sync's codecs. The server keeps each request's bytes as they arrived
//! beside what they decode to; a client replaying a capture sends bytes as
//! they are. Everything else is prost's.

use bytes::{BufMut, Bytes};
use prost::bytes::Buf;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

use super::Received;
use super::vxmgr::v1::SyncResponse;

/// The server side of Sync: `Received` in, `SyncResponse` out.
#[derive(Debug, Default)]
pub struct SyncServerCodec;

impl Codec for SyncServerCodec {
    type Encode = SyncResponse;
    type Decode = Received;
    type Encoder = ProstEncoder<SyncResponse>;
    type Decoder = ReceivedDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ReceivedDecoder
    }
}

#[derive(Debug)]
pub struct ReceivedDecoder;

impl Decoder for ReceivedDecoder {
    type Item = Received;
    type Error = Status;

    /// A message that does not decode is handed on as such, to be rejected
    /// on its own: the stream goes on.
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Received>, Status> {
        // Shares the buffer the message arrived in: no copy.
        let bytes = buf.copy_to_bytes(buf.remaining());
        Ok(Some(Received::new(bytes)))
    }
}

/// The client side of Sync for messages that are bytes already.
#[derive(Debug, Default)]
pub struct SyncBytesCodec;

impl Codec for SyncBytesCodec {
    type Encode = Bytes;
    type Decode = SyncResponse;
    type Encoder = BytesEncoder;
    type Decoder = ProstDecoder<SyncResponse>;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

#[derive(Debug)]
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}
