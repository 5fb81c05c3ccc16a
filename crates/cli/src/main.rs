//! `softverbs`: the command-line tool of softverbs.
//!
//! Device information (`devinfo`), counters (`stat`), an `ibv_rc_pingpong`-like
//! ping-pong (`pingpong`), perftest-like benchmarks (`perf`), rdmacm-utils-like tools
//! (`rping`, `udaddy`) and multicast (`mcast`). Peers exchange connection data over TCP
//! as the classic tools do, or meet through the connection manager (`--cm`, as
//! perftest's `-R`); the data path is softverbs RoCEv2-in-UDP.

mod cmlink;
mod cmpingpong;
mod conn;
mod devinfo;
mod devnode;
mod json;
mod mcast;
mod perf;
mod pingpong;
mod plot;
mod progress;
mod rping;
mod rstream;
mod run;
mod stat;
mod stats;
mod udaddy;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Errors end the program with a message and exit status 1.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// An error already reported elsewhere (a local server tells its client, which
/// prints it): exit status 1 without a message.
#[derive(Debug)]
pub struct Quiet;

impl std::fmt::Display for Quiet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed (reported by the peer)")
    }
}

impl std::error::Error for Quiet {}

/// Builds an error from a message.
#[macro_export]
macro_rules! fail {
    ($($t:tt)*) => { return Err(format!($($t)*).into()) };
}

#[derive(Parser, Debug)]
#[command(
    name = "softverbs",
    version,
    about = "RDMA verbs in user space over RoCEv2-in-UDP: device info, counters, ping-pong, benchmarks",
    after_help = "The device each command opens is configured by the SOFTVERBS_* environment \
variables (SOFTVERBS_ADDR, SOFTVERBS_PORT, SOFTVERBS_MTU, SOFTVERBS_BUSY_POLL, SOFTVERBS_FAULTS, \
SOFTVERBS_PCAP, SOFTVERBS_ICRC, SOFTVERBS_GSO)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Show the softverbs device, its port and GID table (like ibv_devinfo).
    Devinfo(DevinfoArgs),
    /// Show the engine and driver counters of every open softverbs device on this host.
    #[command(
        long_about = "Show the engine and driver counters of every open softverbs device on this \
host, as name/value lines.\n\n\
Every process that opens a softverbs device publishes that device's counters (at most every \
100 ms) in $XDG_RUNTIME_DIR/softverbs or /tmp/softverbs-<uid>; this command reads them. With \
--open it opens a device of its own instead and shows that one's."
    )]
    Stat(StatArgs),
    /// RC SEND/RECV ping-pong between two processes (like ibv_rc_pingpong).
    Pingpong(PingpongArgs),
    /// perftest-like bandwidth and latency benchmarks (like ib_write_bw, ib_send_lat...).
    Perf(PerfArgs),
    /// RDMA ping through the connection manager (like rdmacm-utils' rping): the server READs
    /// the client's buffer and WRITEs it back into another.
    Rping(RpingArgs),
    /// Stream sockets over RDMA (like librdmacm's rstream, same wire protocol, options and
    /// output): latency and bandwidth between a server and a client.
    Rstream(rstream::RstreamArgs),
    /// UD datagrams to a service resolved through the connection manager (SIDR), echoed
    /// back (like rdmacm-utils' udaddy, and surviving loss).
    Udaddy(udaddy::UdaddyArgs),
    /// UD multicast between processes: attach to a group and print what arrives, or send to it.
    Mcast(mcast::McastArgs),
    /// Run an unmodified rdma-core program on softverbs (the drop-in libibverbs.so.1).
    #[command(
        long_about = "Run an unmodified rdma-core program (ibv_devinfo, ibv_rc_pingpong, \
perftest...) on softverbs.\n\n\
Finds libsoftverbs_ibverbs.so next to this softverbs binary (cargo builds both into \
target/<profile>/), makes a directory dropin/ there holding a symlink libibverbs.so.1 to it, \
and runs CMD with that directory prepended to LD_LIBRARY_PATH. The device is configured by the \
SOFTVERBS_* environment variables as usual. Example: softverbs run -- ibv_devinfo -v\n\n\
UCX uses a device only if /dev/infiniband/<dev_name> is a character device, so CMD runs in a \
private mount namespace (a user namespace too when not root) whose /dev also holds \
infiniband/softverbs0, a bind mount of /dev/null; nothing outside CMD and its children sees it. \
--dev-node off leaves /dev alone; see docs/scale-out.md.\n\n\
--sockets also puts rdma-core's librspreload.so (Debian package librdmacm1; or the file named by \
SOFTVERBS_RSPRELOAD) first in LD_PRELOAD, so an unmodified socket program (iperf3, nc, socat) \
talks over rsockets: softverbs run --sockets -- iperf3 -s"
    )]
    Run(run::RunArgs),
}

