//! `softverbs rping`: what rdmacm-utils' rping does, over the connection manager.
//!
//! The client connects to the server's rdma_cm address (TCP port space, default port 7174),
//! then, each iteration: fills its source buffer with the rping pattern and SENDs the
//! buffer's address, rkey and length (16 bytes: BE64, BE32, BE32); the server RDMA READs
//! that buffer into its own and SENDs "go"; the client SENDs where its sink buffer is; the
//! server RDMA WRITEs what it read there and SENDs "done". With `--validate` the client
//! checks the sink against the source. Both sides disconnect at the end.

use crate::conn::{all_access, check_wc};
use crate::{fail, Result, RpingArgs};
use softverbs::cm::{ConnParam, RcConnection, RcListener, RcOptions};
use softverbs::{
    Config, Context, Cq, Device, Mr, PageAligned, Pd, QpCap, SendOp, SendWr, WorkCompletion,
};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long one step (a completion, a connection) may take.
const STEP: Duration = Duration::from_secs(20);

/// The bytes of rping's ping pattern: "rdma-ping-N: " then printable characters rotating
/// with N.
fn pattern(iter: u32, len: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{iter}: ").into_bytes();
    let mut c = (iter % 94) as u8;
    while v.len() < len {
        v.push(b'!' + c);
        c = (c + 1) % 94;
    }
    v.truncate(len);
    v
}

/// One side's buffers: `size` bytes of data (client: source then sink), then a 16-byte
/// send slot and a 16-byte receive slot for the control messages.
struct Bufs {
    mr: Mr<PageAligned>,
    size: usize,
    data_len: usize,
}

impl Bufs {
    fn new(pd: &Pd, size: usize, regions: usize) -> Result<Bufs> {
        let data_len = size * regions;
        Ok(Bufs {
            mr: pd.reg_mr(PageAligned::new(data_len + 32), all_access())?,
            size,
            data_len,
        })
    }
    fn tx(&self) -> usize {
        self.data_len
    }
    fn rx(&self) -> usize {
        self.data_len + 16
    }
}

fn wait(cq: &Cq) -> Result<WorkCompletion> {
    wait_on(|wc| cq.poll(wc), STEP)
}

/// Polls `poll` (a CQ's poll) until it gives one completion, for at most `step`; the
/// completion must be a success.
fn wait_on(
    mut poll: impl FnMut(&mut [WorkCompletion]) -> usize,
    step: Duration,
) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default(); 1];
    let end = Instant::now() + step;
    let mut spins = 0u32;
    loop {
        if poll(&mut wc) == 1 {
            check_wc(&wc[0])?;
            return Ok(wc[0]);
        }
        if Instant::now() > end {
            fail!("no completion within {step:?}");
        }
        spins += 1;
        if spins > 1000 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn send_ctrl(conn: &RcConnection, b: &Bufs, msg: [u8; 16]) -> Result<()> {
    b.mr.write(b.tx(), &msg);
    let sge = [b.mr.sge(b.tx(), 16)];
    conn.qp.post_send(&SendWr::new(1, SendOp::Send, &sge))?;
    Ok(())
}

fn post_ctrl_recv(conn: &RcConnection, b: &Bufs) -> Result<()> {
    conn.qp.post_recv(2, &[b.mr.sge(b.rx(), 16)])?;
    Ok(())
}

fn read_ctrl(b: &Bufs) -> (u64, u32, u32) {
    let mut m = [0u8; 16];
    b.mr.read(b.rx(), &mut m);
    (
        u64::from_be_bytes(m[..8].try_into().unwrap_or_default()),
        u32::from_be_bytes(m[8..12].try_into().unwrap_or_default()),
        u32::from_be_bytes(m[12..].try_into().unwrap_or_default()),
    )
}

fn info(b: &Bufs, offset: usize) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&(b.mr.addr() + offset as u64).to_be_bytes());
    m[8..12].copy_from_slice(&b.mr.rkey().to_be_bytes());
    m[12..].copy_from_slice(&(b.size as u32).to_be_bytes());
    m
}

