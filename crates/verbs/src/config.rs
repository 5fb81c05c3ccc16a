//! Driver configuration: a typed struct, filled from environment variables.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `SOFTVERBS_ADDR` | IP address the device listens on | this process's own loopback address `127.83.x.y` |
//! | `SOFTVERBS_PORT` | UDP port; 4791 gives the standard RoCEv2 GID | 4791, else a free port in 20000-49151 |
//! | `SOFTVERBS_MTU` | active path MTU reported and used (256-4096) | `4096` |
//! | `SOFTVERBS_BUSY_POLL` | progress thread spins this many µs before sleeping | `0` |
//! | `SOFTVERBS_FAULTS` | fault injection, e.g. `loss=0.05,dup=0.01,reorder=0.01,corrupt=0.01,seed=7` | none |
//! | `SOFTVERBS_CM_DROP` | fault injection for tests: drop the first N connection manager messages of a type this device sends, e.g. `dreq:1` or `dreq:1,drep:2` (types: req, mra, rej, rep, rtu, dreq, drep, sidr_req, sidr_rep) | none |
//! | `SOFTVERBS_PCAP` | write every packet sent and received to this pcap file | none |
//! | `SOFTVERBS_ICRC` | receive-side ICRC: `enforce`, `count` or `skip` | `enforce` |
//! | `SOFTVERBS_GSO` | UDP GSO/GRO batching; `0` turns it off (injected faults act on GSO segments) | `1` |
//! | `SOFTVERBS_SELECTIVE_REPEAT` | selective repeat with softverbs peers that offer it too; `0`: plain IBA go-back-N with every peer | `1` |
//! | `SOFTVERBS_SAME_HOST` | the same-host path for RDMA WRITE/READ with softverbs peers on this host (`crate::samehost`): `auto` (when the peer shares our PID namespace and we may read its memory), `0` never, `1` as auto but warns when a QP cannot have it | `auto` |
//! | `SOFTVERBS_MAX_MR_BYTES` | most bytes registered at once on the device (beyond: ENOMEM) | the machine's physical memory |
//! | `SOFTVERBS_SOCKET_BUFFER` | the UDP socket's send and receive buffer sizes in bytes | `8388608` |
//! | `SOFTVERBS_SOCK_COALESCE` | stream sockets on the same-host path announce the writes made while one is in flight in one later WRITE WITH IMM (`crate::sock`); `0` turns it off | `1` |
//! | `SOFTVERBS_SOCK_BUSY_HANDOFF` | a same-host stream socket that moves data keeps its device's socket handed over to its threads ten times `SOFTVERBS_POLL_HANDOFF` (`crate::sock`); `0` turns it off (for tests that compare) | `1` |
//! | `SOFTVERBS_SOCK_EARLY_ROOM` | a stream socket's writer on the same-host path gets room back as soon as memory says so: its send ring bytes at once (nothing is staged there), the reader's buffer grant once its WRITE placed it in the target area, before the datagrams of the ACK and the grant's message arrive (`crate::sock`); `1` turns it on (measured no faster yet: `docs/sockets.md`, session 10) | `0` |
//!
//! How the address and port become the device's GID and LID: [`crate::addressing`].

use softverbs_engine::{IcrcPolicy, Mtu};
use softverbs_wire::cm::AttributeId;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Fault injection rates (each 0.0-1.0) applied to datagrams the driver sends.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Probability a datagram is dropped.
    pub loss: f64,
    /// Probability a datagram is sent twice.
    pub duplicate: f64,
    /// Probability a datagram is held back and sent after the next one.
    pub reorder: f64,
    /// Probability one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Seed of the fault generator.
    pub seed: u64,
}

