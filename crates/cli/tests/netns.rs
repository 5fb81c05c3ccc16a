//! Two network namespaces joined by a veth pair that the test creates: the
//! devices talk over a real (virtual) link, with the kernel segmenting GSO
//! batches. Needs root and iproute2; elsewhere it skips with a loud message,
//! unless `CI=true` or `SOFTVERBS_REQUIRE_NETNS=1`, where a skip is a failure.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(90);

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("SOFTVERBS_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

/// Whether namespaces can be made here; skips (or fails, where required) if not.
fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc_geteuid() } == 0;
    let ip = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && ip {
        return true;
    }
    let why = if !root {
        "not running as root"
    } else {
        "iproute2 (ip) not installed"
    };
    assert!(
        !required(),
        "{test}: network namespace test required here but {why}"
    );
    eprintln!("\n*** SKIPPED {test}: {why}; network namespace tests need root and iproute2 ***\n");
    false
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces with a veth pair between them; removed on drop.
struct Link {
    ns: [String; 2],
    addr: [String; 2],
}

impl Link {
    fn new(tag: u8) -> Link {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let ns = [format!("svt{id}a"), format!("svt{id}b")];
        let dev = [format!("sv{id}a"), format!("sv{id}b")];
        let subnet = 200 + u32::from(tag);
        let addr = [format!("10.254.{subnet}.1"), format!("10.254.{subnet}.2")];
        for n in &ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
            ip(&["netns", "add", n]);
        }
        let link = Link {
            ns: ns.clone(),
            addr: addr.clone(),
        };
        ip(&[
            "link", "add", &dev[0], "type", "veth", "peer", "name", &dev[1],
        ]);
        for i in 0..2 {
            ip(&["link", "set", &dev[i], "netns", &ns[i]]);
            ip(&[
                "-n",
                &ns[i],
                "addr",
                "add",
                &format!("{}/24", addr[i]),
                "dev",
                &dev[i],
            ]);
            ip(&["-n", &ns[i], "link", "set", &dev[i], "up"]);
            ip(&["-n", &ns[i], "link", "set", "lo", "up"]);
        }
        link
    }

    /// Runs the softverbs binary inside namespace `i`, its device on that side's
    /// address.
    fn spawn(&self, i: usize, args: &[&str], extra_env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[i], BIN]).args(args);
        cmd.env("SOFTVERBS_ADDR", &self.addr[i]);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().expect("start softverbs in a namespace")
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Waits for `child` (killing it after TIMEOUT); returns success and output.
fn finish(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut out);
    let _ = child.stderr.take().unwrap().read_to_string(&mut out);
    (status.success(), out)
}

fn pair(link: &Link, server: &[&str], client: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let srv = link.spawn(0, server, env);
    std::thread::sleep(Duration::from_millis(300));
    let cli = link.spawn(1, client, env);
    let (cok, cout) = finish(cli);
    let (sok, sout) = finish(srv);
    assert!(
        cok && sok,
        "client ok={cok}:\n{cout}\nserver ok={sok}:\n{sout}"
    );
    (sout, cout)
}

#[test]
fn pingpong_and_perf_between_two_namespaces() {
    if !can_run("pingpong_and_perf_between_two_namespaces") {
        return;
    }
    let link = Link::new(1);
    let peer = link.addr[0].clone();
    // RC ping-pong, every byte checked, 64 KiB messages (16 packets each way).
    let (_, out) = pair(
        &link,
        &[
            "pingpong",
            "--server",
            "-s",
            "65536",
            "-n",
            "200",
            "--validate",
        ],
        &["pingpong", &peer, "-s", "65536", "-n", "200", "--validate"],
        &[],
    );
    assert!(out.contains("usec/iter"), "{out}");
    // RDMA WRITE bandwidth across the link: GSO batches are segmented by the
    // kernel on the way, so segment k arrives as its own datagram with IPv4 ID k.
    let (_, out) = pair(
        &link,
        &["perf", "write", "--bw", "--server"],
        &[
            "perf", "write", "--bw", "--size", "65536", "--iters", "500", &peer,
        ],
        &[],
    );
    assert!(out.contains("65536"), "{out}");
    // And with 5 % injected loss: still exits 0 with every byte validated.
    let (_, out) = pair(
        &link,
        &[
            "pingpong",
            "--server",
            "-s",
            "4096",
            "-n",
            "100",
            "--validate",
        ],
        &["pingpong", &peer, "-s", "4096", "-n", "100", "--validate"],
        &[("SOFTVERBS_FAULTS", "loss=0.05,seed=3")],
    );
    assert!(out.contains("usec/iter"), "{out}");
}

/// The connection manager across a real link: rping (RC connect through rendezvous
/// socket and QP1, RDMA READ and WRITE, disconnect), clean and with 2 % loss.
#[test]
fn rping_between_two_namespaces() {
    if !can_run("rping_between_two_namespaces") {
        return;
    }
    let link = Link::new(2);
    let peer = link.addr[0].clone();
    for env in [&[][..], &[("SOFTVERBS_FAULTS", "loss=0.02,seed=11")][..]] {
        pair(
            &link,
            &["rping", "-s", "-p", "7174"],
            &[
                "rping", "-c", "-a", &peer, "-p", "7174", "-C", "10", "-S", "2000", "-V",
            ],
            env,
        );
    }
}