#[derive(Args, Debug)]
pub struct RpingArgs {
    /// Run the server.
    #[arg(short, long, conflicts_with = "client")]
    server: bool,
    /// Run the client.
    #[arg(short, long)]
    client: bool,
    /// Address: the server's to connect to (client), or to listen at (server; default: all).
    #[arg(short, long)]
    addr: Option<String>,
    /// rdma_cm port (TCP port space).
    #[arg(short, long, default_value_t = 7174)]
    port: u16,
    /// Pings (0: until interrupted).
    #[arg(short = 'C', long, default_value_t = 0)]
    count: u32,
    /// Ping size in bytes (16-65535).
    #[arg(short = 'S', long, default_value_t = 64)]
    size: u32,
    /// Check every pong against its ping.
    #[arg(short = 'V', long)]
    validate: bool,
    /// Print the ping data.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Args, Debug)]
struct DevinfoArgs {
    /// Also print device limits and the GID table.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Args, Debug)]
struct StatArgs {
    /// Print the counters as JSON (an array of devices; one object with --open).
    #[arg(long)]
    json: bool,
    /// Open a device and show its own counters (checks the SOFTVERBS_* configuration).
    #[arg(long)]
    open: bool,
}

#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// Wait for a client on the TCP port.
    #[arg(long, conflicts_with = "host")]
    server: bool,
    /// Server to connect to.
    #[arg(required_unless_present = "server")]
    host: Option<String>,
    /// TCP port for the connection exchange.
    #[arg(short, long, default_value_t = 18515)]
    port: u16,
    /// Message size in bytes [default: 4096; with --ud 2048, as ibv_ud_pingpong, or the
    /// port's MTU if smaller].
    #[arg(short, long)]
    size: Option<u32>,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Fill every message with a per-iteration pattern and check every received byte.
    #[arg(long)]
    validate: bool,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096) [default: 1024, as ibv_rc_pingpong;
    /// with --ud the port's MTU, which this lowers].
    #[arg(long)]
    mtu: Option<u32>,
    /// Use an unreliable connected (UC) QP, like ibv_uc_pingpong: a lost message
    /// is not recovered, so this needs a lossless path.
    #[arg(long, conflicts_with = "ud")]
    uc: bool,
    /// Receive through a shared receive queue (like ibv_srq_pingpong).
    #[arg(long)]
    srq: bool,
    /// Use an unreliable datagram (UD) QP, like ibv_ud_pingpong: messages of at
    /// most one MTU, received after a 40-byte GRH area; needs a lossless path.
    #[arg(long)]
    ud: bool,
    /// Connect the RC QPs through the connection manager (as perftest's -R): --port is
    /// the rdma_cm port (TCP port space) and no TCP connection is used.
    #[arg(long, conflicts_with_all = ["ud", "uc", "srq"])]
    cm: bool,
}

/// The operation a benchmark measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND/RECV.
    Send,
    /// Atomic FETCH_AND_ADD (8 bytes).
    Atomic,
}

impl Op {
    /// Its name in the control protocol and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }

