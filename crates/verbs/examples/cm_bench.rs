//! Connection set-up through the connection manager on loopback, against TCP connect in the
//! same run (run by `bench/cm.sh`).
//!
//! - sequential: N connects one after another (resolve address, resolve route, create the
//!   QP, REQ / REP / RTU until ESTABLISHED), each closed before the next; median and p99;
//! - concurrent: C clients connect at once; connects per second over the whole batch.
//!
//! Both devices live in this process (each its own 127.83.x.y endpoint and progress thread).
//! Usage: cm_bench [N] [C]

use softverbs::cm::{connect_rc, CmEventKind, CmId, EventChannel, PortSpace, RcOptions};
use softverbs::{Config, Context, Device, QpCap};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
        "{what:<28} n={:<5} median {:>8.1} us  p99 {:>8.1} us",
        t.len(),
        percentile(&t, 0.5).as_secs_f64() * 1e6,
        percentile(&t, 0.99).as_secs_f64() * 1e6
    );
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
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        while !stop.load(Ordering::Relaxed) {
            let Some(mut ev) = channel.get_event_timeout(Duration::from_millis(50)) else {
                continue;
            };
            match ev.kind() {
                CmEventKind::ConnectRequest => {
                    let id = ev.take_request().unwrap();
                    id.create_qp(&pd, &cq, cap).unwrap();
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

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let c: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);

    let stop = Arc::new(AtomicBool::new(false));
    let server = Device::with_config("bench-s", Config::default())
        .open()
        .unwrap();
    let (at, h) = serve(server, Arc::clone(&stop));
    let client = Device::with_config("bench-c", Config::default())
        .open()
        .unwrap();
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4096, None).unwrap();
    let opts = RcOptions {
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..RcOptions::default()
    };

    // Sequential.
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let conn = connect_rc(&pd, &cq, at, &opts).expect("connect");
        times.push(t.elapsed());
        drop(conn);
    }
    report("rdma_cm connect (sequential)", times);

    // Concurrent: C threads connect at once.
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
    println!(
        "rdma_cm {c} concurrent connects: {:.1} ms, {:.0} connects/s",
        took.as_secs_f64() * 1e3,
        c as f64 / took.as_secs_f64()
    );
    drop(conns);

    // TCP on loopback, same machine, same run.
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tat = tcp.local_addr().unwrap();
    let tstop = Arc::new(AtomicBool::new(false));
    let ts = Arc::clone(&tstop);
    let acceptor = std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in tcp.incoming() {
            if ts.load(Ordering::Relaxed) {
                break;
            }
            keep.push(s);
            if keep.len() > 256 {
                keep.clear();
            }
        }
    });
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let s = TcpStream::connect(tat).unwrap();
        times.push(t.elapsed());
        drop(s);
    }
    report("TCP connect (sequential)", times);
    let start = Instant::now();
    let socks: Vec<_> = (0..c)
        .map(|_| std::thread::spawn(move || TcpStream::connect(tat).unwrap()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let took = start.elapsed();
    println!(
        "TCP {c} concurrent connects: {:.1} ms, {:.0} connects/s",
        took.as_secs_f64() * 1e3,
        c as f64 / took.as_secs_f64()
    );
    drop(socks);
    tstop.store(true, Ordering::Relaxed);
    let _ = TcpStream::connect(tat);
    let _ = acceptor.join();
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
}
