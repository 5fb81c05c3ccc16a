//! The measuring programs run, check what they moved, and refuse bad arguments.
//! Each run is a fraction of a second on loopback; nothing here asserts on time
//! or speed, only on what the programs report having moved and verified.

use std::collections::HashMap;
use std::process::Command;

fn run(exe: &str, args: &[&str]) -> (bool, HashMap<String, String>, String) {
    let out = Command::new(exe).args(args).output().expect("start");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let kv = stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), kv, text)
}

fn num(kv: &HashMap<String, String>, key: &str, text: &str) -> f64 {
    kv.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in:\n{text}"))
}

#[test]
fn copy_limits_moves_and_verifies_every_kind_of_copy() {
    let exe = env!("CARGO_BIN_EXE_copy-limits");
    let (ok, kv, text) = run(
        exe,
        &["--size", "4096", "--secs", "0.02", "--warmup", "0.01"],
    );
    if !ok && text.contains("not permitted here") {
        // The kernel's policy (Yama ptrace_scope, a seccomp filter), not a bug here.
        eprintln!("\n*** SKIPPED copy-limits: process_vm_writev is refused here:\n{text}***\n");
        return;
    }
    assert!(ok, "{text}");
    assert_eq!(kv.get("size").map(String::as_str), Some("4096"), "{text}");
    for key in [
        "memcpy_gbs",
        "process_vm_writev_gbs",
        "process_vm_readv_gbs",
    ] {
        assert!(num(&kv, key, &text) > 0.0, "{key}: {text}");
    }
    // The child saw the last pattern written and it was read back.
    assert_eq!(kv.get("check").map(String::as_str), Some("ok"), "{text}");
}

#[test]
fn udp_gso_delivers_gro_batches_in_order() {
    let exe = env!("CARGO_BIN_EXE_udp-gso");
    let (ok, kv, text) = run(exe, &["--secs", "0.05"]);
    assert!(ok, "{text}");
    let sent = num(&kv, "sent_bytes", &text);
    let received = num(&kv, "received_bytes", &text);
    assert!(received > 0.0 && received <= sent, "{text}");
    // Everything counted arrived in 4096-byte segments, merged by GRO.
    assert_eq!(
        num(&kv, "received_segments", &text) * 4096.0,
        received,
        "{text}"
    );
    assert_eq!(num(&kv, "gro_segment_size", &text), 4096.0, "{text}");
    assert!(num(&kv, "gro_reads", &text) > 0.0, "{text}");
    assert_eq!(num(&kv, "out_of_order_segments", &text), 0.0, "{text}");
    // What was not received is accounted as lost, and nothing else is.
    let lost = num(&kv, "lost_segments", &text);
    assert!(lost * 4096.0 <= sent - received, "{text}");
    assert!(num(&kv, "udp_gso_gbs", &text) > 0.0, "{text}");
    assert!(num(&kv, "cpu_s_per_gb", &text) > 0.0, "{text}");
}

#[test]
fn bad_arguments_fail_with_a_message() {
    for (exe, args, says) in [
        (
            env!("CARGO_BIN_EXE_copy-limits"),
            &["--size", "0"][..],
            "--size",
        ),
        (
            env!("CARGO_BIN_EXE_copy-limits"),
            &["--bogus"][..],
            "--bogus",
        ),
        (
            env!("CARGO_BIN_EXE_udp-gso"),
            &["--segments", "16"][..],
            "65507",
        ),
        (
            env!("CARGO_BIN_EXE_udp-gso"),
            &["--secs", "0"][..],
            "duration",
        ),
        (
            env!("CARGO_BIN_EXE_udp-gso"),
            &["--segment", "8"][..],
            "--segment",
        ),
    ] {
        let (ok, _, text) = run(exe, args);
        assert!(!ok, "{exe} {args:?} succeeded:\n{text}");
        assert!(text.contains(says), "{exe} {args:?}:\n{text}");
    }
}
