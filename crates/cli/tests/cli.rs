//! The `softverbs` binary end to end: every test runs it as separate processes
//! talking over loopback, each bounded by a timeout.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(60);

/// The machine may have two cores; benchmarks spin, so they run one at a time.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start softverbs")
}

/// Waits for `child`, killing it after `TIMEOUT`.
fn finish(mut child: Child, what: &str) -> Out {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {TIMEOUT:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Out {
    finish(spawn(args, env), &args.join(" "))
}

fn run_ok(args: &[&str]) -> Out {
    let out = run(args, &[]);
    assert!(
        out.status.success(),
        "softverbs {} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// The numbers of the first table row after the header line starting with `#bytes`.
fn table_row(out: &str) -> Vec<f64> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next().expect("a results table");
    let row = lines.next().expect("a results row");
    row.split_whitespace()
        .map(|w| {
            w.parse::<f64>()
                .unwrap_or_else(|_| panic!("number in {row:?}"))
        })
        .collect()
}

#[test]
fn devinfo_shows_an_active_port_and_the_gid() {
    let out = run_ok(&["devinfo", "-v"]);
    let text = &out.stdout;
    assert!(text.contains("hca_id:\tsoftverbs0"), "{text}");
    assert!(text.contains("PORT_ACTIVE"), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
    assert!(text.contains("max_qp_rd_atom:"), "{text}");
    // The GID is the device's UDP endpoint in RoCEv2 form: by default the process's own
    // loopback address 127.83.x.y at 4791, so the standard ::ffff:a.b.c.d (other ports ride
    // in bytes 8-9).
    let endpoint: std::net::SocketAddrV4 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("udp_endpoint:"))
        .expect("udp_endpoint line")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .expect("an IPv4 endpoint");
    let [a, b, c, d] = endpoint.ip().octets();
    // (127.0.0.1 and a free port where something holds every address at 4791.)
    let fallback = endpoint.port() != 4791 && [a, b, c, d] == [127, 0, 0, 1];
    assert!([a, b] == [127, 83] || fallback, "{text}");
    let port = match endpoint.port() {
        4791 => 0,
        p => p,
    };
    let gid = format!("0000:0000:0000:0000:{port:04x}:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}");
    assert!(
        text.contains(&format!("GID[  0]:\t\t{gid}")),
        "{gid} in\n{text}"
    );
    let plain = run_ok(&["devinfo"]).stdout;
    assert!(plain.contains("PORT_ACTIVE") && !plain.contains("max_qp:"));
}

#[test]
fn stat_open_prints_its_own_counters_as_text_and_json() {
    let text = run_ok(&["stat", "--open"]).stdout;
    assert!(text.lines().any(|l| l.starts_with("tx_packets ")), "{text}");
    assert!(text.contains("udp_rx_datagrams"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&run_ok(&["stat", "--open", "--json"]).stdout)
            .expect("stat --open --json is JSON");
    assert_eq!(json["counters"]["tx_packets"], 0);
    assert!(json["counters"]["injected_drops"].is_u64());
}

#[test]
fn stat_shows_the_devices_of_other_processes() {
    let _g = heavy();
    let port = free_port().to_string();
    // A ping-pong long enough to be watched, killed once seen.
    let mut server = spawn(
        &["pingpong", "--server", "-p", &port, "-n", "100000000"],
        &[],
    );
    let mut client = spawn(
        &["pingpong", "127.0.0.1", "-p", &port, "-n", "100000000"],
        &[],
    );
    let pids = [server.id() as u64, client.id() as u64];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let seen = loop {
        let out = run_ok(&["stat", "--json"]).stdout;
        let v: serde_json::Value = serde_json::from_str(&out).expect("stat --json is JSON");
        let busy = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| pids.contains(&d["pid"].as_u64().unwrap_or(0)))
            .filter(|d| d["counters"]["tx_packets"].as_u64().unwrap_or(0) > 0)
            .count();
        if busy == 2 || Instant::now() > deadline {
            break busy == 2;
        }
        last = out;
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = run_ok(&["stat"]).stdout;
    for c in [&mut server, &mut client] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(seen, "both ping-pong devices publish counters:\n{last}");
    assert!(text.contains(&format!("(pid {})", pids[0])), "{text}");
}

#[test]
fn perf_bw_every_operation_both_ends_local() {
    let _g = heavy();
    for op in ["write", "read", "send", "atomic"] {
        let mut args = vec!["perf", op, "--bw", "--iters", "200"];
        if op != "atomic" {
            args.extend(["--size", "4096"]);
        }
        let out = run_ok(&args);
        let row = table_row(&out.stdout);
        let size = if op == "atomic" { 8.0 } else { 4096.0 };
        assert_eq!(&row[..2], &[size, 200.0], "{op}: {}", out.stdout);
        // peak, average, message rate
        assert!(
            row[2] > 0.0 && row[3] > 0.0 && row[4] > 0.0,
            "{op}: {row:?}"
        );
        assert!(row[2] >= row[3], "{op}: peak below average: {row:?}");
    }
}

#[test]
fn perf_lat_every_operation_both_ends_local() {
    let _g = heavy();
    for op in ["write", "read", "send", "atomic"] {
        let out = run_ok(&["perf", op, "--lat", "--iters", "100"]);
        let row = table_row(&out.stdout);
        assert_eq!(row.len(), 9, "{op}: {}", out.stdout);
        assert_eq!(row[1], 100.0);
        let (min, max, typical, avg, p99, p999) = (row[2], row[3], row[4], row[5], row[7], row[8]);
        assert!(min > 0.0, "{op}: {row:?}");
        assert!(min <= typical && typical <= max && min <= avg && avg <= max);
        assert!(
            typical <= p99 && p99 <= p999 && p999 <= max,
            "{op}: {row:?}"
        );
    }
}

/// More SENDs than the 512 receives posted before a SEND ping-pong: each side must post
/// its receives again as it polls them (as ib_send_lat does), or the peer's SENDs find no
/// receive and the run stalls.
#[test]
fn perf_send_lat_reposts_its_receives() {
    let _g = heavy();
    let out = run_ok(&["perf", "send", "--lat", "--size", "8", "--iters", "1300"]);
    let row = table_row(&out.stdout);
    assert_eq!(row[1], 1300.0, "{}", out.stdout);
}

#[test]
fn perf_json_is_json() {
    let _g = heavy();
    let out = run_ok(&[
        "perf", "write", "--bw", "--lat", "--size", "4096", "--iters", "100", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}", out.stdout));
    assert_eq!(v["test"], "write");
    assert_eq!(v["mtu"], 4096);
    let bw = &v["bw"][0];
    assert_eq!(bw["bytes"], 4096);
    assert_eq!(bw["iterations"], 100);
    assert!(bw["bw_avg_mb_per_sec"].as_f64().unwrap() > 0.0, "{bw}");
    assert!(bw["msg_rate_mpps"].as_f64().unwrap() > 0.0, "{bw}");
    let lat = &v["lat"][0];
    assert!(lat["t_typical_usec"].as_f64().unwrap() > 0.0, "{lat}");
    assert!(lat["p99_9_usec"].as_f64().unwrap() >= lat["t_min_usec"].as_f64().unwrap());
    // The client's counters show its 100 WRITEs on whichever path carried them: packets on
    // the UDP path, or placed writes once the same-host path has taken over (those send no
    // packet at all).
    let c = &v["client_counters"];
    let carried = c["tx_packets"].as_u64().unwrap() + c["same_host_writes"].as_u64().unwrap();
    assert!(carried >= 100, "{c}");
}

#[test]
fn perf_bw_for_a_duration() {
    let _g = heavy();
    for (op, qps) in [("write", "1"), ("read", "2")] {
        let out = run_ok(&[
            "perf",
            op,
            "--bw",
            "--size",
            "4096",
            "--duration",
            "0.5",
            "--qps",
            qps,
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}", out.stdout));
        let bw = &v["bw"][0];
        let iters = bw["iterations"].as_u64().unwrap();
        // It stops at a signaled WR: a whole number of moderation periods.
        assert!(iters >= 64 && iters % 64 == 0, "{op}: {bw}");
        let secs = bw["seconds"].as_f64().unwrap();
        assert!((0.5..10.0).contains(&secs), "{op}: {bw}");
        assert!(
            bw["bw_avg_mb_per_sec"].as_f64().unwrap() > 0.0,
            "{op}: {bw}"
        );
    }
    // A SEND receiver needs the count; latency tests and sweeps have one.
    let out = run(&["perf", "send", "--bw", "--duration", "1"], &[]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--duration"), "{}", out.stderr);
    for extra in ["--lat", "--all"] {
        let out = run(&["perf", "write", "--duration", "1", extra], &[]);
        assert!(!out.status.success(), "--duration with {extra}");
    }
    let out = run(&["perf", "write", "--duration", "0"], &[]);
    assert!(!out.status.success());
}

#[test]
fn perf_all_sizes_with_plot() {
    let _g = heavy();
    let dir = std::env::temp_dir().join(format!("softverbs-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("chart.svg");
    let out = run_ok(&[
        "perf",
        "send",
        "--all",
        "--bw",
        "--lat",
        "--iters",
        "4",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let sizes: Vec<u64> = v["bw"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, (1..=23).map(|k| 1u64 << k).collect::<Vec<_>>());
    assert_eq!(v["lat"].as_array().unwrap().len(), 23);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.contains("<svg"), "{chart}");
    assert!(chart.contains("bandwidth") && chart.contains("latency"));
    assert!(chart.contains(">8M<"), "x axis reaches 8 MiB");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perf_server_and_client_as_separate_commands() {
    let _g = heavy();
    let port = free_port().to_string();
    let server = spawn(&["perf", "read", "--server", "-p", &port], &[]);
    let client = run(
        &[
            "perf",
            "read",
            "127.0.0.1",
            "-p",
            &port,
            "--bw",
            "--size",
            "1024",
            "--iters",
            "300",
            "--qps",
            "2",
        ],
        &[],
    );
    let server = finish(server, "perf server");
    assert!(client.status.success(), "client: {}", client.stderr);
    assert!(server.status.success(), "server: {}", server.stderr);
    let row = table_row(&client.stdout);
    assert_eq!(&row[..2], &[1024.0, 300.0]);
    assert!(row[3] > 0.0);
    assert!(server.stdout.contains("2 QP(s)"), "{}", server.stdout);
}

#[test]
fn perf_rejects_mismatched_operations_and_bad_sizes() {
    let out = run(&["perf", "atomic", "--size", "64"], &[]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("8 bytes"), "{}", out.stderr);
    let port = free_port().to_string();
    let server = spawn(&["perf", "write", "--server", "-p", &port], &[]);
    let client = run(&["perf", "read", "127.0.0.1", "-p", &port], &[]);
    let server = finish(server, "perf server");
    assert!(!client.status.success() && !server.status.success());
    assert!(
        client.stderr.contains("started for write"),
        "{}",
        client.stderr
    );
}

fn pingpong(env: &[(&str, &str)], iters: &str) {
    pingpong_with(env, iters, &[]);
}

fn pingpong_with(env: &[(&str, &str)], iters: &str, extra: &[&str]) {
    let port = free_port().to_string();
    let mut server_args = vec![
        "pingpong",
        "--server",
        "-p",
        &port,
        "--validate",
        "-n",
        iters,
    ];
    server_args.extend_from_slice(extra);
    let server = spawn(&server_args, env);
    let mut client_args = vec![
        "pingpong",
        "127.0.0.1",
        "-p",
        &port,
        "--validate",
        "-n",
        iters,
    ];
    client_args.extend_from_slice(extra);
    let client = finish(spawn(&client_args, env), "pingpong client");
    let server = finish(server, "pingpong server");
    for (who, out) in [("client", &client), ("server", &server)] {
        assert!(
            out.status.success(),
            "{who} failed ({}):\n{}\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        assert!(
            out.stdout.contains(&format!("{iters} iters in")),
            "{who}: {}",
            out.stdout
        );
        assert!(out.stdout.contains("Mbit/sec"));
        assert!(out.stdout.contains("validated"));
    }
}

#[test]
fn pingpong_validates_every_byte() {
    let _g = heavy();
    pingpong(&[], "300");
}

#[test]
fn uc_pingpong_validates_every_byte() {
    let _g = heavy();
    pingpong_with(&[], "200", &["--uc", "-s", "10000"]);
}

#[test]
fn ud_pingpong_validates_every_byte() {
    let _g = heavy();
    pingpong_with(&[], "200", &["--ud", "-s", "1000"]);
}

/// `softverbs pingpong --ud` with its default options: 2048-byte datagrams (as
/// ibv_ud_pingpong), within the port's MTU.
#[test]
fn ud_pingpong_runs_with_its_defaults() {
    let _g = heavy();
    let port = free_port().to_string();
    let server = spawn(&["pingpong", "--server", "--ud", "-p", &port], &[]);
    let client = finish(
        spawn(&["pingpong", "--ud", "127.0.0.1", "-p", &port], &[]),
        "pingpong --ud client",
    );
    let server = finish(server, "pingpong --ud server");
    for (who, out) in [("client", &client), ("server", &server)] {
        assert!(
            out.status.success(),
            "{who} failed ({}):\n{}\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        assert!(
            out.stdout.contains("4096000 bytes in"),
            "{who}: {}",
            out.stdout
        );
    }
}

#[test]
fn perf_send_over_ud_bw_and_lat() {
    let _g = heavy();
    for mode in ["--bw", "--lat"] {
        let out = run_ok(&[
            "perf", "send", mode, "--ud", "--size", "1024", "--iters", "300",
        ]);
        let row = table_row(&out.stdout);
        assert!(row.len() >= 3 && row[0] == 1024.0, "{mode}: {}", out.stdout);
        assert!(row[2] > 0.0, "{mode}: non-zero figure: {}", out.stdout);
    }
    // UD carries SEND only, and at most one MTU.
    let out = run(
        &[
            "perf", "write", "--bw", "--ud", "--size", "1024", "--iters", "10",
        ],
        &[],
    );
    assert!(!out.status.success());
    let out = run(
        &[
            "perf", "send", "--bw", "--ud", "--size", "8192", "--iters", "10",
        ],
        &[],
    );
    assert!(!out.status.success());
}

/// UD has no retry: with datagrams dropped, a ping-pong whose ping or pong is lost
/// would wait forever (ib_send_lat does). `perf send --lat --ud` pings again after a
/// quiet spell, keeps no sample for that round trip, and says how many it resent.
#[test]
fn perf_send_lat_over_ud_survives_loss() {
    let _g = heavy();
    let args = [
        "perf", "send", "--lat", "--ud", "--size", "64", "--iters", "300",
    ];
    let out = run(&args, &[("SOFTVERBS_FAULTS", "loss=0.05,seed=3")]);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let row = table_row(&out.stdout);
    assert_eq!(row[..2], [64.0, 300.0], "{}", out.stdout);
    assert!(row[2] > 0.0, "a minimum: {}", out.stdout);
    // 5 % of the pings and 5 % of the pongs are dropped: about 30 of 300 resent. (Without
    // loss a 20 ms stall of either end resends too, so no lossless count is asserted.)
    let resent = *row.last().unwrap();
    assert!(
        (1.0..300.0).contains(&resent),
        "pings resent: {}",
        out.stdout
    );
}

#[test]
fn srq_pingpong_validates_every_byte() {
    let _g = heavy();
    pingpong_with(&[], "200", &["--srq"]);
}

#[test]
fn pingpong_validates_under_injected_loss() {
    let _g = heavy();
    pingpong(&[("SOFTVERBS_FAULTS", "loss=0.05,seed=1")], "100");
}

/// `softverbs run -- CMD`: CMD runs with a directory first on LD_LIBRARY_PATH that links
/// libibverbs.so.1, librdmacm.so.1, libmlx5.so.1 and libefa.so.1 to the libraries built
/// beside the binary (`cargo build --workspace` builds them); a C program started that way
/// sees softverbs0, and rdma_cm programs load both drop-in libraries with every import bound.
#[test]
fn run_puts_the_drop_in_libraries_first() {
    let out = run_ok(&["run", "--", "sh", "-c", "echo \"$LD_LIBRARY_PATH\""]);
    let first = out
        .stdout
        .trim()
        .split(':')
        .next()
        .unwrap_or("")
        .to_string();
    let dir = std::path::Path::new(&first);
    assert!(dir.ends_with("dropin"), "first entry: {first}");
    let profile = std::path::Path::new(BIN).parent().expect("profile dir");
    for (link, lib) in [
        ("libibverbs.so.1", "libsoftverbs_ibverbs.so"),
        ("librdmacm.so.1", "libsoftverbs_rdmacm.so"),
        ("libmlx5.so.1", "libsoftverbs_mlx5.so"),
        ("libefa.so.1", "libsoftverbs_efa.so"),
    ] {
        let target = std::fs::read_link(dir.join(link))
            .unwrap_or_else(|e| panic!("{link} in {first}: {e} (run cargo build --workspace)"));
        assert_eq!(
            target,
            profile.join(lib).canonicalize().expect("built library"),
            "{link}"
        );
    }
    // An existing LD_LIBRARY_PATH is kept after it.
    let out = run(
        &["run", "--", "sh", "-c", "echo \"$LD_LIBRARY_PATH\""],
        &[("LD_LIBRARY_PATH", "/opt/x")],
    );
    assert!(out.stdout.trim().ends_with(":/opt/x"), "{}", out.stdout);
    // A program that cannot be started is a clear error.
    let out = run(&["run", "--", "/nonexistent/program"], &[]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("cannot run /nonexistent/program"),
        "{}",
        out.stderr
    );
    // Debian's ibv_devices, unmodified, lists the softverbs device.
    if std::path::Path::new("/usr/bin/ibv_devices").is_file() {
        let out = run_ok(&["run", "--", "/usr/bin/ibv_devices"]);
        assert!(out.stdout.contains("softverbs0"), "{}", out.stdout);
    } else {
        eprintln!(
            "SKIPPED part: /usr/bin/ibv_devices not installed (apt-get install ibverbs-utils)"
        );
    }
    // Debian's rping and perftest's ib_send_bw (which uses rdma_cm with -R) load both drop-in
    // libraries, and the loader binds every import at its version node (`ldd -r`).
    for (tool, package) in [
        ("/usr/bin/rping", "rdmacm-utils"),
        ("/usr/bin/ib_send_bw", "perftest"),
    ] {
        if !std::path::Path::new(tool).is_file() {
            eprintln!("SKIPPED part: {tool} not installed (apt-get install {package})");
            continue;
        }
        let out = run_ok(&["run", "--", "ldd", "-r", tool]).stdout;
        for lib in ["librdmacm.so.1", "libibverbs.so.1"] {
            assert!(
                out.contains(&format!("{lib} => {}", dir.join(lib).display())),
                "{tool}: {lib} not from {first}:\n{out}"
            );
        }
        assert!(
            !out.contains("undefined symbol") && !out.contains("not found"),
            "{tool}:\n{out}"
        );
    }
}

/// `softverbs run --sockets` preloads rdma-core's librspreload.so (first, before what the
/// caller preloads) on top of what `run` does; a missing library is a clear error and runs
/// nothing; without `--sockets` nothing is preloaded.
#[test]
fn run_sockets_preloads_librspreload() {
    const SHOW: &str = "echo \"$LD_PRELOAD|$LD_LIBRARY_PATH\"";
    let system = std::path::Path::new("/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so");
    // A library named by SOFTVERBS_RSPRELOAD is used as given (any file will do here: the
    // shell never opens a socket, so the preload is never asked to do anything).
    let stand_in = std::env::temp_dir().join(format!("rspreload-{}.so", std::process::id()));
    std::fs::copy("/bin/true", &stand_in).expect("make a stand-in library file");
    let stand_in_str = stand_in.to_str().unwrap();
    let out = run(
        &["run", "--sockets", "--", "sh", "-c", SHOW],
        &[("SOFTVERBS_RSPRELOAD", stand_in_str), ("LD_PRELOAD", "")],
    );
    assert!(out.status.success(), "{}", out.stderr);
    let (preload, libpath) = out.stdout.trim().split_once('|').expect("two fields");
    assert_eq!(preload, stand_in_str);
    assert!(
        libpath.split(':').next().unwrap().ends_with("dropin"),
        "{libpath}"
    );
    // The caller's own preloads stay, after it.
    let out = run(
        &["run", "--sockets", "--", "sh", "-c", SHOW],
        &[
            ("SOFTVERBS_RSPRELOAD", stand_in_str),
            ("LD_PRELOAD", "libfoo.so"),
        ],
    );
    let _ = std::fs::remove_file(&stand_in);
    assert!(
        out.stdout
            .starts_with(&format!("{stand_in_str}:libfoo.so|")),
        "{}",
        out.stdout
    );
    // Missing: an error naming what is wrong, and the program never runs.
    let out = run(
        &["run", "--sockets", "--", "sh", "-c", "echo ran"],
        &[("SOFTVERBS_RSPRELOAD", "/nonexistent/librspreload.so")],
    );
    assert!(!out.status.success());
    assert!(!out.stdout.contains("ran"), "{}", out.stdout);
    assert!(
        out.stderr.contains("/nonexistent/librspreload.so")
            && out.stderr.contains("librspreload.so"),
        "{}",
        out.stderr
    );
    // Without --sockets, nothing is preloaded.
    let out = run(&["run", "--", "sh", "-c", SHOW], &[("LD_PRELOAD", "")]);
    assert!(out.stdout.starts_with('|'), "{}", out.stdout);
    // Debian's own library is found where librdmacm1 installs it.
    if system.is_file() {
        let out = run(
            &["run", "--sockets", "--", "sh", "-c", SHOW],
            &[("LD_PRELOAD", "")],
        );
        assert!(out.status.success(), "{}", out.stderr);
        assert!(
            out.stdout.starts_with(&format!("{}|", system.display())),
            "{}",
            out.stdout
        );
    } else {
        eprintln!(
            "SKIPPED part: {} not installed (apt-get install librdmacm1)",
            system.display()
        );
    }
    // Argument handling: --sockets still needs a program.
    let out = run(&["run", "--sockets"], &[]);
    assert!(!out.status.success());
}

/// The JSON document of a local `softverbs perf send --bw --ud` run of `iters` 1024-byte
/// messages, checked: it completes, and every message sent is counted as received or lost.
fn perf_ud_bw(iters: u64, env: &[(&str, &str)]) -> serde_json::Value {
    let _g = heavy();
    let n = iters.to_string();
    let args = [
        "perf", "send", "--bw", "--ud", "--size", "1024", "--iters", &n, "--json",
    ];
    let out = run(&args, env);
    assert!(
        out.status.success(),
        "softverbs {} failed ({}):\n{}\n{}",
        args.join(" "),
        out.status,
        out.stdout,
        out.stderr
    );
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let row = &v["bw"][0];
    assert_eq!(row["iterations"], iters, "{v}");
    let received = row["received"].as_u64().expect("received count");
    let lost = row["lost"].as_u64().expect("lost count");
    assert_eq!(received + lost, iters, "{v}");
    assert!(received > 0, "{v}");
    assert!(row["bw_avg_mb_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    v
}

/// UD bandwidth over ten times the receives the server keeps posted: the run ends with
/// an account of what arrived (UD may drop datagrams) instead of waiting for a count.
#[test]
fn perf_ud_bw_outlasts_the_receive_queue() {
    perf_ud_bw(5000, &[]);
}

/// With injected loss a UD bandwidth run still ends (checkpoints and their answers are
/// datagrams too, and are repeated) and reports the loss.
#[test]
fn perf_ud_bw_reports_injected_loss() {
    let v = perf_ud_bw(5000, &[("SOFTVERBS_FAULTS", "loss=0.05,seed=7")]);
    assert!(v["bw"][0]["lost"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["client_counters"]["injected_drops"].as_u64().unwrap() > 0,
        "{v}"
    );
}
