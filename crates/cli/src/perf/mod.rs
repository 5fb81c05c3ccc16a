//! `softverbs perf`: perftest-like bandwidth and latency benchmarks.
//!
//! Control protocol (text lines over TCP, client first):
//!
//! ```text
//! C: SOFTVERBS-PERF 1 op=write qps=1 mtu=4096 region=65536 tx_depth=128 cq_mod=64
//! C: lid:qpn:psn:rkey:vaddr:gid        (one line per QP, hex)
//! S: OK                                (or ERR why)
//! S: lid:qpn:psn:rkey:vaddr:gid        (one line per QP; the server's QPs are in RTS)
//! then per measurement:
//! C: RUN bw|lat SIZE ITERS   S: GO     (the server has posted receives / reset its buffer)
//! C: FIN                     S: DONE   (both ends finished their part)
//! C: BYE                     S: BYE
//! ```
//!
//! Each QP has one page-aligned registered buffer of two regions of `region`
//! bytes: the first is what the peer targets (WRITE destination, READ source,
//! atomic word, SEND landing zone), the second is local data (WRITE and SEND
//! source, READ and atomic results).

mod bw;
mod cm;
mod lat;
mod report;
mod ud;
mod udlat;

use crate::cmlink::CmLink;
use crate::conn::{connect_qp, open_device, random_psn, Ctrl, QpInfo};
use crate::progress::Progress;
use crate::{fail, Op, PerfArgs, Result};
use report::{BwRow, LatRow, Report};
use softverbs::cm::{CmId, EventChannel, PortSpace, RcListener};
use softverbs::{
    AddressHandle, Context, Cq, Mr, Mtu, PageAligned, Pd, Qp, QpBuilder, QpCap, QpType, Qpn,
};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receives kept posted per QP by a SEND receiver.
pub const RX_DEPTH: u32 = 512;
/// Messages up to this size go inline in latency tests.
pub const INLINE_MAX: u32 = 256;
/// Largest size of `--all`.
const ALL_MAX: u32 = 8 << 20;

/// What a measurement measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Bw,
    Lat,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bw => "bw",
            Mode::Lat => "lat",
        }
    }
}

/// One measurement: a mode, a message size and a number of iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub mode: Mode,
    pub size: u32,
    pub iters: u32,
    /// Bandwidth of one-sided operations only: run this long instead of
    /// `iters` iterations (the client alone decides when to stop).
    pub duration: Option<Duration>,
}

/// What the client tells the server before anything is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub op: Op,
    pub qps: u32,
    pub mtu: u32,
    pub region: usize,
    pub tx_depth: u32,
    pub cq_mod: u32,
    /// SEND over UD QPs.
    pub ud: bool,
}

const MAGIC: &str = "SOFTVERBS-PERF 1";

impl Plan {
    fn line(&self) -> String {
        format!(
            "{MAGIC} op={} qps={} mtu={} region={} tx_depth={} cq_mod={} ud={}",
            self.op.name(),
            self.qps,
            self.mtu,
            self.region,
            self.tx_depth,
            self.cq_mod,
            u8::from(self.ud)
        )
    }

