//! An id's life in the connection manager, and the events it delivers.
//!
//! Each id librdmacm creates gets a twin in the connection manager of softverbs'
//! libibverbs.so.1 (`create_id` of the private table), with an [`EventSink`] whose cookie is
//! the id's address. The connection manager calls [`deliver`] for every event; it turns the
//! event into a `struct rdma_cm_event` and queues it on the id's channel, where
//! `rdma_get_cm_event` finds it. For CONNECT_REQUEST it also creates the new id, on the
//! listener's channel, and returns it as the cookie for the new id's own events.
//!
//! When there is no connection manager (a libibverbs.so.1 that is not softverbs') ids still
//! exist, without a twin; the calls that need one fail with `ENOSYS` (see `ibverbs::cm`).

use core::ffi::{c_int, c_void};
use core::ptr;
use std::sync::Arc;

use softverbs_private_abi::{AddrInfo, CmEvent, CmHandle, CmOps, EventSink};
use softverbs_stub_support::Zeroed;

use crate::abi::*;
use crate::errno::Errno;
use crate::event::Event;
use crate::ibverbs::{cm_if_present, cm_ops};
use crate::id::{Id, IDS};
use crate::mcast::GROUPS;

/// Creates the id's twin in the connection manager, if there is one.
pub fn attach(id: &Arc<Id>) -> Result<(), Errno> {
    let Some(ops) = cm_if_present() else {
        return Ok(());
    };
    // SAFETY: plain reads of our own C struct's fields.
    let (ps, qp_type) = unsafe { ((*id.c()).ps, (*id.c()).qp_type) };
    let sink = EventSink {
        deliver,
        cookie: id.c_ptr().cast(),
    };
    let mut handle = 0;
    // SAFETY: a table function called with valid arguments; `handle` is writable.
    let r = unsafe { (ops.create_id)(ps, qp_type, sink, &mut handle) };
    if r < 0 {
        return Err(-r);
    }
    id.set_cm(handle);
    Ok(())
}

/// Destroys the id's twin, if it has one. Afterwards no event for it is delivered.
pub fn forget(id: &Arc<Id>) {
    let handle = id.cm();
    if handle == 0 {
        return;
    }
    if let Some(ops) = cm_if_present() {
        // SAFETY: a table function called with a handle it gave out. Its result is ignored:
        // the id goes away either way, as rdma_destroy_id's does in the kernel.
        let _ = unsafe { (ops.destroy_id)(handle) };
    }
    id.set_cm(0);
}

/// Whether the id's events carry UD parameters (rdma-core's `ucma_is_ud_qp`).
fn is_ud(id: &Id) -> bool {
    // SAFETY: plain read of a field of the id's C struct.
    unsafe { (*id.c()).qp_type == IBV_QPT_UD }
}

/// `ah_attr` from the connection manager's plain address vector.
fn ah_attr(av: &softverbs_private_abi::AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: av.dlid,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: av.static_rate,
        is_global: av.is_global,
        port_num: av.port_num,
    }
}

/// Fills an event's parameters from the connection manager's.
fn fill(event: &mut Event, from: &CmEvent, ud: bool) {
    let data: &[u8] = if from.conn.private_data.is_null() || from.conn.private_data_len == 0 {
        &[]
    } else {
        // SAFETY: the connection manager guarantees the bytes are valid during `deliver`.
        unsafe {
            core::slice::from_raw_parts(from.conn.private_data, from.conn.private_data_len as usize)
        }
    };
    event.set_private_data(data, ud);
    // SAFETY: writes plain fields of the union member the program will read.
    unsafe {
        if ud {
            event.c.param.ud.ah_attr = ah_attr(&from.ud.ah);
            event.c.param.ud.qp_num = from.ud.qp_num;
            event.c.param.ud.qkey = from.ud.qkey;
        } else {
            let conn = &mut event.c.param.conn;
            conn.responder_resources = from.conn.responder_resources;
            conn.initiator_depth = from.conn.initiator_depth;
            conn.flow_control = from.conn.flow_control;
            conn.retry_count = from.conn.retry_count;
            conn.rnr_retry_count = from.conn.rnr_retry_count;
            conn.srq = from.conn.srq;
            conn.qp_num = from.conn.qp_num;
        }
    }
    if matches!(
        from.event as i32,
        RDMA_CM_EVENT_MULTICAST_JOIN | RDMA_CM_EVENT_MULTICAST_ERROR
    ) {
        // The connection manager carries the group record's address (see `mcast`); rdma_cm
        // reports the program's context for the join in place of private data.
        event.group = GROUPS.get(from.mc_context.cast_const());
        event.c.param.ud.private_data = match &event.group {
            Some(g) => g.context.cast_const(),
            None => from.mc_context.cast_const(),
        };
        event.c.param.ud.private_data_len = 0;
    }
}

