//! The private interface between softverbs' two drop-in libraries: what `libibverbs.so.1`
//! (crate `softverbs-ibverbs-abi`, which holds the process's one device and its connection
//! manager) offers `librdmacm.so.1` (crate `softverbs-rdmacm-abi`, the rdma_cm C ABI).
//!
//! This crate holds only `#[repr(C)]` types and constants, no code, so both libraries compile
//! against one definition while neither links the other's Rust code. Why the split, and the
//! rules every side follows, are in `docs/c-programs.md` ("How librdmacm reaches the device").
//!
//! # The entry point
//!
//! `libibverbs.so.1` exports one function at a private version node:
//!
//! ```c
//! /* softverbs_private_cm@@SOFTVERBS_PRIVATE_1 */
//! const struct softverbs_cm_ops *softverbs_private_cm(uint32_t abi_version);
//! ```
//!
//! It returns the table ([`CmOps`]) when it implements `abi_version` ([`ABI_VERSION`]), NULL
//! otherwise. `librdmacm.so.1` finds it with `dlvsym(handle, ENTRY_SYMBOL, VERSION_NODE)` on
//! the `libibverbs.so.1` it depends on; rdma-core's libibverbs has no such symbol, so that
//! lookup is what tells the two apart.
//!
//! # Conventions
//!
//! - Every table function returns 0 or a negative errno value (the kernel's convention, not
//!   `errno`), except where it says otherwise.
//! - A cm id is a [`CmHandle`]: nonzero, never reused while the id exists.
//! - Pointers passed down are borrowed for the call only; pointers in a delivered
//!   [`CmEvent`] are valid only while `deliver` runs (the receiver copies what it keeps).
//! - Public C structs the two libraries both mirror (`struct sockaddr`,
//!   `struct ibv_qp_attr`, `struct ibv_sa_path_rec`) cross as pointers to those structs, in
//!   rdma-core 44's layout; everything else is defined here.

#![no_std]

use core::ffi::{c_int, c_void, CStr};

pub use libc::{sockaddr, sockaddr_storage, socklen_t};

/// Name of the entry point `libibverbs.so.1` exports.
pub const ENTRY_SYMBOL: &CStr = c"softverbs_private_cm";

/// The version node the entry point is exported at (`softverbs_private_cm@@SOFTVERBS_PRIVATE_1`).
/// A new node is added only if the entry point's own signature changes; the table evolves
/// through [`ABI_VERSION`] and [`CmOps::size`].
pub const VERSION_NODE: &CStr = c"SOFTVERBS_PRIVATE_1";

/// The table version this crate describes. Changed whenever a field of [`CmOps`], [`CmEvent`]
/// or their parts changes meaning or place; fields appended at the end of [`CmOps`] keep it
/// and are detected through [`CmOps::size`].
///
/// Version 2 added [`CmOps::stream`] (stream rsockets).
pub const ABI_VERSION: u32 = 2;

/// `softverbs_private_cm`: the table for `abi_version`, or NULL when not implemented.
pub type EntryFn = unsafe extern "C" fn(abi_version: u32) -> *const CmOps;

/// A cm id inside the connection manager (0: none).
pub type CmHandle = u64;

/// Where the connection manager delivers an id's events.
///
/// `deliver(cookie, event)` runs on the device's progress thread, or on the thread of the
/// table call that caused the event. It must not block and must not call the table. For
/// `RDMA_CM_EVENT_CONNECT_REQUEST` it returns the cookie the new id's events are delivered to
/// from then on; NULL refuses the request (the CM rejects it and destroys the new id). Its
/// return value is ignored for every other event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventSink {
    /// The callback.
    pub deliver: unsafe extern "C" fn(cookie: *mut c_void, event: *const CmEvent) -> *mut c_void,
    /// Passed back to `deliver` unchanged (librdmacm: its id).
    pub cookie: *mut c_void,
}

