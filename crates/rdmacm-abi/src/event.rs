//! Events: `struct rdma_cm_event` plus what librdmacm keeps with it until the program
//! acknowledges it (`rdma_ack_cm_event`).
//!
//! rdma_cm's accounting (`rdma_cm(7)`, rdma-core's cma.c): every event handed to the program
//! is charged to one id (the listener for CONNECT_REQUEST, else the event's id), and
//! destroying or migrating an id waits until all events charged to it are acknowledged.

use core::ffi::c_int;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use softverbs_stub_support::Zeroed;

use crate::abi::*;
use crate::id::Id;
use crate::mcast::Group;

/// rdma-core's `RDMA_MAX_PRIVATE_DATA`: the room an event has for private data.
pub const MAX_PRIVATE_DATA: usize = 256;

/// An event. `#[repr(C)]` with the C struct first: the `struct rdma_cm_event *` handed to C
/// points to the `Event`.
#[repr(C)]
pub struct Event {
    /// What the program reads.
    pub c: rdma_cm_event,
    /// The bytes `c.param.*.private_data` points to.
    private_data: [u8; MAX_PRIVATE_DATA],
    /// The id this event is charged to.
    pub owner: Arc<Id>,
    /// CONNECT_REQUEST: the new id, destroyed with the event if the program never gets it.
    pub child: Option<Arc<Id>>,
    /// MULTICAST_JOIN / MULTICAST_ERROR: the group, which is charged with the event too.
    pub group: Option<Arc<Group>>,
}

impl Event {
    /// An event of type `event` about `owner` (the event's id), with zero parameters.
    pub fn new(owner: &Arc<Id>, event: c_int, status: c_int) -> Box<Event> {
        let mut c = rdma_cm_event::zeroed();
        c.id = owner.c_ptr();
        c.event = event;
        c.status = status;
        Box::new(Event {
            c,
            private_data: [0; MAX_PRIVATE_DATA],
            owner: Arc::clone(owner),
            child: None,
            group: None,
        })
    }

    /// Copies `data` (at most [`MAX_PRIVATE_DATA`] bytes, and at most 255 as the C length
    /// field is a byte) into the event and points `param.conn` (`param.ud` for UD) at it.
    pub fn set_private_data(&mut self, data: &[u8], ud: bool) {
        let n = data.len().min(MAX_PRIVATE_DATA).min(u8::MAX as usize);
        self.private_data[..n].copy_from_slice(&data[..n]);
        let p = self.private_data.as_ptr().cast();
        // Both union members start with `private_data` and `private_data_len`; write the one
        // the program will read.
        if ud {
            self.c.param.ud.private_data = p;
            self.c.param.ud.private_data_len = n as u8;
        } else {
            self.c.param.conn.private_data = p;
            self.c.param.conn.private_data_len = n as u8;
        }
    }
}

// SAFETY: the raw pointers in the C struct point into the event itself or to ids, which are
// shared between threads by design (`Id` is `Sync`); nothing in an event is tied to a thread.
unsafe impl Send for Event {}

/// A fetched event's address, as a key.
fn key(event: *const rdma_cm_event) -> usize {
    event as usize
}

/// Events handed to the program and not yet acknowledged.
static FETCHED: Mutex<BTreeMap<usize, Box<Event>>> = Mutex::new(BTreeMap::new());

fn fetched() -> std::sync::MutexGuard<'static, BTreeMap<usize, Box<Event>>> {
    FETCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps `event` until the program acknowledges it; returns what the program gets.
pub fn hand_out(mut event: Box<Event>) -> *mut rdma_cm_event {
    let p: *mut rdma_cm_event = &mut event.c;
    fetched().insert(key(p), event);
    p
}

/// `rdma_ack_cm_event`: completes one event of its owner (and group) and frees it; `EINVAL`
/// for NULL or a pointer that is not an unacknowledged event.
pub fn ack(event: *mut rdma_cm_event) -> Result<(), crate::errno::Errno> {
    let event = fetched().remove(&key(event)).ok_or(libc::EINVAL)?;
    event.completed();
    Ok(())
}

impl Event {
    /// Counts the event as handed to the program, for its owner and group (under the lock
    /// of the channel it is taken from).
    pub fn reported(&self) {
        self.owner.count_reported();
        if let Some(g) = &self.group {
            g.count_reported();
        }
    }

    /// Counts it as acknowledged (by the program, or by librdmacm for an event it swallowed
    /// after taking it).
    pub fn completed(&self) {
        if let Some(g) = &self.group {
            g.complete_event();
        }
        self.owner.complete_event();
    }
}
