//! What the two ends share outside the data path: a TCP control connection that
//! carries text lines, the device each end opens, and connecting RC QPs from the
//! peer's `lid:qpn:psn:...:gid` line.

use crate::cmlink::CmLink;
use crate::{fail, Result};
use softverbs::{
    AccessFlags, Config, Context, Device, Gid, InitAttr, Mtu, Qp, Qpn, RemoteQp, RtrAttr, RtsAttr,
    WcStatus, WorkCompletion,
};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A control connection carrying text messages: newline-terminated lines over TCP, or
/// one SEND per line over an RC connection the connection manager made ([`CmLink`]).
pub struct Ctrl {
    link: Link,
}

enum Link {
    Tcp {
        reader: BufReader<TcpStream>,
        writer: TcpStream,
    },
    Cm(Box<CmLink>),
}

impl Ctrl {
    fn new(stream: TcpStream) -> Result<Ctrl> {
        stream.set_nodelay(true)?;
        Ok(Ctrl {
            link: Link::Tcp {
                reader: BufReader::new(stream.try_clone()?),
                writer: stream,
            },
        })
    }

    /// Control messages over a connection the connection manager made.
    pub fn over_cm(link: CmLink) -> Ctrl {
        Ctrl {
            link: Link::Cm(Box::new(link)),
        }
    }

    /// The connection-manager link, if this is one.
    pub fn cm_link(&mut self) -> Option<&mut CmLink> {
        match &mut self.link {
            Link::Cm(l) => Some(l),
            Link::Tcp { .. } => None,
        }
    }

    /// Connects to `host:port`, retrying while nobody listens yet (a server that
    /// is still starting) for up to `patience`. `give_up` is asked between tries.
    pub fn connect(
        host: &str,
        port: u16,
        patience: Duration,
        mut give_up: impl FnMut() -> Option<String>,
    ) -> Result<Ctrl> {
        let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => fail!("cannot resolve {host}: {e}"),
        };
        // IPv4 first: a softverbs GID carries an IPv4 address with any UDP port.
        let mut addrs = addrs;
        addrs.sort_by_key(|a| a.is_ipv6());
        let Some(&addr) = addrs.first() else {
            fail!("{host} has no address");
        };
        let deadline = Instant::now() + patience;
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(s) => return Ctrl::new(s),
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    if let Some(why) = give_up() {
                        fail!("{why}");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => fail!("cannot connect to {addr}: {e}"),
            }
        }
    }

    /// Listens on TCP `port` (all addresses) and accepts one client.
    pub fn accept(port: u16) -> Result<Ctrl> {
        let listener = match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            Ok(l) => l,
            Err(e) => fail!("cannot listen on TCP port {port}: {e}"),
        };
        let (stream, _) = listener.accept()?;
        Ctrl::new(stream)
    }

    /// The IP address of this end of the connection.
    pub fn local_ip(&self) -> Result<IpAddr> {
        match &self.link {
            Link::Tcp { writer, .. } => Ok(writer.local_addr()?.ip()),
            Link::Cm(l) => match l.local() {
                Some(a) => Ok(a.ip()),
                None => fail!("the control connection has no local address"),
            },
        }
    }

    /// The peer's address (TCP, or rdma_cm).
    pub fn peer(&self) -> Result<SocketAddr> {
        match &self.link {
            Link::Tcp { writer, .. } => Ok(writer.peer_addr()?),
            Link::Cm(l) => match l.peer() {
                Some(a) => Ok(a),
                None => fail!("the control connection has no peer address"),
            },
        }
    }

    /// Sends one line (a newline is appended on TCP).
    pub fn send(&mut self, line: &str) -> Result<()> {
        match &mut self.link {
            Link::Tcp { writer, .. } => {
                let mut buf = Vec::with_capacity(line.len() + 1);
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                writer.write_all(&buf)?;
            }
            Link::Cm(l) => l.send(line)?,
        }
        Ok(())
    }

    /// Receives one line (without its newline); the peer closing is an error.
    pub fn recv(&mut self) -> Result<String> {
        let mut line = String::new();
        match &mut self.link {
            Link::Tcp { reader, .. } => {
                if reader.read_line(&mut line)? == 0 {
                    fail!("the peer closed the connection");
                }
            }
            Link::Cm(l) => line = l.recv()?,
        }
        while line.ends_with('\n') || line.ends_with('\r') {
            line.pop();
        }
        if let Some(msg) = line.strip_prefix("ERR ") {
            fail!("the peer failed: {msg}");
        }
        Ok(line)
    }

    /// Receives one line and checks it is `expected`.
    pub fn expect(&mut self, expected: &str) -> Result<()> {
        let got = self.recv()?;
        if got != expected {
            fail!("protocol error: expected {expected:?} from the peer, got {got:?}");
        }
        Ok(())
    }

    /// Tells the peer this end failed (best effort).
    pub fn send_error(&mut self, why: &str) {
        let mut line = format!("ERR {}", why.replace('\n', " "));
        if line.len() > crate::cmlink::LINE_MAX {
            let mut end = crate::cmlink::LINE_MAX;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
        }
        let _ = self.send(&line);
    }
}

