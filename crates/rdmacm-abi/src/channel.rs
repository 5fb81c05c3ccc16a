//! Event channels: `struct rdma_event_channel { int fd; }` with a queue of events behind it.
//!
//! Programs poll `channel->fd`, read it from other threads, and set `O_NONBLOCK` on it with
//! `fcntl`; `rdma_get_cm_event` then blocks, or fails with `EAGAIN` on an empty channel, and
//! a signal interrupts a blocked call as it would interrupt the read rdma-core makes
//! (`EINTR`, or a restart under `SA_RESTART`). To get exactly the kernel's semantics the fd is
//! one end of a `socketpair`, and the channel keeps one byte in it while events are queued:
//!
//! - posting an event appends it and writes the byte if it is not there (`flagged`);
//! - `take` reads the byte with a plain `recv` on the program's fd, so blocking, `O_NONBLOCK`
//!   and signals behave as the kernel makes them; then, under the lock, it pops an event and
//!   puts the byte back if more remain;
//! - removing events (an id destroyed or migrated) takes the byte back with
//!   `recv(MSG_DONTWAIT)` when the queue empties. If a reader already holds it, that reader
//!   finds the queue empty and waits again.
//!
//! So the fd is readable exactly while events are queued, and no thread ever blocks while
//! holding the lock.

use core::ffi::c_void;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::abi::rdma_event_channel;
use crate::errno::{errno, Errno};
use crate::event::Event;

/// An event channel. `#[repr(C)]` with the C struct first: a `struct rdma_event_channel *`
/// handed to C is a pointer to the `Channel`.
#[repr(C)]
pub struct Channel {
    /// What C reads (`channel->fd`).
    c: UnsafeCell<rdma_event_channel>,
    /// The program's end of the socketpair (`c.fd`).
    rx: OwnedFd,
    /// librdmacm's end: the byte is written here.
    tx: OwnedFd,
    /// Private to one synchronous id (created by `rdma_create_id` with no channel): the
    /// program may poll it but not destroy it.
    pub private: bool,
    queue: Mutex<Queue>,
}

// SAFETY: `c` is written only at construction; afterwards C and Rust only read it. Everything
// else is behind the mutex or is an fd.
unsafe impl Sync for Channel {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for Channel {}

/// The events of a channel and whether the byte is in (or being taken from) the socket.
pub struct Queue {
    events: VecDeque<Box<Event>>,
    flagged: bool,
}

impl Channel {
    /// A new, empty channel with a blocking fd.
    pub fn new(private: bool) -> Result<Arc<Channel>, Errno> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(errno());
        }
        // SAFETY: socketpair returned two new descriptors that nothing else owns.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Arc::new(Channel {
            c: UnsafeCell::new(rdma_event_channel { fd: fds[0] }),
            rx,
            tx,
            private,
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
                flagged: false,
            }),
        }))
    }

    /// The pointer C programs get.
    pub fn c_ptr(self: &Arc<Channel>) -> *mut rdma_event_channel {
        Arc::as_ptr(self).cast_mut().cast()
    }

    /// The program's fd.
    pub fn fd(&self) -> i32 {
        self.rx.as_raw_fd()
    }

    /// Locks the queue.
    pub fn lock(&self) -> Locked<'_> {
        Locked {
            channel: self,
            queue: self.queue.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Appends an event, making the fd readable.
    pub fn post(&self, event: Box<Event>) {
        self.lock().push(event);
    }

    /// Waits for an event as the program's fd allows (blocking, or `EAGAIN` with
    /// `O_NONBLOCK`; `EINTR` when a signal interrupts a blocked wait) and takes it. `taken` runs
    /// under the queue lock, so the event is accounted for atomically with its removal.
    pub fn take(&self, taken: impl Fn(&Event)) -> Result<Box<Event>, Errno> {
        loop {
            let mut byte = 0u8;
            // SAFETY: reads at most one byte into `byte` from our own socket.
            let n = unsafe { libc::recv(self.fd(), (&raw mut byte).cast::<c_void>(), 1, 0) };
            if n < 0 {
                return Err(errno());
            }
            if n == 0 {
                // The other end is ours and stays open; never reached.
                return Err(libc::EIO);
            }
            if let Some(event) = self.claim(&taken) {
                return Ok(event);
            }
            // Its event was removed (id destroyed or migrated) after the byte was read.
        }
    }

    /// What `take` does once it has read the byte: pops the first event, if there still is
    /// one, and puts the byte back when more remain.
    fn claim(&self, taken: &impl Fn(&Event)) -> Option<Box<Event>> {
        let mut q = self.lock();
        q.queue.flagged = false;
        let event = q.queue.events.pop_front()?;
        taken(&event);
        if !q.queue.events.is_empty() {
            q.flag();
        }
        Some(event)
    }
}

/// A channel with its queue locked.
pub struct Locked<'a> {
    channel: &'a Channel,
    queue: MutexGuard<'a, Queue>,
}

