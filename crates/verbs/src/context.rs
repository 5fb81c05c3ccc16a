//! Devices and opened device contexts.
//!
//! Every context opened on a [`Device`] shares the device's endpoint, GID, LID, engine and
//! progress thread (`crate::device`); a context owns its objects and its asynchronous
//! events, which arrive on an fd of its own.

use crate::config::Config;
use crate::cq::{CompletionChannel, Cq};
use crate::device::{DeviceCore, Inherited, Slot, PROCESS_SLOT};
use crate::driver::{AsyncQueue, Driver, OpenError};
use crate::error::{QueryError, ResourceError};
use crate::events::Source;
use crate::gid::Gid;
use crate::pd::Pd;
use softverbs_engine::{AsyncEvent, Counters, Mtu};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Where a [`Device`] keeps its running device.
#[derive(Clone)]
enum SlotRef {
    /// `softverbs0` of [`Device::list`]: one per process.
    Process,
    /// A device made with [`Device::with_config`].
    Own(Arc<Slot>),
}

/// A softverbs device that can be opened: a configuration for a UDP endpoint. Opening it
/// while it is open joins the running device (contexts share it as they share an RNIC).
#[derive(Clone)]
pub struct Device {
    name: String,
    config: Config,
    slot: SlotRef,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish()
    }
}

impl Device {
    /// The devices this process can open: one, `softverbs0`, configured from the
    /// `SOFTVERBS_*` environment variables (see [`Config`]). Every context opened on it in
    /// this process shares one device.
    pub fn list() -> Result<Vec<Device>, crate::config::ConfigError> {
        Ok(vec![Device {
            name: "softverbs0".into(),
            config: Config::from_env()?,
            slot: SlotRef::Process,
        }])
    }

    /// A device of its own with an explicit configuration: its contexts share one
    /// endpoint, distinct from every other device's.
    pub fn with_config(name: impl Into<String>, config: Config) -> Device {
        Device {
            name: name.into(),
            config,
            slot: SlotRef::Own(Arc::new(Slot::new())),
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration it opens with (when it is not running yet).
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn slot(&self) -> &Slot {
        match &self.slot {
            SlotRef::Process => &PROCESS_SLOT,
            SlotRef::Own(s) => s,
        }
    }

    /// Opens a context: joins the running device, or brings it up (binds its UDP socket
    /// and starts its progress thread; the new context then sees `PortActive`).
    pub fn open(&self) -> Result<Context, OpenError> {
        let (device, fresh) = self.slot().get_or_open(&self.config)?;
        let events = AsyncQueue::new(false).map_err(|source| OpenError::Io {
            what: "async event fd",
            source,
        })?;
        if fresh {
            // IBA 14.2.5.2: a port that reaches Active reports it as an asynchronous event.
            events.push(AsyncEvent::PortActive);
        }
        Ok(Context {
            inner: Arc::new(ContextInner {
                device,
                events: Arc::new(events),
                name: self.name.clone(),
            }),
        })
    }

    /// Whether the device runs (a context of it is open) in this process.
    pub fn is_running(&self) -> bool {
        self.slot().running().is_some()
    }
}

/// Device capabilities (as `ibv_query_device` reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (derived from the GID).
    pub node_guid: u64,
    /// IEEE vendor id: 0xFFFFFF, the software RoCE one (rxe's), which no program
    /// mistakes for hardware it knows.
    pub vendor_id: u32,
    /// Vendor part id (0).
    pub vendor_part_id: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Deepest send or receive queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Deepest CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Largest memory region in bytes (the registration cap).
    pub max_mr_size: u64,
    /// Most protection domains.
    pub max_pd: u32,
    /// Outstanding READ/atomic per QP as responder.
    pub max_qp_rd_atom: u8,
    /// Outstanding READ/atomic per QP as requester.
    pub max_qp_init_rd_atom: u8,
    /// Most inline bytes per send WR.
    pub max_inline_data: u32,
    /// Largest message.
    pub max_msg_size: u32,
    /// Atomics are atomic with respect to this device only (IBV_ATOMIC_HCA).
    pub atomic_cap_hca: bool,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Most multicast groups the device joins at once.
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most attachments of QPs to groups in all.
    pub max_total_mcast_qp_attach: u32,
    /// Completion vectors (`comp_vector` of a CQ is below this).
    pub num_comp_vectors: u32,
}

/// Multicast limits: each group the device joins is a socket of its own.
pub(crate) const MAX_MCAST_GRP: u32 = 64;
pub(crate) const MAX_MCAST_QP_ATTACH: u32 = 64;
pub(crate) const MAX_TOTAL_MCAST_QP_ATTACH: u32 = MAX_MCAST_GRP * MAX_MCAST_QP_ATTACH;

/// Port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Up and usable.
    Active,
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// RoCE: Ethernet framing (here: UDP).
    Ethernet,
}

