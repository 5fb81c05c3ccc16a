//! udp-send1: what one small datagram's send costs with each system call a UDP
//! transport may use for it (issue 16: the softverbs driver sent every batch,
//! one datagram too, with `sendmmsg`).
//!
//! One process, two sockets on 127.0.0.1: the sender is set up as the softverbs
//! driver sets its own (unconnected, DF on: `IP_MTU_DISCOVER` = `IP_PMTUDISC_DO`,
//! 8 MiB buffers asked); the receiver drains what arrived after every send, with
//! one non-blocking `recv`, outside the timed call. Each round times N sends of a
//! BYTES-byte datagram with each method in turn (the methods interleaved, rounds
//! repeated), and the figure of a method is its median round, in ns per send:
//!
//!   sendto      `sendto` with the destination address
//!   sendmsg     `sendmsg`, one iovec, the address in the header, no cmsg
//!   sendmmsg1   `sendmmsg` of one message built like `sendmsg`'s
//!
//! With `--driver-opts` both sockets also take the options the driver's socket has
//! beside DF: `IP_RECVERR` and `UDP_GRO`.
//!
//! With `--watcher EVENTS` another thread sleeps in `poll` on the receiving socket
//! the whole time, asking for EVENTS (0: none, only errors and hang-ups; 1:
//! POLLIN, then it drains the socket), as the driver's progress thread may.
//!
//! Usage: udp-send1 [--bytes B] [--sends N] [--rounds R] [--driver-opts] [--watcher EVENTS]
//! Prints key=value lines: METHOD_ns (median ns per send) and the ratios of
//! sendmsg and sendmmsg1 to sendto.

use softverbs_bench_tools::{error, Options, Result};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::Instant;

const HELP: &str = "\
udp-send1 [--bytes B] [--sends N] [--rounds R] [--driver-opts] [--watcher EVENTS]
  Times N sends of a B-byte datagram (default 60, about an 8-byte RoCE SEND)
  from an unconnected DF socket to another on 127.0.0.1, with sendto, sendmsg
  and a one-message sendmmsg, interleaved, R rounds (defaults 20000 and 15).
  Prints the median ns per send of each and the ratios to sendto.
  --driver-opts: both sockets with IP_RECVERR and UDP_GRO on, as the driver's.
  --watcher EVENTS: a thread sleeps in poll(2) on the receiving socket for
  EVENTS (0 or 1 = POLLIN) meanwhile.";

/// Linux `UDP_GRO` (include/uapi/linux/udp.h).
const UDP_GRO: libc::c_int = 104;

const METHODS: [&str; 3] = ["sendto", "sendmsg", "sendmmsg1"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        return ExitCode::SUCCESS;
    }
    match run(Options::new(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp-send1: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut opts: Options) -> Result<()> {
    let bytes: usize = opts.value("--bytes", 60)?;
    let sends: usize = opts.value("--sends", 20_000)?;
    let rounds: usize = opts.value("--rounds", 15)?;
    let driver_opts = opts.flag("--driver-opts");
    let watcher: Option<i16> = match opts.value("--watcher", -1i16)? {
        -1 => None,
        0 => Some(0),
        1 => Some(libc::POLLIN),
        w => return Err(error!("--watcher {w}: 0 or 1")),
    };
    opts.finish()?;
    if bytes == 0 || bytes > 1400 || sends == 0 || rounds == 0 {
        return Err(error!("--bytes 1..=1400, --sends and --rounds at least 1"));
    }
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_nonblocking(true)?;
    set_int(
        &tx,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )?;
    for s in [&tx, &rx] {
        // Best effort, as the driver asks.
        let _ = set_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20);
        let _ = set_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20);
    }
    if driver_opts {
        for s in [&tx, &rx] {
            set_int(s, libc::IPPROTO_IP, libc::IP_RECVERR, 1)?;
            set_int(s, libc::SOL_UDP, UDP_GRO, 1)?;
        }
    }
    let SocketAddr::V4(dst) = rx.local_addr()? else {
        return Err(error!("expected an IPv4 address"));
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = watcher.map(|events| {
        let fd = rx.as_raw_fd();
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || watch(fd, events, &stop))
    });
    let payload = vec![0x5au8; bytes];
    let mut sink = vec![0u8; 2048];
    let mut per_method: Vec<Vec<f64>> = vec![Vec::new(); METHODS.len()];
    for _ in 0..rounds {
        for (m, samples) in per_method.iter_mut().enumerate() {
            let mut spent = std::time::Duration::ZERO;
            for _ in 0..sends {
                let t = Instant::now();
                send_one(m, &tx, &sin, &payload)?;
                spent += t.elapsed();
                // Drained outside the timed call, so the receive queue stays short.
                let _ = rx.recv(&mut sink);
            }
            samples.push(spent.as_nanos() as f64 / sends as f64);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    if let Some(w) = watch {
        let _ = w.join();
    }
    let medians: Vec<f64> = per_method.iter_mut().map(|s| median(s)).collect();
    for (name, m) in METHODS.iter().zip(&medians) {
        println!("{name}_ns={m:.0}");
    }
    println!("sendmsg_over_sendto={:.3}", medians[1] / medians[0]);
    println!("sendmmsg1_over_sendto={:.3}", medians[2] / medians[0]);
    Ok(())
}

fn send_one(method: usize, tx: &UdpSocket, sin: &libc::sockaddr_in, payload: &[u8]) -> Result<()> {
    let fd = tx.as_raw_fd();
    let name = (sin as *const libc::sockaddr_in).cast::<libc::sockaddr>();
    let namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_name = name as *mut libc::c_void;
    hdr.msg_namelen = namelen;
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    // SAFETY: every pointer refers to a live local or `payload`, which the kernel only
    // reads during the call.
    let r = unsafe {
        match method {
            0 => libc::sendto(fd, payload.as_ptr().cast(), payload.len(), 0, name, namelen),
            1 => libc::sendmsg(fd, &hdr, 0),
            _ => {
                let mut mm = libc::mmsghdr {
                    msg_hdr: hdr,
                    msg_len: 0,
                };
                libc::sendmmsg(fd, &mut mm, 1, 0) as isize
            }
        }
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Sleeps in `poll` on `fd` for `events` (with a 10 ms timeout, to see `stop`); drains
/// what POLLIN reports.
fn watch(fd: libc::c_int, events: i16, stop: &std::sync::atomic::AtomicBool) {
    let mut buf = [0u8; 2048];
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 10) };
        if r > 0 && p.revents & libc::POLLIN != 0 {
            // SAFETY: a live buffer of the stated length.
            unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        }
    }
}

fn set_int(s: &UdpSocket, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> Result<()> {
    // SAFETY: a valid fd and a pointer to a live int of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
