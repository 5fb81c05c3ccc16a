//! udp-gso: the kernel's own UDP path at its best, as the limit a UDP
//! transport can reach (issue 16's "raw UDP with GSO").
//!
//! Two processes on loopback: this one sends batches of equal segments with
//! one `send` each (UDP_SEGMENT, i.e. GSO: the kernel cuts the batch into
//! datagrams), its child receives with UDP_GRO on, so one `recvmsg` returns a
//! whole batch and a cmsg names the segment size. A RoCEv2 driver moves data
//! the same way. Default: segments of 4096 bytes, 15 per batch (61440 bytes: a
//! 16th would pass the 65507-byte limit of one IPv4 UDP send).
//!
//! Like any transport the sender keeps a window: the receiver acknowledges
//! what it has read (a cumulative byte count every quarter window) and the
//! sender never has more than the window unacknowledged, so the socket
//! buffer does not overflow and the figure is what was delivered, not what
//! was offered. The window is half the receive buffer the kernel granted
//! (SO_RCVBUF asked for 8 MiB, best effort, as the softverbs driver asks).
//! Every segment starts with its sequence number; the receiver checks they
//! only grow and counts gaps as lost segments. A window that waits more than
//! 20 ms for an acknowledgement gives up on it (counted as a stall).
//!
//! Usage: udp-gso [--secs S] [--segment BYTES] [--segments N]
//! Prints key=value lines; udp_gso_gbs is payload bytes the receiver read
//! per second between its first and last read, in 10^9 bytes per second.

use softverbs_bench_tools::{cpu_seconds, error, seconds, Options, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const HELP: &str = "\
udp-gso [--secs S] [--segment BYTES] [--segments N]
  A sender and a receiver process on 127.0.0.1 move batches of N segments of
  BYTES (defaults 15 x 4096) with UDP GSO on send and GRO on receive, for S
  seconds (default 3), with a window of half the receive buffer. Prints
  key=value lines; GB/s are 10^9 payload bytes per second.";

/// Linux `UDP_SEGMENT` (include/uapi/linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
/// Linux `UDP_GRO`.
const UDP_GRO: libc::c_int = 104;
/// The largest UDP payload of one IPv4 send (65535 - 20 - 8).
const MAX_SEND: usize = 65507;
/// What the receive buffer is asked to be (the softverbs driver asks the same).
const RCVBUF_WANTED: libc::c_int = 8 << 20;
/// The sender's last datagram, from another socket so GRO never merges it.
const END: &[u8] = b"END";
/// How long a full window waits for an acknowledgement before giving up on it.
const STALL: Duration = Duration::from_millis(20);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--receiver") {
        receiver()
    } else if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        Ok(())
    } else {
        sender(Options::new(args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp-gso: {e}");
            ExitCode::FAILURE
        }
    }
}

fn setsockopt_int(
    sock: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> Result<()> {
    // SAFETY: the option value is one c_int that lives for the call, and its
    // length is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(error!(
            "setsockopt({level}, {name}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn getsockopt_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int) -> Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`, which we own.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(error!(
            "getsockopt({level}, {name}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(v)
}

/// One datagram read: its length, its sender, and the GRO segment size if the
/// kernel merged segments into it.
struct Read {
    len: usize,
    from: Option<SocketAddr>,
    gro_segment: Option<u16>,
}

/// `recvmsg` with room for the UDP_GRO control message.
fn recv_with_gro(sock: &UdpSocket, buf: &mut [u8]) -> Result<Read> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: sockaddr_in is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: every pointer in `msg` points at a live local of the stated
    // length: the kernel writes at most buf.len() data bytes, the address and
    // the control buffer within their lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(error!("recvmsg: {}", std::io::Error::last_os_error()));
    }
    let mut gro_segment = None;
    // SAFETY: the CMSG_* walk stays inside the control buffer the kernel filled
    // (msg_controllen was updated to what it wrote); UDP_GRO carries one int,
    // read unaligned because CMSG_DATA promises no alignment.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                gro_segment = u16::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = (msg.msg_namelen as usize >= std::mem::size_of::<libc::sockaddr_in>()).then(|| {
        SocketAddr::from((
            u32::from_be(addr.sin_addr.s_addr).to_be_bytes(),
            u16::from_be(addr.sin_port),
        ))
    });
    Ok(Read {
        len: n as usize,
        from,
        gro_segment,
    })
}