/// Opens the softverbs device from the `SOFTVERBS_*` environment, listening on
/// `ip` (the address the control connection uses, so that the peer can reach
/// it) unless `SOFTVERBS_ADDR` says otherwise, with `mtu` if given. A loopback `ip`
/// leaves the device on its own loopback address (`softverbs::addressing`).
pub fn open_device(ip: Option<IpAddr>, mtu: Option<u32>) -> Result<Context> {
    let mut cfg = Config::from_env()?;
    if cfg.addr.is_none() {
        cfg.addr = ip.and_then(device_ip).filter(|ip| !ip.is_loopback());
    }
    if let Some(m) = mtu {
        cfg.mtu = parse_mtu(m)?;
    }
    Ok(Device::with_config("softverbs0", cfg).open()?)
}

/// The local address the kernel would send to `dst` from (a connected UDP socket's),
/// `None` when there is no route.
pub fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = if dst.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let s = std::net::UdpSocket::bind((any, 0)).ok()?;
    // Port 9 (discard): a connect sends nothing.
    s.connect((dst, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The address a device can use for `ip`: IPv4 (a softverbs GID carries an IPv4
/// address with any UDP port; IPv6 devices need port 4791).
fn device_ip(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v4) => Some(IpAddr::V4(v4)),
        IpAddr::V6(v6) if v6.is_loopback() => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
    }
}

/// An MTU given in bytes.
pub fn parse_mtu(bytes: u32) -> Result<Mtu> {
    match Mtu::from_bytes(bytes) {
        Some(m) => Ok(m),
        None => fail!("invalid MTU {bytes}: use 256, 512, 1024, 2048 or 4096"),
    }
}

/// Everything a peer needs to reach one QP and its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpInfo {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: Gid,
}

fn gid_hex(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_gid_hex(s: &str) -> Option<Gid> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Gid(g))
}

fn hex<T: TryFrom<u64>>(s: &str, what: &str, max_digits: usize) -> Result<T> {
    if s.is_empty() || s.len() > max_digits {
        fail!("bad {what} {s:?} in the peer's address");
    }
    let v = u64::from_str_radix(s, 16).map_err(|_| format!("bad {what} {s:?}"))?;
    T::try_from(v).map_err(|_| format!("{what} {s:?} out of range").into())
}

impl QpInfo {
    /// `lid:qpn:psn:gid`, as ibv_rc_pingpong exchanges it (hex, GID as 32 digits).
    pub fn to_pingpong(self) -> String {
        format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            gid_hex(&self.gid)
        )
    }

    /// Parses [`QpInfo::to_pingpong`].
    pub fn from_pingpong(s: &str) -> Result<QpInfo> {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 4 {
            fail!("bad address line from the peer: {s:?}");
        }
        Ok(QpInfo {
            lid: hex(f[0], "LID", 4)?,
            qpn: hex(f[1], "QPN", 6)?,
            psn: hex(f[2], "PSN", 6)?,
            rkey: 0,
            vaddr: 0,
            gid: parse_gid_hex(f[3]).ok_or_else(|| format!("bad GID {:?}", f[3]))?,
        })
    }

    /// `lid:qpn:psn:rkey:vaddr:gid` (perftest's fields, in hex).
    pub fn to_perf(self) -> String {
        format!(
            "{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            self.rkey,
            self.vaddr,
            gid_hex(&self.gid)
        )
    }

    /// Parses [`QpInfo::to_perf`].
    pub fn from_perf(s: &str) -> Result<QpInfo> {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 6 {
            fail!("bad address line from the peer: {s:?}");
        }
        Ok(QpInfo {
            lid: hex(f[0], "LID", 4)?,
            qpn: hex(f[1], "QPN", 6)?,
            psn: hex(f[2], "PSN", 6)?,
            rkey: hex(f[3], "rkey", 8)?,
            vaddr: hex(f[4], "address", 16)?,
            gid: parse_gid_hex(f[5]).ok_or_else(|| format!("bad GID {:?}", f[5]))?,
        })
    }
}