/// Port attributes (as `ibv_query_port` reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Always active: the port is a bound socket.
    pub state: PortState,
    /// Largest MTU supported.
    pub max_mtu: Mtu,
    /// MTU in use: the configured one, capped so that a packet with every header
    /// fits the link the device's address is on.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Local identifier: names this device to programs on the same host
    /// (`crate::addressing`).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// A counter snapshot of the device's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// Datagrams read from the kernel.
    pub rx_datagrams: u64,
    /// Of those, datagrams the progress thread read (the others: threads polling a CQ).
    pub rx_by_progress_thread: u64,
    /// Reads that took datagrams with a single `recvmsg` rather than a batch (a
    /// ping-pong's spinning poller).
    pub rx_single_reads: u64,
    /// Datagrams the kernel refused for good.
    pub tx_errors: u64,
    /// Datagrams fault injection dropped.
    pub injected_drops: u64,
    /// Reads too large for a receive buffer.
    pub rx_truncated: u64,
    /// Send calls (`sendmmsg`, or `sendmsg` for a single message).
    pub tx_syscalls: u64,
    /// Of those, `sendmsg` calls that sent a single message.
    pub tx_single_sends: u64,
    /// Times a full socket buffer made sending wait.
    pub tx_backpressure: u64,
    /// Send WRs posted without a send call of their own: they left with the next batch.
    pub posts_joined_batch: u64,
    /// Times a thread moved the progress thread's wake-up earlier for a timer.
    pub timer_wakeups: u64,
    /// Times another thread woke the progress thread at once (its eventfd).
    pub progress_wakes: u64,
    /// Times the progress thread went to sleep (each ends in a wake-up).
    pub progress_sleeps: u64,
    /// Times an empty CQ poll yielded the CPU.
    pub poll_yields: u64,
    /// Times a spinning poller that shared its CPU with another busy thread slept briefly to
    /// move to an idle CPU.
    pub poll_cpu_moves: u64,
    /// Times an empty CQ poll, quiet for long, slept on the socket instead of spinning.
    pub poll_waits: u64,
    /// Times an empty CQ poll slept on the socket instead of yielding, its thread's last
    /// yield having given the CPU away for a slice or longer.
    pub poll_yield_waits: u64,
    /// Times a spinning poller moved the progress thread's hand-off timer later.
    pub handoff_pushes: u64,
    /// Times a poll loop woke the progress thread asleep on the socket to leave it to
    /// the loop.
    pub socket_taken_from_progress: u64,
    /// Times a thread polling its CQ kept the ACKs of what it received back until its
    /// answer.
    pub acks_held: u64,
    /// Times held ACKs left right behind the answer, in its `sendmmsg`.
    pub acks_after_requests: u64,
    /// Times the progress thread kept the ACK of a lone RDMA WRITE it placed into memory
    /// back for the answer of a thread spinning on that memory.
    pub acks_held_for_memory: u64,
    /// Times such a hold ended without an answer.
    pub ack_holds_expired: u64,
    /// Stream socket data writes (`RdmaStream`'s `io::Write` and `send_with`, so the C
    /// API's `rsend`/`rwrite`; not `AsyncRdmaStream`'s) that found no room to write (a
    /// grant, credit, send ring or queue entry) and waited, or returned `WouldBlock`: a
    /// writer ahead of its reader counts one per receive half it is granted (half of
    /// `softverbs_sock::DEFAULT_RING` by default).
    pub sock_writes_blocked: u64,
    /// Receives from the device's socket by a same-host stream writer about to hold a
    /// write back, for the ACK of the write in flight: one at a hold's first write, then
    /// one per 256 KiB held, or per eighth of the peer's ring if that is less.
    pub sock_ack_looks: u64,
    /// Times a blocked stream reader found itself on its same-host bulk writer's CPU and
    /// moved to an idle one (`Config::sock_apart`).
    pub sock_cpu_moves: u64,
    /// Times such a reader looked for an idle CPU to move to (it moves only where one
    /// idled half the time since its last look).
    pub sock_cpu_looks: u64,
    /// Small same-host stream messages sent with their bytes in their one packet rather
    /// than placed with `process_vm_writev` behind a header-only packet: a data write of
    /// at most 4 KiB carrying its announcement, after a read, when the stream's previous
    /// data write was no larger (a request/response exchange of small messages).
    pub sock_small_in_packet: u64,
    /// Stream socket buffer grants a writer took from its target area before their
    /// message arrived (`Config::sock_early_room`).
    pub sock_grants_from_memory: u64,
    /// Stream socket buffer grants taken when their message arrived (early grants on).
    pub sock_grants_from_message: u64,
    /// Stream bytes read before their DATA message arrived, from the "bytes placed"
    /// word (`Config::sock_placed_word`).
    pub sock_bytes_read_ahead: u64,
    /// Stream DATA messages every byte of which was read before they arrived.
    pub sock_messages_read_ahead: u64,
    /// Stream DATA messages that arrived with bytes to read (word offered).
    pub sock_messages_announced: u64,
}

