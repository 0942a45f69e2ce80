//! Connecting to vxmgrd's unix socket as a gRPC client.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

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