    /// Parses [`Op::name`].
    pub fn from_name(s: &str) -> Option<Op> {
        [Op::Write, Op::Read, Op::Send, Op::Atomic]
            .into_iter()
            .find(|o| o.name() == s)
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
With neither HOST nor --server, both ends run on this machine: the command starts a copy of \
itself as the server (on a free TCP port) and runs the client against 127.0.0.1.

A server takes the test parameters (sizes, iterations, QPs, MTU, depth) from the client; only \
the operation must match.

Bandwidth is reported in MB/sec with MB = 2^20 bytes (as ib_*_bw print by default) and message \
rate in millions of messages per second. Latency is in microseconds; write and send latencies \
are half the round trip (as ib_write_lat and ib_send_lat report), read and atomic latencies the \
full time to completion.")]
pub struct PerfArgs {
    /// Operation to measure.
    #[arg(value_enum)]
    op: Op,
    /// Server to connect to (omit it, and --server, to run both ends locally).
    host: Option<String>,
    /// Measure bandwidth (the default). With --lat too, both are measured.
    #[arg(long)]
    bw: bool,
    /// Measure latency.
    #[arg(long)]
    lat: bool,
    /// Message size in bytes [default: 65536 for bandwidth, 2 for latency, 8 for atomic].
    #[arg(short, long, conflicts_with = "all")]
    size: Option<u32>,
    /// Sweep sizes from 2 bytes to 8 MiB in powers of two (fewer iterations for big sizes).
    #[arg(short, long)]
    all: bool,
    /// Iterations per size and QP [default: 5000 for bandwidth, 1000 for latency].
    #[arg(short = 'n', long)]
    iters: Option<u32>,
    /// Run a bandwidth test for this many seconds instead of a number of iterations
    /// (write, read and atomic only: a SEND receiver needs the message count).
    #[arg(short = 'D', long, value_name = "SECS", conflicts_with_all = ["iters", "all", "lat"])]
    duration: Option<f64>,
    /// Number of QPs (bandwidth tests spread the work over all of them; latency tests use the first).
    #[arg(short, long, default_value_t = 1)]
    qps: u32,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096) [default: SOFTVERBS_MTU or 4096].
    #[arg(short, long)]
    mtu: Option<u32>,
    /// Wait for a client on the TCP port.
    #[arg(long, conflicts_with = "host")]
    server: bool,
    /// TCP port for the connection exchange.
    #[arg(short, long, default_value_t = 18515)]
    port: u16,
    /// Print results as JSON on stdout (and nothing else there).
    #[arg(long)]
    json: bool,
    /// Write an SVG chart of bandwidth and latency against message size.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Work requests kept outstanding per QP in bandwidth tests.
    #[arg(short, long, default_value_t = 128)]
    tx_depth: u32,
    /// Signal one work request in this many (perftest's CQ moderation).
    #[arg(long, default_value_t = 64)]
    cq_mod: u32,
    /// Show progress on stderr even when it is not a terminal.
    #[arg(long)]
    progress: bool,
    /// SEND over unreliable datagram (UD) QPs: messages of at most one MTU
    /// (like ib_send_bw/lat on a UD connection).
    #[arg(long)]
    ud: bool,
    /// Connect through the connection manager, as perftest's -R: --port is the rdma_cm
    /// port (TCP port space, and the UDP one for --ud), the test parameters travel over an
    /// rdma_cm connection, and every test QP gets a connection of its own (UD: a service
    /// resolution, SIDR). No TCP connection is used.
    #[arg(long)]
    cm: bool,
    /// Set on the server a local run starts: it stays quiet.
    #[arg(long, hide = true)]
    spawned: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Devinfo(a) => devinfo::run(a.verbose),
        Cmd::Stat(a) => stat::run(a.json, a.open),
        Cmd::Pingpong(a) => pingpong::run(&a),
        Cmd::Perf(a) => perf::run(&a),
        Cmd::Mcast(a) => mcast::run(&a),
        Cmd::Udaddy(a) => udaddy::run(&a),
        Cmd::Rping(a) => rping::run(&a),
        Cmd::Rstream(a) => rstream::run(&a),
        Cmd::Run(a) => run::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.downcast_ref::<Quiet>().is_none() {
                eprintln!("softverbs: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
