//! A batch: the messages of one CompleteDeferredWork tick, and the status
//! reported for them.

use std::time::Duration;

use crate::calc_source::responses::Responder;
use crate::reconciler::Report;
use crate::wire::vxmgr::v1::{
    BatchResult, BatchStatus, KernelError, ObjectCounts, RejectedMessage,
};

/// Numbers a stream's messages. A message's number is the one it was sent
/// with, except that a message sent without one (0, which proto3 cannot
/// tell from unset) after the first takes the number after its
/// predecessor's. Felix numbers from 0, so its numbers are kept as sent,
/// and a stream that numbers nothing is numbered 0, 1, 2, … by position.
#[derive(Debug, Default)]
pub struct Numbering {
    last: Option<u64>,
}

impl Numbering {
    pub fn number(&mut self, sent: u64) -> u64 {
        let number = match self.last {
            // Numbers are the client's: the largest is followed by 0.
            Some(last) if sent == 0 => last.wrapping_add(1),
            _ => sent,
        };
        self.last = Some(number);
        number
    }
}

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

    /// Whether message `sequence` continues this batch's run of numbers.
    pub fn follows(&self, sequence: u64) -> bool {
        self.count == 0 || sequence == self.last_sequence.wrapping_add(1)
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
        let all_rejected = self.count > 0 && self.rejected.len() as u32 == self.count;
        // Errors count refusals made before any operation was sent, so they
        // are not compared with the operations attempted: a batch failed
        // when it changed nothing and had something to report.
        let result = if !changed_kernel && (all_rejected || !report.errors.is_empty()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::ObjectError;

    fn batch(messages: u64, rejected: &[u64]) -> Batch {
        let mut b = Batch::new(1, None);
        for sequence in 1..=messages {
            b.add(sequence);
            if rejected.contains(&sequence) {
                b.reject(sequence, format!("bad {sequence}"));
            }
        }
        b
    }

    fn report(added: u32, operations: u32, errors: usize) -> Report {
        Report {
            added,
            operations,
            errors: (0..errors)
                .map(|i| ObjectError {
                    object: format!("route {i}"),
                    error: "EEXIST".into(),
                })
                .collect(),
            ..Report::default()
        }
    }

    fn result(b: &Batch, r: &Report) -> BatchResult {
        let status = b.status(r, Duration::ZERO, true);
        BatchResult::try_from(status.result).unwrap()
    }

    #[test]
    fn result_is_ok_partial_or_failed() {
        let cases = [
            (
                "all applied",
                batch(3, &[]),
                report(3, 3, 0),
                BatchResult::Ok,
            ),
            (
                "nothing to program",
                batch(2, &[]),
                report(0, 0, 0),
                BatchResult::Ok,
            ),
            (
                "one rejected",
                batch(3, &[2]),
                report(2, 2, 0),
                BatchResult::Partial,
            ),
            (
                "some kernel errors",
                batch(3, &[]),
                report(2, 3, 1),
                BatchResult::Partial,
            ),
            (
                "all rejected",
                batch(2, &[1, 2]),
                report(0, 0, 0),
                BatchResult::Failed,
            ),
            (
                "all rejected but a config key applied",
                batch(1, &[1]),
                Report {
                    changed: 1,
                    ..report(0, 1, 0)
                },
                BatchResult::Partial,
            ),
            (
                "every operation failed",
                batch(2, &[]),
                report(0, 2, 2),
                BatchResult::Failed,
            ),
            (
                "refused before any operation",
                batch(2, &[]),
                report(0, 0, 2),
                BatchResult::Failed,
            ),
            (
                "more refusals than operations, some applied",
                batch(7, &[]),
                report(3, 3, 4),
                BatchResult::Partial,
            ),
        ];
        for (what, b, r, want) in cases {
            assert_eq!(result(&b, &r), want, "{what}");
        }
    }

    #[test]
    fn numbers_are_kept_as_sent_and_missing_ones_follow_their_predecessor() {
        let cases: [(&str, &[u64], &[u64]); 5] = [
            ("Felix, from 0", &[0, 1, 2], &[0, 1, 2]),
            ("nothing numbered", &[0, 0, 0], &[0, 1, 2]),
            ("numbered from 1", &[1, 2, 3], &[1, 2, 3]),
            ("numbered, then not", &[5, 0, 0], &[5, 6, 7]),
            ("the largest, then none", &[u64::MAX, 0], &[u64::MAX, 0]),
        ];
        for (what, sent, want) in cases {
            let mut numbering = Numbering::default();
            let got: Vec<u64> = sent.iter().map(|&n| numbering.number(n)).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn a_batch_is_a_run_of_consecutive_numbers() {
        let mut b = Batch::new(1, None);
        assert!(b.follows(7), "an empty batch takes any number");
        b.add(7);
        assert!(b.follows(8));
        assert!(!b.follows(7) && !b.follows(9) && !b.follows(0));
        let mut last = Batch::new(1, None);
        last.add(u64::MAX);
        assert!(last.follows(0), "numbers wrap");
    }

    #[test]
    fn status_covers_the_sequence_range_and_lists_rejections() {
        let b = batch(4, &[3]);
        let status = b.status(&report(3, 3, 0), Duration::from_micros(7), false);
        assert_eq!((status.first_sequence, status.last_sequence), (1, 4));
        assert_eq!(status.message_count, 4);
        assert_eq!(status.rejected.len(), 1);
        assert_eq!(status.rejected[0].sequence_number, 3);
        assert_eq!(status.rejected[0].reason, "bad 3");
        assert_eq!(status.apply_micros, 7);
    }
}
