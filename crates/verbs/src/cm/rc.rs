//! Connected RC QPs in one call, in the spirit of librdmacm's `rdma_create_ep` (active side)
//! and `rdma_get_request` + `rdma_accept` (passive side).

use super::{CmError, CmEventKind, CmId, ConnParam, Event, EventChannel, EventStatus, PortSpace};
use crate::context::Context;
use crate::cq::Cq;
use crate::pd::Pd;
use crate::qp::Qp;
use softverbs_engine::QpCap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How [`connect_rc`] and [`RcListener::accept`] set up a connection.
#[derive(Debug, Clone)]
pub struct RcOptions {
    /// The QP's queue capacities.
    pub cap: QpCap,
    /// Connection parameters (private data, READ/atomic depths, retries); `None`:
    /// librdmacm's defaults (the device's most READs/atomics, 7 retries).
    pub param: Option<ConnParam>,
    /// How long each step may take (address resolution, the peer's answer).
    pub timeout: Duration,
}

impl Default for RcOptions {
    fn default() -> Self {
        RcOptions {
            cap: QpCap::default(),
            param: None,
            timeout: Duration::from_secs(10),
        }
    }
}

/// A connected RC QP and the id that holds its connection. Dropping it disconnects.
pub struct RcConnection {
    /// The QP, in RTS.
    pub qp: Arc<Qp>,
    /// The peer's private data (from its REQ or REP).
    pub private_data: Vec<u8>,
    id: CmId,
}

impl std::fmt::Debug for RcConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcConnection")
            .field("id", &self.id)
            .field("qp", &self.qp)
            .finish()
    }
}

/// Waits for the next event on `channel` and checks it is `want`.
pub(crate) fn expect(
    channel: &EventChannel,
    want: CmEventKind,
    op: &'static str,
    timeout: Duration,
) -> Result<Event, CmError> {
    let ev = channel
        .get_event_timeout(timeout)
        .ok_or(CmError::Unexpected {
            op,
            kind: want,
            status: EventStatus::TimedOut,
        })?;
    if ev.kind() != want || ev.status() != EventStatus::Ok {
        return Err(CmError::Unexpected {
            op,
            kind: ev.kind(),
            status: ev.status(),
        });
    }
    Ok(ev)
}

/// Connects an RC QP to the listener at `dst` (an IP address and rdma_cm port): resolves
/// the address and route, creates the QP on `pd` with `cq`, connects, and returns once the
/// connection is established. A refusal or no answer is an [`CmError::Unexpected`] carrying
/// the event (REJECTED with the reason, UNREACHABLE).
pub fn connect_rc(
    pd: &Pd,
    cq: &Cq,
    dst: SocketAddr,
    opts: &RcOptions,
) -> Result<RcConnection, CmError> {
    connect_rc_with(pd, cq, dst, opts, |_| Ok(()))
}

/// [`connect_rc`], running `prepare` on the new QP (in INIT) before the REQ goes out: the
/// place to post receives, as rdma_cm programs do before `rdma_connect`, so that the
/// peer's first SEND finds one (else it meets an RNR NAK, and the timer the connection
/// manager sets, min_rnr_timer 0, is 655 ms).
pub fn connect_rc_with(
    pd: &Pd,
    cq: &Cq,
    dst: SocketAddr,
    opts: &RcOptions,
    prepare: impl FnOnce(&Qp) -> Result<(), crate::error::PostError>,
) -> Result<RcConnection, CmError> {
    let channel = EventChannel::new(&pd.context())?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    id.resolve_addr(None, dst, opts.timeout)?;
    expect(
        &channel,
        CmEventKind::AddrResolved,
        "resolve_addr",
        opts.timeout,
    )?;
    id.resolve_route()?;
    expect(
        &channel,
        CmEventKind::RouteResolved,
        "resolve_route",
        opts.timeout,
    )?;
    let qp = id.create_qp(pd, cq, opts.cap)?;
    prepare(&qp)?;
    id.connect(opts.param.clone())?;
    // The cm retries a lost REQ for up to 15 × 4 s; the caller's timeout bounds the wait.
    let ev = expect(&channel, CmEventKind::Established, "connect", opts.timeout)?;
    Ok(RcConnection {
        qp,
        private_data: ev.private_data().to_vec(),
        id,
    })
}

