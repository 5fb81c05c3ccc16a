//! rdma_cm ids: `struct rdma_cm_id` plus librdmacm's bookkeeping, and their life: create,
//! destroy (waiting for acknowledgements), migrate between channels, synchronous ids.
//!
//! The rules are rdma_cm's (`rdma_create_id(3)`, `rdma_destroy_id(3)`, `rdma_migrate_id(3)`,
//! rdma-core 44's cma.c):
//! - an id created without a channel is *synchronous*: it gets a private channel, and the
//!   calls that wait for an event wait on it;
//! - destroying an id drops its events still queued, and waits until every event already
//!   handed to the program for it has been acknowledged (an event for a synchronous id that
//!   the library holds in `id->event` is acknowledged by the destroy itself);
//! - migrating moves the id's queued events to the new channel, and waits likewise.

use core::ffi::{c_int, c_void};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use softverbs_private_abi::CmHandle;
use softverbs_stub_support::Zeroed;

use crate::abi::*;
use crate::channel::Channel;
use crate::errno::Errno;
use crate::event::{ack, Event};
use crate::mcast::Group;
use crate::registry::Registry;

/// Ids handed to C.
pub static IDS: Registry<Id> = Registry::new();
/// Channels handed to C (private channels of synchronous ids included: programs poll them).
pub static CHANNELS: Registry<Channel> = Registry::new();

/// An id. `#[repr(C)]` with the C struct first: the `struct rdma_cm_id *` handed to C points
/// to the `Id`.
#[repr(C)]
pub struct Id {
    /// What the program reads and writes (`id->context`, `id->qp`, ...).
    c: UnsafeCell<rdma_cm_id>,
    state: Mutex<IdState>,
    /// Events charged to this id that were handed to the program; counted under the lock of
    /// the channel they were taken from.
    reported: AtomicU32,
    /// Of those, how many the program acknowledged.
    acked: Mutex<u32>,
    acked_changed: Condvar,
}

// SAFETY: the C struct is shared with C code by design (rdma-core's id is too): librdmacm
// writes its fields only where rdma-core does and reads them as plain data, through the
// `UnsafeCell`. Everything else is behind locks or atomics.
unsafe impl Sync for Id {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for Id {}

/// What librdmacm keeps of an id.
struct IdState {
    /// The channel its events go to (`c.channel` points to it).
    channel: Arc<Channel>,
    /// Created without a channel: `channel` is private to it.
    sync: bool,
    /// The connection manager's id (0: none).
    cm: CmHandle,
    /// ECE options set with `rdma_set_local_ece`, and the peer's.
    local_ece: ibv_ece,
    remote_ece: ibv_ece,
    /// The device context `c.verbs` names, whose shared PD `c.pd` started as: the id holds a
    /// reference to it (rdma-core's `ucma_get_device` / `ucma_put_device`).
    device: Option<Device>,
    /// Setting up the connection failed locally (CONNECT_ERROR was reported): the
    /// REJECTED and DISCONNECTED that may follow are not (rdma-core's `connect_error`).
    connect_error: bool,
    /// `rdma_create_ep` of a passive endpoint: the QP `rdma_get_request` creates for each
    /// request.
    qp_init_attr: Option<ibv_qp_init_attr>,
    /// `rdma_create_ep`: private data (`ai_connect`) put before the program's own in the
    /// next `rdma_connect`.
    connect_data: Vec<u8>,
    /// Groups joined (`rdma_join_multicast`), newest first.
    groups: Vec<Arc<Group>>,
}

/// A device context an id holds.
#[derive(Clone, Copy)]
pub struct Device(pub *mut ibv_context);

/// The QP type rdma_cm gives an id of port space `ps` (rdma-core's `rdma_create_id`; the
/// kernel refuses other port spaces with `EINVAL`).
pub fn qp_type_of(ps: c_int) -> Result<c_int, Errno> {
    match ps {
        RDMA_PS_TCP | RDMA_PS_IB => Ok(IBV_QPT_RC),
        RDMA_PS_UDP | RDMA_PS_IPOIB => Ok(IBV_QPT_UD),
        _ => Err(libc::EINVAL),
    }
}

impl Id {
    /// A new id on `channel` (a new private channel when `None`), registered.
    pub fn create(
        channel: Option<Arc<Channel>>,
        context: *mut c_void,
        ps: c_int,
        qp_type: c_int,
    ) -> Result<Arc<Id>, Errno> {
        let sync = channel.is_none();
        let channel = match channel {
            Some(c) => c,
            None => {
                let c = Channel::new(true)?;
                CHANNELS.insert(&c);
                c
            }
        };
        let mut c = rdma_cm_id::zeroed();
        c.channel = channel.c_ptr();
        c.context = context;
        c.ps = ps;
        c.qp_type = qp_type;
        let id = Arc::new(Id {
            c: UnsafeCell::new(c),
            state: Mutex::new(IdState {
                channel,
                sync,
                cm: 0,
                local_ece: ibv_ece::zeroed(),
                remote_ece: ibv_ece::zeroed(),
                device: None,
                connect_error: false,
                qp_init_attr: None,
                connect_data: Vec::new(),
                groups: Vec::new(),
            }),
            reported: AtomicU32::new(0),
            acked: Mutex::new(0),
            acked_changed: Condvar::new(),
        });
        IDS.insert(&id);
        Ok(id)
    }