    fn parse(line: &str) -> Result<Plan> {
        let Some(rest) = line.strip_prefix(MAGIC) else {
            fail!("the client does not speak this protocol (got {line:?})");
        };
        let mut plan = Plan {
            op: Op::Write,
            qps: 1,
            mtu: 4096,
            region: 4096,
            tx_depth: 128,
            cq_mod: 64,
            ud: false,
        };
        for kv in rest.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                fail!("bad parameter {kv:?} from the client");
            };
            let num = || -> Result<u64> {
                v.parse::<u64>()
                    .map_err(|_| format!("bad value in {kv:?} from the client").into())
            };
            match k {
                "op" => plan.op = Op::from_name(v).ok_or_else(|| format!("unknown op {v:?}"))?,
                "qps" => plan.qps = num()?.try_into()?,
                "mtu" => plan.mtu = num()?.try_into()?,
                "region" => plan.region = num()?.try_into()?,
                "tx_depth" => plan.tx_depth = num()?.try_into()?,
                "cq_mod" => plan.cq_mod = num()?.try_into()?,
                "ud" => plan.ud = num()? == 1,
                _ => {} // newer clients may say more
            }
        }
        plan.check()?;
        Ok(plan)
    }

    fn check(&self) -> Result<()> {
        if !(1..=4096).contains(&self.qps) {
            fail!("QPs must be between 1 and 4096");
        }
        if !(1..=16384).contains(&self.tx_depth) {
            fail!("the TX depth must be between 1 and 16384");
        }
        if self.ud && self.op != Op::Send {
            fail!("only SEND runs over UD");
        }
        if self.cq_mod == 0 {
            fail!("CQ moderation must be at least 1");
        }
        let total = (self.region as u64) * 2 * self.qps as u64;
        if total > 8 << 30 {
            fail!(
                "{} QPs with {} byte buffers need {} MiB; that is too much",
                self.qps,
                self.region,
                total >> 20
            );
        }
        Ok(())
    }

    fn max_send_wr(&self) -> u32 {
        self.tx_depth.max(64)
    }
}

/// The Q_Key of UD benchmark QPs.
const UD_QKEY: u32 = 0x1111_1111;

/// Where a UD QP's SENDs go.
#[derive(Debug, Clone, Copy)]
pub struct UdPeer {
    pub ah: AddressHandle,
    pub qpn: Qpn,
    pub qkey: u32,
}

impl QpEnd {
    /// The SEND this QP posts: to its peer's QP, by address handle on UD.
    pub fn send_op(&self) -> softverbs::SendOp {
        match self.ud {
            Some(p) => p.ah.send(p.qpn, p.qkey, None),
            None => softverbs::SendOp::Send,
        }
    }

    /// Bytes a receive needs beyond the message: the GRH area on UD.
    pub fn recv_extra(&self) -> u32 {
        if self.qp.qp_type() == QpType::Ud {
            40
        } else {
            0
        }
    }
}

/// One QP with its buffer and its peer.
pub struct QpEnd {
    pub qp: Arc<Qp>,
    pub mr: Mr<PageAligned>,
    pub psn: u32,
    pub remote: QpInfo,
    /// UD: where SENDs go.
    pub ud: Option<UdPeer>,
}

/// One end of a benchmark: a device, a CQ shared by all QPs, the QPs.
pub struct Side {
    pub ctx: Context,
    pd: Pd,
    pub cq: Cq,
    pub qps: Vec<QpEnd>,
    pub region: usize,
    pub max_send_wr: u32,
    /// With `--cm`: the connections (RC) or ids (UD) behind the QPs.
    cm: Vec<cm::Hold>,
}

impl Side {
    /// The device's share: a PD and one CQ for every QP to come.
    fn new(ctx: Context, plan: &Plan) -> Result<Side> {
        let pd = ctx.alloc_pd()?;
        let max_send_wr = plan.max_send_wr();
        let cqe = plan.qps * (max_send_wr + RX_DEPTH) + 64;
        let cq = ctx.create_cq(cqe, None)?;
        Ok(Side {
            ctx,
            pd,
            cq,
            qps: Vec::with_capacity(plan.qps as usize),
            region: plan.region,
            max_send_wr,
            cm: Vec::new(),
        })
    }