/// Waits up to `limit` for `events` on `sock`; false when the time passed.
fn wait_for(sock: &UdpSocket, events: libc::c_short, limit: Duration) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one pollfd that lives for the call.
    let n = unsafe { libc::poll(&mut pfd, 1, limit.as_millis() as libc::c_int) };
    if n < 0 {
        return Err(error!("poll: {}", std::io::Error::last_os_error()));
    }
    Ok(n > 0)
}

/// What the receiver counted.
#[derive(Debug, Default)]
struct Received {
    bytes: u64,
    reads: u64,
    gro_reads: u64,
    gro_segment: u16,
    segments: u64,
    lost_segments: u64,
    out_of_order: u64,
    seconds: f64,
}

/// The child: receives until END, acknowledging as it goes, then reports.
fn receiver() -> Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let _ = setsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF_WANTED);
    setsockopt_int(&sock, libc::SOL_UDP, UDP_GRO, 1)?;
    let rcvbuf = getsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {rcvbuf}", sock.local_addr()?.port())?;
    out.flush()?;
    // The sender answers with the segment size and how often to acknowledge.
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let mut words = line.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(segment)), Some(Ok(ack_every))) = (words.next(), words.next()) else {
        return Err(error!(
            "receiver: expected \"SEGMENT ACK_EVERY\", got {line:?}"
        ));
    };
    let segment = segment as usize;

    let mut buf = vec![0u8; 1 << 16];
    let mut r = Received::default();
    let mut next_seq = 0u64;
    let mut acked_at = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        let got = recv_with_gro(&sock, &mut buf)?;
        if &buf[..got.len] == END {
            break;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        r.bytes += got.len as u64;
        r.reads += 1;
        if let Some(s) = got.gro_segment {
            r.gro_reads += 1;
            r.gro_segment = s;
        }
        // The segments of this read, each opening with its sequence number.
        let seg = got.gro_segment.map_or(segment, usize::from).max(8);
        for chunk in buf[..got.len].chunks(seg) {
            r.segments += 1;
            let Some(head) = chunk.get(..8) else {
                r.out_of_order += 1;
                continue;
            };
            let seq = u64::from_le_bytes(head.try_into().expect("8 bytes"));
            if seq < next_seq {
                r.out_of_order += 1;
            } else {
                r.lost_segments += seq - next_seq;
                next_seq = seq + 1;
            }
        }
        if r.bytes - acked_at >= ack_every {
            acked_at = r.bytes;
            if let Some(to) = got.from {
                sock.send_to(&r.bytes.to_le_bytes(), to)?;
            }
        }
    }
    r.seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    writeln!(
        out,
        "{} {} {} {} {} {} {} {:.9} {:.6}",
        r.bytes,
        r.reads,
        r.gro_reads,
        r.gro_segment,
        r.segments,
        r.lost_segments,
        r.out_of_order,
        r.seconds,
        cpu_seconds()
    )?;
    out.flush()?;
    Ok(())
}

