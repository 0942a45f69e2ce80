//! Makes gRPC clients with their default settings work on the unix socket.
//!
//! Many clients put the socket's path in the HTTP/2 `:authority`
//! (grpcurl up to 1.8.9, grpc-java) or its %-encoding (grpcio from 1.57).
//! Neither is a URI authority, and the HTTP/2 layer under tonic resets
//! such a request with PROTOCOL_ERROR before our code sees it, with no
//! setting to allow it. A unix socket has no host name to check, so the
//! socket's connections go through a filter that hands the server
//! `localhost` for any `:authority` it could not parse. It rewrites the
//! header blocks the client sends and nothing else.

pub mod frames;
pub mod header_block;

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

use frames::RequestFilter;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// An accepted connection whose incoming bytes pass the [`RequestFilter`];
/// what the server writes goes to the socket as it is.
pub struct AuthorityFixingStream {
    inner: UnixStream,
    filter: RequestFilter,
    chunk: Box<[u8]>,
    /// The part of `chunk` read but not yet through the filter.
    unfiltered: Range<usize>,
    /// Filtered bytes the server has not read yet, from `start`.
    filtered: Vec<u8>,
    start: usize,
}

impl AuthorityFixingStream {
    pub fn new(inner: UnixStream) -> AuthorityFixingStream {
        AuthorityFixingStream {
            inner,
            filter: RequestFilter::default(),
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            unfiltered: 0..0,
            filtered: Vec::new(),
            start: 0,
        }
    }
}

impl Connected for AuthorityFixingStream {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> UdsConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for AuthorityFixingStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A header block may be held back whole: read until something
        // passes the filter, or the client is done. The filter may leave
        // part of a chunk for later, to bound what one read expands to.
        while this.start == this.filtered.len() {
            this.filtered.clear();
            this.start = 0;
            if this.unfiltered.is_empty() {
                let mut chunk = ReadBuf::new(&mut this.chunk);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
                if chunk.filled().is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.unfiltered = 0..chunk.filled().len();
            }
            let input = &this.chunk[this.unfiltered.clone()];
            this.unfiltered.start += this.filter.feed(input, &mut this.filtered);
        }
        let n = buf.remaining().min(this.filtered.len() - this.start);
        buf.put_slice(&this.filtered[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for AuthorityFixingStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
