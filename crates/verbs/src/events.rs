//! Event queues behind a file descriptor: the completion channel's CQ events and a context's
//! asynchronous events, with the semantics of the kernel's uverbs event files.
//!
//! - The fd is readable exactly while an event is pending: it is one end of a Unix socket
//!   pair holding one byte while the queue is not empty (written and drained under the
//!   queue's lock), so `poll`/`epoll` on it mean what they mean on rdma-core.
//! - [`EventQueue::get`] waits with a `recv(MSG_PEEK)` on that fd, so it follows the fd's
//!   flags as rdma-core's `read()` does: `EAGAIN` when the application made it `O_NONBLOCK`
//!   and nothing is pending, `EINTR` when a signal interrupts the wait (the kernel restarts
//!   it only for `SA_RESTART` handlers).
//! - Events name their object ([`Source`]). An object is registered while it lives; events
//!   for an object that is not registered are dropped, [`EventQueue::close`] drops those
//!   still pending, so no event is ever delivered for a destroyed object.
//! - Every event handed out is counted against its object, and acknowledged by the
//!   application (`ibv_ack_cq_events`, `ibv_ack_async_event`); [`EventQueue::wait_acked`]
//!   blocks until the counts meet, which is what destroying an object waits for
//!   (ibv_destroy_cq(3), ibv_get_async_event(3)).

use softverbs_engine::{AsyncEvent, CqHandle, QpHandle, SrqHandle};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A completion queue.
    Cq(CqHandle),
    /// A queue pair.
    Qp(QpHandle),
    /// A shared receive queue.
    Srq(SrqHandle),
}

/// An event that may name an object.
pub trait Sourced: Copy {
    /// The object it is about (`None`: the port or device).
    fn source(&self) -> Option<Source>;
}

impl Sourced for CqHandle {
    fn source(&self) -> Option<Source> {
        Some(Source::Cq(*self))
    }
}