/// Configuration of a softverbs device.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address to listen on; `None`: a loopback address of this process's own
    /// (`127.83.x.y`, see [`crate::addressing`]).
    pub addr: Option<IpAddr>,
    /// UDP port; `None`: 4791 (the RoCEv2 port) if free, else a free one.
    pub port: Option<u16>,
    /// Path MTU.
    pub mtu: Mtu,
    /// How long the progress thread spins for packets before blocking.
    pub busy_poll: Duration,
    /// While an application thread polled a CQ (and so received from the socket itself)
    /// less than this long ago, the progress thread leaves the socket to it and does not
    /// wake for arriving datagrams (zero: it always does). See `Driver::poller_handoff`.
    /// A same-host stream that moves data keeps the socket ten times as long (at most
    /// 450 µs more): `Driver::keep_handoff_busy`.
    pub poll_handoff: Duration,
    /// How long the progress thread keeps the ACK of a lone RDMA WRITE it placed into
    /// memory back for the answer of a thread spinning on that memory (zero: it sends it
    /// at once). See `crate::ack_hold`.
    pub ack_hold: Duration,
    /// A thread polling a CQ in a loop whose device socket brought nothing and whose
    /// polls found no completion for this long sleeps in each further empty poll (on the
    /// socket where the progress thread left it to pollers; until a datagram comes, at
    /// most 40 µs), instead of spinning through `recvmmsg` and `sched_yield` (zero, the
    /// default: it never sleeps). Opt-in: 60 µs (longer than a ping-pong's round trip
    /// here, 8 B SEND about 20 µs, WRITE 55 µs) made a 64 KiB WRITE sender, which waits
    /// some 100 µs for each ACK, faster and cheaper, but ib_write_lat looked slower on
    /// a loaded host (docs/udp-bandwidth.md, session 9). See `Cq::poll`.
    pub poll_wait_after: Duration,
    /// The same sleep where `poll_wait_after` is zero, but only while the device has a
    /// WRITE or SEND window in flight: more request packets than one 64 KiB message at a
    /// 4096-byte MTU (no ping-pong has that many, so none's latency changes) and no RDMA
    /// READ response received for the last 50 ms (a READ requester's poller posts the
    /// next READs as the progress thread completes them: with `poll_wait_after` it lost
    /// 5 % of READ bandwidth and cost 10 % more CPU). Zero, the default: never. Opt-in:
    /// a 64 KiB WRITE sender whose window is out spins through 2-3 `recvmmsg` and
    /// `sched_yield` per message while it waits for ACKs, and `poll_wait_after` (30 µs)
    /// cut its CPU per GB by 28 % at load 5-7, but this form's interleaved runs at load
    /// 5-20 did not tell it from the default (docs/udp-bandwidth.md, session 13).
    pub poll_wait_under_window: Duration,
    /// A thread polling a CQ whose device has a bandwidth window in flight (more request
    /// packets than one 64 KiB message at a 4096-byte MTU) yields the CPU at every empty
    /// poll, instead of at every fourth in a row only (`Cq::poll`):
    /// perftest's bandwidth clients poll back to back, and their spin kept the progress
    /// threads, which move the stream, off the CPUs of a small host. Opt-in: on a loaded
    /// host ib_read_bw was faster with it, but it was not measured idle, and on by default
    /// it made the loopback test of the plain hand-off under a window fail beside two busy
    /// loops (docs/udp-bandwidth.md, session 12).
    pub poll_yield_under_window: bool,
    /// A thread spinning on a CQ that keeps sharing its CPU with another runnable thread
    /// (its yields keep switching to it) sleeps this long once, so that its wake-up can
    /// place it on an idle CPU (zero, the default: it never does). Opt-in (20 µs): on the
    /// idle host it made `perf send --lat` slower in 6 of 8 interleaved pairs (median
    /// 11.7 → 15.1 µs one way; docs/udp-latency.md, session 13). See `crate::spread`.
    pub poll_spread: Duration,
    /// A lone WRITE or SEND of at most 4096 bytes posted to an RC QP with more than this
    /// many packets unacknowledged joins the next batch instead of a send call of its own
    /// (`Poster::post_send`; READs and atomics always use 8). 8, the default; 2 halves the
    /// lone sends of a program that posts onto a drained QP (ib_write_bw at 4 KiB: 12 500
    /// -> 8 200 send calls per 100 000 packets) but its bandwidth gain was not shown at
    /// load 4-8 (ahead in 11 of 18 interleaved pairs; docs/udp-bandwidth.md, session 17).
    pub post_join_above: u32,
    /// A `sched_yield` of a spinning poller's empty poll that kept it off its CPU this
    /// long makes the poller stop yielding for 10 ms (160 ms at most while such yields go
    /// on): it spins while its socket is busy and sleeps on it (40 µs at most) once quiet
    /// for 15 µs, which costs no scheduler slice (zero, the default: it always yields).
    /// Since Linux 6.17 each yield charges a spinning poller the rest of its slice, and
    /// beside busy tasks it got a few thousandths of a CPU. Opt-in (1000 µs): beside two
    /// busy loops `perf send --lat` pinned apart went from 1.4 ms one way to 5.9 µs; at
    /// load 5-6 no change; on the idle host no gain (pinned apart perf send, perf write,
    /// ib_send_lat, ib_write_lat 5.83 → 6.93, 6.46 → 7.57, 10.68 → 5.92, 6.00 → 6.68 µs;
    /// free perf write 11.05 → 14.27; docs/udp-latency.md, session 16). See `Cq::poll`.
    pub poll_long_yield: Duration,
    /// The scheduler slice the progress thread asks for (Linux 6.12+ EEVDF,
    /// `sched_attr::sched_runtime`, which the kernel clamps to 0.1-100 ms; zero: the
    /// kernel's default). A short slice lets the thread run sooner when a datagram wakes
    /// it on a busy CPU; it buys no more CPU time (see docs/loss-recovery.md, session 7).
    pub progress_slice: Duration,
    /// Fault injection.
    pub faults: Option<FaultConfig>,
    /// Packet capture file.
    pub pcap: Option<PathBuf>,
    /// ICRC checking on receive.
    pub icrc: IcrcPolicy,
    /// Use UDP GSO on send and GRO on receive where the kernel offers them.
    pub gso: bool,
    /// Most bytes of memory registered at once on the device; a registration that
    /// would pass it fails (ENOMEM, as the kernel's locked-memory limit does).
    pub max_mr_bytes: u64,
    /// SO_SNDBUF and SO_RCVBUF of the device's socket (the kernel may cap them).
    pub socket_buffer: usize,
    /// Selective repeat with softverbs peers that offer it too (RC recovers only
    /// the packets lost); off, RC is plain IBA go-back-N with every peer.
    pub selective_repeat: bool,
    /// The packet life time (IBA 4.096 µs × 2^n) of the paths the connection manager
    /// resolves, from which rdma_cm derives the QPs' local ACK timeout and its own
    /// response timeouts. Default 18, Linux's for RoCE (a local ACK timeout of about
    /// 2.1 s); lower suits a link whose round trips take microseconds.
    pub cm_packet_life_time: u8,
    /// The same-host path (`crate::samehost`).
    pub same_host: SameHostMode,
    /// Fault injection for tests: the first this many same-host handshake datagrams
    /// the device sends are dropped (the handshake's resend must recover).
    pub drop_first_hellos: u32,
    /// Fault injection for tests (`SOFTVERBS_CM_DROP`): of each CM message type listed,
    /// the first this many the device sends are dropped (a teardown message exactly,
    /// which seeded loss hits only by chance).
    pub cm_drop: Vec<(AttributeId, u32)>,
    /// Notification coalescing of the stream sockets (`crate::sock`) on the same-host
    /// path: writes made while one is in flight go as plain WRITEs, announced together by
    /// one later WRITE WITH IMM.
    pub sock_coalesce: bool,
    /// Stream sockets (`crate::sock`) on the same-host path: a write's send ring bytes
    /// come back when it is posted (not when the peer's ACK completes it), and a buffer
    /// grant is taken from the target area once it is there, before its message's
    /// datagram arrives.
    pub sock_early_room: bool,
    /// Stream sockets (`crate::sock`) between softverbs peers: each offers a "bytes
    /// placed" word (after its target area's slots, advertised after the 40-byte
    /// connection data), into which a same-host writer writes its cumulative count of
    /// data bytes after the bytes, in the same copy; the reader reads bytes up to it
    /// before their DATA message's datagram arrives. Off by default: no gain measured
    /// yet (docs/sockets.md, session 11).
    pub sock_placed_word: bool,
    /// A same-host stream socket (`crate::sock`) that moves data keeps its device's
    /// socket handed over to application threads ten times `poll_handoff`
    /// (`Driver::keep_handoff_busy`); off, only the plain poller hand-off applies. On by
    /// default; the switch lets a test compare both in one run.
    pub sock_busy_handoff: bool,
    /// A blocked stream reader that finds itself on the CPU its same-host peer's bulk
    /// writer last ran on moves to another CPU that idled half the time since its last
    /// look, once (`crate::sock::apart`), with a backoff while moves do not help. Off by
    /// default: no gain shown on a loaded host, and too little on the idle one (rstream /
    /// `perf write` free, 8 interleaved pairs: median 0.69 off, 0.75 on, higher in 5 of 8;
    /// docs/sockets.md, session 16).
    pub sock_apart: bool,
}