impl Locked<'_> {
    /// Puts the byte in the socket unless it is there.
    fn flag(&mut self) {
        if !self.queue.flagged {
            let byte = 1u8;
            // SAFETY: writes one byte from `byte` to our own socket. At most one byte is ever
            // unread in it, so the send cannot block or fail for space.
            let n = unsafe {
                libc::send(
                    self.channel.tx.as_raw_fd(),
                    (&raw const byte).cast::<c_void>(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            debug_assert_eq!(n, 1, "send to the channel's own socket");
            self.queue.flagged = true;
        }
    }

    /// Takes the byte back when the queue is empty (see the module documentation).
    fn unflag_if_empty(&mut self) {
        if self.queue.events.is_empty() && self.queue.flagged {
            let mut byte = 0u8;
            // SAFETY: reads at most one byte into `byte`, without blocking.
            let n = unsafe {
                libc::recv(
                    self.channel.fd(),
                    (&raw mut byte).cast::<c_void>(),
                    1,
                    libc::MSG_DONTWAIT,
                )
            };
            // Not there: a reader holds it and will find the queue empty.
            if n == 1 {
                self.queue.flagged = false;
            }
        }
    }

    /// Appends an event.
    pub fn push(&mut self, event: Box<Event>) {
        self.queue.events.push_back(event);
        self.flag();
    }

    /// Removes and returns the queued events `which` selects, in order.
    pub fn remove(&mut self, which: impl Fn(&Event) -> bool) -> Vec<Box<Event>> {
        let (gone, kept): (Vec<_>, Vec<_>) = self.queue.events.drain(..).partition(|e| which(e));
        self.queue.events = kept.into();
        self.unflag_if_empty();
        gone
    }

    /// Whether this locks `channel`.
    pub fn is(&self, channel: &Channel) -> bool {
        core::ptr::eq(self.channel, channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Id;
    use std::sync::mpsc;
    use std::time::Duration;

    fn readable(channel: &Channel) -> bool {
        let mut p = libc::pollfd {
            fd: channel.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn set_nonblocking(channel: &Channel, on: bool) {
        // SAFETY: fcntl on our own fd.
        unsafe {
            let flags = libc::fcntl(channel.fd(), libc::F_GETFL);
            let flags = if on {
                flags | libc::O_NONBLOCK
            } else {
                flags & !libc::O_NONBLOCK
            };
            libc::fcntl(channel.fd(), libc::F_SETFL, flags);
        }
    }

    fn id_on(channel: &Arc<Channel>) -> Arc<Id> {
        Id::create(Some(Arc::clone(channel)), core::ptr::null_mut(), 0x0106, 2).unwrap()
    }

    #[test]
    fn readable_exactly_while_events_are_queued() {
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel);
        assert!(!readable(&channel));
        for kind in [1, 2, 3] {
            channel.post(Event::new(&id, kind, 0));
            assert!(readable(&channel));
        }
        for kind in [1, 2, 3] {
            assert!(readable(&channel));
            let event = channel.take(|_| {}).unwrap();
            assert_eq!(event.c.event, kind, "in order");
        }
        assert!(!readable(&channel));
        set_nonblocking(&channel, true);
        assert_eq!(channel.take(|_| {}).err(), Some(libc::EAGAIN));
        id.destroy();
    }

    #[test]
    fn a_blocked_take_wakes_for_an_event_posted_later() {
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel);
        let (tx, rx) = mpsc::channel();
        let reader = {
            let channel = Arc::clone(&channel);
            std::thread::spawn(move || {
                let event = channel.take(|_| {}).unwrap();
                tx.send(event.c.event).unwrap();
            })
        };
        // Still waiting while nothing is queued.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        channel.post(Event::new(&id, 9, 0));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 9);
        reader.join().unwrap();
        assert!(!readable(&channel));
        id.destroy();
    }

    #[test]
    fn removing_the_last_event_makes_the_fd_unreadable() {
        let channel = Channel::new(false).unwrap();
        let a = id_on(&channel);
        let b = id_on(&channel);
        channel.post(Event::new(&a, 1, 0));
        channel.post(Event::new(&b, 2, 0));
        let gone = channel.lock().remove(|e| Arc::ptr_eq(&e.owner, &a));
        assert_eq!(gone.len(), 1);
        assert!(readable(&channel), "b's event is still queued");
        let gone = channel.lock().remove(|e| Arc::ptr_eq(&e.owner, &b));
        assert_eq!(gone.len(), 1);
        assert!(!readable(&channel));
        set_nonblocking(&channel, true);
        assert_eq!(channel.take(|_| {}).err(), Some(libc::EAGAIN));
        a.destroy();
        b.destroy();
    }

    /// Reads the byte as `take` does first.
    fn read_byte(channel: &Channel) {
        let mut byte = 0u8;
        // SAFETY: reads one byte from our own socket into `byte`.
        let n = unsafe { libc::recv(channel.fd(), (&raw mut byte).cast(), 1, 0) };
        assert_eq!(n, 1);
    }

    #[test]
    fn a_reader_whose_event_was_removed_gets_the_next_one() {
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel);
        // A reader read the byte for event 1; the event is removed before it locks the queue,
        // and event 2 arrives: the reader gets event 2, and the fd is unreadable after.
        channel.post(Event::new(&id, 1, 0));
        read_byte(&channel);
        assert_eq!(channel.lock().remove(|_| true).len(), 1);
        channel.post(Event::new(&id, 2, 0));
        assert_eq!(channel.claim(&|_| {}).unwrap().c.event, 2);
        assert!(!readable(&channel));
        // Same, but nothing arrives before it locks: it finds nothing and waits again; the
        // next event makes the fd readable.
        channel.post(Event::new(&id, 3, 0));
        read_byte(&channel);
        assert_eq!(channel.lock().remove(|_| true).len(), 1);
        assert!(channel.claim(&|_| {}).is_none());
        assert!(!readable(&channel));
        channel.post(Event::new(&id, 4, 0));
        assert!(readable(&channel));
        assert_eq!(channel.take(|_| {}).unwrap().c.event, 4);
        assert!(!readable(&channel));
        id.destroy();
    }
}
