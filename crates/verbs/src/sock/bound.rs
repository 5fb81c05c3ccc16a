//! [`RdmaSocket`]: an rsocket bound to a local address before it listens or connects, as
//! `rbind` leaves one (rsocket.c binds its rdma_cm id at once, `rdma_bind_addr`).

use super::listener::RdmaListener;
use super::stream::{cm_to_io, RdmaStream, StreamOptions};
use crate::cm::{CmId, EventChannel, IdOptions, PortSpace, RcListener};
use crate::context::Context;
use std::io;
use std::net::SocketAddr;

/// A bound, not yet listening or connected rsocket: its address is held from the bind on,
/// so a second bind to it fails at once (`AddrInUse`), and a connect from it leaves from it.
pub struct RdmaSocket {
    id: CmId,
    ctx: Context,
}

impl std::fmt::Debug for RdmaSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaSocket")
            .field("local", &self.local_addr())
            .finish()
    }
}

/// How [`RdmaSocket::bind_with`] binds (`SO_REUSEADDR`, `IPV6_V6ONLY`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BindOptions {
    /// Another bound, non-listening id with this option may hold the same address
    /// (`RDMA_OPTION_ID_REUSEADDR`).
    pub reuse_addr: bool,
    /// An IPv6 wildcard takes IPv6 only (`RDMA_OPTION_ID_AFONLY`), so it leaves the IPv4
    /// wildcard of the same port free.
    pub v6only: bool,
}

impl RdmaSocket {
    /// Binds to `addr` (port 0: an ephemeral port) on `ctx`'s device.
    pub fn bind_with(ctx: &Context, addr: SocketAddr, opts: BindOptions) -> io::Result<Self> {
        let channel = EventChannel::new(ctx).map_err(cm_to_io)?;
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(cm_to_io)?;
        if opts != BindOptions::default() {
            id.set_options(IdOptions {
                reuse_addr: opts.reuse_addr,
                afonly: opts.v6only,
                ..IdOptions::default()
            })
            .map_err(cm_to_io)?;
        }
        id.bind(addr).map_err(cm_to_io)?;
        Ok(RdmaSocket {
            id,
            ctx: ctx.clone(),
        })
    }

    /// The bound address (with the port picked for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Listens at the bound address (`backlog` ≤ 0: the default); accepted streams use
    /// `opts`. On failure the socket comes back, still bound.
    #[allow(clippy::result_large_err)]
    pub fn listen(
        self,
        backlog: i32,
        opts: StreamOptions,
    ) -> Result<RdmaListener, (io::Error, RdmaSocket)> {
        if let Err(e) = self.id.listen(backlog) {
            return Err((cm_to_io(e), self));
        }
        let RdmaSocket { id, ctx } = self;
        Ok(RdmaListener::from_rc(
            &ctx,
            RcListener::from_listening(id),
            opts,
        ))
    }

    /// Connects to the rsocket listener at `addr` from the bound address.
    pub fn connect(self, addr: SocketAddr, opts: &StreamOptions) -> io::Result<RdmaStream> {
        RdmaStream::connect_id(&self.ctx, self.id, addr, opts)
    }
}
