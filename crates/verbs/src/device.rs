//! The device: one engine, one UDP endpoint and one progress thread, shared by every context
//! opened on it, as the contexts of one RNIC share its port.
//!
//! [`DeviceCore`] is the internal handle to a running device. Whoever holds an
//! `Arc<DeviceCore>` keeps the device up: verbs contexts do, and so can other consumers of
//! the same endpoint (the connection manager, which puts its MADs on this device's QP1).
//! The last holder to let go stops it (after a short linger for ACKs a closed QP may owe).
//! Contexts share the engine (so QPNs, GIDs and LIDs), each keeps its own objects, fds and
//! asynchronous events (see `crate::context`).
//!
//! A [`Slot`] remembers the running device of one [`crate::Device`]: opening the device
//! again while it runs joins it. `Device::list()` hands out the process's one slot, so every
//! `ibv_open_device` of `softverbs0` in a process shares one device.

use crate::config::Config;
use crate::driver::{Driver, OpenError, State};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The device was opened by the parent of this process (before a `fork()`): it cannot be
/// used here (see `crate::fork`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the device belongs to the parent process (inherited across fork()); open a new one")]
pub struct Inherited;

/// A running device (see the module documentation).
pub(crate) struct DeviceCore {
    driver: Arc<Driver>,
    /// The fork generation the device was opened in.
    generation: u64,
    /// The configuration it was opened with (a context that joins a running device gets
    /// this one, whatever its own `Device` said).
    config: Config,
}

impl DeviceCore {
    fn open(config: &Config) -> Result<DeviceCore, OpenError> {
        crate::fork::install();
        Ok(DeviceCore {
            driver: Driver::open(config.clone())?,
            generation: crate::fork::generation(),
            config: config.clone(),
        })
    }

    /// The configuration the device runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether the device was inherited from the parent process.
    pub fn inherited(&self) -> bool {
        self.generation != crate::fork::generation()
    }

    /// The driver's immutable parts (address, MTU, limits, counters): safe to read even on
    /// an inherited device, since nothing there is locked.
    pub fn info(&self) -> &Driver {
        &self.driver
    }

    /// The driver, unless the device was inherited.
    pub fn driver(&self) -> Result<&Arc<Driver>, Inherited> {
        if self.inherited() {
            Err(Inherited)
        } else {
            Ok(&self.driver)
        }
    }

    /// Runs `f` on the engine under the device lock, then sends what it produced (after the
    /// lock is released) and delivers completion and asynchronous events.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, Inherited> {
        self.with_pump_if(|st| (f(st), true))
    }

    /// [`DeviceCore::with`] for `f` that says, besides its result, whether it may have
    /// produced anything to send or deliver: when it says no, the engine is not pumped
    /// (a pump and its finish are some 0.3 µs of locks, clock reads and scans, on a
    /// ping-pong's path where its answerer posts a receive WR before its answer).
    pub fn with_pump_if<R>(&self, f: impl FnOnce(&mut State) -> (R, bool)) -> Result<R, Inherited> {
        let d = self.driver()?;
        let (r, deferred) = {
            let mut st = d.lock();
            crate::trace::stamp(crate::trace::Step::PostLocked);
            let (r, produced) = f(&mut st);
            (r, produced.then(|| d.pump(&mut st)))
        };
        crate::trace::stamp(crate::trace::Step::Unlocked);
        if let Some(deferred) = deferred {
            d.finish(deferred);
        }
        Ok(r)
    }

    /// Runs `f` under the device lock for a call that produces nothing to send (queries,
    /// polling a CQ).
    pub fn read<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, Inherited> {
        let d = self.driver()?;
        let mut st = d.lock();
        Ok(f(&mut st))
    }
}

impl Drop for DeviceCore {
    fn drop(&mut self) {
        if self.inherited() {
            // The parent's device: its thread does not exist here and its locks may be
            // held forever. Leave it alone (its sockets were released at the fork).
            return;
        }
        self.driver.close();
    }
}

/// The running device of one [`crate::Device`], if any.
pub(crate) struct Slot(Mutex<Weak<DeviceCore>>);

impl Slot {
    pub const fn new() -> Slot {
        Slot(Mutex::new(Weak::new()))
    }

    fn lock(&self) -> MutexGuard<'_, Weak<DeviceCore>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running device, opened with `config` if none runs (or only an inherited one);
    /// whether it was opened now.
    pub fn get_or_open(&self, config: &Config) -> Result<(Arc<DeviceCore>, bool), OpenError> {
        let mut running = self.lock();
        if let Some(core) = running.upgrade().filter(|c| !c.inherited()) {
            return Ok((core, false));
        }
        let core = Arc::new(DeviceCore::open(config)?);
        *running = Arc::downgrade(&core);
        Ok((core, true))
    }

    /// The running device, if any.
    pub fn running(&self) -> Option<Arc<DeviceCore>> {
        self.lock().upgrade().filter(|c| !c.inherited())
    }
}

/// The slot of this process's `softverbs0`.
pub(crate) static PROCESS_SLOT: Slot = Slot::new();

thread_local! {
    /// The process slot's lock, held by the thread that forks from before the fork until
    /// it returns (in the parent and in the child).
    static HELD_FOR_FORK: RefCell<Option<MutexGuard<'static, Weak<DeviceCore>>>> =
        const { RefCell::new(None) };
}

/// Takes the process slot's lock (atfork "prepare" handler).
pub(crate) fn hold_process_slot() {
    let guard = PROCESS_SLOT.lock();
    HELD_FOR_FORK.with(|h| *h.borrow_mut() = Some(guard));
}

/// Releases it (atfork "parent" and "child" handlers).
pub(crate) fn release_process_slot() {
    HELD_FOR_FORK.with(|h| drop(h.borrow_mut().take()));
}