// SAFETY: the cookie is an opaque value the connection manager only passes back to `deliver`;
// the receiver of the callback is responsible for what it points to, from any thread.
unsafe impl Send for EventSink {}
// SAFETY: as above; the sink is never mutated through a shared reference.
unsafe impl Sync for EventSink {}

/// Connection parameters, both ways: what `rdma_connect`/`rdma_accept` pass down, and what
/// an event reports (already in the receiver's view: responder resources and initiator depth
/// swapped, as rdma_cm reports them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConnParam {
    /// Private data (the caller's bytes; in events the whole field the message carries).
    pub private_data: *const u8,
    /// Its length in bytes.
    pub private_data_len: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// Nonzero when the QP uses a shared receive queue.
    pub srq: u8,
    /// The QP number. Down: the QP to connect when the id has none tied to it (an
    /// application's own QP, `conn_param->qp_num`); up: the peer's.
    pub qp_num: u32,
}

/// A UD destination as `struct ibv_ah_attr` describes it, in plain fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AddressVector {
    /// Destination GID.
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub dlid: u16,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub static_rate: u8,
    /// Nonzero: a GRH is used (always so on RoCE).
    pub is_global: u8,
    pub port_num: u8,
}

/// UD parameters of an event (ESTABLISHED after SIDR, MULTICAST_JOIN).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UdParam {
    /// Peer QPN (0xFFFFFF for multicast).
    pub qp_num: u32,
    pub qkey: u32,
    /// How to reach the peer or group.
    pub ah: AddressVector,
}

/// One event, as `deliver` receives it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CmEvent {
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// 0; a negative errno (e.g. -ETIMEDOUT); the REJ reason for REJECTED; the SIDR status
    /// for UNREACHABLE.
    pub status: i32,
    /// The id the event is about: for CONNECT_REQUEST the new id (delivered to the listener's
    /// sink), otherwise the id whose sink is called.
    pub id: CmHandle,
    /// RC events: the connection parameters (and private data).
    pub conn: ConnParam,
    /// UD events: where the peer or group is.
    pub ud: UdParam,
    /// MULTICAST_JOIN / MULTICAST_ERROR: the `context` given to `join_multicast`.
    pub mc_context: *mut c_void,
}

/// The addresses of an id (ADDR_RESOLVED, CONNECT_REQUEST, after bind).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AddrInfo {
    /// Local address and port.
    pub src: sockaddr_storage,
    /// Peer address and port (zero family when none).
    pub dst: sockaddr_storage,
    /// Local and peer GID.
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    /// P_Key, network order.
    pub pkey: u16,
    /// The port of the device the id is on (1).
    pub port_num: u8,
    /// Node GUID of that device, network order, as `ibv_get_device_guid` returns it: which
    /// entry of `ibv_get_device_list` the id's `verbs` context is for.
    pub node_guid: u64,
}