/// Waits for the completions of one send and one receive, in either order.
fn wait_send_and_recv(cq: &Cq) -> Result<()> {
    let (mut sent, mut got) = (false, false);
    while !(sent && got) {
        let wc = wait(cq)?;
        match wc.wr_id {
            1 => sent = true,
            2 => got = true,
            _ => {}
        }
    }
    Ok(())
}

/// The rdma_cm address `host:port` names (IPv4 or IPv6).
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    match (host, port).to_socket_addrs()?.next() {
        Some(a) => Ok(a),
        None => fail!("{host} has no address"),
    }
}

fn open() -> Result<Context> {
    Ok(Device::with_config("softverbs0", Config::from_env()?).open()?)
}

fn opts() -> RcOptions {
    RcOptions {
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        param: Some(ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }),
        timeout: STEP,
    }
}

pub fn run(a: &RpingArgs) -> Result<()> {
    if a.size < 16 || a.size > 65535 {
        fail!("size must be 16 to 65535 bytes (as rping's -S)");
    }
    if a.server {
        server(a)
    } else {
        client(a)
    }
}

fn server(a: &RpingArgs) -> Result<()> {
    let ctx = open()?;
    let ip: IpAddr = match &a.addr {
        Some(h) => resolve(h, a.port)?.ip(),
        None => "0.0.0.0".parse()?,
    };
    let listener = RcListener::bind(&ctx, SocketAddr::new(ip, a.port), 8)?;
    if a.verbose {
        eprintln!("rping server listening at {}", SocketAddr::new(ip, a.port));
    }
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32, None)?;
    // Room for any client size (rping: up to 65535 bytes).
    let b = Bufs::new(&pd, 65535, 1)?;
    // One client, as rping without -P: wait as long as it takes to come.
    let (id, pd_data) = loop {
        match listener.get_request(Duration::from_secs(3600)) {
            Ok(r) => break r,
            Err(softverbs::cm::CmError::Unexpected { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // The receive for the client's first message is posted before the REP goes out, and
    // each next one before "done": a SEND that found none would wait out the RNR timer.
    let conn = softverbs::cm::accept_request_with(id, pd_data, &pd, &cq, &opts(), |qp| {
        qp.post_recv(2, &[b.mr.sge(b.rx(), 16)])
    })?;
    let mut n = 0u64;
    // Whether the receive for the client's next message already completed while the
    // server waited for something else (its "done" SEND's completion can come after
    // the client's next ping when the ACK of "done" was lost and had to be asked for
    // again: the client goes on as soon as "done" arrives).
    let mut recv_done = false;
    loop {
        // The client's source buffer, or the end.
        if !recv_done && !wait_recv_or_disconnect(&conn, &cq)? {
            break;
        }
        let (addr, rkey, len) = read_ctrl(&b);
        let len = len.min(b.size as u32);
        let sge = [b.mr.sge(0, len)];
        conn.qp.post_recv(2, &[b.mr.sge(b.rx(), 16)])?;
        conn.qp.post_send(&SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey: softverbs::Rkey(rkey),
            },
            &sge,
        ))?;
        wait_for_id(&cq, 3)?;
        if a.verbose {
            let mut data = vec![0u8; len as usize];
            b.mr.read(0, &mut data);
            println!("server ping data: {}", String::from_utf8_lossy(&data));
        }
        send_ctrl(&conn, &b, *b"go ahead\0\0\0\0\0\0\0\0")?;
        wait_send_and_recv(&cq)?;
        let (addr, rkey, len) = read_ctrl(&b);
        let sge = [b.mr.sge(0, len.min(b.size as u32))];
        conn.qp.post_send(&SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey: softverbs::Rkey(rkey),
            },
            &sge,
        ))?;
        wait_for_id(&cq, 3)?;
        post_ctrl_recv(&conn, &b)?;
        send_ctrl(&conn, &b, *b"done\0\0\0\0\0\0\0\0\0\0\0\0")?;
        let sent = wait_done_sent(&conn, &cq)?;
        n += 1;
        match sent {
            DoneSent::Sent { recv_done: r } => recv_done = r,
            DoneSent::ClientLeft => break,
        }
    }
    if a.verbose {
        eprintln!("rping server: {n} pings, client disconnected");
    }
    Ok(())
}

