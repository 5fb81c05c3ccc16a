//! A control connection through the connection manager: text lines carried as SENDs on an
//! RC QP that rdma_cm connected, as perftest's `-R` exchanges its test parameters over an
//! rdma_cm connection instead of a TCP socket.
//!
//! Each line is one SEND of at most [`LINE_MAX`] bytes. Both ends keep [`SLOTS`] receives
//! posted from before the connection exists (so a line never meets an empty receive
//! queue and its RNR timer), and wait for completions on a completion channel rather than
//! spinning: the control connection idles while a benchmark runs beside it.

use crate::{fail, Result};
use softverbs::cm::{
    CmError, CmEventKind, ConnParam, EventStatus, RcConnection, RcListener, RcOptions, RejReason,
};
use softverbs::{
    AccessFlags, CompletionChannel, Context, Cq, Mr, PageAligned, Pd, Qp, QpCap, SendOp, SendWr,
    WcStatus, WorkCompletion,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The longest line, in bytes.
pub const LINE_MAX: usize = 1024;
/// Receives kept posted.
pub const SLOTS: usize = 8;
/// The send's work request id (receives use their slot number).
const SEND_ID: u64 = u64::MAX;
/// How long one line may take to go out (the peer's ACK, retries included).
const SEND_PATIENCE: Duration = Duration::from_secs(60);

/// One end of a control connection.
pub struct CmLink {
    // Dropped first: the connection (disconnecting it), then its QP's resources.
    conn: RcConnection,
    cq: Cq,
    channel: CompletionChannel,
    mr: Mr<PageAligned>,
    _pd: Pd,
    /// Receive slots that completed while a send was waited for: (slot, length).
    early: VecDeque<(usize, usize)>,
    /// The peer disconnected.
    closed: bool,
}

/// The connection parameters of a control connection: no RDMA READ, retries forever on RNR.
fn options(timeout: Duration) -> RcOptions {
    RcOptions {
        cap: QpCap {
            max_send_wr: 2,
            max_recv_wr: SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        param: Some(ConnParam {
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }),
        timeout,
    }
}

/// What a link needs before its QP exists.
struct Parts {
    pd: Pd,
    cq: Cq,
    channel: CompletionChannel,
    mr: Mr<PageAligned>,
}

impl Parts {
    fn new(ctx: &Context) -> Result<Parts> {
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(2 * SLOTS as u32 + 4, Some(&channel))?;
        let mr = pd.reg_mr(
            PageAligned::new((SLOTS + 1) * LINE_MAX),
            AccessFlags::LOCAL_WRITE,
        )?;
        Ok(Parts {
            pd,
            cq,
            channel,
            mr,
        })
    }

    /// Posts every receive slot on `qp`.
    fn post_all(
        mr: &Mr<PageAligned>,
        qp: &Qp,
    ) -> std::result::Result<(), softverbs::error::PostError> {
        for slot in 0..SLOTS {
            qp.post_recv(slot as u64, &[mr.sge(slot * LINE_MAX, LINE_MAX as u32)])?;
        }
        Ok(())
    }

    fn into_link(self, conn: RcConnection) -> CmLink {
        CmLink {
            conn,
            cq: self.cq,
            channel: self.channel,
            mr: self.mr,
            _pd: self.pd,
            early: VecDeque::new(),
            closed: false,
        }
    }
}

/// Whether a failed connect means nobody listens (yet) at the address.
pub fn is_refused(e: &CmError) -> bool {
    matches!(
        e,
        CmError::Unexpected {
            kind: CmEventKind::Rejected,
            status: EventStatus::Rejected(RejReason::INVALID_SERVICE_ID),
            ..
        }
    )
}

impl CmLink {
    /// Connects to the listener at `dst` (an rdma_cm address, TCP port space). A refusal
    /// (nobody listens there yet) is retried every 100 ms for up to `patience`, as
    /// perftest's `-R` client does; `give_up` is asked between tries.
    pub fn connect(
        ctx: &Context,
        dst: SocketAddr,
        patience: Duration,
        mut give_up: impl FnMut() -> Option<String>,
    ) -> Result<CmLink> {
        let deadline = Instant::now() + patience;
        loop {
            let parts = Parts::new(ctx)?;
            let r = softverbs::cm::connect_rc_with(
                &parts.pd,
                &parts.cq,
                dst,
                &options(Duration::from_secs(30)),
                |qp| Parts::post_all(&parts.mr, qp),
            );
            match r {
                Ok(conn) => return Ok(parts.into_link(conn)),
                Err(e) if is_refused(&e) && Instant::now() < deadline => {
                    if let Some(why) = give_up() {
                        fail!("{why}");
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => fail!("cannot connect to rdma_cm address {dst}: {e}"),
            }
        }
    }

    /// Takes the next connection request on `listener` (waiting up to `patience`) and
    /// accepts it.
    pub fn accept(ctx: &Context, listener: &RcListener, patience: Duration) -> Result<CmLink> {
        let (id, data) = listener.get_request(patience)?;
        let parts = Parts::new(ctx)?;
        let conn = softverbs::cm::accept_request_with(
            id,
            data,
            &parts.pd,
            &parts.cq,
            &options(Duration::from_secs(30)),
            |qp| Parts::post_all(&parts.mr, qp),
        )?;
        Ok(parts.into_link(conn))
    }

    /// The peer's rdma_cm address.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.conn.id().peer_addr()
    }

    /// This end's rdma_cm address.
    pub fn local(&self) -> Option<SocketAddr> {
        self.conn.id().local_addr()
    }

    /// Sends one line (without its newline), waiting until the peer has it.
    pub fn send(&mut self, line: &str) -> Result<()> {
        if line.len() > LINE_MAX {
            fail!("control message of {} bytes is too long", line.len());
        }
        if self.closed {
            fail!("the peer closed the connection");
        }
        let at = SLOTS * LINE_MAX;
        self.mr.write(at, line.as_bytes());
        let sge = [self.mr.sge(at, line.len() as u32)];
        self.conn
            .qp
            .post_send(&SendWr::new(SEND_ID, SendOp::Send, &sge))?;
        let deadline = Instant::now() + SEND_PATIENCE;
        loop {
            let wc = self.next_wc(Some(deadline))?;
            if wc.wr_id == SEND_ID {
                if wc.status != WcStatus::Success {
                    fail!("sending a control message failed: {:?}", wc.status);
                }
                return Ok(());
            }
            let slot = self.received(&wc)?;
            self.early.push_back(slot);
        }
    }

    /// Receives one line; the peer disconnecting is an error.
    pub fn recv(&mut self) -> Result<String> {
        let (slot, len) = match self.early.pop_front() {
            Some(s) => s,
            None => loop {
                let wc = self.next_wc(None)?;
                if wc.wr_id != SEND_ID {
                    break self.received(&wc)?;
                }
            },
        };
        let mut buf = vec![0u8; len];
        self.mr.read(slot * LINE_MAX, &mut buf);
        self.conn.qp.post_recv(
            slot as u64,
            &[self.mr.sge(slot * LINE_MAX, LINE_MAX as u32)],
        )?;
        match String::from_utf8(buf) {
            Ok(s) => Ok(s),
            Err(_) => fail!("the peer sent a control message that is not text"),
        }
    }

    /// A receive completion: its slot and length.
    fn received(&mut self, wc: &WorkCompletion) -> Result<(usize, usize)> {
        match wc.status {
            WcStatus::Success if (wc.wr_id as usize) < SLOTS => {
                Ok((wc.wr_id as usize, (wc.byte_len as usize).min(LINE_MAX)))
            }
            WcStatus::Success => fail!("completion for unknown work request {}", wc.wr_id),
            // The QP went to ERR: the peer disconnected (or the connection broke).
            WcStatus::WrFlushErr => {
                self.closed = true;
                fail!("the peer closed the connection")
            }
            s => fail!("control connection failed: {s:?}"),
        }
    }

    /// The next completion, sleeping on the completion channel while there is none. A
    /// disconnect from the peer ends the wait with an error.
    fn next_wc(&mut self, deadline: Option<Instant>) -> Result<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            if self.cq.poll(&mut wc) == 1 {
                return Ok(wc[0]);
            }
            self.cq.req_notify(false)?;
            // A completion that came before the CQ was armed raises no event.
            if self.cq.poll(&mut wc) == 1 {
                return Ok(wc[0]);
            }
            if self
                .channel
                .get_event_timeout(Duration::from_millis(200))
                .is_some()
            {
                self.cq.ack_events(1);
            }
            if let Some(ev) = self.conn.id().channel().try_get_event() {
                if ev.kind() == CmEventKind::Disconnected {
                    // Answer the DREQ; the QP is in ERR and its receives flush.
                    let _ = self.conn.id().disconnect();
                    self.closed = true;
                }
            }
            if self.closed && self.cq.poll(&mut wc) == 0 {
                fail!("the peer closed the connection");
            } else if self.closed {
                return Ok(wc[0]);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                fail!("the control connection made no progress");
            }
        }
    }

    /// Disconnects and waits (at most `timeout`) for the peer's answer.
    pub fn disconnect(&self, timeout: Duration) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.conn.disconnect(timeout)?;
        Ok(())
    }

    /// Waits (at most `timeout`) for the peer to disconnect, and answers it.
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.conn.wait_disconnected(timeout)?;
        self.closed = true;
        Ok(())
    }
}
