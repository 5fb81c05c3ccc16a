//! Devices and opened device contexts.

use crate::config::Config;
use crate::cq::{CompletionChannel, Cq};
use crate::driver::{Driver, DriverHandle, OpenError};
use crate::error::{QueryError, ResourceError};
use crate::gid::Gid;
use crate::pd::Pd;
use softverbs_engine::{AsyncEvent, Counters, Mtu};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A softverbs device that can be opened: a configuration for a UDP endpoint.
#[derive(Debug, Clone)]
pub struct Device {
    name: String,
    config: Config,
}

impl Device {
    /// The devices this process can open: one, `softverbs0`, configured from the
    /// `SOFTVERBS_*` environment variables (see [`Config`]).
    pub fn list() -> Result<Vec<Device>, crate::config::ConfigError> {
        Ok(vec![Device {
            name: "softverbs0".into(),
            config: Config::from_env()?,
        }])
    }

    /// A device with an explicit configuration.
    pub fn with_config(name: impl Into<String>, config: Config) -> Device {
        Device {
            name: name.into(),
            config,
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration it opens with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens the device: binds its UDP socket and starts its progress thread.
    pub fn open(&self) -> Result<Context, OpenError> {
        let driver = Driver::open(self.config.clone())?;
        Ok(Context {
            handle: Arc::new(DriverHandle(driver)),
            name: self.name.clone(),
        })
    }
}

/// Device capabilities (as `ibv_query_device` reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (derived from the GID).
    pub node_guid: u64,
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
    /// Largest memory region in bytes.
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
}

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
    /// Local identifier: names this device to programs on the same host.
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// An opened device: one UDP endpoint with its progress thread.
#[derive(Clone)]
pub struct Context {
    pub(crate) handle: Arc<DriverHandle>,
    name: String,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
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

    pub(crate) fn driver(&self) -> &Arc<Driver> {
        &self.handle.0
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The UDP endpoint the device listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.driver().local
    }

    /// The device's GID (index 0).
    pub fn gid(&self) -> Gid {
        Gid::from_socket_addr(self.local_addr()).unwrap_or_default()
    }

    /// The device's LID: its UDP port, for peers on the same host.
    pub fn lid(&self) -> u16 {
        let port = self.local_addr().port();
        if port <= 0xbfff {
            port
        } else {
            0
        }
    }

    /// The UDP endpoint of a device on this host addressed by LID.
    pub fn lid_to_addr(&self, lid: u16) -> SocketAddr {
        SocketAddr::new(self.local_addr().ip(), lid)
    }

    /// Device capabilities.
    pub fn query_device(&self) -> DeviceAttr {
        let st = self.driver().lock();
        let c = st.engine.config();
        DeviceAttr {
            node_guid: self.gid().interface_id(),
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_cq: c.max_cq,
            max_cqe: c.max_cqe,
            max_mr: c.max_mr,
            max_mr_size: u64::MAX,
            max_pd: c.max_pd,
            max_qp_rd_atom: c.max_qp_rd_atom,
            max_qp_init_rd_atom: c.max_qp_rd_atom,
            max_inline_data: c.max_inline_data,
            max_msg_size: c.max_msg_size,
            atomic_cap_hca: true,
            phys_port_cnt: 1,
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
            active_mtu: self.driver().active_mtu,
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

    /// The engine's counters.
    pub fn counters(&self) -> Counters {
        self.driver().lock().engine.counters()
    }

    /// Driver counters: (datagrams sent, received, send errors, injected drops).
    pub fn driver_counters(&self) -> (u64, u64, u64, u64) {
        let c = &self.driver().counters;
        (
            c.tx_datagrams.load(Ordering::Relaxed),
            c.rx_datagrams.load(Ordering::Relaxed),
            c.tx_errors.load(Ordering::Relaxed),
            c.injected_drops.load(Ordering::Relaxed),
        )
    }

    /// The next asynchronous event, if any (non-blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let ev = self.driver().lock().async_events.pop_front();
        if ev.is_some() {
            self.driver().async_fd.take();
        }
        ev
    }

    /// Blocks until an asynchronous event arrives (like `ibv_get_async_event`).
    pub fn get_async_event(&self) -> AsyncEvent {
        loop {
            // The fd is a blocking semaphore eventfd: one count per event.
            self.driver().async_fd.take();
            if let Some(ev) = self.driver().lock().async_events.pop_front() {
                return ev;
            }
        }
    }

    /// The fd that is readable while async events are pending.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        self.driver().async_fd.raw()
    }
}