/// Whether RC QPs whose peer is a softverbs process on this host move RDMA WRITE and
/// READ bytes straight between the two processes (`SOFTVERBS_SAME_HOST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameHostMode {
    /// Never: every QP uses UDP.
    Off,
    /// Where the peer offers it and the kernel allows it.
    Auto,
    /// As `Auto`, and a QP that cannot have it is reported with a warning.
    On,
}

/// The machine's physical memory in bytes (a registration cap no real program passes).
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory arguments.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(p), Ok(s)) if p > 0 && s > 0 => p.saturating_mul(s),
        _ => u64::MAX,
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: None,
            port: None,
            mtu: Mtu::Mtu4096,
            busy_poll: Duration::ZERO,
            poll_handoff: Duration::from_micros(50),
            ack_hold: Duration::from_micros(50),
            poll_wait_after: Duration::ZERO,
            poll_wait_under_window: Duration::ZERO,
            poll_yield_under_window: false,
            poll_spread: Duration::ZERO,
            post_join_above: 8,
            poll_long_yield: Duration::ZERO,
            progress_slice: Duration::ZERO,
            faults: None,
            pcap: None,
            icrc: IcrcPolicy::Enforce,
            gso: true,
            max_mr_bytes: physical_memory(),
            socket_buffer: 8 << 20,
            selective_repeat: true,
            cm_packet_life_time: 18,
            same_host: SameHostMode::Auto,
            drop_first_hellos: 0,
            cm_drop: Vec::new(),
            sock_coalesce: true,
            sock_early_room: false,
            sock_placed_word: false,
            sock_apart: false,
            sock_busy_handoff: true,
        }
    }
}