    fn cap(&self, _plan: &Plan) -> QpCap {
        QpCap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: RX_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        }
    }

    fn builder(&self, plan: &Plan, qp_type: QpType) -> QpBuilder {
        QpBuilder::new(&self.pd, &self.cq)
            .qp_type(qp_type)
            .cap(self.cap(plan))
    }

    /// One QP's buffer: two regions.
    fn new_mr(&self, plan: &Plan) -> Result<Mr<PageAligned>> {
        Ok(self
            .pd
            .reg_mr(PageAligned::new(plan.region * 2), crate::conn::all_access())?)
    }

    /// The QPs of a run whose ends exchange QP numbers themselves (over TCP).
    fn create_qps(&mut self, plan: &Plan) -> Result<()> {
        let qp_type = if plan.ud { QpType::Ud } else { QpType::Rc };
        for _ in 0..plan.qps {
            let qp = Arc::new(self.builder(plan, qp_type).build()?);
            let mr = self.new_mr(plan)?;
            let psn = random_psn(qp.qpn().value());
            self.qps.push(QpEnd {
                qp,
                mr,
                psn,
                remote: QpInfo::default(),
                ud: None,
            });
        }
        Ok(())
    }

    fn local_info(&self, q: usize) -> QpInfo {
        let e = &self.qps[q];
        QpInfo {
            lid: self.ctx.lid(),
            qpn: e.qp.qpn().value(),
            psn: e.psn,
            rkey: e.mr.rkey(),
            vaddr: e.mr.addr(),
            gid: self.ctx.gid(),
        }
    }

    fn connect(&mut self, remotes: Vec<QpInfo>, mtu: Mtu) -> Result<()> {
        for (e, remote) in self.qps.iter_mut().zip(remotes) {
            if e.qp.qp_type() == QpType::Ud {
                e.qp.ud_to_init(UD_QKEY)?;
                e.qp.ud_to_rtr()?;
                e.qp.to_rts(softverbs::RtsAttr {
                    sq_psn: e.psn,
                    ..Default::default()
                })?;
                e.ud = Some(UdPeer {
                    ah: AddressHandle::from_gid(remote.gid),
                    qpn: Qpn::new(remote.qpn),
                    qkey: UD_QKEY,
                });
            } else {
                connect_qp(&self.ctx, &e.qp, e.psn, &remote, mtu)?;
            }
            e.remote = remote;
        }
        Ok(())
    }
}

pub fn run(a: &PerfArgs) -> Result<()> {
    if a.server {
        return server(a);
    }
    match &a.host {
        Some(host) => client(a, host, a.port, None),
        None => local(a),
    }
}

/// The measurements the arguments ask for.
fn plan_steps(a: &PerfArgs) -> Result<Vec<Step>> {
    let mut modes = Vec::new();
    if a.bw || !a.lat {
        modes.push(Mode::Bw);
    }
    if a.lat {
        modes.push(Mode::Lat);
    }
    if a.iters == Some(0) {
        fail!("iterations must be at least 1");
    }
    if a.qps == 0 || a.tx_depth == 0 || a.cq_mod == 0 {
        fail!("--qps, --tx-depth and --cq-mod must be at least 1");
    }
    let duration = match a.duration {
        None => None,
        Some(_) if a.op == Op::Send => {
            fail!("--duration works with write, read and atomic: a SEND receiver needs the message count")
        }
        Some(s) if s.is_finite() && s > 0.0 && s <= 1e6 => Some(Duration::from_secs_f64(s)),
        Some(s) => fail!("bad --duration {s}: give a number of seconds above 0"),
    };
    let mut steps = Vec::new();
    for mode in modes {
        let base = a.iters.unwrap_or(match mode {
            Mode::Bw => 5000,
            Mode::Lat => 1000,
        });
        let sizes: Vec<u32> = if a.op == Op::Atomic {
            if a.size.is_some_and(|s| s != 8) {
                fail!("atomic operations move 8 bytes: use --size 8 or leave it out");
            }
            vec![8]
        } else if a.all {
            (1..=23)
                .map(|k| 1u32 << k)
                .filter(|&s| s <= ALL_MAX)
                .collect()
        } else {
            vec![a.size.unwrap_or(match mode {
                Mode::Bw => 65536,
                Mode::Lat => 2,
            })]
        };
        for size in sizes {
            if size == 0 {
                fail!("the message size must be at least 1 byte");
            }
            if size > 1 << 30 {
                fail!("messages larger than 1 GiB are not supported here");
            }
            let iters = if a.all && a.op != Op::Atomic {
                // Keep every size of a sweep to a bounded amount of data.
                let budget: u64 = match mode {
                    Mode::Bw => 1 << 30,
                    Mode::Lat => 128 << 20,
                };
                let floor = match mode {
                    Mode::Bw => 64,
                    Mode::Lat => 20,
                };
                (base as u64).min((budget / size as u64).max(floor)) as u32
            } else {
                base
            };
            steps.push(Step {
                mode,
                size,
                iters,
                duration: if mode == Mode::Bw { duration } else { None },
            });
        }
    }
    Ok(steps)
}

