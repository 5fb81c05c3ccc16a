//! tokio `AsyncRead` / `AsyncWrite` rsocket streams (feature `tokio`).
//!
//! The stream's completion channel fd is registered with tokio's reactor. A read or write
//! makes one non-blocking attempt; when it would block, the CQ was armed before the last
//! look, so the next completion makes the fd readable and wakes the task. Connecting and
//! accepting wait for connection-manager events and run on tokio's blocking pool.

use super::{RdmaListener, RdmaStream, StreamOptions};
use crate::context::Context;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context as TaskContext, Poll, Waker};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// An [`RdmaStream`] for tokio: `AsyncRead` + `AsyncWrite` (split it with
/// `tokio::io::split` for a reader and a writer task). Must be used within a tokio runtime
/// with I/O enabled. Keep-alives are sent only by blocking calls.
pub struct AsyncRdmaStream {
    // Declared first so it is deregistered before the stream closes the fd it watches.
    fd: AsyncFd<ChannelFd>,
    stream: Arc<RdmaStream>,
    // tokio wakes only the last task that polled the fd's readiness, but a reader and a
    // writer task may both wait on it: whoever sees it ready, or handles completions the
    // other may be waiting for, wakes the other.
    waiting: Mutex<[Option<Waker>; 2]>,
}

#[derive(Clone, Copy)]
enum Side {
    Read = 0,
    Write = 1,
}

impl std::fmt::Debug for AsyncRdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncRdmaStream")
            .field(&self.stream)
            .finish()
    }
}

fn join_error(e: tokio::task::JoinError) -> io::Error {
    io::Error::other(e)
}

impl AsyncRdmaStream {
    /// Wraps a connected stream.
    pub fn new(stream: RdmaStream) -> io::Result<AsyncRdmaStream> {
        // SAFETY: the fd is the stream's completion channel's; the stream (kept in the
        // same struct, dropped after the AsyncFd by field order) keeps it open and the same.
        let fd = unsafe { AsyncFd::register(ChannelFd(stream.channel_fd())) }?;
        Ok(AsyncRdmaStream {
            fd,
            stream: Arc::new(stream),
            waiting: Mutex::new([None, None]),
        })
    }

    /// Connects to the rsocket listener at `addr` from `ctx`'s device.
    pub async fn connect_with(
        ctx: &Context,
        addr: SocketAddr,
        opts: &StreamOptions,
    ) -> io::Result<AsyncRdmaStream> {
        let (ctx, opts) = (ctx.clone(), opts.clone());
        let stream =
            tokio::task::spawn_blocking(move || RdmaStream::connect_with(&ctx, addr, &opts))
                .await
                .map_err(join_error)??;
        AsyncRdmaStream::new(stream)
    }

    /// Connects to `addr` on the process's softverbs device.
    pub async fn connect(addr: SocketAddr) -> io::Result<AsyncRdmaStream> {
        let stream = tokio::task::spawn_blocking(move || RdmaStream::connect(addr))
            .await
            .map_err(join_error)??;
        AsyncRdmaStream::new(stream)
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &RdmaStream {
        &self.stream
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, [Option<Waker>; 2]> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poll_op<R>(
        &self,
        cx: &mut TaskContext<'_>,
        side: Side,
        ready_when: impl Fn(&softverbs_sock::StreamCore) -> bool + Copy,
        mut op: impl FnMut(&RdmaStream, &mut softverbs_sock::StreamCore) -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        loop {
            let before = self.stream.handled();
            let result = self.stream.attempt(ready_when, &mut op);
            let blocked = matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
            if !blocked || self.stream.handled() != before {
                // This task's progress may have readied the other side's operation.
                let other = self.lock_waiting()[1 - side as usize].take();
                if let Some(w) = other {
                    w.wake();
                }
            }
            if !blocked {
                return Poll::Ready(result);
            }
            self.lock_waiting()[side as usize] = Some(cx.waker().clone());
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            guard.clear_ready();
            let wakers = std::mem::take(&mut *self.lock_waiting());
            for w in wakers.into_iter().flatten() {
                if !w.will_wake(cx.waker()) {
                    w.wake();
                }
            }
        }
    }
}

impl AsyncRead for AsyncRdmaStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let n = ready!(self.poll_op(
            cx,
            Side::Read,
            |c| c.read_ready(),
            |s, core| s.read_locked(core, buf.initialize_unfilled())
        ))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for AsyncRdmaStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.poll_op(
            cx,
            Side::Write,
            |c| c.write_ready(),
            |s, core| s.write_locked(core, buf),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.poll_op(cx, Side::Write, |c| c.all_sends_done(), |_, _| Ok(()))
    }

    /// Shuts writing down (the peer reads end of stream) and waits for every write to
    /// complete.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.stream
            .start_shutdown(softverbs_sock::Shutdown::Write)?;
        self.poll_op(cx, Side::Write, |c| c.all_sends_done(), |_, _| Ok(()))
    }
}

/// An [`RdmaListener`] for tokio: `accept` waits on the blocking pool.
#[derive(Debug, Clone)]
pub struct AsyncRdmaListener {
    listener: Arc<RdmaListener>,
}

impl AsyncRdmaListener {
    /// Wraps a listener.
    pub fn new(listener: RdmaListener) -> AsyncRdmaListener {
        AsyncRdmaListener {
            listener: Arc::new(listener),
        }
    }

    /// The address it listens at.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection.
    pub async fn accept(&self) -> io::Result<(AsyncRdmaStream, SocketAddr)> {
        let l = Arc::clone(&self.listener);
        let (stream, addr) = tokio::task::spawn_blocking(move || l.accept())
            .await
            .map_err(join_error)??;
        Ok((AsyncRdmaStream::new(stream)?, addr))
    }
}