/// A configuration variable has a value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: {why}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub why: &'static str,
}

impl Config {
    /// Defaults overridden by the `SOFTVERBS_*` environment variables.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_env`] with a custom variable lookup (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let err = |var, value: &str, why| ConfigError {
            var,
            value: value.to_string(),
            why,
        };
        // A duration given in whole microseconds.
        let micros = |var| -> Result<Option<Duration>, ConfigError> {
            get(var)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map(Duration::from_micros)
                        .map_err(|_| err(var, &v, "not a number of µs"))
                })
                .transpose()
        };
        // An on/off switch.
        let switch = |var| -> Result<Option<bool>, ConfigError> {
            get(var)
                .map(|v| match v.trim() {
                    "1" | "on" | "yes" => Ok(true),
                    "0" | "off" | "no" => Ok(false),
                    _ => Err(err(var, &v, "must be 0 or 1")),
                })
                .transpose()
        };
        if let Some(v) = get("SOFTVERBS_ADDR") {
            if !v.trim().is_empty() {
                c.addr = Some(
                    v.trim()
                        .parse()
                        .map_err(|_| err("SOFTVERBS_ADDR", &v, "not an IP address"))?,
                );
            }
        }
        if let Some(v) = get("SOFTVERBS_PORT") {
            let port: u16 = v
                .trim()
                .parse()
                .map_err(|_| err("SOFTVERBS_PORT", &v, "not a port number"))?;
            c.port = (port != 0).then_some(port);
        }
        if let Some(v) = get("SOFTVERBS_MTU") {
            let bytes: u32 = v
                .trim()
                .parse()
                .map_err(|_| err("SOFTVERBS_MTU", &v, "not a number"))?;
            c.mtu = Mtu::from_bytes(bytes)
                .ok_or_else(|| err("SOFTVERBS_MTU", &v, "must be 256, 512, 1024, 2048 or 4096"))?;
        }
        if let Some(d) = micros("SOFTVERBS_BUSY_POLL")? {
            c.busy_poll = d;
        }
        if let Some(d) = micros("SOFTVERBS_POLL_HANDOFF")? {
            c.poll_handoff = d;
        }
        if let Some(d) = micros("SOFTVERBS_ACK_HOLD")? {
            c.ack_hold = d;
        }
        if let Some(d) = micros("SOFTVERBS_POLL_WAIT_AFTER")? {
            c.poll_wait_after = d;
        }
        if let Some(d) = micros("SOFTVERBS_POLL_WAIT_WINDOW")? {
            c.poll_wait_under_window = d;
        }
        if let Some(on) = switch("SOFTVERBS_POLL_YIELD_WINDOW")? {
            c.poll_yield_under_window = on;
        }
        if let Some(d) = micros("SOFTVERBS_POLL_SPREAD")? {
            c.poll_spread = d;
        }
        if let Some(v) = get("SOFTVERBS_POST_JOIN_ABOVE") {
            c.post_join_above = v
                .trim()
                .parse()
                .map_err(|_| err("SOFTVERBS_POST_JOIN_ABOVE", &v, "not a number"))?;
        }
        if let Some(d) = micros("SOFTVERBS_POLL_LONG_YIELD")? {
            c.poll_long_yield = d;
        }
        if let Some(d) = micros("SOFTVERBS_PROGRESS_SLICE")? {
            c.progress_slice = d;
        }
        if let Some(v) = get("SOFTVERBS_FAULTS") {
            c.faults = Some(parse_faults(&v).map_err(|why| err("SOFTVERBS_FAULTS", &v, why))?);
        }
        if let Some(v) = get("SOFTVERBS_CM_DROP") {
            c.cm_drop = parse_cm_drop(&v).map_err(|why| err("SOFTVERBS_CM_DROP", &v, why))?;
        }
        if let Some(v) = get("SOFTVERBS_PCAP") {
            if !v.is_empty() {
                c.pcap = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = get("SOFTVERBS_ICRC") {
            c.icrc = match v.trim() {
                "enforce" => IcrcPolicy::Enforce,
                "count" => IcrcPolicy::CountOnly,
                "skip" => IcrcPolicy::Skip,
                _ => return Err(err("SOFTVERBS_ICRC", &v, "must be enforce, count or skip")),
            };
        }
        if let Some(on) = switch("SOFTVERBS_GSO")? {
            c.gso = on;
        }
        if let Some(on) = switch("SOFTVERBS_SELECTIVE_REPEAT")? {
            c.selective_repeat = on;
        }
        if let Some(on) = switch("SOFTVERBS_SOCK_COALESCE")? {
            c.sock_coalesce = on;
        }
        if let Some(on) = switch("SOFTVERBS_SOCK_EARLY_ROOM")? {
            c.sock_early_room = on;
        }
        if let Some(on) = switch("SOFTVERBS_SOCK_PLACED_WORD")? {
            c.sock_placed_word = on;
        }
        if let Some(on) = switch("SOFTVERBS_SOCK_APART")? {
            c.sock_apart = on;
        }
        if let Some(on) = switch("SOFTVERBS_SOCK_BUSY_HANDOFF")? {
            c.sock_busy_handoff = on;
        }
        if let Some(v) = get("SOFTVERBS_SAME_HOST") {
            c.same_host = match v.trim() {
                "auto" | "" => SameHostMode::Auto,
                "1" | "on" | "yes" => SameHostMode::On,
                "0" | "off" | "no" => SameHostMode::Off,
                _ => return Err(err("SOFTVERBS_SAME_HOST", &v, "must be 0, 1 or auto")),
            };
        }
        if let Some(v) = get("SOFTVERBS_MAX_MR_BYTES") {
            c.max_mr_bytes = v
                .trim()
                .parse()
                .map_err(|_| err("SOFTVERBS_MAX_MR_BYTES", &v, "not a number of bytes"))?;
        }
        if let Some(v) = get("SOFTVERBS_SOCKET_BUFFER") {
            c.socket_buffer = v
                .trim()
                .parse()
                .ok()
                .filter(|&b: &usize| b > 0 && b <= i32::MAX as usize)
                .ok_or_else(|| {
                    err(
                        "SOFTVERBS_SOCKET_BUFFER",
                        &v,
                        "not a positive number of bytes",
                    )
                })?;
        }
        if let Some(v) = get("SOFTVERBS_CM_PACKET_LIFE_TIME") {
            c.cm_packet_life_time =
                v.trim()
                    .parse()
                    .ok()
                    .filter(|&n: &u8| n <= 30)
                    .ok_or_else(|| {
                        err(
                            "SOFTVERBS_CM_PACKET_LIFE_TIME",
                            &v,
                            "not an exponent from 0 to 30",
                        )
                    })?;
        }
        Ok(c)
    }
}

