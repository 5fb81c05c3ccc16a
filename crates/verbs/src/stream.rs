//! Completions as an async stream (feature `tokio`).
//!
//! The stream owns a non-blocking completion channel; tokio's reactor watches
//! its fd. Each `poll_next` drains the CQ; when it is empty the CQ is
//! armed, polled once more (a completion may have landed between the two), and
//! the task sleeps until the channel fires.

use crate::context::Context;
use crate::cq::{CompletionChannel, Cq};
use crate::error::ResourceError;
use futures_core::Stream;
use softverbs_engine::WorkCompletion;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use tokio::io::unix::AsyncFd;

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A CQ's completions as a [`Stream`]. It never ends on its own.
pub struct CompletionStream {
    // Declared first so it is dropped (deregistered) before the channel closes
    // the fd it watches.
    fd: AsyncFd<ChannelFd>,
    cq: Cq,
    channel: CompletionChannel,
    ready: VecDeque<WorkCompletion>,
}

impl CompletionStream {
    /// The CQ (to hand to a QP builder).
    pub fn cq(&self) -> &Cq {
        &self.cq
    }
}

impl Context {
    /// Creates a CQ of `cqe` entries whose completions are read as an async
    /// stream. Must be called within a tokio runtime.
    pub fn create_cq_stream(&self, cqe: u32) -> Result<CompletionStream, ResourceError> {
        let channel =
            CompletionChannel::new_nonblocking(self).map_err(|_| ResourceError::LimitReached)?;
        let cq = self.create_cq(cqe, Some(&channel))?;
        // SAFETY: the fd belongs to `channel`, which the stream owns and drops
        // only after the AsyncFd (field order), so it stays open and the same.
        let fd = unsafe { AsyncFd::register(ChannelFd(channel.fd())) }
            .map_err(|_| ResourceError::LimitReached)?;
        Ok(CompletionStream {
            cq,
            channel,
            fd,
            ready: VecDeque::new(),
        })
    }
}

impl CompletionStream {
    fn drain(&mut self) {
        let mut batch = [WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut batch);
            self.ready.extend(&batch[..n]);
            if n < batch.len() {
                break;
            }
        }
    }
}

impl Stream for CompletionStream {
    type Item = WorkCompletion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<WorkCompletion>> {
        let this = self.get_mut();
        loop {
            if let Some(wc) = this.ready.pop_front() {
                return Poll::Ready(Some(wc));
            }
            this.drain();
            if !this.ready.is_empty() {
                continue;
            }
            if this.cq.req_notify(false).is_err() {
                return Poll::Ready(None);
            }
            this.drain();
            if !this.ready.is_empty() {
                continue;
            }
            let mut guard = match this.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            // Consume (and acknowledge) the events; when none is left the fd would block.
            if this.channel.try_get_event().is_some() {
                this.cq.ack_events(1);
            } else {
                guard.clear_ready();
            }
        }
    }
}
