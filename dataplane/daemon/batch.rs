//! A batch: the messages of one CompleteDeferredWork tick, and the status
//! reported for them.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::reconciler::Report;
use crate::wire::vxmgr::v1::{
    BatchResult, BatchStatus, KernelError, ObjectCounts, RejectedMessage, SyncResponse,
};

/// Where a stream's responses go.
pub type Responder = mpsc::Sender<Result<SyncResponse, tonic::Status>>;

/// The messages of a batch, as they are taken in.
#[derive(Debug)]
pub struct Batch {
    pub stream: u64,
    pub responder: Option<Responder>,
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub count: u32,
    pub rejected: Vec<RejectedMessage>,
    pub ignored: u32,
}

impl Batch {
    pub fn new(stream: u64, responder: Option<Responder>) -> Batch {
        Batch {
            stream,
            responder,
            first_sequence: 0,
            last_sequence: 0,
            count: 0,
            rejected: Vec::new(),
            ignored: 0,
        }
    }

    pub fn add(&mut self, sequence: u64) {
        if self.count == 0 {
            self.first_sequence = sequence;
        }
        self.last_sequence = sequence;
        self.count += 1;
    }

    pub fn reject(&mut self, sequence: u64, reason: String) {
        self.rejected.push(RejectedMessage {
            sequence_number: sequence,
            reason,
        });
    }

    /// The status of this batch once the kernel has been programmed.
    pub fn status(&self, report: &Report, apply_time: Duration, in_sync: bool) -> BatchStatus {
        // A rejected ConfigUpdate may still have applied its good keys.
        let changed_kernel = report.added + report.changed + report.removed > 0;
        let nothing_applied =
            self.count > 0 && self.rejected.len() as u32 == self.count && !changed_kernel;
        let every_op_failed =
            report.operations > 0 && report.errors.len() as u32 >= report.operations;
        let result = if nothing_applied || every_op_failed {
            BatchResult::Failed
        } else if !self.rejected.is_empty() || !report.errors.is_empty() {
            BatchResult::Partial
        } else {
            BatchResult::Ok
        };
        BatchStatus {
            first_sequence: self.first_sequence,
            last_sequence: self.last_sequence,
            message_count: self.count,
            result: result as i32,
            rejected: self.rejected.clone(),
            kernel_errors: report
                .errors
                .iter()
                .map(|e| KernelError {
                    object: e.object.clone(),
                    error: e.error.clone(),
                })
                .collect(),
            objects: Some(ObjectCounts {
                added: report.added,
                changed: report.changed,
                removed: report.removed,
            }),
            apply_micros: apply_time.as_micros().min(u32::MAX as u128) as u32,
            in_sync,
            ignored: self.ignored,
        }
    }
}
