//! The ids a process still holds when it exits are destroyed, as Linux destroys them.
//!
//! On Linux the rdma_cm's state lives in the kernel: when a process exits, its rdma_cm
//! file closes and the kernel destroys every id the process left (`ucma_close`), so an
//! established connection's peer gets a DREQ and sees DISCONNECTED. Programs rely on it
//! without knowing: a client that returns from `main` (or calls `exit`) without
//! `rdma_destroy_id` leaves a server that waits for DISCONNECTED, as rping's does, and
//! that server never learns otherwise (the CM has no keepalive). Here the cm lives in the
//! process and dies with it, so an `atexit` hook, installed when a device first creates an
//! id, destroys what is left ([`softverbs_cm::Cm::destroy_all`]) and waits, bounded, for a
//! DREQ to be answered as `rdma_destroy_id` does. A process killed by a signal runs no
//! hook: its peers still learn nothing (a data transfer's retry timeout is all they get).

use crate::device::DeviceCore;
use crate::driver;
use std::sync::{Arc, Mutex, Once, Weak};

/// The devices whose cm has made an id, each once.
static DEVICES: Mutex<Vec<Weak<DeviceCore>>> = Mutex::new(Vec::new());

/// Notes that `core`'s cm holds ids; installs the exit hook once per process.
pub(crate) fn watch(core: &Arc<DeviceCore>) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments, which
        // catches every panic before returning to libc.
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::warn!("atexit failed: ids left at exit will not be disconnected");
        }
    });
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devices.retain(|d| d.strong_count() > 0);
    if !devices
        .iter()
        .any(|d| std::ptr::eq(d.as_ptr(), Arc::as_ptr(core)))
    {
        devices.push(Arc::downgrade(core));
    }
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(destroy_what_is_left);
}

/// Destroys every id of every watched device (a forked child's inherited devices are left
/// alone: their cm belongs to the parent), then waits while their DREQs linger.
fn destroy_what_is_left() {
    // A thread that exits from inside a device call (a signal handler, a sink that calls
    // `exit`) would wait for its own lock forever.
    if driver::holds_a_device_lock() {
        return;
    }
    let devices: Vec<Arc<DeviceCore>> = {
        let Ok(devices) = DEVICES.try_lock() else {
            return;
        };
        devices
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| !c.inherited())
            .collect()
    };
    let mut left_ids = Vec::new();
    for core in devices {
        let now = super::driver::cm_now(core.info().now());
        let Ok(destroyed) = core.with(|st| st.cm.cm.destroy_all(now)) else {
            continue;
        };
        if destroyed.is_empty() {
            continue;
        }
        tracing::debug!(ids = destroyed.len(), "destroyed the ids left at exit");
        super::forget_destroyed_ids(&core, &destroyed);
        left_ids.push(core);
    }
    // One wait for all: their DREQs went out together.
    for core in &left_ids {
        super::linger(core);
    }
}
