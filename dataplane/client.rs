//! Connecting to vxmgrd's unix socket as a gRPC client.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Status, Streaming};

use crate::wire::codec::SyncBytesCodec;
use crate::wire::vxmgr::v1::SyncResponse;
use crate::wire::vxmgr::v1::dataplane_client::DataplaneClient;

/// A channel to the daemon on `socket`. The URI is a placeholder: every
/// connection goes to the socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}

/// Largest response accepted: GetState of a large cluster runs to megabytes.
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// A Dataplane client on `socket`.
pub async fn dataplane(socket: &Path) -> Result<DataplaneClient<Channel>, tonic::transport::Error> {
    Ok(DataplaneClient::new(connect(socket).await?).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// Opens a Sync stream on `socket` whose messages are bytes already, sent
/// as they are: a capture replays with its numbers and with the fields and
/// kinds vxmgr does not know.
pub async fn sync_bytes(
    socket: &Path,
    messages: impl Stream<Item = Bytes> + Send + 'static,
) -> Result<Streaming<SyncResponse>, SyncError> {
    let mut grpc = tonic::client::Grpc::new(connect(socket).await?)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready().await?;
    let path = PathAndQuery::from_static("/vxmgr.v1.Dataplane/Sync");
    let responses = grpc
        .streaming(Request::new(messages), path, SyncBytesCodec)
        .await?;
    Ok(responses.into_inner())
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Connect(#[from] tonic::transport::Error),
    #[error("{0}")]
    Rpc(#[from] Status),
}