fn parse_faults(s: &str) -> Result<FaultConfig, &'static str> {
    let mut f = FaultConfig::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or("expected key=value pairs")?;
        if k == "seed" {
            f.seed = v.parse().map_err(|_| "seed must be an integer")?;
            continue;
        }
        let rate: f64 = v.parse().map_err(|_| "rates must be numbers")?;
        if !(0.0..=1.0).contains(&rate) {
            return Err("rates must be between 0 and 1");
        }
        match k {
            "loss" => f.loss = rate,
            "dup" | "duplicate" => f.duplicate = rate,
            "reorder" => f.reorder = rate,
            "corrupt" => f.corrupt = rate,
            _ => return Err("unknown key (loss, dup, reorder, corrupt, seed)"),
        }
    }
    Ok(f)
}

/// `SOFTVERBS_CM_DROP`: `type:count` pairs, comma-separated.
fn parse_cm_drop(s: &str) -> Result<Vec<(AttributeId, u32)>, &'static str> {
    const TYPES: [(&str, AttributeId); 9] = [
        ("req", AttributeId::Req),
        ("mra", AttributeId::Mra),
        ("rej", AttributeId::Rej),
        ("rep", AttributeId::Rep),
        ("rtu", AttributeId::Rtu),
        ("dreq", AttributeId::Dreq),
        ("drep", AttributeId::Drep),
        ("sidr_req", AttributeId::SidrReq),
        ("sidr_rep", AttributeId::SidrRep),
    ];
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (name, count) = part.split_once(':').ok_or("expected type:count pairs")?;
            let kind = TYPES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
                .ok_or("unknown type (req, mra, rej, rep, rtu, dreq, drep, sidr_req, sidr_rep)")?
                .1;
            let count = count
                .trim()
                .parse()
                .map_err(|_| "counts must be integers")?;
            Ok((kind, count))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn parses_every_variable() {
        let c = cfg(&[
            ("SOFTVERBS_ADDR", "10.1.2.3"),
            ("SOFTVERBS_PORT", "4791"),
            ("SOFTVERBS_MTU", "1024"),
            ("SOFTVERBS_BUSY_POLL", "50"),
            ("SOFTVERBS_POLL_HANDOFF", "0"),
            ("SOFTVERBS_ACK_HOLD", "0"),
            ("SOFTVERBS_POLL_WAIT_AFTER", "60"),
            ("SOFTVERBS_POLL_WAIT_WINDOW", "30"),
            ("SOFTVERBS_POLL_YIELD_WINDOW", "1"),
            ("SOFTVERBS_POLL_SPREAD", "20"),
            ("SOFTVERBS_POST_JOIN_ABOVE", "2"),
            ("SOFTVERBS_POLL_LONG_YIELD", "1000"),
            ("SOFTVERBS_PROGRESS_SLICE", "300"),
            ("SOFTVERBS_FAULTS", "loss=0.05, dup=0.01,seed=9"),
            ("SOFTVERBS_PCAP", "/tmp/x.pcap"),
            ("SOFTVERBS_ICRC", "count"),
            ("SOFTVERBS_MAX_MR_BYTES", "1048576"),
            ("SOFTVERBS_SOCKET_BUFFER", "65536"),
            ("SOFTVERBS_SELECTIVE_REPEAT", "0"),
            ("SOFTVERBS_CM_PACKET_LIFE_TIME", "10"),
            ("SOFTVERBS_SAME_HOST", "0"),
            ("SOFTVERBS_SOCK_COALESCE", "off"),
            ("SOFTVERBS_SOCK_EARLY_ROOM", "1"),
            ("SOFTVERBS_SOCK_PLACED_WORD", "1"),
            ("SOFTVERBS_SOCK_APART", "1"),
            ("SOFTVERBS_SOCK_BUSY_HANDOFF", "0"),
            ("SOFTVERBS_GSO", "no"),
            ("SOFTVERBS_CM_DROP", "dreq:1, DREP:2"),
        ])
        .unwrap();
        assert_eq!(c.cm_drop, [(AttributeId::Dreq, 1), (AttributeId::Drep, 2)]);
        assert!(Config::default().cm_drop.is_empty());
        assert!(cfg(&[("SOFTVERBS_CM_DROP", "dreq")]).is_err());
        assert!(cfg(&[("SOFTVERBS_CM_DROP", "lap:1")]).is_err());
        assert!(cfg(&[("SOFTVERBS_CM_DROP", "dreq:-1")]).is_err());
        assert!(!c.sock_coalesce && !c.gso && c.sock_early_room && !c.sock_busy_handoff);
        assert!(Config::default().sock_coalesce && Config::default().gso);
        assert!(Config::default().sock_busy_handoff);
        assert!(!Config::default().sock_early_room);
        assert!(c.sock_placed_word && !Config::default().sock_placed_word);
        assert!(c.sock_apart);
        assert_eq!(c.same_host, SameHostMode::Off);
        assert_eq!(Config::default().same_host, SameHostMode::Auto);
        assert!(cfg(&[("SOFTVERBS_SAME_HOST", "maybe")]).is_err());
        assert!(!c.selective_repeat);
        assert!(Config::default().selective_repeat);
        assert_eq!(c.cm_packet_life_time, 10);
        assert_eq!(c.addr, Some(IpAddr::from([10, 1, 2, 3])));
        assert_eq!((c.max_mr_bytes, c.socket_buffer), (1 << 20, 65536));
        assert_eq!(c.port, Some(4791));
        assert_eq!(c.mtu, Mtu::Mtu1024);
        assert_eq!(c.busy_poll, Duration::from_micros(50));
        assert_eq!(c.poll_handoff, Duration::ZERO);
        assert_eq!(c.ack_hold, Duration::ZERO);
        assert_eq!(c.poll_wait_after, Duration::from_micros(60));
        assert_eq!(Config::default().poll_wait_after, Duration::ZERO);
        assert_eq!(c.poll_wait_under_window, Duration::from_micros(30));
        assert_eq!(Config::default().poll_wait_under_window, Duration::ZERO);
        assert!(c.poll_yield_under_window && !Config::default().poll_yield_under_window);
        assert_eq!(c.poll_spread, Duration::from_micros(20));
        assert_eq!(Config::default().poll_spread, Duration::ZERO);
        assert_eq!(c.post_join_above, 2);
        assert_eq!(Config::default().post_join_above, 8);
        assert_eq!(c.poll_long_yield, Duration::from_millis(1));
        assert_eq!(Config::default().poll_long_yield, Duration::ZERO);
        assert_eq!(c.progress_slice, Duration::from_micros(300));
        let f = c.faults.unwrap();
        assert_eq!((f.loss, f.duplicate, f.seed), (0.05, 0.01, 9));
        assert_eq!(c.pcap.as_deref(), Some(std::path::Path::new("/tmp/x.pcap")));
        assert_eq!(c.icrc, IcrcPolicy::CountOnly);
        assert_eq!(cfg(&[]).unwrap(), Config::default());
        assert_eq!(Config::default().cm_packet_life_time, 18);
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(
            cfg(&[("SOFTVERBS_MTU", "1500")]).unwrap_err().var,
            "SOFTVERBS_MTU"
        );
        assert!(cfg(&[("SOFTVERBS_PORT", "70000")]).is_err());
        assert!(cfg(&[("SOFTVERBS_ADDR", "localhost:1")]).is_err());
        assert!(cfg(&[("SOFTVERBS_FAULTS", "loss=2")]).is_err());
        assert!(cfg(&[("SOFTVERBS_FAULTS", "drop=0.1")]).is_err());
        assert!(cfg(&[("SOFTVERBS_ICRC", "maybe")]).is_err());
        assert!(cfg(&[("SOFTVERBS_MAX_MR_BYTES", "lots")]).is_err());
        assert!(cfg(&[("SOFTVERBS_SOCKET_BUFFER", "0")]).is_err());
        assert!(cfg(&[("SOFTVERBS_POLL_HANDOFF", "soon")]).is_err());
        assert!(cfg(&[("SOFTVERBS_ACK_HOLD", "-5")]).is_err());
        assert!(cfg(&[("SOFTVERBS_PROGRESS_SLICE", "short")]).is_err());
        assert!(cfg(&[("SOFTVERBS_SELECTIVE_REPEAT", "sometimes")]).is_err());
        // Any value but a switch's was taken as "on" when the stream read it itself.
        assert!(cfg(&[("SOFTVERBS_SOCK_COALESCE", "false")]).is_err());
        assert!(cfg(&[("SOFTVERBS_GSO", "2")]).is_err());
        assert!(cfg(&[("SOFTVERBS_CM_PACKET_LIFE_TIME", "31")]).is_err());
        assert!(cfg(&[("SOFTVERBS_CM_PACKET_LIFE_TIME", "-1")]).is_err());
    }
}