/// The connection manager's operations. Each returns 0 or a negative errno.
#[repr(C)]
pub struct CmOps {
    /// [`ABI_VERSION`] of the library that built the table.
    pub abi_version: u32,
    /// `size_of::<CmOps>()` there: a field lies wholly below it or must not be used.
    pub size: u32,
    /// Creates an id (`ps`: `enum rdma_port_space`, `qp_type`: `enum ibv_qp_type`) whose
    /// events go to `sink`; stores its handle in `*id`. Brings the process's device up.
    pub create_id: unsafe extern "C" fn(
        ps: c_int,
        qp_type: c_int,
        sink: EventSink,
        id: *mut CmHandle,
    ) -> c_int,
    /// Destroys an id. When it returns, no `deliver` for the id runs or will start.
    pub destroy_id: unsafe extern "C" fn(id: CmHandle) -> c_int,
    /// `rdma_bind_addr`.
    pub bind_addr:
        unsafe extern "C" fn(id: CmHandle, addr: *const sockaddr, len: socklen_t) -> c_int,
    /// `rdma_resolve_addr` (`src` may be NULL): ADDR_RESOLVED or ADDR_ERROR follows.
    pub resolve_addr: unsafe extern "C" fn(
        id: CmHandle,
        src: *const sockaddr,
        src_len: socklen_t,
        dst: *const sockaddr,
        dst_len: socklen_t,
        timeout_ms: c_int,
    ) -> c_int,
    /// `rdma_resolve_route`: ROUTE_RESOLVED or ROUTE_ERROR follows.
    pub resolve_route: unsafe extern "C" fn(id: CmHandle, timeout_ms: c_int) -> c_int,
    /// Fills `*out` with the id's addresses.
    pub query_addr: unsafe extern "C" fn(id: CmHandle, out: *mut AddrInfo) -> c_int,
    /// Writes up to `*num_paths` path records (`struct ibv_sa_path_rec`, rdma-core 44 layout)
    /// to `paths` and stores how many the id has in `*num_paths`.
    pub query_route:
        unsafe extern "C" fn(id: CmHandle, paths: *mut c_void, num_paths: *mut c_int) -> c_int,
    /// Ties QP `qp_num` to the id (`rdma_create_qp`, after librdmacm created the QP through
    /// the public verbs). With `managed` nonzero the connection manager drives the QP's
    /// state as librdmacm does (INIT now, and for UD RTR and RTS; RTR and RTS on connect
    /// and accept; ERR on disconnect and reject), its driver applying each transition to
    /// the QP inside libibverbs. `srq` is nonzero when the QP receives from an SRQ.
    pub set_qp: unsafe extern "C" fn(id: CmHandle, qp_num: u32, srq: u8, managed: u8) -> c_int,
    /// Unties the id's QP (`rdma_destroy_qp`, before librdmacm destroys it).
    pub clear_qp: unsafe extern "C" fn(id: CmHandle) -> c_int,
    /// `rdma_listen`.
    pub listen: unsafe extern "C" fn(id: CmHandle, backlog: c_int) -> c_int,
    /// `rdma_connect` (REQ, or SIDR_REQ for UD ids).
    pub connect: unsafe extern "C" fn(id: CmHandle, param: *const ConnParam) -> c_int,
    /// `rdma_accept` (REP, or SIDR_REP for UD ids).
    pub accept: unsafe extern "C" fn(id: CmHandle, param: *const ConnParam) -> c_int,
    /// `rdma_reject` / `rdma_reject_ece` with the IB CM reason.
    pub reject: unsafe extern "C" fn(id: CmHandle, data: *const u8, len: u8, reason: u8) -> c_int,
    /// `rdma_establish`: the RTU after CONNECT_RESPONSE.
    pub establish: unsafe extern "C" fn(id: CmHandle) -> c_int,
    /// `rdma_disconnect` (DREQ, or DREP when a DREQ was received).
    pub disconnect: unsafe extern "C" fn(id: CmHandle) -> c_int,
    /// `rdma_init_qp_attr`: fills `*attr` (`struct ibv_qp_attr`, rdma-core 44 layout) and
    /// `*mask` for moving the id's QP to `attr->qp_state`.
    pub init_qp_attr:
        unsafe extern "C" fn(id: CmHandle, attr: *mut c_void, mask: *mut c_int) -> c_int,
    /// `rdma_notify`.
    pub notify: unsafe extern "C" fn(id: CmHandle, event: c_int) -> c_int,
    /// `rdma_join_multicast_ex`: MULTICAST_JOIN or MULTICAST_ERROR follows, carrying
    /// `context`.
    pub join_multicast: unsafe extern "C" fn(
        id: CmHandle,
        addr: *const sockaddr,
        len: socklen_t,
        join_flags: u32,
        context: *mut c_void,
    ) -> c_int,
    /// `rdma_leave_multicast`.
    pub leave_multicast:
        unsafe extern "C" fn(id: CmHandle, addr: *const sockaddr, len: socklen_t) -> c_int,
    /// `rdma_set_option` (RDMA_OPTION_ID_TOS, _REUSEADDR, _AFONLY, _ACK_TIMEOUT;
    /// RDMA_OPTION_IB_PATH).
    pub set_option: unsafe extern "C" fn(
        id: CmHandle,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: usize,
    ) -> c_int,
    /// Stream rsockets on the process's device (version 2).
    pub stream: &'static StreamOps,
}