/// The [`EventSink`] callback (see `softverbs_private_abi`): queues the event on the id's
/// channel. For CONNECT_REQUEST, creates the new id and returns it (NULL refuses).
///
/// # Safety
/// `cookie` is a cookie librdmacm gave the connection manager; `event` is valid for the call.
pub unsafe extern "C" fn deliver(cookie: *mut c_void, event: *const CmEvent) -> *mut c_void {
    let Some(id) = IDS.get(cookie.cast::<rdma_cm_id>()) else {
        return ptr::null_mut();
    };
    // SAFETY: the caller guarantees `event` is valid for the call.
    let from = unsafe { &*event };
    let kind = from.event as i32;
    let mut out = Event::new(&id, kind, from.status);
    let mut child_ptr = ptr::null_mut();
    if kind == RDMA_CM_EVENT_CONNECT_REQUEST {
        // rdma-core's ucma_process_conn_req: the new id takes the listener's channel, context,
        // port space and QP type.
        // SAFETY: plain reads of the listener's C struct.
        let (context, ps, qp_type) =
            unsafe { ((*id.c()).context, (*id.c()).ps, (*id.c()).qp_type) };
        let Ok(child) = Id::create(Some(id.channel()), context, ps, qp_type) else {
            return ptr::null_mut();
        };
        child.set_cm(from.id);
        out.c.id = child.c_ptr();
        out.c.listen_id = id.c_ptr();
        child_ptr = child.c_ptr().cast();
        out.child = Some(child);
    }
    fill(&mut out, from, is_ud(&id));
    id.post(out);
    child_ptr
}

// ---------------------------------------------------------------------------------------------
// Calls into the connection manager
// ---------------------------------------------------------------------------------------------

/// The table and the id's twin in it (`ENOSYS`, said once on stderr, without a connection
/// manager).
pub fn twin(id: &Id) -> Result<(&'static CmOps, CmHandle), Errno> {
    let ops = cm_ops()?;
    match id.cm() {
        0 => Err(libc::ENOSYS),
        h => Ok((ops, h)),
    }
}

/// A table call's result (0 or a negative errno).
pub fn check(r: c_int) -> Result<(), Errno> {
    if r < 0 {
        Err(-r)
    } else {
        Ok(())
    }
}

/// rdma-core's `ucma_query_route`: copies the id's addresses, GIDs and path records from
/// the connection manager into `id->route`, and, the first time the id is on a device,
/// sets `id->verbs`, `id->pd` (the device's shared PD) and `id->port_num`.
pub fn query_route(id: &Arc<Id>) -> Result<(), Errno> {
    let (ops, h) = twin(id)?;
    // SAFETY: all-zero is a valid `AddrInfo` (integers and socket address storage).
    let mut info: AddrInfo = unsafe { core::mem::zeroed() };
    // SAFETY: a table call with a writable out-parameter.
    check(unsafe { (ops.query_addr)(h, &mut info) })?;
    let mut paths = [ibv_sa_path_rec::zeroed(); 1];
    let mut n: c_int = paths.len() as c_int;
    // SAFETY: room for `n` path records in rdma-core's layout.
    check(unsafe { (ops.query_route)(h, paths.as_mut_ptr().cast(), &mut n) })?;
    let n = (n.max(0) as usize).min(paths.len());
    id.set_path_records(&paths[..n])?;
    // SAFETY: plain writes of our own C struct's fields, where rdma-core writes them.
    unsafe {
        let c = &mut *id.c();
        c.route.addr.src.storage = info.src;
        if info.dst.ss_family != 0 {
            c.route.addr.dst.storage = info.dst;
        }
        c.route.addr.addr.ibaddr.sgid = ibv_gid { raw: info.sgid };
        c.route.addr.addr.ibaddr.dgid = ibv_gid { raw: info.dgid };
        c.route.addr.addr.ibaddr.pkey = info.pkey;
    }
    if info.node_guid != 0 && id.device().is_none() {
        let context = crate::devices::context_for(info.node_guid)?;
        let pd = crate::devices::acquire(context)?;
        id.set_device(crate::id::Device(context));
        // SAFETY: as above.
        unsafe {
            let c = &mut *id.c();
            c.verbs = context;
            c.pd = pd;
            c.port_num = info.port_num;
        }
    }
    Ok(())
}