/// A TCP port nobody listens on right now.
fn free_tcp_port() -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// An rdma_cm port nobody holds right now (rdma_cm ports are UDP ports here: a
/// listener's rendezvous socket).
fn free_cm_port() -> Result<u16> {
    let s = std::net::UdpSocket::bind(("0.0.0.0", 0))?;
    Ok(s.local_addr()?.port())
}

/// Both ends on this machine: a child process serves, this one measures.
fn local(a: &PerfArgs) -> Result<()> {
    let port = if a.cm {
        free_cm_port()?
    } else {
        free_tcp_port()?
    };
    let exe = std::env::current_exe()?;
    let port_arg = port.to_string();
    let mut args = vec![
        "perf",
        a.op.name(),
        "--server",
        "--spawned",
        "-p",
        &port_arg,
    ];
    if a.cm {
        args.push("--cm");
    }
    let mut child = Command::new(exe)
        .args(args)
        // Each end opens its own device: one fixed port or capture file cannot
        // serve both (the client's capture sees both directions anyway).
        .env_remove("SOFTVERBS_PORT")
        .env_remove("SOFTVERBS_PCAP")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the local server: {e}"))?;
    let result = client(a, "127.0.0.1", port, Some(&mut child));
    match result {
        Ok(()) => match wait_child(&mut child, Duration::from_secs(30))? {
            Some(status) if status.success() => Ok(()),
            Some(status) => fail!("the local server failed ({status})"),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                fail!("the local server did not exit after the test")
            }
        },
        Err(e) => {
            if wait_child(&mut child, Duration::from_secs(2))?.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            Err(e)
        }
    }
}

fn wait_child(child: &mut Child, patience: Duration) -> Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The rdma_cm address `host:port` names.
fn cm_address(host: &str, port: u16) -> Result<SocketAddr> {
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => match addrs.next() {
            Some(a) => Ok(a),
            None => fail!("{host} has no address"),
        },
        Err(e) => fail!("cannot resolve {host}: {e}"),
    }
}

fn client(a: &PerfArgs, host: &str, port: u16, mut child: Option<&mut Child>) -> Result<()> {
    let steps = plan_steps(a)?;
    let give_up = || {
        let c = child.as_mut()?;
        match c.try_wait() {
            Ok(Some(status)) => Some(format!("the local server exited early ({status})")),
            _ => None,
        }
    };
    let (mut ctrl, ctx) = if a.cm {
        // The device must exist before the connection manager can connect anything: open
        // it on the address the kernel would send to the server from.
        let dst = cm_address(host, port)?;
        let ctx = open_device(crate::conn::route_source(dst.ip()), a.mtu)?;
        let link = CmLink::connect(&ctx, dst, Duration::from_secs(10), give_up)?;
        (Ctrl::over_cm(link), Some(ctx))
    } else {
        let ctrl = Ctrl::connect(host, port, Duration::from_secs(10), give_up)?;
        (ctrl, None)
    };
    let result = client_session(a, &mut ctrl, ctx, &steps);
    if let Err(e) = &result {
        ctrl.send_error(&e.to_string());
    }
    // The test QPs are disconnected (dropped with the session); the control connection
    // goes last, and the server waits for it.
    if let (Ok(()), Some(link)) = (&result, ctrl.cm_link()) {
        link.disconnect(cm::STEP)?;
    }
    result
}