/// Waits for completion `wr_id` (other successful completions pass).
fn wait_for_id(cq: &Cq, wr_id: u64) -> Result<()> {
    loop {
        if wait(cq)?.wr_id == wr_id {
            return Ok(());
        }
    }
}

/// What became of the server's "done" SEND.
#[derive(Debug, PartialEq, Eq)]
enum DoneSent {
    /// It completed; `recv_done`: the client's next message completed the posted
    /// receive first (the ACK of "done" was lost and asked for again, while the
    /// client, which had "done", went on at once).
    Sent { recv_done: bool },
    /// The client disconnected before it completed: it had "done" and finished, and
    /// the ACK of "done" was lost (its QP, gone to error, no longer answers the SEND
    /// sent again).
    ClientLeft,
}

/// Waits for the "done" SEND (wr_id 1), keeping a receive (wr_id 2) that completes
/// meanwhile and watching for the client's disconnect.
fn wait_done_sent(conn: &RcConnection, cq: &Cq) -> Result<DoneSent> {
    let left = || {
        let gone = conn
            .id()
            .channel()
            .try_get_event()
            .is_some_and(|ev| ev.kind() == softverbs::cm::CmEventKind::Disconnected);
        if gone {
            // Answer the DREQ.
            let _ = conn.id().disconnect();
        }
        gone
    };
    wait_done_sent_on(|wc| cq.poll(wc), left, STEP)
}

