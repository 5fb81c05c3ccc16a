//! Writes a device's counter file ([`crate::published`]) on a thread of its own.
//!
//! Writing the file and renaming it over the old one are file-system calls, and they may
//! block: on a file system mounted with `discard` the rename that frees the old file's
//! blocks waits for the disk to discard them (`ext4_free_blocks` -> `blkdev_issue_discard`
//! -> `submit_bio_wait`). Made by the progress thread, that call kept a responder from
//! reading its socket for 0.7 s under load, long enough for the requester's IBTA local ACK
//! timer to expire again and again until it failed with `RETRY_EXC_ERR` on a lossless path
//! (docs/loss-recovery.md, session 7). So the progress thread only hands the latest
//! figures over; this thread writes them, and a slow disk delays `softverbs stat`, never a
//! datagram.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The counter file's writer of one device.
pub(crate) struct Publisher {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    slot: Mutex<Slot>,
    ready: Condvar,
}

/// What the progress thread hands over: the latest figures not written yet (a newer
/// hand-over replaces them), and whether the device closes.
#[derive(Default)]
struct Slot {
    pending: Option<Vec<(String, u64)>>,
    stop: bool,
}

impl Shared {
    /// Tells the writer to end after any write under way.
    fn ask_to_stop(&self) {
        lock(&self.slot).stop = true;
        self.ready.notify_one();
    }
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Publisher {
    /// Starts the writer of `local`'s counter file (it takes no signals, as the progress
    /// thread).
    pub fn start(local: SocketAddr) -> std::io::Result<Publisher> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::default()),
            ready: Condvar::new(),
        });
        let for_thread = Arc::clone(&shared);
        let thread = crate::sys::with_signals_blocked(|| {
            std::thread::Builder::new()
                .name(format!("svstat-{}", local.port()))
                .spawn(move || write_loop(&for_thread, local))
        })?;
        Ok(Publisher {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands the counters over to be written; returns at once (a lock held only to swap
    /// them in, never over a file-system call).
    pub fn offer(&self, lines: &[(&str, u64)]) {
        let owned = lines.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        lock(&self.shared.slot).pending = Some(owned);
        self.shared.ready.notify_one();
    }

    /// Stops the writer and waits for a write under way to end (so that the file the
    /// caller removes next does not come back). Figures not written yet are dropped.
    pub fn stop(&self) {
        self.shared.ask_to_stop();
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Publisher {
    /// A device dropped without closing: the writer ends after any write under way.
    fn drop(&mut self) {
        self.shared.ask_to_stop();
    }
}

fn write_loop(shared: &Shared, local: SocketAddr) {
    loop {
        let lines = {
            let mut slot = lock(&shared.slot);
            while slot.pending.is_none() && !slot.stop {
                slot = shared.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
            }
            if slot.stop {
                return;
            }
            slot.pending.take().unwrap_or_default()
        };
        let borrowed: Vec<(&str, u64)> = lines.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        if let Err(e) = crate::published::publish(local, &borrowed) {
            tracing::debug!(error = %e, "cannot publish counters");
        }
    }
}
