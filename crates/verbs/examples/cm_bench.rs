//! Connection set-up through the connection manager on loopback, against TCP connect in the
//! same run (run by `bench/cm.sh`).
//!
//! - sequential: N connects one after another (resolve address, resolve route, create the
//!   QP, REQ / REP / RTU until ESTABLISHED), each closed before the next; median and p99;
//! - concurrent: C clients connect at once (a thread each); connects per second over the
//!   whole batch, the batch run R times (one batch alone is at the mercy of the
//!   scheduler on a shared machine): the median rate and the slowest and fastest batch.
//!
//! Both measured twice: with the listening device in this process (each device its own
//! 127.83.x.y endpoint and progress thread), and across two processes, the listener in a
//! child (`cm_bench --serve`) as real programs meet. TCP connect to a listener in the same
//! place is measured beside each.
//!
//! Usage: cm_bench [N] [C] [R]   (defaults 1000, 100, 10)

use softverbs::cm::{connect_rc, CmEventKind, CmId, EventChannel, PortSpace, RcOptions};
use softverbs::{Config, Context, Cq, Device, Pd, QpCap};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut t: Vec<Duration>) {
    t.sort();
    println!(
        "{what:<48} n={:<5} median {:>8.1} us  p99 {:>8.1} us",
        t.len(),
        percentile(&t, 0.5).as_secs_f64() * 1e6,
        percentile(&t, 0.99).as_secs_f64() * 1e6
    );
}

/// Connects per second of batches of `c` connects that took `took` each: the median
/// batch, then the slowest and fastest.
fn report_rate(what: &str, c: usize, mut took: Vec<Duration>) {
    took.sort();
    let rate = |d: Duration| c as f64 / d.as_secs_f64();
    println!(
        "{what:<48} {:>6.0} connects/s median of {} batches ({:.0} .. {:.0})",
        rate(percentile(&took, 0.5)),
        took.len(),
        rate(took[took.len() - 1]),
        rate(took[0]),
    );
}

fn small_cap() -> QpCap {
    QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// A server that accepts every request on `ctx` at once (no waiting for the RTU), until
/// `stop`.
fn serve(ctx: Context, stop: Arc<AtomicBool>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let channel = EventChannel::new(&ctx).unwrap();
    let listener = CmId::new(&channel, PortSpace::Tcp).unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    listener.listen(0).unwrap();
    let at = listener.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096, None).unwrap();
        let mut live: Vec<CmId> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let Some(mut ev) = channel.get_event_timeout(Duration::from_millis(50)) else {
                continue;
            };
            match ev.kind() {
                CmEventKind::ConnectRequest => {
                    let id = ev.take_request().unwrap();
                    id.create_qp(&pd, &cq, small_cap()).unwrap();
                    id.accept(None).unwrap();
                    live.push(id);
                }
                CmEventKind::Disconnected => {
                    let h = ev.id();
                    live.retain(|i| i.handle() != h);
                }
                _ => {}
            }
        }
        drop(listener);
    });
    (at, h)
}

/// A TCP listener that accepts until `stop` (then one more connect wakes it).
fn tcp_serve(stop: Arc<AtomicBool>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = tcp.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in tcp.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            keep.push(s);
            if keep.len() > 256 {
                keep.clear();
            }
        }
    });
    (at, h)
}

/// N sequential and R batches of C concurrent rdma_cm connects to `at`.
fn cm_rounds(pd: &Pd, cq: &Cq, at: SocketAddr, [n, c, r]: [usize; 3], place: &str) {
    let opts = RcOptions {
        cap: small_cap(),
        ..RcOptions::default()
    };
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let conn = connect_rc(pd, cq, at, &opts).expect("connect");
        times.push(t.elapsed());
        drop(conn);
    }
    report(&format!("rdma_cm connect, sequential ({place})"), times);
    let batches = (0..r)
        .map(|_| {
            let start = Instant::now();
            let conns: Vec<_> = (0..c)
                .map(|_| {
                    let (pd, cq, opts) = (pd.clone(), cq.clone(), opts.clone());
                    std::thread::spawn(move || connect_rc(&pd, &cq, at, &opts).expect("connect"))
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let took = start.elapsed();
            drop(conns);
            took
        })
        .collect();
    report_rate(
        &format!("rdma_cm {c} concurrent connects ({place})"),
        c,
        batches,
    );
}

/// N sequential and R batches of C concurrent TCP connects to `at`.
fn tcp_rounds(at: SocketAddr, [n, c, r]: [usize; 3], place: &str) {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let s = TcpStream::connect(at).unwrap();
        times.push(t.elapsed());
        drop(s);
    }
    report(&format!("TCP connect, sequential ({place})"), times);
    let batches = (0..r)
        .map(|_| {
            let start = Instant::now();
            let socks: Vec<_> = (0..c)
                .map(|_| std::thread::spawn(move || TcpStream::connect(at).unwrap()))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let took = start.elapsed();
            drop(socks);
            took
        })
        .collect();
    report_rate(
        &format!("TCP {c} concurrent connects ({place})"),
        c,
        batches,
    );
}

/// The child of a two-process run: serves rdma_cm and TCP, prints both addresses, and
/// leaves when its stdin closes.
fn serve_child() {
    let stop = Arc::new(AtomicBool::new(false));
    let ctx = Device::with_config("bench-s", Config::default())
        .open()
        .unwrap();
    let (cm_at, cm) = serve(ctx, Arc::clone(&stop));
    let (tcp_at, tcp) = tcp_serve(Arc::clone(&stop));
    println!("cm {cm_at} tcp {tcp_at}");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    stop.store(true, Ordering::Relaxed);
    let _ = TcpStream::connect(tcp_at);
    let _ = tcp.join();
    let _ = cm.join();
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--serve") {
        return serve_child();
    }
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let c: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let r: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10)
        .max(1);
    let counts = [n.max(1), c, r];

    let client = Device::with_config("bench-c", Config::default())
        .open()
        .unwrap();
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4096, None).unwrap();

    // One process: the listening device lives here too.
    let stop = Arc::new(AtomicBool::new(false));
    let server = Device::with_config("bench-s", Config::default())
        .open()
        .unwrap();
    let (at, h) = serve(server, Arc::clone(&stop));
    cm_rounds(&pd, &cq, at, counts, "one process");
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    let tstop = Arc::new(AtomicBool::new(false));
    let (tat, acceptor) = tcp_serve(Arc::clone(&tstop));
    tcp_rounds(tat, counts, "one process");
    tstop.store(true, Ordering::Relaxed);
    let _ = TcpStream::connect(tat);
    let _ = acceptor.join();

    // Two processes: the listeners live in a child.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the serving child");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let (cm_at, tcp_at): (SocketAddr, SocketAddr) = match words.as_slice() {
        ["cm", cm, "tcp", tcp] => (cm.parse().unwrap(), tcp.parse().unwrap()),
        _ => panic!("the child said {line:?}"),
    };
    cm_rounds(&pd, &cq, cm_at, counts, "two processes");
    tcp_rounds(tcp_at, counts, "two processes");
    drop(child.stdin.take());
    let _ = child.wait();
}