fn client_session(
    a: &PerfArgs,
    ctrl: &mut Ctrl,
    ctx: Option<Context>,
    steps: &[Step],
) -> Result<()> {
    let ctx = match ctx {
        Some(ctx) => ctx,
        None => open_device(Some(ctrl.local_ip()?), a.mtu)?,
    };
    let mtu = ctx.query_port(1)?.active_mtu;
    let max_size = steps.iter().map(|s| s.size).max().unwrap_or(8) as usize;
    let plan = Plan {
        op: a.op,
        qps: a.qps,
        mtu: mtu.bytes(),
        // UD receives need room for the GRH area too.
        region: (max_size + if a.ud { 40 } else { 0 }).max(8).div_ceil(4096) * 4096,
        tx_depth: a.tx_depth,
        cq_mod: a.cq_mod.min(a.tx_depth),
        ud: a.ud,
    };
    if a.ud && max_size > mtu.bytes() as usize {
        fail!("UD messages are at most one MTU ({} bytes)", mtu.bytes());
    }
    plan.check()?;
    let mut side = Side::new(ctx, &plan)?;
    if a.cm {
        // The server has its buffers once it says OK; then one rdma_cm connection per QP.
        ctrl.send(&plan.line())?;
        ctrl.expect("OK")?;
        side.cm_connect(&plan, ctrl.peer()?)?;
    } else {
        side.create_qps(&plan)?;
        ctrl.send(&plan.line())?;
        for q in 0..side.qps.len() {
            ctrl.send(&side.local_info(q).to_perf())?;
        }
        ctrl.expect("OK")?;
        let mut remotes = Vec::with_capacity(side.qps.len());
        for _ in 0..side.qps.len() {
            remotes.push(QpInfo::from_perf(&ctrl.recv()?)?);
        }
        side.connect(remotes, mtu)?;
    }

    let mut report = Report::new(a, &plan, ctrl.peer()?.port());
    report.header(&side);
    let mut progress = Progress::new(a.progress);
    for (run, step) in (0u32..).zip(steps) {
        progress.start(format!(
            "{} {} {} bytes",
            a.op.name(),
            step.mode.name(),
            step.size
        ));
        match step.mode {
            Mode::Lat => {
                match a.op {
                    Op::Write => lat::write_prepare(&side, step.size),
                    Op::Send if plan.ud => {}
                    Op::Send => lat::send_prepare(&side, step.size, step.iters)?,
                    Op::Read | Op::Atomic => {}
                }
                run_cmd(ctrl, step)?;
                let mut resent = None;
                let mut samples = match a.op {
                    Op::Write => lat::write_lat(&side, step, true, &mut progress)?,
                    Op::Send if plan.ud => {
                        let r = udlat::client(&side, step, ud::tag(run), &mut progress)?;
                        resent = Some(r.resent);
                        r.samples
                    }
                    Op::Send => lat::send_lat(&side, step, true, &mut progress)?,
                    Op::Read | Op::Atomic => lat::rdma_lat(&side, a.op, step, &mut progress)?,
                };
                finish_cmd(ctrl)?;
                progress.finish();
                let stats = crate::stats::lat_stats(&mut samples);
                report.lat_row(LatRow {
                    bytes: step.size,
                    iters: step.iters,
                    stats,
                    resent,
                });
            }
            Mode::Bw => {
                run_cmd(ctrl, step)?;
                let tag = ud::tag(run);
                let r = bw::bw_client(&side, a.op, step, &plan, tag, &mut progress)?;
                finish_cmd(ctrl)?;
                progress.finish();
                report.bw_row(BwRow {
                    bytes: step.size,
                    iters: r.iters,
                    peak_mbs: r.peak_mbs,
                    avg_mbs: r.avg_mbs,
                    msg_rate_mpps: r.msg_rate_mpps,
                    seconds: r.seconds,
                    received: r.received,
                    lost: r
                        .received
                        .map(|got| (r.iters * plan.qps as u64).saturating_sub(got)),
                });
            }
        }
    }
    ctrl.send("BYE")?;
    ctrl.expect("BYE")?;
    report.finish(&side)?;
    Ok(())
}

fn run_cmd(ctrl: &mut Ctrl, step: &Step) -> Result<()> {
    ctrl.send(&format!(
        "RUN {} {} {}",
        step.mode.name(),
        step.size,
        step.iters
    ))?;
    ctrl.expect("GO")
}

fn finish_cmd(ctrl: &mut Ctrl) -> Result<()> {
    ctrl.send("FIN")?;
    ctrl.expect("DONE")
}

fn server(a: &PerfArgs) -> Result<()> {
    if a.cm {
        return server_cm(a);
    }
    if !a.spawned {
        eprintln!(
            "softverbs perf {}: waiting for a client on TCP port {}",
            a.op.name(),
            a.port
        );
    }
    let mut ctrl = Ctrl::accept(a.port)?;
    let result = server_session(a, &mut ctrl, None);
    server_result(a, &mut ctrl, result)
}

