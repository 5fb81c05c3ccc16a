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
        // ibv_req_notify_cq: with solicited_only, only solicited receives and error
        // completions wake the channel.
        let notify = match self.armed {
            Some(false) => true,
            Some(true) => wc.solicited || wc.status != WcStatus::Success,
            None => false,
        };
        if notify {
            self.armed = None;
        }
        Pushed::Stored { notify }
    }

    pub fn pop(&mut self) -> Option<(WorkCompletion, Option<Reclaim>)> {
        self.entries.pop_front()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}
