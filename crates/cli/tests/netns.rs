//! Two network namespaces joined by a veth pair that the test creates: the
//! devices talk over a real (virtual) link, with the kernel segmenting GSO
//! batches. Needs root and iproute2; elsewhere it skips with a loud message,
//! unless `CI=true` or `SOFTVERBS_REQUIRE_NETNS=1`, where a skip is a failure.

mod common;

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

impl Link {
    /// Waits (bounded) until process `pid` in namespace `i` listens: a TCP listener or an
    /// unconnected UDP socket of its own beside the device's socket at 4791 (the rdma_cm
    /// rendezvous socket, or the out-of-band exchange's listener). A fixed head start was
    /// not enough on a loaded machine: a client that comes too early is refused.
    fn wait_listening(&self, i: usize, pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let owner = format!("pid={pid},");
        while Instant::now() < deadline {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns[i], "ss", "-Hlnptu"])
                .output()
                .expect("run ss in the namespace");
            let listing = String::from_utf8_lossy(&out.stdout);
            let ready = listing.lines().any(|l| {
                l.contains(&owner)
                    && l.split_whitespace()
                        .nth(4)
                        .is_some_and(|local| !local.ends_with(":4791"))
            });
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
fn finish(child: Child) -> (bool, String) {
    common::finish(child, TIMEOUT)
}

/// [`finish`] for a child whose stdout someone else reads: success and stderr.
fn finish_stderr(mut child: Child) -> (bool, String) {
    let status = common::wait_or_kill(&mut child, TIMEOUT);
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status.success(), err)
}

fn pair(link: &Link, server: &[&str], client: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let srv = link.spawn(0, server, env);
    link.wait_listening(0, srv.id());
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
/// socket and QP1, RDMA READ and WRITE, disconnect), clean and with 2 % loss. And
/// address resolution where the kernel has no route (the namespaces have only their
/// /24): ADDR_ERROR with ENETUNREACH's status, for RC (rping) and UD (udaddy) alike.
#[test]
fn rping_between_two_namespaces() {
    if !can_run("rping_between_two_namespaces") {
        return;
    }
    let link = Link::new(2);
    let peer = link.addr[0].clone();
    for tool in ["rping", "udaddy"] {
        let (ok, out) = finish(link.spawn(1, &[tool, "-c", "-a", "10.9.9.9", "-C", "1"], &[]));
        assert!(!ok, "{tool} to an address with no route succeeded:\n{out}");
        assert!(
            out.contains("AddrError") && out.contains("NetworkUnreachable"),
            "{tool}: {out}"
        );
    }
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

/// UD service resolution (SIDR) across a real link, and datagrams echoed back; with 2 %
/// loss some are sent again, and every one comes back.
#[test]
fn udaddy_between_two_namespaces() {
    if !can_run("udaddy_between_two_namespaces") {
        return;
    }
    let link = Link::new(3);
    let peer = link.addr[0].clone();
    for env in [&[][..], &[("SOFTVERBS_FAULTS", "loss=0.02,seed=13")][..]] {
        let (_, out) = pair(
            &link,
            &["udaddy", "-s", "-p", "7174"],
            &[
                "udaddy", "-c", "-a", &peer, "-p", "7174", "-C", "100", "-S", "1000", "-n", "2",
                "-V",
            ],
            env,
        );
        assert!(
            out.contains("udaddy client: 200 message(s) echoed on 2 connection(s)"),
            "{out}"
        );
    }
}

/// perf --cm across the link: RC QPs connected by REQ/REP/RTU (clean and with 2 % loss),
/// UD QPs found by SIDR.
#[test]
fn perf_cm_between_two_namespaces() {
    if !can_run("perf_cm_between_two_namespaces") {
        return;
    }
    let link = Link::new(4);
    let peer = link.addr[0].clone();
    for env in [&[][..], &[("SOFTVERBS_FAULTS", "loss=0.02,seed=17")][..]] {
        let (_, out) = pair(
            &link,
            &["perf", "write", "--server", "--cm"],
            &[
                "perf", "write", "--bw", "--lat", "--cm", "--qps", "2", "--size", "16384",
                "--iters", "300", &peer,
            ],
            env,
        );
        assert!(out.contains("rdma_cm port 18515"), "{out}");
        assert!(out.contains("16384"), "{out}");
    }
    let (_, out) = pair(
        &link,
        &["perf", "send", "--server", "--cm"],
        &[
            "perf", "send", "--ud", "--bw", "--cm", "--qps", "2", "--size", "1024", "--iters",
            "300", &peer,
        ],
        &[],
    );
    assert!(out.contains("Connection type : UD"), "{out}");
}

/// Three processes in one namespace join a group through the connection manager; a
/// process in the other sends to it across the link (the sender repeats itself, so with
/// 2 % loss every receiver still gets the message).
#[test]
fn multicast_through_the_cm_between_two_namespaces() {
    if !can_run("multicast_through_the_cm_between_two_namespaces") {
        return;
    }
    let link = Link::new(5);
    let group = format!("239.77.{}.{}", std::process::id() % 251, 5);
    for (n, env) in [&[][..], &[("SOFTVERBS_FAULTS", "loss=0.02,seed=19")][..]]
        .into_iter()
        .enumerate()
    {
        let message = format!("across the link {n}");
        let (tx, rx) = std::sync::mpsc::channel::<(usize, String)>();
        let mut receivers: Vec<Child> = Vec::new();
        for i in 0..3 {
            let mut r = link.spawn(
                0,
                &["mcast", "--cm", "--recv", &group, "--timeout", "60"],
                env,
            );
            let out = r.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((i, line));
                }
            });
            receivers.push(r);
        }
        drop(tx);
        // Send once every receiver has joined.
        let mut lines: Vec<Vec<String>> = vec![Vec::new(); 3];
        while !lines
            .iter()
            .all(|l| l.iter().any(|s| s.starts_with("joined ")))
        {
            let (i, line) = rx.recv_timeout(TIMEOUT).expect("a receiver did not join");
            lines[i].push(line);
        }
        let (ok, out) = finish(link.spawn(
            1,
            &[
                "mcast",
                "--cm",
                "--send",
                &group,
                &message,
                "--repeat",
                "10",
                "--interval",
                "20",
            ],
            env,
        ));
        assert!(ok, "sender: {out}");
        for (i, r) in receivers.into_iter().enumerate() {
            let (ok, err) = finish_stderr(r);
            assert!(ok, "receiver {i}: {err}");
        }
        for (i, line) in rx.iter() {
            lines[i].push(line);
        }
        for (i, out) in lines.iter().map(|l| l.join("\n")).enumerate() {
            assert!(
                out.contains(&format!("joined {group} through the connection manager")),
                "receiver {i}: {out}"
            );
            assert!(out.contains(&format!(": {message}")), "receiver {i}: {out}");
        }
    }
}
