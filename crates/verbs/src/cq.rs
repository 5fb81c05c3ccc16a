//! Completion queues and completion channels.

use crate::context::Context;
use crate::driver::{ChannelShared, DriverHandle};
use crate::error::ResourceError;
use crate::sys::{self, EventFd};
use softverbs_engine::{CqHandle, WorkCompletion};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct CqInner {
    pub handle: Arc<DriverHandle>,
    pub cq: CqHandle,
    channel: Option<Arc<ChannelShared>>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let mut st = self.handle.0.lock();
        st.channels.remove(&self.cq);
        let _ = st.engine.destroy_cq(self.cq);
    }
}

/// A completion queue. QPs using it keep it alive.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cq").field(&self.inner.cq).finish()
    }
}

impl Cq {
    pub(crate) fn new(
        ctx: &Context,
        cqe: u32,
        channel: Option<&CompletionChannel>,
    ) -> Result<Cq, ResourceError> {
        let mut st = ctx.driver().lock();
        let cq = st.engine.create_cq(cqe)?;
        if let Some(ch) = channel {
            st.channels.insert(cq, Arc::clone(&ch.shared));
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                handle: Arc::clone(&ctx.handle),
                cq,
                channel: channel.map(|c| Arc::clone(&c.shared)),
            }),
        })
    }

    /// Takes up to `out.len()` completions; returns how many. When the CQ is empty
    /// the calling thread receives what waits on the device's socket and looks
    /// again, so a thread spinning on its CQ needs no other thread to run.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        match self.poll_ready(out) {
            0 if self.inner.handle.0.try_progress() => self.poll_ready(out),
            n => n,
        }
    }

    /// Takes up to `out.len()` completions already in the CQ, without receiving what
    /// waits on the socket (`ibv_next_poll`): a completion that arrives later raises its
    /// armed event instead of being consumed here while the event still fires.
    pub fn poll_ready(&self, out: &mut [WorkCompletion]) -> usize {
        self.inner
            .handle
            .0
            .lock()
            .engine
            .poll_cq(self.inner.cq, out)
            .unwrap_or(0)
    }

    /// Arms the CQ: the next completion (only solicited or error ones when
    /// `solicited_only`) raises an event on its completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), ResourceError> {
        if self.inner.channel.is_none() {
            return Err(ResourceError::InvalidArgument(
                "CQ has no completion channel",
            ));
        }
        self.inner
            .handle
            .0
            .lock()
            .engine
            .req_notify_cq(self.inner.cq, solicited_only)
    }

    /// Polls until `n` completions arrived or `timeout` passed (spinning a while,
    /// then polling with short sleeps); returns them.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        let mut batch = [WorkCompletion::default(); 16];
        let mut spins = 0u32;
        while got.len() < n && std::time::Instant::now() < deadline {
            let k = self.poll(&mut batch[..(n - got.len()).min(16)]);
            got.extend_from_slice(&batch[..k]);
            if k == 0 {
                spins += 1;
                if spins < 2000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        got
    }

    /// Whether QPs still use this CQ.
    pub fn in_use(&self) -> bool {
        let inner = &self.inner;
        inner.handle.0.lock().engine.cq_in_use(inner.cq)
    }

    /// The engine handle.
    pub fn handle(&self) -> CqHandle {
        self.inner.cq
    }
}

/// A completion channel: a real, pollable, blocking file descriptor that becomes
/// readable when an armed CQ gets a completion (like `ibv_comp_channel`).
pub struct CompletionChannel {
    pub(crate) shared: Arc<ChannelShared>,
    _handle: Arc<DriverHandle>,
    acked: Mutex<u64>,
}

impl CompletionChannel {
    pub(crate) fn new(ctx: &Context) -> std::io::Result<CompletionChannel> {
        Ok(CompletionChannel {
            shared: Arc::new(ChannelShared {
                fd: EventFd::new(false, true)?,
                fired: Mutex::new(Default::default()),
            }),
            _handle: Arc::clone(&ctx.handle),
            acked: Mutex::new(0),
        })
    }

    /// A channel whose fd does not block (for async readers).
    #[cfg(feature = "tokio")]
    pub(crate) fn new_nonblocking(ctx: &Context) -> std::io::Result<CompletionChannel> {
        Ok(CompletionChannel {
            shared: Arc::new(ChannelShared {
                fd: EventFd::new(true, true)?,
                fired: Mutex::new(Default::default()),
            }),
            _handle: Arc::clone(&ctx.handle),
            acked: Mutex::new(0),
        })
    }

    /// Takes one pending event without blocking (only meaningful on a
    /// non-blocking channel).
    #[cfg(feature = "tokio")]
    pub(crate) fn try_get_event(&self) -> Option<CqHandle> {
        self.shared.fd.take()?;
        self.shared
            .fired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// The file descriptor: readable while an event is pending.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.shared.fd.raw()
    }

    /// Blocks until a CQ of this channel fires; returns its handle.
    pub fn get_event(&self) -> CqHandle {
        loop {
            self.shared.fd.take();
            if let Some(cq) = self
                .shared
                .fired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            {
                return cq;
            }
        }
    }

    /// Waits up to `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Option<CqHandle> {
        let _ = sys::poll_readable(&[self.fd()], Some(timeout));
        let mut fired = self.shared.fired.lock().unwrap_or_else(|e| e.into_inner());
        let cq = fired.pop_front()?;
        drop(fired);
        self.shared.fd.take();
        Some(cq)
    }

    /// Acknowledges `n` events (kept for verbs parity; nothing waits on it).
    pub fn ack_events(&self, n: u64) {
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) += n;
    }
}