impl RcConnection {
    /// The id holding the connection.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Disconnects and waits (at most `timeout`) for DISCONNECTED: the peer answered, or
    /// gave up. Outstanding work on the QP is flushed.
    pub fn disconnect(&self, timeout: Duration) -> Result<(), CmError> {
        self.id.disconnect()?;
        self.wait_disconnected(timeout)
    }

    /// Waits (at most `timeout`) for the peer's disconnect, then answers it.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<(), CmError> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let ev = self
                .id
                .channel()
                .get_event_timeout(left)
                .ok_or(CmError::Unexpected {
                    op: "disconnect",
                    kind: CmEventKind::Disconnected,
                    status: EventStatus::TimedOut,
                })?;
            if ev.kind() == CmEventKind::Disconnected {
                // Answer a DREQ (a no-op when this side sent it).
                let _ = self.id.disconnect();
                return Ok(());
            }
        }
    }
}

/// A listening id that hands out connected RC QPs, one per accepted request.
pub struct RcListener {
    id: CmId,
}

impl std::fmt::Debug for RcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcListener").field("id", &self.id).finish()
    }
}

impl RcListener {
    /// Listens at `addr` (port 0: an ephemeral one) with `backlog` (≤ 0: the default).
    /// `AddrInUse` when someone listens there already.
    pub fn bind(ctx: &Context, addr: SocketAddr, backlog: i32) -> Result<RcListener, CmError> {
        let channel = EventChannel::new(ctx)?;
        let id = CmId::new(&channel, PortSpace::Tcp)?;
        id.bind(addr)?;
        id.listen(backlog)?;
        Ok(RcListener { id })
    }

    /// Wraps an id that listens already (bound first on its own, as `rbind` then
    /// `rlisten` do).
    pub fn from_listening(id: CmId) -> RcListener {
        RcListener { id }
    }

    /// The address it listens at.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The next connection request (`rdma_get_request`), waiting at most `timeout`: a new
    /// id on a channel of its own, with the peer's private data, to accept or reject.
    pub fn get_request(&self, timeout: Duration) -> Result<(CmId, Vec<u8>), CmError> {
        let mut ev = expect(
            self.id.channel(),
            CmEventKind::ConnectRequest,
            "get_request",
            timeout,
        )?;
        let data = ev.private_data().to_vec();
        let mut id = ev.take_request().ok_or(CmError::Unexpected {
            op: "get_request",
            kind: ev.kind(),
            status: ev.status(),
        })?;
        let own = EventChannel::new(self.id.channel().cm().context())?;
        id.migrate(&own)?;
        Ok((id, data))
    }

    /// Waits for a request, creates its QP on `pd` with `cq`, accepts, and returns once
    /// the peer confirmed (RTU).
    pub fn accept(&self, pd: &Pd, cq: &Cq, opts: &RcOptions) -> Result<RcConnection, CmError> {
        let (id, private_data) = self.get_request(opts.timeout)?;
        accept_request(id, private_data, pd, cq, opts)
    }
}

/// Accepts a request id (from [`RcListener::get_request`], with the private data it
/// came with) with a new QP on `pd` and `cq`, and waits for the peer's RTU.
pub fn accept_request(
    id: CmId,
    private_data: Vec<u8>,
    pd: &Pd,
    cq: &Cq,
    opts: &RcOptions,
) -> Result<RcConnection, CmError> {
    accept_request_with(id, private_data, pd, cq, opts, |_| Ok(()))
}

/// [`accept_request`], running `prepare` on the new QP (in INIT) before the REP goes out:
/// the place to post receives (see [`connect_rc_with`]).
pub fn accept_request_with(
    id: CmId,
    private_data: Vec<u8>,
    pd: &Pd,
    cq: &Cq,
    opts: &RcOptions,
    prepare: impl FnOnce(&Qp) -> Result<(), crate::error::PostError>,
) -> Result<RcConnection, CmError> {
    let qp = id.create_qp(pd, cq, opts.cap)?;
    prepare(&qp)?;
    id.accept(opts.param.clone())?;
    expect(
        id.channel(),
        CmEventKind::Established,
        "accept",
        opts.timeout,
    )?;
    Ok(RcConnection {
        qp,
        private_data,
        id,
    })
}