/// Every access right: the benchmarks use all of them.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// A 24-bit starting PSN that differs between runs (as the classic tools pick
/// random ones).
pub fn random_psn(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut x = (t.subsec_nanos() as u64) ^ ((std::process::id() as u64) << 20) ^ salt as u64;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((x >> 40) as u32) & 0x00ff_ffff
}

/// Moves `qp` through INIT, RTR and RTS towards `remote` (timeout 14, retry 7,
/// rnr_retry 7, as perftest and pingpong do).
pub fn connect_qp(ctx: &Context, qp: &Qp, local_psn: u32, remote: &QpInfo, mtu: Mtu) -> Result<()> {
    qp.to_init(InitAttr {
        access: all_access(),
    })?;
    rtr_rts(ctx, qp, local_psn, remote, mtu)
}

/// Moves `qp` from INIT through RTR and RTS towards `remote`.
pub fn rtr_rts(ctx: &Context, qp: &Qp, local_psn: u32, remote: &QpInfo, mtu: Mtu) -> Result<()> {
    // A GRH-style address when the GID names a device, else the LID (same host).
    let remote_qp = if remote.gid.interface_id() != 0 {
        RemoteQp::from_gid(remote.gid, Qpn::new(remote.qpn), remote.psn)
    } else if let Some(addr) = ctx.lid_to_addr(remote.lid) {
        RemoteQp {
            addr,
            qpn: Qpn::new(remote.qpn),
            psn: remote.psn,
        }
    } else {
        fail!(
            "the peer sent neither a GID nor a LID that names a device ({})",
            remote.lid
        );
    };
    let max_rd = ctx.query_device().max_qp_rd_atom;
    qp.to_rtr(RtrAttr {
        remote: remote_qp,
        mtu,
        max_dest_rd_atomic: max_rd,
        // 0.01 ms: a receiver that keeps receives posted is soon ready again.
        min_rnr_timer: 1,
    })?;
    qp.to_rts(RtsAttr {
        sq_psn: local_psn,
        max_rd_atomic: max_rd,
        ..RtsAttr::default()
    })?;
    Ok(())
}

/// Turns an unsuccessful completion into an error.
pub fn check_wc(wc: &WorkCompletion) -> Result<()> {
    if wc.status != WcStatus::Success {
        fail!(
            "completion with error: {:?} (status {}) for wr_id {} on QP {:#x}",
            wc.status,
            wc.status as u32,
            wc.wr_id,
            wc.qp_num.value()
        );
    }
    Ok(())
}

/// Rounds a wait spins before it starts yielding the CPU (measured on two cores:
/// spinning longer starves the progress threads; yielding early costs little).
const SPINS: u32 = 16;

/// Stops a wait that makes no progress for this long.
pub const STALL: Duration = Duration::from_secs(30);

/// A spin-wait helper: spins briefly, then yields the CPU (the progress thread
/// of the device needs it on small machines), and reports a stall.
pub struct Spin {
    n: u32,
    last_progress: Instant,
}

impl Spin {
    pub fn new() -> Spin {
        Spin {
            n: 0,
            last_progress: Instant::now(),
        }
    }

    /// Something happened.
    pub fn progress(&mut self) {
        self.n = 0;
        self.last_progress = Instant::now();
    }

    /// Nothing happened this round; `Err` once nothing happened for [`STALL`].
    pub fn idle(&mut self, what: &str) -> Result<()> {
        self.n += 1;
        if self.n < SPINS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
            if self.n % 1024 == 0 && self.last_progress.elapsed() > STALL {
                fail!("no progress for {} s while {what}", STALL.as_secs());
            }
        }
        Ok(())
    }

    /// Nothing happened this round of a wait on a CQ: like [`Spin::idle`] but never
    /// yields the CPU itself, since an empty `Cq::poll` already did (two yields per
    /// round otherwise).
    pub fn idle_polled(&mut self, what: &str) -> Result<()> {
        self.n = self.n.wrapping_add(1);
        std::hint::spin_loop();
        if self.n % 1024 == 0 && self.last_progress.elapsed() > STALL {
            fail!("no progress for {} s while {what}", STALL.as_secs());
        }
        Ok(())
    }
}