fn sender(mut o: Options) -> Result<()> {
    let span = seconds(o.value("--secs", 3.0)?)?;
    let segment: usize = o.value("--segment", 4096)?;
    let segments: usize = o.value("--segments", 15)?;
    o.finish()?;
    if !(64..=MAX_SEND).contains(&segment) {
        return Err(error!("--segment must be between 64 and {MAX_SEND} bytes"));
    }
    if segments == 0 || segments > 64 || segment * segments > MAX_SEND {
        return Err(error!(
            "--segments: 1 to 64 segments, at most {MAX_SEND} bytes per batch ({segments} x {segment} is too many)"
        ));
    }
    let batch = segment * segments;

    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("--receiver")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| error!("cannot start the receiver: {e}"))?;
    let mut to_child = child.stdin.take().expect("piped stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    from_child.read_line(&mut line)?;
    let mut words = line.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(port)), Some(Ok(rcvbuf))) = (words.next(), words.next()) else {
        return Err(error!(
            "the receiver said {line:?}, not its port and buffer"
        ));
    };
    let window = (rcvbuf / 2).max(batch as u64);
    let ack_every = (window / 4).max(1);
    writeln!(to_child, "{segment} {ack_every}")?;
    to_child.flush()?;

    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let _ = setsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_SNDBUF, RCVBUF_WANTED);
    sock.connect(("127.0.0.1", port as u16))?;
    setsockopt_int(&sock, libc::SOL_UDP, UDP_SEGMENT, segment as libc::c_int)?;

    let mut data = vec![0u8; batch];
    let mut ack = [0u8; 8];
    let mut seq = 0u64;
    let mut sent = 0u64;
    let mut acked = 0u64;
    let mut stalls = 0u64;
    // Non-blocking throughout: waits are poll(2) with a bound.
    sock.set_nonblocking(true)?;
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    while start.elapsed() < span {
        // Take the acknowledgements that are there; wait while the window is full.
        loop {
            match sock.recv(&mut ack) {
                Ok(8) => acked = acked.max(u64::from_le_bytes(ack)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if sent - acked + batch as u64 <= window {
                        break;
                    }
                    if !wait_for(&sock, libc::POLLIN, STALL)? {
                        stalls += 1;
                        acked = sent;
                    }
                }
                Err(e) => return Err(error!("receiving an acknowledgement: {e}")),
            }
        }
        for chunk in data.chunks_mut(segment) {
            chunk[..8].copy_from_slice(&seq.to_le_bytes());
            seq += 1;
        }
        let n = loop {
            match sock.send(&data) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_for(&sock, libc::POLLOUT, STALL)?;
                }
                Err(e) => return Err(error!("send: {e}")),
            }
        };
        if n != batch {
            return Err(error!("send moved {n} of {batch} bytes"));
        }
        sent += batch as u64;
    }
    let sender_cpu = cpu_seconds() - cpu0;
    UdpSocket::bind("127.0.0.1:0")?.send_to(END, ("127.0.0.1", port as u16))?;

    line.clear();
    from_child.read_line(&mut line)?;
    drop(to_child);
    let status = child.wait()?;
    if !status.success() {
        return Err(error!("the receiver failed ({status})"));
    }
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [bytes, reads, gro_reads, gro_segment, segs, lost, out_of_order, secs, receiver_cpu] =
        f[..]
    else {
        return Err(error!("the receiver reported {line:?}"));
    };
    if bytes == 0.0 || secs <= 0.0 {
        return Err(error!("the receiver got nothing"));
    }
    let gbs = bytes / secs / 1e9;
    println!("segment={segment}");
    println!("segments_per_batch={segments}");
    println!("batch_bytes={batch}");
    println!("rcvbuf={rcvbuf}");
    println!("window_bytes={window}");
    println!("sent_bytes={sent}");
    println!("received_bytes={bytes}");
    println!("received_segments={segs}");
    println!("lost_segments={lost}");
    println!("out_of_order_segments={out_of_order}");
    println!("reads={reads}");
    println!("gro_reads={gro_reads}");
    println!("gro_segment_size={gro_segment}");
    println!("stalls={stalls}");
    println!("seconds={secs:.6}");
    println!("udp_gso_gbs={gbs:.3}");
    println!("sender_cpu_s={sender_cpu:.3}");
    println!("receiver_cpu_s={receiver_cpu:.3}");
    println!(
        "cpu_s_per_gb={:.3}",
        (sender_cpu + receiver_cpu) / (bytes / 1e9)
    );
    Ok(())
}