fn wait_done_sent_on(
    mut poll: impl FnMut(&mut [WorkCompletion]) -> usize,
    mut client_left: impl FnMut() -> bool,
    step: Duration,
) -> Result<DoneSent> {
    let mut wc = [WorkCompletion::default(); 1];
    let mut recv_done = false;
    let end = Instant::now() + step;
    loop {
        if poll(&mut wc) == 1 {
            if wc[0].status != softverbs::WcStatus::Success && client_left() {
                return Ok(DoneSent::ClientLeft);
            }
            check_wc(&wc[0])?;
            match wc[0].wr_id {
                1 => return Ok(DoneSent::Sent { recv_done }),
                2 => recv_done = true,
                _ => {}
            }
            continue;
        }
        if client_left() {
            return Ok(DoneSent::ClientLeft);
        }
        if Instant::now() > end {
            fail!("no completion within {step:?}");
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Waits for the posted receive: `true` when it completed, `false` when the client
/// disconnected (the receive then flushes).
fn wait_recv_or_disconnect(conn: &RcConnection, cq: &Cq) -> Result<bool> {
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            if wc[0].status != softverbs::WcStatus::Success {
                return Ok(false);
            }
            if wc[0].wr_id == 2 {
                return Ok(true);
            }
            continue;
        }
        if let Some(ev) = conn.id().channel().try_get_event() {
            if ev.kind() == softverbs::cm::CmEventKind::Disconnected {
                let _ = conn.id().disconnect();
                return Ok(false);
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn client(a: &RpingArgs) -> Result<()> {
    let Some(host) = &a.addr else {
        fail!("the client needs the server's address (-a)");
    };
    let dst = resolve(host, a.port)?;
    let ctx = open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32, None)?;
    let size = a.size as usize;
    let b = Bufs::new(&pd, size, 2)?;
    let conn = softverbs::cm::connect_rc(&pd, &cq, dst, &opts())?;
    let count = if a.count == 0 { u32::MAX } else { a.count };
    for i in 0..count {
        let ping = pattern(i, size);
        b.mr.write(0, &ping);
        b.mr.write(size, &vec![0u8; size]);
        post_ctrl_recv(&conn, &b)?;
        send_ctrl(&conn, &b, info(&b, 0))?;
        wait_send_and_recv(&cq)?; // "go ahead": the server read our source
        post_ctrl_recv(&conn, &b)?;
        send_ctrl(&conn, &b, info(&b, size))?;
        wait_send_and_recv(&cq)?; // "done": the server wrote our sink
        if a.validate {
            let mut got = vec![0u8; size];
            b.mr.read(size, &mut got);
            if got != ping {
                fail!("data mismatch in ping {i}");
            }
        }
        if a.verbose {
            println!("ping data: {}", String::from_utf8_lossy(&ping));
        }
    }
    conn.disconnect(STEP)?;
    if a.verbose {
        eprintln!("rping client: {count} pings done");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A CQ that gives `completions` in order, then nothing.
    fn scripted(
        completions: &[u64],
    ) -> (
        VecDeque<u64>,
        impl FnMut(&mut VecDeque<u64>, &mut [WorkCompletion]) -> usize,
    ) {
        let poll = |q: &mut VecDeque<u64>, wc: &mut [WorkCompletion]| match q.pop_front() {
            Some(id) => {
                wc[0] = WorkCompletion {
                    wr_id: id,
                    ..WorkCompletion::default()
                };
                1
            }
            None => 0,
        };
        (completions.iter().copied().collect(), poll)
    }

    fn failed(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status: softverbs::WcStatus::RetryExcErr,
            ..WorkCompletion::default()
        }
    }

    /// The client's next ping can complete the server's receive before the server's
    /// "done" SEND completes (the ACK of "done" was lost and asked for again): waiting
    /// for the SEND must keep that receive, or the server waits for it forever while
    /// the client waits for "go ahead" (the hang of `rping_with_two_percent_loss`).
    #[test]
    fn a_receive_completing_before_the_done_send_is_kept() {
        let step = Duration::from_millis(50);
        let (mut q, mut poll) = scripted(&[2, 1]);
        let got = wait_done_sent_on(|wc| poll(&mut q, wc), || false, step);
        assert_eq!(got.unwrap(), DoneSent::Sent { recv_done: true });
        assert!(q.is_empty());
        // In the usual order the receive is still to come.
        let (mut q, mut poll) = scripted(&[1, 2]);
        let got = wait_done_sent_on(|wc| poll(&mut q, wc), || false, step);
        assert_eq!(got.unwrap(), DoneSent::Sent { recv_done: false });
        assert_eq!(q, [2]);
        // Other completions pass without counting as the receive.
        let (mut q, mut poll) = scripted(&[3, 1]);
        let got = wait_done_sent_on(|wc| poll(&mut q, wc), || false, step);
        assert_eq!(got.unwrap(), DoneSent::Sent { recv_done: false });
        // Nothing comes: a clear error, not a hang.
        let (mut q, mut poll) = scripted(&[]);
        let err = wait_done_sent_on(|wc| poll(&mut q, wc), || false, Duration::from_millis(5));
        assert!(err.unwrap_err().to_string().contains("no completion"));
    }

    /// After the last ping the client disconnects as soon as "done" is in; if its ACK
    /// of "done" was lost, the SEND sent again finds its QP gone and fails: that is
    /// the client leaving, not an error of the server.
    #[test]
    fn the_done_send_failing_after_the_client_left_ends_the_session() {
        let step = Duration::from_millis(50);
        let mut fed = false;
        let poll = |wc: &mut [WorkCompletion]| {
            if std::mem::replace(&mut fed, true) {
                0
            } else {
                wc[0] = failed(1);
                1
            }
        };
        let got = wait_done_sent_on(poll, || true, step);
        assert_eq!(got.unwrap(), DoneSent::ClientLeft);
        // The client still there: the failure is reported.
        let mut fed = false;
        let poll = |wc: &mut [WorkCompletion]| {
            if std::mem::replace(&mut fed, true) {
                0
            } else {
                wc[0] = failed(1);
                1
            }
        };
        let err = wait_done_sent_on(poll, || false, step).unwrap_err();
        assert!(err.to_string().contains("RetryExcErr"), "{err}");
        // A disconnect while nothing completed ends the wait too.
        let got = wait_done_sent_on(|_: &mut [WorkCompletion]| 0, || true, step);
        assert_eq!(got.unwrap(), DoneSent::ClientLeft);
    }
}
