//! softverbs-wire against scapy: for packets of every opcode (IPv4 and IPv6, payloads
//! needing 0 to 3 pad bytes, non-zero IPv4 IDs) scapy builds the same packet from the
//! field values with its own code (tests/scapy_build.py, `scapy.contrib.roce`), and
//! the two must agree byte for byte: headers, pad and ICRC. The scapy-built bytes
//! then go through our parser and ICRC check.
//!
//! Needs /usr/bin/python3 with scapy (Debian: python3-scapy); `SOFTVERBS_PYTHON`
//! names another interpreter. Without it the test skips loudly, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1`.

mod common;

use common::{assert_coverage, cases, hex, skip, unhex, Case};
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::{PacketRepr, RocePacket};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn python() -> String {
    std::env::var("SOFTVERBS_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_owned())
}

/// Whether `python` can import scapy's RoCE module.
fn scapy_available(python: &str) -> Result<(), String> {
    match Command::new(python)
        .args(["-c", "import scapy.contrib.roce"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{python} cannot import scapy.contrib.roce: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {python}: {e}")),
    }
}

/// Runs tests/scapy_build.py over `cases`; returns the UDP payload scapy built for each.
fn scapy_build(python: &str, cases: &[Case]) -> Vec<Vec<u8>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scapy_build.py");
    let mut input = String::new();
    for c in cases {
        input.push_str(&c.to_json());
        input.push('\n');
    }
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start scapy_build.py");
    let mut stdin = child.stdin.take().unwrap();
    // Write from another thread so that neither side can block the other on a full pipe.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("run scapy_build.py");
    writer.join().unwrap().expect("write to scapy_build.py");
    assert!(
        out.status.success(),
        "scapy_build.py failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<u8>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(unhex)
        .collect();
    assert_eq!(lines.len(), cases.len(), "one packet per case");
    lines
}

#[test]
fn every_opcode_matches_scapy_byte_for_byte() {
    let python = python();
    if let Err(why) = scapy_available(&python) {
        skip(&format!("scapy cross-check: {why}"));
        return;
    }
    let cases = cases();
    assert_coverage(&cases);
    let theirs = scapy_build(&python, &cases);

    let mut mismatches = Vec::new();
    for (case, scapy) in cases.iter().zip(&theirs) {
        let ours = case.emit();
        if ours != *scapy {
            let first = ours
                .iter()
                .zip(scapy)
                .position(|(a, b)| a != b)
                .unwrap_or(ours.len().min(scapy.len()));
            mismatches.push(format!(
                "{}: first difference at byte {first} (lengths {} vs {})\n  ours:  {}\n  scapy: {}",
                case.label,
                ours.len(),
                scapy.len(),
                hex(&ours[..ours.len().min(96)]),
                hex(&scapy[..scapy.len().min(96)]),
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} packets differ from scapy's:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
    eprintln!(
        "scapy agreed on {} packets over {} opcodes",
        cases.len(),
        softverbs_wire::opcode::OPCODE_TABLE.len()
    );
}

#[test]
fn scapy_packets_parse_and_verify() {
    let python = python();
    if let Err(why) = scapy_available(&python) {
        skip(&format!("scapy cross-check: {why}"));
        return;
    }
    let cases = cases();
    let theirs = scapy_build(&python, &cases);
    for (case, scapy) in cases.iter().zip(&theirs) {
        let packet = RocePacket::new_checked(&scapy[..])
            .unwrap_or_else(|e| panic!("{}: scapy's packet rejected: {e}", case.label));
        assert_eq!(packet.opcode(), case.info.opcode, "{}", case.label);
        assert_eq!(packet.payload(), &case.payload[..], "{}", case.label);
        let repr = PacketRepr::parse(&packet)
            .unwrap_or_else(|e| panic!("{}: scapy's packet does not parse: {e}", case.label));
        assert_eq!(repr, case.parsed_repr(), "{}", case.label);
        assert!(
            icrc::verify(&case.ctx, scapy),
            "{}: scapy's ICRC rejected",
            case.label
        );
        // The ICRC covers the IPv4 ID, the addresses and the ports.
        if case.src_ip.is_ipv4() {
            let other_id = IcrcContext {
                ipv4_id: case.ctx.ipv4_id ^ 1,
                ..case.ctx
            };
            assert!(!icrc::verify(&other_id, scapy), "{}", case.label);
        }
        let swapped = IcrcContext::new(case.ctx.dst, case.ctx.src);
        assert!(!icrc::verify(&swapped, scapy), "{}", case.label);
    }
}