/// Reports a server's failure to its client.
fn server_result(a: &PerfArgs, ctrl: &mut Ctrl, result: Result<()>) -> Result<()> {
    if let Err(e) = &result {
        ctrl.send_error(&e.to_string());
        if a.spawned {
            // The client that started us prints it (or its own error).
            return Err(Box::new(crate::Quiet));
        }
    }
    result
}

/// What a `--cm` server listens with.
struct CmServer {
    ctx: Context,
    listener: RcListener,
}

/// `--cm`: listen at rdma_cm port PORT of every address (IPv6 and IPv4), take one
/// client's control connection, then its QPs' connections.
fn server_cm(a: &PerfArgs) -> Result<()> {
    // SOFTVERBS_ADDR places the device, as for every softverbs program (the connection
    // manager answers from the device's address).
    let ctx = open_device(None, a.mtu)?;
    let v6 = SocketAddr::new(IpAddr::from([0u16; 8]), a.port);
    let listener = match RcListener::bind(&ctx, v6, 16) {
        Ok(l) => l,
        // No IPv6 here: IPv4 only.
        Err(softverbs::cm::CmError::Bind { .. }) => {
            RcListener::bind(&ctx, SocketAddr::new(IpAddr::from([0u8; 4]), a.port), 16)?
        }
        Err(e) => fail!("cannot listen at rdma_cm port {}: {e}", a.port),
    };
    if !a.spawned {
        eprintln!(
            "softverbs perf {}: waiting for a client on rdma_cm port {}",
            a.op.name(),
            a.port
        );
    }
    let link = loop {
        match CmLink::accept(&ctx, &listener, Duration::from_secs(3600)) {
            Ok(l) => break l,
            // A request that went away before it was accepted; wait for the next.
            Err(e) if e.downcast_ref::<softverbs::cm::CmError>().is_some() => continue,
            Err(e) => return Err(e),
        }
    };
    let mut ctrl = Ctrl::over_cm(link);
    let result = server_session(a, &mut ctrl, Some(CmServer { ctx, listener }));
    let result = server_result(a, &mut ctrl, result);
    if result.is_ok() {
        if let Some(link) = ctrl.cm_link() {
            // The client disconnects once it has read BYE.
            link.wait_disconnected(cm::STEP)?;
        }
    }
    result
}

