//! Helpers for the unit tests that drive the C API.

use core::ptr;

use crate::abi::*;
use crate::ctx::ibv_open_device;
use crate::exports::{ibv_free_device_list, ibv_get_device_list};
use std::time::{Duration, Instant};

/// Opens softverbs0.
///
/// # Safety
/// Plain C API calls.
pub unsafe fn open() -> *mut ibv_context {
    // SAFETY: the list is NULL-terminated and freed after use.
    unsafe {
        let list = ibv_get_device_list(ptr::null_mut());
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        ctx
    }
}

/// Polls `cq` through the context op until one completion arrives (10 s at most).
///
/// # Safety
/// `ctx` live, `cq` from `ibv_create_cq` on it.
pub unsafe fn poll_one(ctx: *mut ibv_context, cq: *mut ibv_cq) -> ibv_wc {
    let mut wc = ibv_wc::zeroed();
    let end = Instant::now() + Duration::from_secs(10);
    // SAFETY: `ctx` is live; the op polls a live CQ into one wc.
    let poll = unsafe { (*ctx).ops.poll_cq.expect("poll_cq op") };
    loop {
        // SAFETY: as above.
        match unsafe { poll(cq, 1, &mut wc) } {
            1 => return wc,
            0 if Instant::now() < end => std::thread::yield_now(),
            n => panic!("poll_cq returned {n}"),
        }
    }
}
