//! `--record`: every message a calc source receives, written as it arrives
//! (see `ReplayWriter` for what each format holds). Shared by the sources;
//! a write error stops the recording, not the daemon.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::wire::Received;
use crate::wire::replay::ReplayWriter;

type Writer = ReplayWriter<BufWriter<File>>;

/// The record file, or nothing when not recording; clones share it.
#[derive(Clone, Default)]
pub struct Recorder(Option<Arc<Record>>);

/// The writer, until a write fails.
struct Record(Mutex<Option<Writer>>);

impl Recorder {
    /// Creates (or truncates) `path`, in the format its extension says.
    pub fn create(path: &Path) -> io::Result<Recorder> {
        let writer = ReplayWriter::create(path)?;
        Ok(Recorder(Some(Arc::new(Record(Mutex::new(Some(writer)))))))
    }

    pub fn record(&self, received: &Received) {
        self.with_writer(|w| w.write(received));
    }

    /// Makes what was recorded so far reach the file.
    pub fn flush(&self) {
        self.with_writer(|w| w.flush());
    }

    fn with_writer(&self, op: impl FnOnce(&mut Writer) -> io::Result<()>) {
        let Some(record) = &self.0 else {
            return;
        };
        let mut writer = record.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = writer.as_mut()
            && let Err(e) = op(w)
        {
            warn!(error = %e, "recording stopped");
            *writer = None;
        }
    }
}