/// What a context is: the device it shares, and what it owns.
pub(crate) struct ContextInner {
    pub device: Arc<DeviceCore>,
    /// This context's asynchronous events.
    pub events: Arc<AsyncQueue>,
    name: String,
}

impl ContextInner {
    /// Runs `f` on the engine (see `DeviceCore::with`).
    pub fn with<R>(&self, f: impl FnOnce(&mut crate::driver::State) -> R) -> Result<R, Inherited> {
        self.device.with(f)
    }

    /// Runs `f` on the engine, sending nothing (see `DeviceCore::read`).
    pub fn read<R>(&self, f: impl FnOnce(&mut crate::driver::State) -> R) -> Result<R, Inherited> {
        self.device.read(f)
    }

    /// Makes this context the owner of `source`: its asynchronous events arrive here.
    /// Call under the device lock, right after the engine made the object.
    pub fn adopt(&self, st: &mut crate::driver::State, source: Source) {
        self.events.register(source);
        st.owners.insert(source, Arc::clone(&self.events));
    }

    /// Undoes [`ContextInner::adopt`] (call under the device lock): the engine's events of
    /// `source` are not routed here any more. Then, without the lock, [`ContextInner::forget`].
    pub fn disown(&self, st: &mut crate::driver::State, source: Source) {
        st.owners.remove(&source);
    }

    /// Drops what is still queued for `source` and forgets it (after
    /// [`ContextInner::disown`], without the device lock: it may touch the event fd).
    pub fn forget(&self, source: Source) {
        self.events.unregister(source);
    }
}

/// An opened device context: shares its device's endpoint and progress thread with the
/// other contexts of the device; owns its objects and asynchronous events.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .field("addr", &self.local_addr())
            .finish()
    }
}