/// Sets `id->qp->state` to the QP's state: the connection manager moves the QPs
/// `rdma_create_qp` made, where rdma-core's librdmacm calls `ibv_modify_qp`, which keeps
/// that field current.
pub fn sync_qp_state(id: &Id) {
    // SAFETY: plain read of our own C struct's field.
    let qp = unsafe { (*id.c()).qp };
    let Ok(verbs) = crate::ibverbs::libibverbs() else {
        return;
    };
    if qp.is_null() {
        return;
    }
    let mut attr = ibv_qp_attr::zeroed();
    let mut init = ibv_qp_init_attr::zeroed();
    // SAFETY: the id's live QP; both out-parameters are whole structs.
    if unsafe { (verbs.query_qp)(qp, &mut attr, IBV_QP_STATE, &mut init) } == 0 {
        // SAFETY: the QP's `state` field, which rdma-core's libibverbs writes likewise.
        unsafe { (*qp).state = attr.qp_state };
    }
}

/// What `rdma_get_cm_event` does with an event it took before handing it out (rdma-core's
/// `rdma_get_cm_event` switch): fills in what programs read, or swallows it.
pub enum Fetched {
    /// Hand it to the program.
    Keep,
    /// Do not: librdmacm completes it and waits for the next.
    Swallow,
}

