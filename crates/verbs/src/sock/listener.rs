//! [`RdmaListener`]: accepts rsocket connections.

use super::stream::{cm_to_io, RdmaStream, Resources, StreamOptions};
use crate::cm::{CmEventKind, RcListener};
use crate::context::Context;
use softverbs_sock::ConnData;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A listening rsocket: [`RdmaStream`]s from `accept`, like a `TcpListener`.
pub struct RdmaListener {
    listener: RcListener,
    ctx: Context,
    opts: StreamOptions,
    nonblocking: AtomicBool,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("local", &self.local_addr())
            .finish()
    }
}

impl RdmaListener {
    /// Listens at `addr` (port 0: an ephemeral port) on the process's softverbs device.
    /// `AddrInUse` when another listener holds it.
    pub fn bind(addr: SocketAddr) -> io::Result<RdmaListener> {
        let ctx = Context::open_default().map_err(io::Error::other)?;
        RdmaListener::bind_with(&ctx, addr, StreamOptions::default())
    }

    /// Listens at `addr` on `ctx`'s device; accepted streams use `opts`.
    pub fn bind_with(
        ctx: &Context,
        addr: SocketAddr,
        opts: StreamOptions,
    ) -> io::Result<RdmaListener> {
        let listener = RcListener::bind(ctx, addr, 0).map_err(cm_to_io)?;
        Ok(RdmaListener::from_rc(ctx, listener, opts))
    }

    pub(super) fn from_rc(ctx: &Context, listener: RcListener, opts: StreamOptions) -> Self {
        RdmaListener {
            listener,
            ctx: ctx.clone(),
            opts,
            nonblocking: AtomicBool::new(false),
        }
    }

    /// The address it listens at.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr()
    }

    /// `accept` returns `WouldBlock` instead of waiting when no request waits.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for a connection request and accepts it (a request whose connection data is
    /// not rsocket's is rejected, as rsocket.c does, and the wait goes on).
    pub fn accept(&self) -> io::Result<(RdmaStream, SocketAddr)> {
        self.accept_with(&self.opts)
    }

    /// [`Self::accept`] with other options for this stream (ring sizes, inline size).
    pub fn accept_with(&self, opts: &StreamOptions) -> io::Result<(RdmaStream, SocketAddr)> {
        self.accept_mode(opts, self.nonblocking.load(Ordering::Relaxed))
    }

    /// [`Self::accept_with`] that returns `WouldBlock` at once, whatever the listener's
    /// mode, when `nonblocking` and no request waits.
    pub fn accept_mode(
        &self,
        opts: &StreamOptions,
        nonblocking: bool,
    ) -> io::Result<(RdmaStream, SocketAddr)> {
        loop {
            let wait = if nonblocking {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            };
            let (id, data) = match self.listener.get_request(wait) {
                Ok(r) => r,
                Err(crate::cm::CmError::Unexpected {
                    kind: CmEventKind::ConnectRequest,
                    ..
                })
                | Err(crate::cm::CmError::Unexpected {
                    status: crate::cm::EventStatus::TimedOut,
                    ..
                }) => {
                    if wait.is_zero() {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    continue;
                }
                Err(e) => return Err(cm_to_io(e)),
            };
            let peer = match ConnData::parse(&data) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!("rejecting a non-rsocket connection request: {e}");
                    let _ = id.reject(&[]);
                    continue;
                }
            };
            let res = Resources::new(&self.ctx, opts.config)?;
            let qp = res.create_qp(&id)?;
            id.accept(Some(res.conn_param())).map_err(cm_to_io)?;
            crate::cm::rc::expect(
                id.channel(),
                CmEventKind::Established,
                "accept",
                opts.connect_timeout,
            )
            .map_err(cm_to_io)?;
            let addr = id
                .peer_addr()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            let peer_word = softverbs_sock::PlacedWordAd::parse(&data);
            return Ok((res.into_stream(id, qp, &peer, peer_word, opts.linger), addr));
        }
    }

    /// The fd that turns readable when a connection request arrives (the listening id's
    /// event channel).
    pub fn wait_fd(&self) -> std::os::fd::RawFd {
        self.listener.id().channel().fd()
    }

    /// An iterator over accepted streams.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<RdmaStream>> + '_ {
        std::iter::from_fn(move || Some(self.accept().map(|(s, _)| s)))
    }
}