impl Context {
    /// Opens the first device of [`Device::list`].
    pub fn open_default() -> Result<Context, Box<dyn std::error::Error + Send + Sync>> {
        let dev = Device::list()?.remove(0);
        Ok(dev.open()?)
    }

    /// The driver's immutable parts (address, MTU, counters), readable even on an
    /// inherited device.
    fn info(&self) -> &Driver {
        self.inner.device.info()
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The configuration the device runs with (the first opener's, see
    /// [`Device::open`]).
    pub(crate) fn config(&self) -> &Config {
        self.inner.device.config()
    }

    /// Whether this context's device was inherited from the parent process across
    /// `fork()`: then every call fails (see [`Inherited`]).
    pub fn inherited(&self) -> bool {
        self.inner.device.inherited()
    }

    /// Whether `other` is a context of the same device.
    pub fn same_device(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner.device, &other.inner.device)
    }

    /// The UDP endpoint the device listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.info().local
    }

    /// The device's GID (index 0): its endpoint in RoCEv2 form.
    pub fn gid(&self) -> Gid {
        crate::addressing::gid_of(self.local_addr())
    }

    /// The device's LID, which names it to programs on the same host (0: none does).
    pub fn lid(&self) -> u16 {
        crate::addressing::lid_of(self.local_addr())
    }

    /// The UDP endpoint of the device on this host that `lid` names (`None`: it names
    /// none; see `crate::addressing`).
    pub fn lid_to_addr(&self, lid: u16) -> Option<SocketAddr> {
        crate::addressing::resolve_lid(lid, self.info().base_ip)
    }

    /// Device capabilities.
    pub fn query_device(&self) -> DeviceAttr {
        let c = self.info().engine_config();
        DeviceAttr {
            node_guid: self.gid().interface_id(),
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_cq: c.max_cq,
            max_cqe: c.max_cqe,
            max_mr: c.max_mr,
            max_mr_size: self.info().max_mr_bytes,
            max_pd: c.max_pd,
            max_qp_rd_atom: c.max_qp_rd_atom,
            max_qp_init_rd_atom: c.max_qp_rd_atom,
            max_inline_data: c.max_inline_data,
            max_msg_size: c.max_msg_size,
            atomic_cap_hca: true,
            phys_port_cnt: 1,
            max_mcast_grp: MAX_MCAST_GRP,
            max_mcast_qp_attach: MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: MAX_TOTAL_MCAST_QP_ATTACH,
            num_comp_vectors: 1,
        }
    }

