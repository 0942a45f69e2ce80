//! The unix socket the calc process connects to: created safely, locked
//! down, and filtered by peer credentials.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt, wrappers::UnixListenerStream};
use tracing::warn;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another vxmgrd is already serving on {}", .0.display())]
    InUse(PathBuf),
    #[error("{} exists and is not a socket; refusing to remove it", .0.display())]
    NotASocket(PathBuf),
    #[error("unknown group {0:?} for the socket")]
    UnknownGroup(String),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Held for as long as a daemon serves on a socket.
pub struct SocketLock {
    _held: Flock<File>,
}

/// Takes the lock on `<socket>.lock`. A daemon's socket file can be deleted
/// under it, so the file alone cannot keep a second daemon off the same
/// path; the lock is the kernel's and lasts until the holder exits. The
/// lock file stays when the daemon stops: deleting it would let two
/// daemons lock two different files of one name.
fn lock(socket: &Path) -> Result<SocketLock, SocketError> {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_error("opening the lock file", &path))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(SocketLock { _held: held }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(SocketError::InUse(socket.to_path_buf())),
        Err((_, errno)) => Err(io_error("locking", &path)(errno.into())),
    }
}

/// Binds `path` with mode 0600, or 0660 and group `group` when given, and
/// locks it for this daemon (see `lock`). A stale socket file is replaced;
/// a live daemon on it is an error.
///
/// The socket is bound in a private (0700) directory beside `path`, given
/// its mode and group there, and only then renamed into place, so it is
/// never reachable with the looser permissions the umask would give it.
pub async fn bind(
    path: &Path,
    group: Option<&str>,
) -> Result<(UnixListener, SocketLock), SocketError> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(io_error("creating directory", dir))?;
            dir
        }
        None => Path::new("."),
    };
    let lock = lock(path)?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("inspecting", path)(e)),
    }
    let gid = match group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| SocketError::UnknownGroup(name.to_string()))?
                .gid,
        ),
        None => None,
    };
    let private = tempfile::Builder::new()
        .prefix(".vxmgr-bind-")
        .tempdir_in(dir)
        .map_err(io_error("creating a private directory in", dir))?;
    let staged = private.path().join("socket");
    let listener = UnixListener::bind(&staged).map_err(io_error("binding", &staged))?;
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))
        .map_err(io_error("setting permissions of", &staged))?;
    if let Some(gid) = gid {
        nix::unistd::chown(&staged, None, Some(gid))
            .map_err(|e| io_error("changing group of", &staged)(e.into()))?;
    }
    // Replaces a stale socket atomically.
    std::fs::rename(&staged, path).map_err(io_error("moving the socket to", path))?;
    Ok((listener, lock))
}

/// Accepted connections, without those from uids not in `allow` (when
/// `allow` is not empty).
pub fn incoming(
    listener: UnixListener,
    allow: Vec<u32>,
) -> impl Stream<Item = io::Result<UnixStream>> {
    UnixListenerStream::new(listener).filter(move |conn| {
        let Ok(stream) = conn else {
            return true;
        };
        if allow.is_empty() {
            return true;
        }
        match stream.peer_cred() {
            Ok(cred) if allow.contains(&cred.uid()) => true,
            Ok(cred) => {
                warn!(uid = cred.uid(), pid = ?cred.pid(), "refused a connection from a uid not allowed");
                false
            }
            Err(e) => {
                warn!(error = %e, "refused a connection whose credentials cannot be read");
                false
            }
        }
    })
}
