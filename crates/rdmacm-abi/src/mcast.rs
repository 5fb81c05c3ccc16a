//! Multicast groups an id joined (`rdma_join_multicast`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`), with rdma-core's accounting: MULTICAST_JOIN / MULTICAST_ERROR
//! events are charged to the group as well as to the id, and leaving a group waits until
//! the program acknowledged its events (rdma-core's `struct cma_multicast`).
//!
//! The connection manager is given the group record's address as the join's context, so
//! its events name the group they are for (rdma-core passes the same pointer to the kernel
//! as the join's `uid`); the program's own context comes back in
//! `event->param.ud.private_data`.

use core::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::abi::sockaddr_storage;
use crate::registry::Registry;

/// Groups joined and not yet left, by the address given to the connection manager.
pub static GROUPS: Registry<Group> = Registry::new();

/// One joined group.
pub struct Group {
    /// The address the program joined, as it gave it (`addr_len` bytes are meaningful):
    /// `rdma_leave_multicast` finds the group by comparing those bytes, as rdma-core does.
    pub addr: sockaddr_storage,
    pub addr_len: usize,
    /// `RDMA_MC_JOIN_FLAG_*`
    pub join_flags: u32,
    /// The program's context for the join's events.
    pub context: *mut c_void,
    reported: AtomicU32,
    acked: Mutex<u32>,
    acked_changed: Condvar,
}

// SAFETY: `context` is the program's opaque value, only handed back to it; the rest is plain
// data or synchronised.
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

impl Group {
    /// A new group record, registered.
    pub fn new(
        addr: sockaddr_storage,
        addr_len: usize,
        join_flags: u32,
        context: *mut c_void,
    ) -> Arc<Group> {
        let g = Arc::new(Group {
            addr,
            addr_len,
            join_flags,
            context,
            reported: AtomicU32::new(0),
            acked: Mutex::new(0),
            acked_changed: Condvar::new(),
        });
        GROUPS.insert(&g);
        g
    }

    /// The value the connection manager carries back in the join's events.
    pub fn token(self: &Arc<Group>) -> *mut c_void {
        Arc::as_ptr(self).cast_mut().cast()
    }

    /// Whether it was joined with the address `addr` (its first `len` bytes).
    pub fn is(&self, addr: &[u8]) -> bool {
        // SAFETY: a sockaddr_storage is plain bytes.
        let mine = unsafe {
            core::slice::from_raw_parts((&raw const self.addr).cast::<u8>(), self.addr_len)
        };
        mine == addr
    }

    /// One of its events was handed to the program.
    pub fn count_reported(&self) {
        self.reported.fetch_add(1, Ordering::SeqCst);
    }

    /// One of its events was acknowledged.
    pub fn complete_event(&self) {
        let mut acked = self.acked.lock().unwrap_or_else(|e| e.into_inner());
        *acked += 1;
        self.acked_changed.notify_all();
    }

    /// Waits until every event handed out for it is acknowledged.
    pub fn wait_acked(&self) {
        let reported = self.reported.load(Ordering::SeqCst);
        let mut acked = self.acked.lock().unwrap_or_else(|e| e.into_inner());
        while *acked < reported {
            acked = self
                .acked_changed
                .wait(acked)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Unregisters it: no later event finds it.
    pub fn forget(self: &Arc<Group>) {
        GROUPS.remove(self.token());
    }
}