/// A stream rsocket inside `libibverbs.so.1`: a listener or a connection (0: none).
pub type SockHandle = u64;

/// What a stream rsocket is set up with (`rsetsockopt` before it connects or listens);
/// 0 in a field: rsocket.c's default.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamSettings {
    /// Send and receive queue entries (`RDMA_SQSIZE`, `RDMA_RQSIZE`).
    pub sq_size: u32,
    pub rq_size: u32,
    /// Bytes a write posts inline (`RDMA_INLINE`).
    pub inline_size: u32,
    /// iomap slots offered to the peer (`RDMA_IOMAPSIZE`).
    pub iomap_size: u32,
    /// Send and receive ring bytes (twice `SO_SNDBUF` / `SO_RCVBUF`).
    pub sbuf_size: u32,
    pub rbuf_size: u32,
}

/// `readiness` bits (as `poll`'s).
pub const READY_IN: u32 = 1;
/// A data write can start.
pub const READY_OUT: u32 = 2;
/// The connection ended in order.
pub const READY_HUP: u32 = 4;
/// The connection failed.
pub const READY_ERR: u32 = 8;

/// `recv` flag: block until something arrives (else `-EAGAIN`).
pub const IO_BLOCK: u32 = 1;
/// `recv` flag: leave the bytes to be read again (`MSG_PEEK`).
pub const IO_PEEK: u32 = 2;