fn server_session(a: &PerfArgs, ctrl: &mut Ctrl, cm_server: Option<CmServer>) -> Result<()> {
    let plan = Plan::parse(&ctrl.recv()?)?;
    if plan.op != a.op {
        fail!(
            "the client measures {} but this server was started for {}",
            plan.op.name(),
            a.op.name()
        );
    }
    let mut side;
    // Kept until the session ends: the UD service the client resolves.
    let mut _ud_service = None;
    if let Some(srv) = cm_server {
        let mtu = srv.ctx.query_port(1)?.active_mtu;
        if plan.ud && mtu.bytes() < plan.mtu {
            fail!(
                "UD messages of up to {} bytes need that MTU here too (this device: {})",
                plan.mtu,
                mtu.bytes()
            );
        }
        side = Side::new(srv.ctx.clone(), &plan)?;
        let ud = if plan.ud {
            // The UDP port space: one process may hold a port in both spaces.
            let channel = EventChannel::new(&srv.ctx)?;
            let id = CmId::new(&channel, PortSpace::Udp)?;
            let at = srv
                .listener
                .local_addr()
                .unwrap_or_else(|| SocketAddr::new(IpAddr::from([0u8; 4]), a.port));
            id.bind(at)?;
            id.listen(16)?;
            Some(id)
        } else {
            None
        };
        ctrl.send("OK")?;
        side.cm_accept(&plan, &srv.listener, ud.as_ref())?;
        _ud_service = ud;
    } else {
        let mut remotes = Vec::with_capacity(plan.qps as usize);
        for _ in 0..plan.qps {
            remotes.push(QpInfo::from_perf(&ctrl.recv()?)?);
        }
        let ctx = open_device(Some(ctrl.local_ip()?), Some(plan.mtu))?;
        // Never more than this side's link carries.
        let mtu = crate::conn::parse_mtu(plan.mtu)?.min(ctx.query_port(1)?.active_mtu);
        side = Side::new(ctx, &plan)?;
        side.create_qps(&plan)?;
        side.connect(remotes, mtu)?;
        ctrl.send("OK")?;
        for q in 0..side.qps.len() {
            ctrl.send(&side.local_info(q).to_perf())?;
        }
    }
    println!(
        "softverbs perf {} server: {} QP(s), MTU {}, client {}",
        plan.op.name(),
        plan.qps,
        plan.mtu,
        ctrl.peer()?
    );
    let mut progress = Progress::new(false);
    // Measurements so far (the client counts them too: they tag UD runs).
    let mut runs = 0u32;
    loop {
        let line = ctrl.recv()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["BYE"] => {
                ctrl.send("BYE")?;
                return Ok(());
            }
            ["RUN", mode, size, iters] => {
                let mode = match *mode {
                    "bw" => Mode::Bw,
                    "lat" => Mode::Lat,
                    _ => fail!("unknown mode {mode:?} from the client"),
                };
                let step = Step {
                    mode,
                    size: size.parse().map_err(|_| "bad size from the client")?,
                    iters: iters
                        .parse()
                        .map_err(|_| "bad iterations from the client")?,
                    duration: None,
                };
                if step.size as usize > side.region || step.size == 0 || step.iters == 0 {
                    fail!("bad step from the client: {line:?}");
                }
                server_step(&side, ctrl, plan.op, &step, ud::tag(runs), &mut progress)?;
                runs = runs.wrapping_add(1);
            }
            _ => fail!("unexpected message from the client: {line:?}"),
        }
    }
}

fn server_step(
    side: &Side,
    ctrl: &mut Ctrl,
    op: Op,
    step: &Step,
    tag: u32,
    progress: &mut Progress,
) -> Result<()> {
    match (step.mode, op) {
        (Mode::Bw, Op::Send) if side.qps.iter().any(|e| e.ud.is_some()) => {
            ud::server_prepare(side)?;
            ctrl.send("GO")?;
            ud::serve_until_fin(ctrl, |fin| ud::server_receive(side, tag, fin))?;
            return ctrl.send("DONE");
        }
        (Mode::Lat, Op::Send) if side.qps.iter().any(|e| e.ud.is_some()) => {
            return udlat::server(side, ctrl, step, tag);
        }
        (Mode::Bw, Op::Send) => {
            let mut posted = bw::recv_prepare(side, step)?;
            ctrl.send("GO")?;
            bw::recv_server(side, step, &mut posted)?;
        }
        (Mode::Lat, Op::Write) => {
            lat::write_prepare(side, step.size);
            ctrl.send("GO")?;
            lat::write_lat(side, step, false, progress)?;
        }
        (Mode::Lat, Op::Send) => {
            lat::send_prepare(side, step.size, step.iters)?;
            ctrl.send("GO")?;
            lat::send_lat(side, step, false, progress)?;
        }
        // The client does it all: one-sided operations, or SENDs we receive above.
        (Mode::Bw, _) | (Mode::Lat, Op::Read | Op::Atomic) => ctrl.send("GO")?,
    }
    ctrl.expect("FIN")?;
    ctrl.send("DONE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips() {
        let p = Plan {
            op: Op::Atomic,
            qps: 3,
            mtu: 1024,
            region: 8192,
            tx_depth: 16,
            cq_mod: 4,
            ud: false,
        };
        assert_eq!(Plan::parse(&p.line()).unwrap(), p);
        let ud = Plan {
            op: Op::Send,
            ud: true,
            ..p
        };
        assert_eq!(Plan::parse(&ud.line()).unwrap(), ud);
        assert!(
            Plan::parse(&Plan { ud: true, ..p }.line()).is_err(),
            "only SEND over UD"
        );
        assert!(Plan::parse("HELLO").is_err());
        assert!(Plan::parse(&format!("{MAGIC} qps=0")).is_err());
    }
}
