//! `softverbs rstream`: librdmacm's rstream example over softverbs' own rsocket streams
//! ([`softverbs::sock`]), with rstream's options, test schedule, data pattern and output,
//! so either side can be Debian's rstream.
//!
//! Without `-s` it is the server. Each test first syncs (16 bytes client → server, then
//! back), then for every iteration the client sends `count` transfers of `size` bytes and
//! the server sends as many back. Without `-S`/`-C`/`-I` it runs rstream's schedule: a
//! latency connection (1 transfer each way, many iterations) over the sizes, then a
//! bandwidth connection (1 iteration, many transfers). `-T v` fills every send with a byte
//! counter and checks every receive against it, as rstream's format_buf / verify_buf.

use crate::{fail, Result};
use clap::Args;
use softverbs::sock::{RdmaListener, RdmaStream, StreamConfig, StreamOptions};
use softverbs::{Config, Context, Device};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct RstreamArgs {
    /// Server address to connect to (client mode); without it, run the server.
    #[arg(short = 's')]
    server: Option<String>,
    /// Address to listen at (server; default: all).
    #[arg(short = 'b')]
    bind: Option<String>,
    /// rdma_cm port.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Transfer size in bytes, or "all" for every size of rstream's table.
    #[arg(short = 'S')]
    size: Option<String>,
    /// Transfers per iteration.
    #[arg(short = 'C')]
    count: Option<u32>,
    /// Iterations.
    #[arg(short = 'I')]
    iterations: Option<u32>,
    /// Socket buffer size (rsockets use twice this for each ring; default: half of
    /// rsockets' default ring, `softverbs_sock::DEFAULT_RING`, as librdmacm's rstream sets
    /// no size without -B).
    #[arg(short = 'B')]
    buffer: Option<u32>,
    /// Inline size for the latency tests.
    #[arg(short = 'i', default_value_t = 64)]
    inline: u32,
    /// Keep-alive interval in seconds.
    #[arg(short = 'k')]
    keepalive: Option<u64>,
    /// Test options: v (verify), b (blocking), n (non-blocking, the default).
    #[arg(short = 'T')]
    test: Vec<String>,
}

/// rstream's size table: (size, shown only with `-S all`).
const SIZES: &[(u32, bool)] = &[
    (1 << 6, false),
    (1 << 7, true),
    ((1 << 7) + (1 << 6), true),
    (1 << 8, true),
    ((1 << 8) + (1 << 7), true),
    (1 << 9, true),
    ((1 << 9) + (1 << 8), true),
    (1 << 10, true),
    ((1 << 10) + (1 << 9), true),
    (1 << 11, true),
    ((1 << 11) + (1 << 10), true),
    (1 << 12, false),
    ((1 << 12) + (1 << 11), true),
    (1 << 13, true),
    ((1 << 13) + (1 << 12), true),
    (1 << 14, true),
    ((1 << 14) + (1 << 13), true),
    (1 << 15, true),
    ((1 << 15) + (1 << 14), true),
    (1 << 16, false),
    ((1 << 16) + (1 << 15), true),
    (1 << 17, true),
    ((1 << 17) + (1 << 16), true),
    (1 << 18, true),
    ((1 << 18) + (1 << 17), true),
    (1 << 19, true),
    ((1 << 19) + (1 << 18), true),
    (1 << 20, false),
    ((1 << 20) + (1 << 19), true),
    (1 << 21, true),
    ((1 << 21) + (1 << 20), true),
    (1 << 22, true),
    ((1 << 22) + (1 << 21), true),
];

fn size_to_count(size: u32) -> u32 {
    match size {
        s if s >= 1 << 20 => 100,
        s if s >= 1 << 16 => 1000,
        s if s >= 1 << 10 => 10000,
        _ => 100000,
    }
}

/// As rstream prints sizes: a magnitude letter, one truncated decimal below 10 units.
fn size_str(v: u64) -> String {
    let (base, mag) = match v {
        v if v >= 1 << 30 => (1 << 30, "g"),
        v if v >= 1 << 20 => (1 << 20, "m"),
        v if v >= 1 << 10 => (1 << 10, "k"),
        _ => (1, ""),
    };
    let fraction = if v / base < 10 {
        (v % base) * 10 / base
    } else {
        0
    };
    if fraction > 0 {
        format!("{}.{fraction}{mag}", v / base)
    } else {
        format!("{}{mag}", v / base)
    }
}

fn cnt_str(v: u64) -> String {
    match v {
        v if v >= 1_000_000_000 => format!("{}b", v / 1_000_000_000),
        v if v >= 1_000_000 => format!("{}m", v / 1_000_000),
        v if v >= 1_000 => format!("{}k", v / 1_000),
        v => v.to_string(),
    }
}

struct Run<'a> {
    a: &'a RstreamArgs,
    verify: bool,
    blocking: bool,
    send_byte: u8,
    recv_byte: u8,
    recv_total: u64,
    buf: Vec<u8>,
}