impl Sourced for AsyncEvent {
    fn source(&self) -> Option<Source> {
        use AsyncEvent as E;
        match *self {
            E::CqError(h) => Some(Source::Cq(h)),
            E::QpFatal(h)
            | E::QpRequestError(h)
            | E::QpAccessError(h)
            | E::SqDrained(h)
            | E::CommEstablished(h)
            | E::LastWqeReached(h) => Some(Source::Qp(h)),
            E::SrqLimitReached(h) => Some(Source::Srq(h)),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// Per object: events handed out and events acknowledged.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    reported: u64,
    acked: u64,
    /// Closing: new events for it are dropped.
    closed: bool,
}

struct Inner<E> {
    pending: VecDeque<E>,
    sources: HashMap<Source, Counts>,
}

/// A queue of events with a pollable fd (see the module documentation).
pub struct EventQueue<E> {
    inner: Mutex<Inner<E>>,
    acked: Condvar,
    /// The end the application sees and waits on.
    user: OwnedFd,
    /// The end the byte is written to.
    signal: OwnedFd,
    /// Run after an event was pushed, by the thread that pushed it (`Driver::finish`).
    hook: Mutex<Option<EventHook>>,
}

/// What runs when an event was pushed (a completion channel's: a stream announcing what
/// it held back, `sock::stream`). It must not block: the pushing thread may be any
/// thread that drives the device, the progress thread included.
pub type EventHook = std::sync::Arc<dyn Fn() + Send + Sync>;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl<E: Sourced> EventQueue<E> {
    /// An empty queue with a blocking fd (`nonblocking` makes it `O_NONBLOCK`).
    pub fn new(nonblocking: bool) -> io::Result<EventQueue<E>> {
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
        if nonblocking {
            // SAFETY: fcntl on a descriptor we own, no memory arguments.
            cvt(unsafe { libc::fcntl(user.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) })?;
        }
        Ok(EventQueue {
            inner: Mutex::new(Inner {
                pending: VecDeque::new(),
                sources: HashMap::new(),
            }),
            acked: Condvar::new(),
            user,
            signal,
            hook: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<E>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets (or with `None` removes) the hook [`Self::run_hook`] runs.
    pub fn set_hook(&self, hook: Option<EventHook>) {
        *self.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// The hook, if one is set.
    pub fn hook(&self) -> Option<EventHook> {
        self.hook.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The fd the application polls: readable while an event is pending.
    pub fn fd(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    /// Makes the fd readable (called with the lock held, when the queue becomes non-empty).
    fn raise(&self) {
        crate::driver::note_syscall();
        let b = 1u8;
        // SAFETY: sends one byte from a live local; never blocks (at most one byte is ever
        // queued on this pair, see `lower`).
        unsafe {
            libc::send(
                self.signal.as_raw_fd(),
                (&b as *const u8).cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }

    /// Makes the fd unreadable (called with the lock held, when the queue becomes empty).
    fn lower(&self) {
        crate::driver::note_syscall();
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

    /// Starts accepting events about `source`.
    pub fn register(&self, source: Source) {
        self.lock().sources.insert(source, Counts::default());
    }

    /// Queues `event`; dropped (false) when it names an object that is not registered or is
    /// closing.
    pub fn push(&self, event: E) -> bool {
        let mut q = self.lock();
        if let Some(s) = event.source() {
            if q.sources.get(&s).is_none_or(|c| c.closed) {
                return false;
            }
        }
        q.pending.push_back(event);
        if q.pending.len() == 1 {
            self.raise();
        }
        true
    }

    /// Takes the oldest event, counting it against its object.
    fn pop(&self, q: &mut Inner<E>) -> Option<E> {
        let ev = q.pending.pop_front()?;
        if q.pending.is_empty() {
            self.lower();
        }
        if let Some(c) = ev.source().and_then(|s| q.sources.get_mut(&s)) {
            c.reported += 1;
        }
        Some(ev)
    }

    /// The oldest event without waiting.
    pub fn try_get(&self) -> Option<E> {
        let mut q = self.lock();
        self.pop(&mut q)
    }

    /// The oldest event, waiting for one as a `read()` of the fd would: `Err` with the
    /// errno of that wait (`EAGAIN` on an `O_NONBLOCK` fd, `EINTR` on a signal).
    pub fn get(&self) -> io::Result<E> {
        loop {
            if let Some(ev) = self.try_get() {
                return Ok(ev);
            }
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
            if r == 0 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
    }

    /// The oldest event, waiting at most `timeout` (whatever the fd's flags).
    pub fn get_timeout(&self, timeout: Duration) -> Option<E> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_get() {
                return Some(ev);
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut p = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, ms) };
        }
    }

    /// Acknowledges `n` events of `source` handed out earlier.
    pub fn ack(&self, source: Source, n: u64) {
        let mut q = self.lock();
        if let Some(c) = q.sources.get_mut(&source) {
            c.acked = c.acked.saturating_add(n).min(c.reported);
            self.acked.notify_all();
        }
    }

    /// Stops accepting events about `source` and drops those still pending.
    pub fn close(&self, source: Source) {
        let mut q = self.lock();
        if let Some(c) = q.sources.get_mut(&source) {
            c.closed = true;
        }
        let before = q.pending.len();
        q.pending.retain(|e| e.source() != Some(source));
        if before > 0 && q.pending.is_empty() {
            self.lower();
        }
    }

    /// Whether every event of `source` handed out was acknowledged.
    #[cfg(test)]
    pub fn all_acked(&self, source: Source) -> bool {
        self.lock()
            .sources
            .get(&source)
            .is_none_or(|c| c.acked >= c.reported)
    }

    /// Waits until every event of `source` handed out is acknowledged.
    pub fn wait_acked(&self, source: Source) {
        let mut q = self.lock();
        while q.sources.get(&source).is_some_and(|c| c.acked < c.reported) {
            q = self.acked.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Forgets `source` (after [`EventQueue::close`]).
    pub fn unregister(&self, source: Source) {
        self.close(source);
        self.lock().sources.remove(&source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CQ handles `cq(1)`, `cq(2)`, ... (real ones, from an engine).
    fn cq(i: usize) -> CqHandle {
        thread_local! {
            static CQS: Vec<CqHandle> = {
                let addr = "127.0.0.1:4791".parse().unwrap();
                let mut e = softverbs_engine::Engine::new(softverbs_engine::EngineConfig::new(addr));
                (0..4).map(|_| e.create_cq(1).unwrap()).collect()
            };
        }
        CQS.with(|c| c[i])
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn fd_is_readable_exactly_while_events_are_pending() {
        let q = EventQueue::<CqHandle>::new(true).unwrap();
        q.register(cq(1).source().unwrap());
        assert!(!readable(q.fd()));
        let e = q.get().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        assert!(q.push(cq(1)));
        assert!(q.push(cq(1)));
        assert!(readable(q.fd()));
        assert_eq!(q.get().unwrap(), cq(1));
        assert!(readable(q.fd()));
        assert_eq!(q.get().unwrap(), cq(1));
        assert!(!readable(q.fd()));
        // Unregistered objects' events are dropped.
        assert!(!q.push(cq(2)));
        assert!(!readable(q.fd()));
    }

    #[test]
    fn closing_drops_pending_events_and_acks_are_counted() {
        let q = EventQueue::<CqHandle>::new(true).unwrap();
        let (a, b) = (cq(1).source().unwrap(), cq(2).source().unwrap());
        q.register(a);
        q.register(b);
        q.push(cq(1));
        q.push(cq(2));
        q.push(cq(1));
        assert_eq!(q.get().unwrap(), cq(1));
        assert!(!q.all_acked(a));
        q.close(a);
        assert!(!q.push(cq(1)), "closing: no new events");
        assert_eq!(q.get().unwrap(), cq(2));
        assert!(
            !readable(q.fd()),
            "the other pending event of A was dropped"
        );
        q.ack(a, 1);
        assert!(q.all_acked(a));
        q.wait_acked(a);
        q.unregister(a);
        assert!(!q.push(cq(1)));
    }

    #[test]
    fn wait_acked_blocks_until_the_ack() {
        let q = std::sync::Arc::new(EventQueue::<CqHandle>::new(false).unwrap());
        let a = cq(1).source().unwrap();
        q.register(a);
        q.push(cq(1));
        assert_eq!(q.get().unwrap(), cq(1));
        let q2 = std::sync::Arc::clone(&q);
        let acker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            q2.ack(a, 1);
        });
        q.wait_acked(a);
        assert!(q.all_acked(a));
        acker.join().unwrap();
    }
}
