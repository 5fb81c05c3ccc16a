//! Two network namespaces joined by a veth pair that the test creates: the
//! devices talk over a real (virtual) link, with the kernel segmenting GSO
//! batches. Needs root and iproute2; elsewhere it skips with a loud message,
//! unless `CI=true` or `SOFTVERBS_REQUIRE_NETNS=1`, where a skip is a failure.

mod common;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::Netns;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(90);

/// Runs the softverbs binary inside namespace `i` of `link`, its device on that side's
/// address.
fn spawn(link: &Netns, i: usize, args: &[&str], extra_env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &link.ns[i], BIN]).args(args);
    cmd.env("SOFTVERBS_ADDR", &link.addr[i]);
    // The link is what is under test: two processes of this host sharing a runtime
    // directory would otherwise move WRITE and READ data by the same-host path.
    cmd.env("SOFTVERBS_SAME_HOST", "0");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start softverbs in a namespace")
}

/// Waits (bounded) until process `pid` in namespace `i` listens: a TCP listener or an
/// unconnected UDP socket of its own beside the device's socket at 4791 (the rdma_cm
/// rendezvous socket, or the out-of-band exchange's listener). A fixed head start was
/// not enough on a loaded machine: a client that comes too early is refused.
fn wait_listening(link: &Netns, i: usize, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let owner = format!("pid={pid},");
    while Instant::now() < deadline {
        let out = Command::new("ip")
            .args(["netns", "exec", &link.ns[i], "ss", "-Hlnptu"])
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

fn pair(link: &Netns, server: &[&str], client: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let srv = spawn(link, 0, server, env);
    wait_listening(link, 0, srv.id());
    let cli = spawn(link, 1, client, env);
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
    let Some(link) = Netns::create("pingpong_and_perf_between_two_namespaces") else {
        return;
    };
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
    let Some(link) = Netns::create("rping_between_two_namespaces") else {
        return;
    };
    let peer = link.addr[0].clone();
    for tool in ["rping", "udaddy"] {
        let (ok, out) = finish(spawn(
            &link,
            1,
            &[tool, "-c", "-a", "10.9.9.9", "-C", "1"],
            &[],
        ));
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
    let Some(link) = Netns::create("udaddy_between_two_namespaces") else {
        return;
    };
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
    let Some(link) = Netns::create("perf_cm_between_two_namespaces") else {
        return;
    };
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
    let Some(link) = Netns::create("multicast_through_the_cm_between_two_namespaces") else {
        return;
    };
    let group = format!("239.77.{}.{}", std::process::id() % 251, 5);
    for (n, env) in [&[][..], &[("SOFTVERBS_FAULTS", "loss=0.02,seed=19")][..]]
        .into_iter()
        .enumerate()
    {
        let message = format!("across the link {n}");
        let (tx, rx) = std::sync::mpsc::channel::<(usize, String)>();
        let mut receivers: Vec<Child> = Vec::new();
        for i in 0..3 {
            let mut r = spawn(
                &link,
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
        let (ok, out) = finish(spawn(
            &link,
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