    /// The pointer C programs get.
    pub fn c_ptr(self: &Arc<Id>) -> *mut rdma_cm_id {
        Arc::as_ptr(self).cast_mut().cast()
    }

    /// The C struct, for reading and writing its fields.
    ///
    /// # Safety
    /// The caller must not keep the pointer beyond the id's life, and must access fields with
    /// plain reads and writes of plain data (C may write them concurrently, as it may with
    /// rdma-core's ids).
    pub fn c(&self) -> *mut rdma_cm_id {
        self.c.get()
    }

    fn state(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection manager's id for this one (0: none).
    pub fn cm(&self) -> CmHandle {
        self.state().cm
    }

    /// Records the connection manager's id for this one.
    pub fn set_cm(&self, cm: CmHandle) {
        self.state().cm = cm;
    }

    /// The channel its events currently go to.
    pub fn channel(&self) -> Arc<Channel> {
        Arc::clone(&self.state().channel)
    }

    /// Whether it was created without a channel.
    pub fn is_sync(&self) -> bool {
        self.state().sync
    }

    /// Queues an event on the id's current channel (consistent with a concurrent migrate).
    pub fn post(&self, event: Box<Event>) {
        let state = self.state();
        state.channel.post(event);
    }

    /// Counts an event charged to this id as handed to the program. Called under the lock
    /// of the channel it was taken from.
    pub fn count_reported(&self) {
        self.reported.fetch_add(1, Ordering::SeqCst);
    }

    /// One of its events was acknowledged.
    pub fn complete_event(&self) {
        let mut acked = self.acked.lock().unwrap_or_else(|e| e.into_inner());
        *acked += 1;
        self.acked_changed.notify_all();
    }

    /// Waits until `reported` events are acknowledged.
    fn wait_acked(&self, reported: u32) {
        let mut acked = self.acked.lock().unwrap_or_else(|e| e.into_inner());
        while *acked < reported {
            acked = self
                .acked_changed
                .wait(acked)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Acknowledges the event a synchronous id holds in `id->event`, if any.
    fn ack_held_event(&self) {
        // SAFETY: plain read and write of a pointer field of our own C struct.
        let held = unsafe { core::mem::replace(&mut (*self.c()).event, core::ptr::null_mut()) };
        if !held.is_null() {
            // An event the program already acknowledged itself is simply not found.
            let _ = ack(held);
        }
    }

    /// Takes out of the id's channel the events charged to it; returns them and how many
    /// were handed to the program so far.
    fn withdraw_queued(self: &Arc<Id>) -> (Vec<Box<Event>>, u32) {
        let state = self.state();
        let mut queue = state.channel.lock();
        let gone = queue.remove(|e| Arc::ptr_eq(&e.owner, self));
        (gone, self.reported.load(Ordering::SeqCst))
    }

    /// `rdma_destroy_id` once the connection manager has forgotten the id: drops its queued
    /// events, acknowledges a held one, waits for the rest, unregisters it and its private
    /// channel, and lets go of its device and path records (rdma-core's `ucma_free_id`).
    pub fn destroy(self: &Arc<Id>) {
        let (dropped, reported) = self.withdraw_queued();
        discard(dropped);
        self.ack_held_event();
        self.wait_acked(reported);
        IDS.remove(self.c_ptr());
        let (device, groups) = {
            let mut state = self.state();
            if state.sync {
                CHANNELS.remove(state.channel.c_ptr());
            }
            (state.device.take(), core::mem::take(&mut state.groups))
        };
        for group in groups {
            group.forget();
        }
        if let Some(device) = device {
            crate::devices::release(device.0);
        }
        // SAFETY: the id is unregistered: no other librdmacm call reaches its C struct, and
        // the path records were malloc'ed by `set_path_records`.
        unsafe {
            let c = &mut *self.c();
            libc::free(c.route.path_rec.cast());
            c.route.path_rec = core::ptr::null_mut();
            c.route.num_paths = 0;
        }
    }

    /// The device the id holds, if any.
    pub fn device(&self) -> Option<Device> {
        self.state().device
    }

    /// Records the device the id now holds (the caller took the reference).
    pub fn set_device(&self, device: Device) {
        self.state().device = Some(device);
    }

    /// Whether CONNECT_ERROR was reported for the id.
    pub fn connect_error(&self) -> bool {
        self.state().connect_error
    }

    /// Notes that CONNECT_ERROR was reported for the id.
    pub fn set_connect_error(&self) {
        self.state().connect_error = true;
    }

    /// The QP attributes of a passive endpoint (`rdma_create_ep`).
    pub fn qp_init_attr(&self) -> Option<ibv_qp_init_attr> {
        self.state().qp_init_attr
    }

    /// Stores them.
    pub fn set_qp_init_attr(&self, attr: ibv_qp_init_attr) {
        self.state().qp_init_attr = Some(attr);
    }

    /// Takes the private data `rdma_create_ep` stored for the next connect.
    pub fn take_connect_data(&self) -> Vec<u8> {
        core::mem::take(&mut self.state().connect_data)
    }

    /// Stores private data for the next connect.
    pub fn set_connect_data(&self, data: Vec<u8>) {
        self.state().connect_data = data;
    }

    /// Adds a joined group.
    pub fn add_group(&self, group: Arc<Group>) {
        self.state().groups.insert(0, group);
    }

    /// Removes and returns the joined group `which` selects.
    pub fn take_group(&self, which: impl Fn(&Group) -> bool) -> Option<Arc<Group>> {
        let mut state = self.state();
        let i = state.groups.iter().position(|g| which(g))?;
        Some(state.groups.remove(i))
    }

    /// Replaces the path records `route.path_rec` points to (malloc'ed, as programs may
    /// keep reading them, until replaced or the id is destroyed).
    pub fn set_path_records(&self, paths: &[ibv_sa_path_rec]) -> Result<(), Errno> {
        let new = if paths.is_empty() {
            core::ptr::null_mut()
        } else {
            // SAFETY: malloc of `paths.len()` records; checked for NULL.
            let p =
                unsafe { libc::malloc(core::mem::size_of_val(paths)) }.cast::<ibv_sa_path_rec>();
            if p.is_null() {
                return Err(libc::ENOMEM);
            }
            // SAFETY: `p` has room for the records; the regions are distinct.
            unsafe { core::ptr::copy_nonoverlapping(paths.as_ptr(), p, paths.len()) };
            p
        };
        let _state = self.state();
        // SAFETY: our own C struct's fields; the old records came from malloc here.
        unsafe {
            let c = &mut *self.c();
            libc::free(c.route.path_rec.cast());
            c.route.path_rec = new;
            c.route.num_paths = paths.len() as c_int;
        }
        Ok(())
    }

    /// `rdma_migrate_id`: moves the id (and its queued events) to `to`, or to a new private
    /// channel when `None`; waits until the events already handed out are acknowledged.
    pub fn migrate(self: &Arc<Id>, to: Option<Arc<Channel>>) -> Result<(), Errno> {
        let was_sync = self.is_sync();
        if was_sync && to.is_none() {
            return Err(libc::EINVAL);
        }
        let new_sync = to.is_none();
        let to = match to {
            Some(c) => c,
            None => {
                let c = Channel::new(true)?;
                CHANNELS.insert(&c);
                c
            }
        };
        if was_sync {
            self.ack_held_event();
        }
        let reported;
        let mut children = Vec::new();
        {
            let mut state = self.state();
            let from = Arc::clone(&state.channel);
            if !Arc::ptr_eq(&from, &to) {
                // Lock both queues in address order, so two migrations the other way round
                // cannot deadlock.
                let (mut a, mut b) = if Arc::as_ptr(&from) < Arc::as_ptr(&to) {
                    let a = from.lock();
                    (a, to.lock())
                } else {
                    let b = to.lock();
                    (from.lock(), b)
                };
                let (from_q, to_q) = if a.is(&from) {
                    (&mut a, &mut b)
                } else {
                    (&mut b, &mut a)
                };
                for event in from_q.remove(|e| Arc::ptr_eq(&e.owner, self)) {
                    children.extend(event.child.clone());
                    to_q.push(event);
                }
            }
            reported = self.reported.load(Ordering::SeqCst);
            if was_sync {
                CHANNELS.remove(from.c_ptr());
            }
            state.channel = Arc::clone(&to);
            state.sync = new_sync;
            // SAFETY: plain write of a pointer field of our own C struct.
            unsafe { (*self.c()).channel = to.c_ptr() };
        }
        // The new ids of connection requests still queued follow their listener (after the
        // queue locks are released: a child's lock is taken before its channel's).
        for child in children {
            child.migrate(Some(Arc::clone(&to)))?;
        }
        self.wait_acked(reported);
        Ok(())
    }

    /// `rdma_set_local_ece`'s storage.
    pub fn set_local_ece(&self, ece: ibv_ece) {
        self.state().local_ece = ece;
    }

    /// The peer's ECE options (zero until a connection manager reports them).
    pub fn remote_ece(&self) -> ibv_ece {
        self.state().remote_ece
    }
}

/// Drops events the program never got; a CONNECT_REQUEST's new id goes with its event
/// (destroyed in the connection manager too), as the kernel's ucma does.
pub fn discard(events: Vec<Box<Event>>) {
    for event in events {
        if let Some(child) = &event.child {
            crate::cm::forget(child);
            child.destroy();
        }
    }
}