    /// Port attributes; softverbs devices have port 1 only.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, QueryError> {
        if port != 1 {
            return Err(QueryError::NoSuchPort(port));
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.info().active_mtu,
            gid_tbl_len: 1,
            lid: self.lid(),
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// The GID at `index` of `port`'s table (one entry).
    pub fn query_gid(&self, port: u8, index: u16) -> Result<Gid, QueryError> {
        if port != 1 {
            return Err(QueryError::NoSuchPort(port));
        }
        if index != 0 {
            return Err(QueryError::NoSuchGid(index));
        }
        Ok(self.gid())
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd, ResourceError> {
        Pd::new(self)
    }

    /// Creates a completion queue of at least `cqe` entries, optionally reporting
    /// to a completion channel.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
    ) -> Result<Cq, ResourceError> {
        Cq::new(self, cqe, channel)
    }

    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> std::io::Result<CompletionChannel> {
        CompletionChannel::new(self)
    }

    /// The same-host path's counters (`softverbs::samehost`), as `softverbs stat`
    /// shows them: `same_host_qps`, bytes moved each way, fallbacks, refusals, failed
    /// probes, and a `same_host_qp_<qpn>` line per QP on the path.
    pub fn same_host_counters(&self) -> Vec<(String, u64)> {
        self.info().same_host.stat_lines()
    }

    /// Replaces the device's fault injection ([`crate::Config::faults`]) from now on:
    /// tests on real sockets make a peer unreachable for a while, then reachable
    /// again. It acts on every datagram the device sends but the same-host handshake
    /// (which `Config::drop_first_hellos` drops). No effect on an inherited device.
    pub fn set_faults(&self, faults: Option<crate::FaultConfig>) {
        if let Ok(d) = self.inner.device.driver() {
            d.set_faults(faults);
        }
    }

    /// The engine's counters (zero on an inherited device).
    pub fn counters(&self) -> Counters {
        self.inner
            .read(|st| st.engine.counters())
            .unwrap_or_default()
    }

    /// Driver counters: (datagrams sent, received, send errors, injected drops).
    pub fn driver_counters(&self) -> (u64, u64, u64, u64) {
        let c = self.device_counters();
        (
            c.tx_datagrams,
            c.rx_datagrams,
            c.tx_errors,
            c.injected_drops,
        )
    }

    /// The driver's counters.
    pub fn device_counters(&self) -> DeviceCounters {
        let c = &self.info().counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        DeviceCounters {
            tx_datagrams: get(&c.tx_datagrams),
            rx_datagrams: get(&c.rx_datagrams),
            rx_by_progress_thread: get(&c.rx_by_progress),
            rx_single_reads: get(&c.rx_single_reads),
            tx_errors: get(&c.tx_errors),
            injected_drops: get(&c.injected_drops),
            rx_truncated: get(&c.rx_truncated),
            tx_syscalls: get(&c.tx_syscalls),
            tx_single_sends: get(&c.tx_single_sends),
            tx_backpressure: get(&c.tx_backpressure),
            posts_joined_batch: get(&c.posts_joined_batch),
            timer_wakeups: get(&c.timer_wakeups),
            progress_wakes: get(&c.progress_wakes),
            progress_sleeps: get(&c.progress_sleeps),
            poll_yields: get(&c.poll_yields),
            poll_cpu_moves: get(&c.poll_cpu_moves),
            poll_waits: get(&c.poll_waits),
            poll_yield_waits: get(&c.poll_yield_waits),
            handoff_pushes: get(&c.handoff_pushes),
            socket_taken_from_progress: get(&c.socket_taken_from_progress),
            acks_held: get(&c.acks_held),
            acks_after_requests: get(&c.acks_after_requests),
            acks_held_for_memory: get(&c.acks_held_for_memory),
            ack_holds_expired: get(&c.ack_holds_expired),
            sock_writes_blocked: get(&c.sock_writes_blocked),
            sock_ack_looks: get(&c.sock_ack_looks),
            sock_cpu_moves: get(&c.sock_cpu_moves),
            sock_cpu_looks: get(&c.sock_cpu_looks),
            sock_small_in_packet: get(&c.sock_small_in_packet),
            sock_grants_from_memory: get(&c.sock_grants_from_memory),
            sock_grants_from_message: get(&c.sock_grants_from_message),
            sock_bytes_read_ahead: get(&c.sock_bytes_read_ahead),
            sock_messages_read_ahead: get(&c.sock_messages_read_ahead),
            sock_messages_announced: get(&c.sock_messages_announced),
        }
    }

    /// The next asynchronous event of this context, if any (non-blocking). Acknowledge
    /// events of objects with [`Context::ack_async_event`]: destroying an object through
    /// the C ABI waits for it.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.events.try_get()
    }

    /// The next asynchronous event, waiting for one as `ibv_get_async_event` does: the
    /// error is the wait's (`EAGAIN` when the fd was made non-blocking, `EINTR`).
    pub fn get_async_event(&self) -> std::io::Result<AsyncEvent> {
        self.inner.events.get()
    }

    /// Acknowledges an event from [`Context::get_async_event`] (`ibv_ack_async_event`).
    pub fn ack_async_event(&self, event: &AsyncEvent) {
        use crate::events::Sourced;
        if let Some(s) = event.source() {
            self.inner.events.ack(s, 1);
        }
    }

    /// The fd that is readable while async events are pending.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        self.inner.events.fd()
    }
}
