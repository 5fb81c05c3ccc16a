//! CM events as an async stream (feature `tokio`): tokio's reactor watches the channel's fd.

use super::{Event, EventChannel};
use futures_core::Stream;
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

/// An event channel's events as a [`Stream`]. It never ends on its own.
pub struct CmEventStream {
    // Declared first so it is deregistered before the channel closes the fd it watches.
    fd: AsyncFd<ChannelFd>,
    channel: EventChannel,
}

impl EventChannel {
    /// The channel's events as an async stream. Must be called within a tokio runtime.
    pub fn stream(&self) -> std::io::Result<CmEventStream> {
        // SAFETY: the fd belongs to the channel, which the stream holds (and drops only
        // after the AsyncFd, by field order), so it stays open and the same.
        let fd = unsafe { AsyncFd::register(ChannelFd(self.fd())) }?;
        Ok(CmEventStream {
            fd,
            channel: self.clone(),
        })
    }
}

impl CmEventStream {
    /// The channel.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }
}

impl Stream for CmEventStream {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        loop {
            if let Some(ev) = this.channel.try_get_event() {
                return Poll::Ready(Some(ev));
            }
            let mut guard = match this.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            match this.channel.try_get_event() {
                Some(ev) => return Poll::Ready(Some(ev)),
                None => guard.clear_ready(),
            }
        }
    }
}