/// The work rdma-core's librdmacm does when an event is read, in the reader's thread.
pub fn on_fetch(event: &mut Event) -> Fetched {
    let id = Arc::clone(&event.owner);
    match event.c.event {
        RDMA_CM_EVENT_ADDR_RESOLVED => {
            if let Err(e) = query_route(&id) {
                event.c.event = RDMA_CM_EVENT_ADDR_ERROR;
                event.c.status = -e;
            }
        }
        RDMA_CM_EVENT_ROUTE_RESOLVED => {
            if let Err(e) = query_route(&id) {
                event.c.event = RDMA_CM_EVENT_ROUTE_ERROR;
                event.c.status = -e;
            }
        }
        RDMA_CM_EVENT_CONNECT_REQUEST => {
            let Some(child) = event.child.clone() else {
                return Fetched::Swallow;
            };
            // rdma-core's ucma_process_conn_req: a synchronous listener's new ids are
            // synchronous too; then the new id learns its addresses and device.
            let ready = match id.is_sync() {
                true => child.migrate(None),
                false => Ok(()),
            }
            .and_then(|()| query_route(&child));
            if ready.is_err() {
                forget(&child);
                child.destroy();
                return Fetched::Swallow;
            }
            // The program owns the new id from now on.
            event.child = None;
        }
        RDMA_CM_EVENT_CONNECT_ERROR => {
            id.set_connect_error();
            sync_qp_state(&id);
        }
        RDMA_CM_EVENT_REJECTED => {
            if id.connect_error() {
                return Fetched::Swallow;
            }
            sync_qp_state(&id);
        }
        // rdma-core leaves the QP alone here: programs (rping) destroy it with
        // ibv_destroy_qp while another thread still reads events, so `id->qp` may dangle.
        RDMA_CM_EVENT_DISCONNECTED if id.connect_error() => return Fetched::Swallow,
        RDMA_CM_EVENT_ESTABLISHED => sync_qp_state(&id),
        _ => {}
    }
    Fetched::Keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Channel;
    use crate::event::{ack, hand_out};
    use std::sync::mpsc;
    use std::time::Duration;

    fn blank() -> CmEvent {
        // SAFETY: `CmEvent` is plain data (integers and raw pointers): all-zero is valid.
        unsafe { core::mem::zeroed() }
    }

    fn id_on(channel: &Arc<Channel>, context: usize, ps: i32, qp_type: i32) -> Arc<Id> {
        Id::create(
            Some(Arc::clone(channel)),
            context as *mut c_void,
            ps,
            qp_type,
        )
        .unwrap()
    }

    /// Takes the next event as `rdma_get_cm_event` does, without waiting.
    fn get(channel: &Channel) -> *mut rdma_cm_event {
        hand_out(channel.take(|e| e.owner.count_reported()).unwrap())
    }

    fn deliver_to(id: &Arc<Id>, event: &CmEvent) -> *mut c_void {
        // SAFETY: the cookie is a live id; the event lives for the call.
        unsafe { deliver(id.c_ptr().cast(), event) }
    }

    #[test]
    fn a_connect_request_creates_the_new_id_on_the_listeners_channel() {
        let channel = Channel::new(false).unwrap();
        let listener = id_on(&channel, 0x1234, RDMA_PS_TCP, IBV_QPT_RC);
        let data: Vec<u8> = (0..56).collect();
        let mut from = blank();
        from.event = RDMA_CM_EVENT_CONNECT_REQUEST as u32;
        from.id = 77;
        from.conn.private_data = data.as_ptr();
        from.conn.private_data_len = data.len() as u32;
        from.conn.responder_resources = 4;
        from.conn.initiator_depth = 3;
        from.conn.retry_count = 7;
        from.conn.rnr_retry_count = 6;
        from.conn.qp_num = 0x1_2345;
        let cookie = deliver_to(&listener, &from);
        let child = IDS
            .get(cookie.cast::<rdma_cm_id>())
            .expect("new id registered");
        assert_eq!(child.cm(), 77);
        // SAFETY: plain reads of live ids' C structs.
        unsafe {
            let c = &*child.c();
            assert_eq!(c.context as usize, 0x1234, "the listener's context");
            assert_eq!((c.ps, c.qp_type), (RDMA_PS_TCP, IBV_QPT_RC));
            assert_eq!(c.channel, channel.c_ptr());
        }
        let event = get(&channel);
        // SAFETY: a fetched event, not yet acknowledged.
        unsafe {
            let e = &*event;
            assert_eq!(e.event, RDMA_CM_EVENT_CONNECT_REQUEST);
            assert_eq!(e.id, child.c_ptr());
            assert_eq!(e.listen_id, listener.c_ptr());
            let conn = e.param.conn;
            assert_eq!(conn.private_data_len, 56);
            let copied = core::slice::from_raw_parts(conn.private_data.cast::<u8>(), 56);
            assert_eq!(copied, &data[..], "a copy, owned by the event");
            assert_ne!(conn.private_data.cast::<u8>(), data.as_ptr());
            assert_eq!((conn.responder_resources, conn.initiator_depth), (4, 3));
            assert_eq!((conn.retry_count, conn.rnr_retry_count), (7, 6));
            assert_eq!(conn.qp_num, 0x1_2345);
        }
        // Charged to the listener: destroying it waits for this ack, the new id's does not.
        child.destroy();
        assert!(IDS.get(cookie.cast::<rdma_cm_id>()).is_none());
        assert_eq!(ack(event), Ok(()));
        assert_eq!(ack(event), Err(libc::EINVAL), "acknowledged twice");
        listener.destroy();
    }

    #[test]
    fn ud_and_multicast_events_carry_ud_parameters() {
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel, 0, RDMA_PS_UDP, IBV_QPT_UD);
        let mut from = blank();
        from.event = RDMA_CM_EVENT_ESTABLISHED as u32;
        from.ud.qp_num = 0x42;
        from.ud.qkey = RDMA_UDP_QKEY;
        from.ud.ah.dgid = [0xfe; 16];
        from.ud.ah.hop_limit = 64;
        from.ud.ah.is_global = 1;
        from.ud.ah.port_num = 1;
        assert!(deliver_to(&id, &from).is_null());
        let mut join = blank();
        join.event = RDMA_CM_EVENT_MULTICAST_JOIN as u32;
        join.ud.qp_num = 0xFF_FFFF;
        join.mc_context = 0x5151 as *mut c_void;
        deliver_to(&id, &join);
        let (first, second) = (get(&channel), get(&channel));
        // SAFETY: fetched events, not yet acknowledged.
        unsafe {
            let ud = (*first).param.ud;
            assert_eq!((ud.qp_num, ud.qkey), (0x42, RDMA_UDP_QKEY));
            assert_eq!(ud.ah_attr.grh.dgid.raw, [0xfe; 16]);
            assert_eq!((ud.ah_attr.grh.hop_limit, ud.ah_attr.is_global), (64, 1));
            assert_eq!(ud.ah_attr.port_num, 1);
            let ud = (*second).param.ud;
            assert_eq!((*second).event, RDMA_CM_EVENT_MULTICAST_JOIN);
            assert_eq!(ud.qp_num, 0xFF_FFFF);
            assert_eq!(ud.private_data as usize, 0x5151, "the join's context");
        }
        ack(first).unwrap();
        ack(second).unwrap();
        id.destroy();
    }

    #[test]
    fn destroy_drops_queued_events_and_waits_for_acks() {
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel, 0, RDMA_PS_TCP, IBV_QPT_RC);
        let mut from = blank();
        from.event = RDMA_CM_EVENT_ADDR_RESOLVED as u32;
        deliver_to(&id, &from);
        from.event = RDMA_CM_EVENT_ROUTE_RESOLVED as u32;
        deliver_to(&id, &from);
        let fetched = get(&channel) as usize;
        let (tx, rx) = mpsc::channel();
        let destroyer = {
            let id = Arc::clone(&id);
            std::thread::spawn(move || {
                id.destroy();
                tx.send(()).unwrap();
            })
        };
        // It waits for the fetched event's ack...
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        ack(fetched as *mut rdma_cm_event).unwrap();
        // ...and not for the queued one, which it dropped.
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        destroyer.join().unwrap();
        assert!(IDS.get(id.c_ptr()).is_none());
        let mut p = libc::pollfd {
            fd: channel.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(
            unsafe { libc::poll(&mut p, 1, 0) },
            0,
            "nothing left queued"
        );
    }

    #[test]
    fn a_listener_destroyed_with_an_unfetched_request_takes_the_new_id_along() {
        let channel = Channel::new(false).unwrap();
        let listener = id_on(&channel, 0, RDMA_PS_TCP, IBV_QPT_RC);
        let mut from = blank();
        from.event = RDMA_CM_EVENT_CONNECT_REQUEST as u32;
        from.id = 5;
        let child = deliver_to(&listener, &from);
        assert!(IDS.get(child.cast::<rdma_cm_id>()).is_some());
        listener.destroy();
        assert!(IDS.get(child.cast::<rdma_cm_id>()).is_none());
    }

    #[test]
    fn migrate_moves_queued_events_and_pending_new_ids() {
        let old = Channel::new(false).unwrap();
        let new = Channel::new(false).unwrap();
        let listener = id_on(&old, 0, RDMA_PS_TCP, IBV_QPT_RC);
        let other = id_on(&old, 0, RDMA_PS_TCP, IBV_QPT_RC);
        let mut from = blank();
        from.event = RDMA_CM_EVENT_CONNECT_REQUEST as u32;
        let child = deliver_to(&listener, &from);
        from.event = RDMA_CM_EVENT_ADDR_RESOLVED as u32;
        deliver_to(&other, &from);
        listener.migrate(Some(Arc::clone(&new))).unwrap();
        // SAFETY: plain reads of live ids' C structs.
        unsafe {
            assert_eq!((*listener.c()).channel, new.c_ptr());
            let child = IDS.get(child.cast::<rdma_cm_id>()).unwrap();
            assert_eq!((*child.c()).channel, new.c_ptr(), "the new id follows");
        }
        let moved = get(&new);
        let stayed = get(&old);
        // SAFETY: fetched events, not yet acknowledged.
        unsafe {
            assert_eq!((*moved).event, RDMA_CM_EVENT_CONNECT_REQUEST);
            assert_eq!((*stayed).event, RDMA_CM_EVENT_ADDR_RESOLVED);
            // The new id's own events now go to the new channel.
            let child = IDS.get(child.cast::<rdma_cm_id>()).unwrap();
            from.event = RDMA_CM_EVENT_ESTABLISHED as u32;
            deliver_to(&child, &from);
            let established = get(&new);
            assert_eq!((*established).id, child.c_ptr());
            ack(established).unwrap();
            child.destroy();
        }
        ack(moved).unwrap();
        ack(stayed).unwrap();
        // Back to a private channel: the id becomes synchronous.
        listener.migrate(None).unwrap();
        assert!(listener.is_sync());
        assert_eq!(listener.migrate(None), Err(libc::EINVAL));
        listener.destroy();
        other.destroy();
    }

    /// A stand-in connection manager: remembers the sinks it was given, by handle.
    mod fake {
        use super::*;
        use softverbs_private_abi::{CmHandle, CmOps, ConnParam, OPS_SIZE};
        use std::collections::BTreeMap;
        use std::sync::Mutex;

        pub static SINKS: Mutex<BTreeMap<CmHandle, (i32, i32, EventSink)>> =
            Mutex::new(BTreeMap::new());
        static NEXT: Mutex<CmHandle> = Mutex::new(1000);

        unsafe extern "C" fn create_id(
            ps: i32,
            qp_type: i32,
            sink: EventSink,
            id: *mut CmHandle,
        ) -> i32 {
            let mut next = NEXT.lock().unwrap();
            *next += 1;
            SINKS.lock().unwrap().insert(*next, (ps, qp_type, sink));
            // SAFETY: the caller passes a writable handle.
            unsafe { *id = *next };
            0
        }
        unsafe extern "C" fn destroy_id(id: CmHandle) -> i32 {
            match SINKS.lock().unwrap().remove(&id) {
                Some(_) => 0,
                None => -libc::EINVAL,
            }
        }
        unsafe extern "C" fn no_addr(_: CmHandle, _: *const sockaddr, _: socklen_t) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_resolve(
            _: CmHandle,
            _: *const sockaddr,
            _: socklen_t,
            _: *const sockaddr,
            _: socklen_t,
            _: i32,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_int(_: CmHandle, _: i32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_query(_: CmHandle, _: *mut softverbs_private_abi::AddrInfo) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_route(_: CmHandle, _: *mut c_void, _: *mut i32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_set_qp(_: CmHandle, _: u32, _: u8, _: u8) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_conn(_: CmHandle, _: *const ConnParam) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_reject(_: CmHandle, _: *const u8, _: u8, _: u8) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_args(_: CmHandle) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_qp_attr(_: CmHandle, _: *mut c_void, _: *mut i32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_join(
            _: CmHandle,
            _: *const sockaddr,
            _: socklen_t,
            _: u32,
            _: *mut c_void,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_option(
            _: CmHandle,
            _: i32,
            _: i32,
            _: *const c_void,
            _: usize,
        ) -> i32 {
            -libc::ENOSYS
        }

        pub static OPS: CmOps = CmOps {
            abi_version: softverbs_private_abi::ABI_VERSION,
            size: OPS_SIZE as u32,
            create_id,
            destroy_id,
            bind_addr: no_addr,
            resolve_addr: no_resolve,
            resolve_route: no_int,
            query_addr: no_query,
            query_route: no_route,
            set_qp: no_set_qp,
            clear_qp: no_args,
            listen: no_int,
            connect: no_conn,
            accept: no_conn,
            reject: no_reject,
            establish: no_args,
            disconnect: no_args,
            init_qp_attr: no_qp_attr,
            notify: no_int,
            join_multicast: no_join,
            leave_multicast: no_addr,
            set_option: no_option,
            stream: &NO_STREAMS,
        };

        unsafe extern "C" fn no_listen(
            _: *const sockaddr,
            _: u32,
            _: i32,
            _: *mut softverbs_private_abi::SockHandle,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_accept(
            _: u64,
            _: *const softverbs_private_abi::StreamSettings,
            _: u8,
            _: *mut libc::sockaddr_storage,
            _: *mut u64,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_connect(
            _: *const sockaddr,
            _: u32,
            _: *const softverbs_private_abi::StreamSettings,
            _: *mut u64,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_handle(_: u64) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_recv(_: u64, _: *mut u8, _: usize, _: u32) -> isize {
            -(libc::ENOSYS as isize)
        }
        unsafe extern "C" fn no_send(_: u64, _: *const u8, _: usize, _: u8) -> isize {
            -(libc::ENOSYS as isize)
        }
        unsafe extern "C" fn no_shutdown(_: u64, _: i32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_readiness(
            _: u64,
            _: u32,
            _: u8,
            _: *mut u32,
            _: *mut i32,
            _: *mut u32,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_addrs(
            _: u64,
            _: *mut libc::sockaddr_storage,
            _: *mut libc::sockaddr_storage,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_keepalive(_: u64, _: u32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_iomap(
            _: u64,
            _: *mut u8,
            _: usize,
            _: u8,
            _: i64,
            _: *mut i64,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_iounmap(_: u64, _: *mut u8, _: usize) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_iowrite(_: u64, _: *const u8, _: usize, _: u64, _: u8) -> isize {
            -(libc::ENOSYS as isize)
        }

        unsafe extern "C" fn no_bind(
            _: *const libc::sockaddr,
            _: libc::socklen_t,
            _: u8,
            _: u8,
            _: *mut u64,
        ) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_connect_bound(
            _: u64,
            _: *const libc::sockaddr,
            _: libc::socklen_t,
            _: *const softverbs_private_abi::StreamSettings,
            _: *mut u64,
        ) -> i32 {
            -libc::ENOSYS
        }

        unsafe extern "C" fn no_watch(_: u64, _: *mut i32) -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_unwatch() -> i32 {
            -libc::ENOSYS
        }
        unsafe extern "C" fn no_readiness_watched(
            _: u64,
            _: u32,
            _: *mut u32,
            _: *mut i32,
            _: *mut u32,
        ) -> i32 {
            -libc::ENOSYS
        }

        static NO_STREAMS: softverbs_private_abi::StreamOps = softverbs_private_abi::StreamOps {
            size: size_of::<softverbs_private_abi::StreamOps>() as u32,
            listen: no_listen,
            accept: no_accept,
            connect: no_connect,
            close: no_handle,
            recv: no_recv,
            send: no_send,
            shutdown: no_shutdown,
            readiness: no_readiness,
            addrs: no_addrs,
            set_keepalive: no_keepalive,
            iomap: no_iomap,
            iounmap: no_iounmap,
            iowrite: no_iowrite,
            bind: no_bind,
            listen_bound: no_shutdown,
            connect_bound: no_connect_bound,
            watch: no_watch,
            unwatch: no_unwatch,
            readiness_watched: no_readiness_watched,
        };
    }

    #[test]
    fn with_a_connection_manager_ids_get_twins_that_deliver_to_them() {
        let _ = crate::ibverbs::FAKE_CM.set(&fake::OPS);
        let channel = Channel::new(false).unwrap();
        let id = id_on(&channel, 0, RDMA_PS_UDP, IBV_QPT_UD);
        attach(&id).unwrap();
        let handle = id.cm();
        let (ps, qp_type, sink) = fake::SINKS.lock().unwrap()[&handle];
        assert_eq!((ps, qp_type), (RDMA_PS_UDP, IBV_QPT_UD));
        assert_eq!(sink.cookie, id.c_ptr().cast());
        // The connection manager delivers through the sink it was given.
        let mut from = blank();
        from.event = RDMA_CM_EVENT_ADDR_RESOLVED as u32;
        from.id = handle;
        // SAFETY: the sink's own callback and cookie; the event lives for the call.
        unsafe { (sink.deliver)(sink.cookie, &from) };
        let event = get(&channel);
        // SAFETY: a fetched event.
        assert_eq!(
            unsafe { ((*event).event, (*event).id) },
            (RDMA_CM_EVENT_ADDR_RESOLVED, id.c_ptr())
        );
        ack(event).unwrap();
        // Destroying the id destroys its twin.
        forget(&id);
        id.destroy();
        assert!(!fake::SINKS.lock().unwrap().contains_key(&handle));
    }

    #[test]
    fn events_for_unknown_ids_are_ignored() {
        let mut from = blank();
        from.event = RDMA_CM_EVENT_CONNECT_REQUEST as u32;
        let mut not_an_id = 0u64;
        // SAFETY: the cookie is looked up, never dereferenced.
        let r = unsafe { deliver((&raw mut not_an_id).cast(), &from) };
        assert!(r.is_null(), "a request for no listener is refused");
    }
}