impl Run<'_> {
    fn send(&mut self, s: &RdmaStream, size: usize) -> Result<()> {
        if self.verify {
            for b in &mut self.buf[..size] {
                *b = self.send_byte;
                self.send_byte = self.send_byte.wrapping_add(1);
            }
        }
        let mut off = 0;
        while off < size {
            match (&*s).write(&self.buf[off..size]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => fail!("rsend: {e}"),
            }
        }
        Ok(())
    }

    fn recv(&mut self, s: &RdmaStream, size: usize) -> Result<()> {
        let mut off = 0;
        while off < size {
            match (&*s).read(&mut self.buf[off..size]) {
                Ok(0) => fail!("rrecv: the peer closed the stream"),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => fail!("rrecv: {e}"),
            }
        }
        if self.verify {
            for &b in &self.buf[..size] {
                if b != self.recv_byte {
                    fail!("data verification failed byte {}", self.recv_total);
                }
                self.recv_byte = self.recv_byte.wrapping_add(1);
                self.recv_total += 1;
            }
        }
        Ok(())
    }

    fn test(
        &mut self,
        s: &RdmaStream,
        name: &str,
        size: u32,
        count: u32,
        iters: u32,
    ) -> Result<()> {
        let client = self.a.server.is_some();
        // Sync: 16 bytes from the client, 16 back.
        if client {
            self.send(s, 16)?;
            self.recv(s, 16)?;
        } else {
            self.recv(s, 16)?;
            self.send(s, 16)?;
        }
        let size_us = size as usize;
        let start = Instant::now();
        for _ in 0..iters {
            for _ in 0..count {
                if client {
                    self.send(s, size_us)?;
                } else {
                    self.recv(s, size_us)?;
                }
            }
            for _ in 0..count {
                if client {
                    self.recv(s, size_us)?;
                } else {
                    self.send(s, size_us)?;
                }
            }
        }
        let usec = start.elapsed().as_secs_f64() * 1e6;
        let bytes = u64::from(iters) * u64::from(count) * u64::from(size) * 2;
        println!(
            "{:<10}{:<8}{:<8}{:<8}{:<8}{:8.2}s{:10.2}{:11.2}",
            name,
            size_str(u64::from(size)),
            cnt_str(u64::from(count)),
            cnt_str(u64::from(iters)),
            size_str(bytes),
            usec / 1e6,
            (bytes as f64 * 8.0) / (1000.0 * usec),
            (usec / f64::from(iters)) / (f64::from(count) * 2.0),
        );
        Ok(())
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    match (host, port).to_socket_addrs()?.next() {
        Some(a) => Ok(a),
        None => fail!("{host} has no address"),
    }
}

enum Ends {
    Client(Context, SocketAddr),
    Server(RdmaListener),
}

impl Ends {
    fn connect(&self, opts: &StreamOptions) -> Result<RdmaStream> {
        Ok(match self {
            Ends::Client(ctx, at) => RdmaStream::connect_with(ctx, *at, opts)?,
            Ends::Server(l) => l.accept_with(opts)?.0,
        })
    }
}

pub fn run(a: &RstreamArgs) -> Result<()> {
    let mut verify = false;
    let mut blocking = false;
    for t in &a.test {
        match t.as_str() {
            "v" => verify = true,
            "b" => blocking = true,
            "n" => blocking = false,
            other => fail!("-T {other}: not supported here (v, b, n are)"),
        }
    }
    let (custom, all) = match a.size.as_deref() {
        Some(s) if s.eq_ignore_ascii_case("all") => (false, true),
        Some(_) => (true, false),
        None => (a.count.is_some() || a.iterations.is_some(), false),
    };
    let custom_size: u32 = match a.size.as_deref() {
        Some(s) if custom => s.parse()?,
        _ => 1000,
    };
    let ctx = Device::with_config("softverbs0", Config::from_env()?).open()?;
    let ends = match &a.server {
        Some(host) => Ends::Client(ctx.clone(), resolve(host, a.port)?),
        None => {
            let ip: IpAddr = match &a.bind {
                Some(h) => resolve(h, a.port)?.ip(),
                None => "0.0.0.0".parse()?,
            };
            Ends::Server(RdmaListener::bind_with(
                &ctx,
                SocketAddr::new(ip, a.port),
                StreamOptions::default(),
            )?)
        }
    };
    let ring = a
        .buffer
        .map_or(StreamConfig::default().rbuf_size, |b| 2 * b);
    let opts = |inline: u32| StreamOptions {
        config: StreamConfig {
            rbuf_size: ring,
            sbuf_size: ring,
            inline_size: inline,
            ..StreamConfig::default()
        },
        connect_timeout: Duration::from_secs(30),
        ..StreamOptions::default()
    };
    let largest = SIZES.last().map_or(0, |s| s.0);
    let mut run = Run {
        a,
        verify,
        blocking,
        send_byte: 0,
        recv_byte: 0,
        recv_total: 0,
        buf: vec![0; if custom { custom_size } else { largest } as usize],
    };
    println!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
        "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
    );
    let open = |run: &Run, inline| -> Result<RdmaStream> {
        let s = ends.connect(&opts(inline))?;
        s.set_nonblocking(!run.blocking)?;
        if let Some(k) = a.keepalive {
            s.set_keepalive(Some(Duration::from_secs(k)));
        }
        Ok(s)
    };
    if custom {
        let s = open(&run, a.inline)?;
        run.test(
            &s,
            "custom",
            custom_size,
            a.count.unwrap_or(1000),
            a.iterations.unwrap_or(1),
        )?;
        s.shutdown(std::net::Shutdown::Both)?;
        return Ok(());
    }
    let wanted = SIZES.iter().filter(|(_, extra)| all || !extra);
    let s = open(&run, a.inline)?;
    for &(size, _) in wanted.clone() {
        let name = format!("{}_lat", size_str(u64::from(size)));
        run.test(&s, &name, size, 1, size_to_count(size))?;
    }
    s.shutdown(std::net::Shutdown::Both)?;
    drop(s);
    let s = open(&run, 0)?;
    for &(size, _) in wanted {
        let name = format!("{}_bw", size_str(u64::from(size)));
        run.test(&s, &name, size, size_to_count(size), 1)?;
    }
    s.shutdown(std::net::Shutdown::Both)?;
    Ok(())
}
