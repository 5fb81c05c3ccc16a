//! The event channel (`rdma_create_event_channel`): a [`CmEventSink`] that queues events
//! behind a pollable fd. The fd is readable exactly while an event waits (a Unix socket pair
//! holding one byte while the queue is not empty), and waiting follows its `O_NONBLOCK`
//! flag, as a `read()` of librdmacm's channel fd does.

use super::{CmError, CmEvent, CmEventKind, CmEventSink, CmId, ConnectionManager};
use crate::context::Context;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The queue and its fd pair.
pub(super) struct Queue {
    pending: Mutex<VecDeque<CmEvent>>,
    /// The end the application polls.
    user: OwnedFd,
    /// The end the byte is written to.
    signal: OwnedFd,
    /// To destroy the new ids of requests nobody took (see `Drop`).
    cm: ConnectionManager,
}

impl Queue {
    fn new(cm: ConnectionManager) -> io::Result<Queue> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        cvt(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: both are fresh descriptors this queue owns from now on.
        let (user, signal) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Queue {
            pending: Mutex::new(VecDeque::new()),
            user,
            signal,
            cm,
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<CmEvent>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, ev: CmEvent) {
        let mut q = self.lock();
        q.push_back(ev);
        if q.len() == 1 {
            let b = 1u8;
            // SAFETY: sends one byte from a live local; never blocks (at most one byte is
            // queued on the pair at a time).
            unsafe {
                libc::send(
                    self.signal.as_raw_fd(),
                    (&b as *const u8).cast(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
        }
    }

    fn try_pop(&self) -> Option<CmEvent> {
        let mut q = self.lock();
        let ev = q.pop_front()?;
        if q.is_empty() {
            let mut b = 0u8;
            // SAFETY: receives at most one byte into a live local, without blocking.
            unsafe {
                libc::recv(
                    self.user.as_raw_fd(),
                    (&mut b as *mut u8).cast(),
                    1,
                    libc::MSG_DONTWAIT,
                )
            };
        }
        Some(ev)
    }

    /// Waits (as the fd's flags say) until an event may be there.
    fn wait(&self) -> io::Result<()> {
        let mut b = 0u8;
        // SAFETY: peeks at most one byte into a live local; blocks per the fd's flags.
        let r = unsafe {
            libc::recv(
                self.user.as_raw_fd(),
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_PEEK,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait_for(&self, timeout: Duration) {
        let mut p = libc::pollfd {
            fd: self.user.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Requests nobody took: their new ids go with the channel.
        let pending = std::mem::take(&mut *self.lock());
        for ev in pending {
            if ev.kind == CmEventKind::ConnectRequest {
                let _ = self.cm.destroy_id(ev.id);
            }
        }
    }
}

/// The sink of a channel: queues every event; a connect request's new id reports to the
/// same channel (as rdma_cm puts it on the listener's channel). It holds the queue weakly:
/// the device's sink table must not keep a channel (and through it the device) alive; once
/// the application let go of the channel, requests are refused and events dropped.
struct ChannelSink(Weak<Queue>);

impl CmEventSink for ChannelSink {
    fn deliver(&self, event: &CmEvent) -> Option<Arc<dyn CmEventSink>> {
        let queue = self.0.upgrade()?;
        queue.push(event.clone());
        (event.kind == CmEventKind::ConnectRequest)
            .then(|| Arc::new(ChannelSink(Weak::clone(&self.0))) as Arc<dyn CmEventSink>)
    }
}

/// An rdma_cm event channel: where the events of the ids created on it arrive. Its fd
/// ([`EventChannel::fd`]) is readable while an event waits, so it works with `poll`/`epoll`
/// and, behind the `tokio` feature, as a [`futures_core::Stream`] ([`EventChannel::stream`]).
/// Cheap to clone; clones are the same channel.
#[derive(Clone)]
pub struct EventChannel {
    queue: Arc<Queue>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// One event taken from a channel.
pub struct Event {
    inner: CmEvent,
    request: Option<CmId>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Event {
    /// Which event.
    pub fn kind(&self) -> CmEventKind {
        self.inner.kind
    }

    /// Its status (what went wrong, typed).
    pub fn status(&self) -> super::EventStatus {
        self.inner.status
    }

    /// Its parameters (private data, connection parameters, UD address).
    pub fn param(&self) -> &super::EventParam {
        &self.inner.param
    }

    /// The id it is about (for a connect request: the new id).
    pub fn id(&self) -> super::CmIdHandle {
        self.inner.id
    }

    /// The whole event as the connection manager made it.
    pub fn raw(&self) -> &CmEvent {
        &self.inner
    }

    /// For a connect request: the new id, to accept or reject (it reports to this
    /// channel until migrated). `None` for other events or when taken already. A request
    /// never taken is destroyed with the event.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }

    /// The peer's private data (RC or UD events), if the event carries any.
    pub fn private_data(&self) -> &[u8] {
        match &self.inner.param {
            super::EventParam::Conn(c) => &c.private_data,
            super::EventParam::Ud(u) => &u.private_data,
            _ => &[],
        }
    }
}

impl EventChannel {
    /// A channel for ids on `ctx`'s device (`rdma_create_event_channel`). Blocking until
    /// [`EventChannel::set_nonblocking`].
    pub fn new(ctx: &Context) -> Result<EventChannel, CmError> {
        Ok(EventChannel {
            queue: Arc::new(Queue::new(ConnectionManager::new(ctx))?),
        })
    }

    /// The connection manager the channel's ids live in.
    pub fn cm(&self) -> &ConnectionManager {
        &self.queue.cm
    }

    /// The sink that feeds this channel (for ids made through the low level).
    pub fn sink(&self) -> Arc<dyn CmEventSink> {
        Arc::new(ChannelSink(Arc::downgrade(&self.queue)))
    }

    /// The fd: readable while an event waits.
    pub fn fd(&self) -> RawFd {
        self.queue.user.as_raw_fd()
    }

    /// Makes [`EventChannel::get_event`] fail with `EAGAIN` instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let fd = self.fd();
        // SAFETY: fcntl on a descriptor we own, no memory arguments.
        let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
        Ok(())
    }

    fn wrap(&self, ev: CmEvent) -> Event {
        let request = (ev.kind == CmEventKind::ConnectRequest).then(|| CmId::adopt(self, ev.id));
        Event { inner: ev, request }
    }

    /// The next event, without waiting.
    pub fn try_get_event(&self) -> Option<Event> {
        self.queue.try_pop().map(|e| self.wrap(e))
    }

    /// The next event, waiting for one as `rdma_get_cm_event` does (`EAGAIN` on a
    /// non-blocking channel with nothing there, `EINTR` when a signal interrupts).
    pub fn get_event(&self) -> io::Result<Event> {
        loop {
            if let Some(ev) = self.try_get_event() {
                return Ok(ev);
            }
            self.queue.wait()?;
        }
    }

    /// The next event, waiting at most `timeout`.
    pub fn get_event_timeout(&self, timeout: Duration) -> Option<Event> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_get_event() {
                return Some(ev);
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            self.queue.wait_for(left);
        }
    }

    /// Whether two handles are the same channel.
    pub fn same(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.queue, &other.queue)
    }
}
