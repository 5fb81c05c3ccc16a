//! Completion queues.

use crate::types::QpHandle;
use crate::wc::{WcStatus, WorkCompletion};
use std::collections::VecDeque;

/// What polling a send completion gives back: the send queue slots of `qp` below
/// sequence number `upto` (the completed WQE and the unsignaled ones before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reclaim {
    pub qp: QpHandle,
    pub upto: u64,
}

/// A completion queue: a bounded FIFO of completions.
pub(crate) struct Cq {
    entries: VecDeque<(WorkCompletion, Option<Reclaim>)>,
    capacity: usize,
    /// Set once a completion was lost to a full queue (IBA 11.4.2.1: CQ overrun).
    pub overrun: bool,
    /// Armed by `req_notify_cq`: `Some(solicited_only)`.
    pub armed: Option<bool>,
    /// QPs and other objects that use this CQ.
    pub users: u32,
}

/// What pushing a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Stored; `notify` when an armed notification fires.
    Stored { notify: bool },
    /// The queue was full: the completion is lost and the CQ is in error.
    Overrun,
}

impl Cq {
    pub fn new(capacity: usize) -> Self {
        Cq {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            overrun: false,
            armed: None,
            users: 0,
        }
    }

    pub fn push(&mut self, wc: WorkCompletion, reclaim: Option<Reclaim>) -> Pushed {
        if self.overrun || self.entries.len() >= self.capacity {
            self.overrun = true;
            return Pushed::Overrun;
        }
        self.entries.push_back((wc, reclaim));
        let notify = self
            .armed
            .is_some_and(|solicited_only| wakes(&wc, solicited_only));
        if notify {
            self.armed = None;
        }
        Pushed::Stored { notify }
    }

    /// Arms the queue (`ibv_req_notify_cq`); true when the notification fires at once.
    ///
    /// It fires at once when a completion already waiting would have fired it: RNICs arm
    /// against their consumer index, so an entry produced but not yet polled raises the
    /// event (mlx5's arm doorbell carries the consumer index). Consumers rely on it: UCX
    /// polls its CQs empty, then arms them and sleeps, and does not poll again in between;
    /// a completion that lands after the poll and before the arm would otherwise never
    /// wake it. A consumer that arms before polling what woke it gets one extra event,
    /// which it must tolerate anyway (the event only says "look at the CQ").
    pub fn arm(&mut self, solicited_only: bool) -> bool {
        if self.entries.iter().any(|(wc, _)| wakes(wc, solicited_only)) {
            self.armed = None;
            true
        } else {
            self.armed = Some(solicited_only);
            false
        }
    }

    pub fn pop(&mut self) -> Option<(WorkCompletion, Option<Reclaim>)> {
        self.entries.pop_front()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `wc` fires a notification armed with `solicited_only`: with it, only solicited
/// receives and error completions do (ibv_req_notify_cq(3)).
fn wakes(wc: &WorkCompletion, solicited_only: bool) -> bool {
    !solicited_only || wc.solicited || wc.status != WcStatus::Success
}