/// Stream rsockets, on the `softverbs::sock` streams of `libibverbs.so.1`. Functions
/// returning `c_int` return 0 or a negative errno; `isize` ones a count or a negative errno.
#[repr(C)]
pub struct StreamOps {
    /// `size_of::<StreamOps>()` in the library that built the table.
    pub size: u32,
    /// Listens at `addr` (port 0: ephemeral).
    pub listen: unsafe extern "C" fn(
        addr: *const sockaddr,
        len: socklen_t,
        backlog: c_int,
        out: *mut SockHandle,
    ) -> c_int,
    /// Accepts one connection request with `settings`; `-EAGAIN` at once when none waits
    /// and `block` is 0. The peer's address goes to `*peer`.
    pub accept: unsafe extern "C" fn(
        listener: SockHandle,
        settings: *const StreamSettings,
        block: u8,
        peer: *mut sockaddr_storage,
        out: *mut SockHandle,
    ) -> c_int,
    /// Connects to `addr`, blocking until established, refused (`-ECONNREFUSED`) or timed
    /// out (`-ETIMEDOUT`).
    pub connect: unsafe extern "C" fn(
        addr: *const sockaddr,
        len: socklen_t,
        settings: *const StreamSettings,
        out: *mut SockHandle,
    ) -> c_int,
    /// Closes a listener or connection (a connection shuts down and lingers for its last
    /// writes first).
    pub close: unsafe extern "C" fn(sock: SockHandle) -> c_int,
    /// Reads up to `len` bytes (`IO_*` flags); 0 at end of stream.
    pub recv: unsafe extern "C" fn(sock: SockHandle, buf: *mut u8, len: usize, flags: u32) -> isize,
    /// Writes what can go of `len` bytes now (waits for the first byte with `block`).
    pub send:
        unsafe extern "C" fn(sock: SockHandle, buf: *const u8, len: usize, block: u8) -> isize,
    /// `SHUT_RD`, `SHUT_WR` or `SHUT_RDWR`; waits for the control message to go.
    pub shutdown: unsafe extern "C" fn(sock: SockHandle, how: c_int) -> c_int,
    /// What `sock` is ready for now (`READY_*` bits in `*ready`; a listener is `READY_IN`
    /// while a connection request waits). With `arm` nonzero and
    /// nothing in `want` ready, it also stores up to 2 fds in `wait_fds` (the count in
    /// `*nfds`) that turn readable when that may change.
    pub readiness: unsafe extern "C" fn(
        sock: SockHandle,
        want: u32,
        arm: u8,
        ready: *mut u32,
        wait_fds: *mut c_int,
        nfds: *mut u32,
    ) -> c_int,
    /// The local and peer addresses (a listener has no peer: family 0).
    pub addrs: unsafe extern "C" fn(
        sock: SockHandle,
        local: *mut sockaddr_storage,
        peer: *mut sockaddr_storage,
    ) -> c_int,
    /// Keep-alives every `seconds` (0: off).
    pub set_keepalive: unsafe extern "C" fn(sock: SockHandle, seconds: u32) -> c_int,
    /// `riomap`: registers `len` bytes at `buf` (remote-writable and published when
    /// `writable`) at `offset` (-1: the address); the offset in `*out`.
    pub iomap: unsafe extern "C" fn(
        sock: SockHandle,
        buf: *mut u8,
        len: usize,
        writable: u8,
        offset: i64,
        out: *mut i64,
    ) -> c_int,
    /// `riounmap`.
    pub iounmap: unsafe extern "C" fn(sock: SockHandle, buf: *mut u8, len: usize) -> c_int,
    /// `riowrite`: what can go now of `len` bytes into the peer's mapping at `offset`
    /// (waits for the first byte with `block`); 0 when no mapping covers `offset`.
    pub iowrite: unsafe extern "C" fn(
        sock: SockHandle,
        buf: *const u8,
        len: usize,
        offset: u64,
        block: u8,
    ) -> isize,
    /// `rbind`: binds a new socket at `addr` at once (`rdma_bind_addr`; port 0: ephemeral)
    /// with the reuse-address and IPv6-only options (nonzero: on); `-EADDRINUSE` when
    /// another socket holds the address. The bound socket's handle goes to `*out`; it
    /// listens with `listen_bound` or connects with `connect_bound`.
    pub bind: unsafe extern "C" fn(
        addr: *const sockaddr,
        len: socklen_t,
        reuse_addr: u8,
        v6only: u8,
        out: *mut SockHandle,
    ) -> c_int,
    /// Makes a bound socket listen (the handle stays; it is a listener from then on). On
    /// failure it stays bound.
    pub listen_bound: unsafe extern "C" fn(sock: SockHandle, backlog: c_int) -> c_int,
    /// Connects a bound socket to `addr` from its address, as `connect` does otherwise;
    /// the bound handle is gone afterwards whatever the outcome, the connection's is in
    /// `*out`.
    pub connect_bound: unsafe extern "C" fn(
        sock: SockHandle,
        addr: *const sockaddr,
        len: socklen_t,
        settings: *const StreamSettings,
        out: *mut SockHandle,
    ) -> c_int,
    /// For a thread about to block on the wait fds of `readiness`: it watches the
    /// connection's device socket too (its fd in `*fd`, -1 when the device does not hand
    /// it over), until this thread calls `unwatch`: the progress thread leaves the socket
    /// to it meanwhile, so a message wakes that thread alone (which receives it in its
    /// next `readiness` or `recv`).
    pub watch: unsafe extern "C" fn(sock: SockHandle, fd: *mut c_int) -> c_int,
    /// Ends every watch the calling thread began with `watch`.
    pub unwatch: unsafe extern "C" fn() -> c_int,
    /// `readiness` armed, for a thread that took its `watch`es first (as `rpoll` does
    /// before it sleeps): when one is on this socket's device, arming leaves the
    /// progress thread asleep (it would wake only to find the socket watched). Without
    /// such a watch, as `readiness` with `arm` 1.
    pub readiness_watched: unsafe extern "C" fn(
        sock: SockHandle,
        want: u32,
        ready: *mut u32,
        wait_fds: *mut c_int,
        nfds: *mut u32,
    ) -> c_int,
}

/// The number of bytes of [`CmOps`] a table must provide for this crate's version.
pub const OPS_SIZE: usize = core::mem::size_of::<CmOps>();
