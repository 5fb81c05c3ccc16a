//! softverbs-wire against Wireshark's InfiniBand dissector: packets of every opcode
//! (IPv4 and IPv6, payloads needing 0 to 3 pad bytes) go into a pcap written by
//! `softverbs_wire::pcap::PcapWriter`, and `tshark` must decode each frame as RoCEv2
//! (`infiniband`) with the same opcode, BTH fields, extension headers, payload, pad
//! and ICRC position, with good IP and UDP checksums and no malformed frames or
//! expert errors.
//!
//! Wireshark 4.0 shows the ICRC (`infiniband.invariant.crc`) but does not check it,
//! so the ICRC value itself is checked against scapy (tests/scapy_crosscheck.rs);
//! here only its place in the frame is.
//!
//! Needs `tshark` (`SOFTVERBS_TSHARK` names another binary). Without it the test
//! skips loudly, or fails when `SOFTVERBS_REQUIRE_TOOLS=1`.

mod common;

use common::{assert_coverage, cases, hex, skip, tshark, tshark_version, Case};
use softverbs_wire::pcap::PcapWriter;
use softverbs_wire::{AethSyndrome, NakCode, Opcode, Transport};
use std::collections::HashMap;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Wireshark's heuristic sub-dissectors for InfiniBand payloads (short names as
/// `--disable-heuristic` takes them). On the random payloads used here some of them
/// claim packets and then throw (Wireshark 4.0: RPC-over-RDMA on RC SENDs of 0 to 4
/// bytes, EoIB on empty UD SENDs, the Ethertype heuristic on some one-byte
/// payloads), which marks a correct packet malformed. The strict pass turns them off
/// so payloads decode as plain data; names this tshark does not know are dropped.
const PAYLOAD_HEURISTICS: &[&str] = &[
    "eth_over_ib",
    "fc_infiniband",
    "iser_infiniband",
    "lnet_ib",
    "mellanox_eoib",
    "nvme_rdma",
    "rpcrdma_infiniband",
    "sdp_infiniband",
    "smb_direct_infiniband",
    "smcr_infiniband",
];

/// The fields asked of tshark, in output column order.
const FIELDS: &[&str] = &[
    "frame.number",
    "frame.protocols",
    "_ws.col.Info",
    "_ws.malformed",
    "_ws.expert",
    "ip.checksum.status",
    "udp.checksum.status",
    "udp.length",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.reserved7",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome.opcode",
    "infiniband.aeth.syndrome.credit_count",
    "infiniband.aeth.syndrome.timer",
    "infiniband.aeth.syndrome.error_code",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
    "data.data",
];

/// One decoded frame: field name to its values (all occurrences).
struct Frame(HashMap<&'static str, Vec<String>>);

impl Frame {
    fn all(&self, field: &str) -> &[String] {
        &self.0[field]
    }
    fn get(&self, field: &str) -> Option<&str> {
        self.0[field].first().map(String::as_str)
    }
    fn has(&self, field: &str) -> bool {
        !self.0[field].is_empty()
    }
    /// A numeric field, printed by tshark in decimal or `0x` hex.
    fn num(&self, field: &str) -> Option<u64> {
        let v = self.get(field)?;
        Some(match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("{field}={v}")),
            None => v.parse().unwrap_or_else(|_| panic!("{field}={v}")),
        })
    }
    fn info(&self) -> &str {
        self.get("_ws.col.Info").unwrap_or("")
    }
    fn malformed(&self) -> String {
        self.all("_ws.malformed").join(",")
    }
}

/// Runs tshark over `pcap`; `strict` turns payload heuristics off and checksum
/// validation on.
fn decode(tshark: &str, pcap: &Path, strict: bool) -> Vec<Frame> {
    let mut heuristics: Vec<&str> = if strict {
        PAYLOAD_HEURISTICS.to_vec()
    } else {
        Vec::new()
    };
    loop {
        let mut cmd = Command::new(tshark);
        cmd.arg("-n").arg("-r").arg(pcap);
        cmd.args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
        ]);
        for h in &heuristics {
            cmd.args(["--disable-heuristic", h]);
        }
        cmd.args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
        cmd.args(["-E", "aggregator=|", "-E", "quote=n"]);
        for f in FIELDS {
            cmd.args(["-e", f]);
        }
        let out = cmd.output().expect("run tshark");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            // An older or newer tshark may lack one of the heuristics: drop it, retry.
            let unknown = heuristics
                .iter()
                .position(|h| stderr.contains(&format!("No such protocol {h},")));
            if let Some(i) = unknown {
                eprintln!("note: this tshark has no heuristic {}", heuristics[i]);
                heuristics.remove(i);
                continue;
            }
            panic!("tshark failed: {}\n{stderr}", out.status);
        }
        return String::from_utf8(out.stdout)
            .expect("tshark output is UTF-8")
            .lines()
            .map(|line| {
                let cols: Vec<&str> = line.split('\t').collect();
                assert_eq!(cols.len(), FIELDS.len(), "tshark line: {line}");
                Frame(
                    FIELDS
                        .iter()
                        .zip(cols)
                        .map(|(f, v)| {
                            let values = if v.is_empty() {
                                Vec::new()
                            } else {
                                v.split('|').map(str::to_owned).collect()
                            };
                            (*f, values)
                        })
                        .collect(),
                )
            })
            .collect();
    }
}

/// The control frames appended after the cases, which the checks must flag.
fn control_frames() -> Vec<Vec<u8>> {
    // RC RDMA READ Request whose RETH is cut short (BTH + 8 bytes, no ICRC).
    let mut truncated = vec![0x0c, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 1];
    truncated.extend_from_slice(&[0; 8]);
    // Reserved RC opcode 0x15.
    let mut unknown = vec![0x15, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 1];
    unknown.extend_from_slice(&[0; 8]);
    vec![truncated, unknown]
}

fn write_pcap(cases: &[Case], path: &Path) {
    let file = std::fs::File::create(path).expect("create pcap");
    let mut w = PcapWriter::new(BufWriter::new(file)).unwrap();
    let mut ts = Duration::from_secs(1_700_000_000);
    for case in cases {
        w.write_roce(ts, &case.ctx, &case.emit()).unwrap();
        ts += Duration::from_micros(10);
    }
    let ctx = cases[0].ctx;
    for frame in control_frames() {
        w.write_udp(ts, ctx.src, ctx.dst, 0, &frame).unwrap();
    }
    w.flush().unwrap();
}

fn pcap_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// What is wrong with how tshark decoded `case` (empty: nothing).
fn problems(case: &Case, f: &Frame) -> Vec<String> {
    fn expect(p: &mut Vec<String>, what: &str, got: Option<u64>, want: Option<u64>) {
        if got != want {
            p.push(format!("{what}: tshark {got:?}, ours {want:?}"));
        }
    }
    let mut p = Vec::new();
    let b = &case.bth;
    let ours = case.emit();
    expect(
        &mut p,
        "opcode",
        f.num("infiniband.bth.opcode"),
        Some(b.opcode.value().into()),
    );
    expect(
        &mut p,
        "SE",
        f.num("infiniband.bth.se"),
        Some(b.solicited.into()),
    );
    expect(
        &mut p,
        "M",
        f.num("infiniband.bth.m"),
        Some(b.mig_req.into()),
    );
    expect(
        &mut p,
        "pad count",
        f.num("infiniband.bth.padcnt"),
        Some(case.pad() as u64),
    );
    expect(&mut p, "TVer", f.num("infiniband.bth.tver"), Some(0));
    expect(
        &mut p,
        "P_Key",
        f.num("infiniband.bth.p_key"),
        Some(b.pkey.into()),
    );
    expect(
        &mut p,
        "dest QP",
        f.num("infiniband.bth.destqp"),
        Some(b.dest_qp.value().into()),
    );
    expect(
        &mut p,
        "AckReq",
        f.num("infiniband.bth.a"),
        Some(b.ack_req.into()),
    );
    // Resv7: how softverbs peers negotiate selective repeat; shown as it is.
    expect(
        &mut p,
        "Resv7",
        f.num("infiniband.bth.reserved7"),
        Some(b.resv7.into()),
    );
    expect(
        &mut p,
        "PSN",
        f.num("infiniband.bth.psn"),
        Some(b.psn.value().into()),
    );
    expect(
        &mut p,
        "UDP length",
        f.num("udp.length"),
        Some(8 + ours.len() as u64),
    );
    if case.src_ip.is_ipv4() {
        expect(
            &mut p,
            "IPv4 checksum status",
            f.num("ip.checksum.status"),
            Some(1),
        );
    }
    expect(
        &mut p,
        "UDP checksum status",
        f.num("udp.checksum.status"),
        Some(1),
    );

    let cnp = case.info.transport == Transport::Cnp;
    if cnp && f.info().contains("Unknown") {
        // Wireshark 4.0 does not know the RoCEv2 CNP opcode (0x81): it decodes the
        // BTH and stops. Everything after the BTH is unchecked for it.
        return p;
    }
    if f.info().contains("Unknown") {
        p.push(format!("tshark calls it unknown: {}", f.info()));
    }

    expect(
        &mut p,
        "DETH Q_Key",
        f.num("infiniband.deth.q_key"),
        case.deth.map(|h| h.qkey.0.into()),
    );
    expect(
        &mut p,
        "DETH source QP",
        f.num("infiniband.deth.srcqp"),
        case.deth.map(|h| h.src_qp.value().into()),
    );
    // Wireshark shows the AtomicETH's address and key with the RETH's fields.
    let va_rkey = case
        .reth
        .map(|h| (h.va, h.rkey))
        .or(case.atomic_eth.map(|h| (h.va, h.rkey)));
    expect(
        &mut p,
        "VA",
        f.num("infiniband.reth.va"),
        va_rkey.map(|(va, _)| va),
    );
    expect(
        &mut p,
        "R_Key",
        f.num("infiniband.reth.r_key"),
        va_rkey.map(|(_, rkey)| rkey.0.into()),
    );
    expect(
        &mut p,
        "DMA length",
        f.num("infiniband.reth.dmalen"),
        case.reth.map(|h| h.dma_len.into()),
    );
    expect(
        &mut p,
        "swap/add",
        f.num("infiniband.atomiceth.swapdt"),
        case.atomic_eth.map(|h| h.swap_add),
    );
    expect(
        &mut p,
        "compare",
        f.num("infiniband.atomiceth.cmpdt"),
        case.atomic_eth.map(|h| h.compare),
    );
    // AETH syndrome as IBA tables 44 and 45 number it, decoded by Wireshark.
    let (kind, credits, timer, code) = match case.aeth.map(|h| h.syndrome) {
        None => (None, None, None, None),
        Some(AethSyndrome::Ack { credits }) => (Some(0), Some(credits.into()), None, None),
        Some(AethSyndrome::RnrNak { timer }) => (Some(1), None, Some(timer.into()), None),
        Some(AethSyndrome::Nak(c)) => {
            let code = match c {
                NakCode::PsnSequenceError => 0,
                NakCode::InvalidRequest => 1,
                NakCode::RemoteAccessError => 2,
                NakCode::RemoteOperationalError => 3,
                NakCode::InvalidRdRequest => 4,
            };
            (Some(3), None, None, Some(code))
        }
    };
    expect(
        &mut p,
        "AETH kind",
        f.num("infiniband.aeth.syndrome.opcode"),
        kind,
    );
    expect(
        &mut p,
        "AETH credits",
        f.num("infiniband.aeth.syndrome.credit_count"),
        credits,
    );
    expect(
        &mut p,
        "AETH timer",
        f.num("infiniband.aeth.syndrome.timer"),
        timer,
    );
    expect(
        &mut p,
        "AETH NAK code",
        f.num("infiniband.aeth.syndrome.error_code"),
        code,
    );
    expect(
        &mut p,
        "MSN",
        f.num("infiniband.aeth.msn"),
        case.aeth.map(|h| h.msn.into()),
    );
    expect(
        &mut p,
        "original data",
        f.num("infiniband.atomicacketh.origremdt"),
        case.atomic_ack_eth.map(|h| h.orig),
    );
    // ImmDt and IETH are byte fields (Wireshark 4.0 adds each twice: every
    // occurrence must match).
    for (field, want) in [
        ("infiniband.immdt", case.immdt),
        ("infiniband.ieth", case.ieth.map(|r| r.0)),
    ] {
        let want = want.map(|v| hex(&v.to_be_bytes()));
        let got = f.all(field);
        let ok = match &want {
            Some(w) => !got.is_empty() && got.iter().all(|g| g == w),
            None => got.is_empty(),
        };
        if !ok {
            p.push(format!("{field}: tshark {got:?}, ours {want:?}"));
        }
    }
    // The ICRC as the last four bytes, which Wireshark reads as a big-endian number.
    let t = &ours[ours.len() - 4..];
    expect(
        &mut p,
        "ICRC",
        f.num("infiniband.invariant.crc"),
        Some(u32::from_be_bytes([t[0], t[1], t[2], t[3]]).into()),
    );
    // Payload: Wireshark 4.0 hands payload and pad on as data.
    let mut data = case.payload.clone();
    data.resize(case.payload.len() + case.pad(), 0);
    let got = f.get("data.data").unwrap_or("");
    if got != hex(&data) {
        p.push(format!(
            "data: tshark {} bytes, ours {} payload + {} pad",
            got.len() / 2,
            case.payload.len(),
            case.pad()
        ));
    }
    let protocols = f.get("frame.protocols").unwrap_or("");
    let want_protocols = if data.is_empty() {
        "udp:infiniband"
    } else {
        "udp:infiniband:data"
    };
    if !protocols.ends_with(want_protocols) {
        p.push(format!("protocols {protocols}, want ...{want_protocols}"));
    }
    p
}

#[test]
fn tshark_decodes_every_opcode() {
    let tshark = tshark();
    let version = match tshark_version(&tshark) {
        Ok(v) => v,
        Err(why) => {
            skip(&format!("tshark decode check: {why}"));
            return;
        }
    };
    eprintln!("using {version}");
    let cases = cases();
    assert_coverage(&cases);
    let path = pcap_path("tshark_decode.pcap");
    write_pcap(&cases, &path);
    eprintln!("pcap: {}", path.display());

    let frames = decode(&tshark, &path, true);
    assert_eq!(frames.len(), cases.len() + control_frames().len());

    let mut failures = Vec::new();
    let mut cnp_unknown = false;
    for (i, (case, f)) in cases.iter().zip(&frames).enumerate() {
        assert_eq!(f.num("frame.number"), Some(i as u64 + 1));
        let mut p = Vec::new();
        if !f
            .get("frame.protocols")
            .unwrap_or("")
            .contains(":infiniband")
        {
            p.push("not decoded as InfiniBand".to_owned());
        }
        if f.has("_ws.malformed") {
            p.push(format!("malformed: {}", f.malformed()));
        }
        if f.has("_ws.expert") {
            p.push(format!("expert info: {}", f.all("_ws.expert").join(" ")));
        }
        p.extend(problems(case, f));
        if case.info.opcode == Opcode::Cnp && f.info().contains("Unknown") {
            cnp_unknown = true;
        }
        if !p.is_empty() {
            failures.push(format!("frame {}: {}: {}", i + 1, case.label, p.join("; ")));
        }
    }
    if cnp_unknown {
        eprintln!("note: {version} does not decode the CNP opcode 0x81 past the BTH");
    }

    // The control frames show that the checks above can fail.
    let truncated = &frames[cases.len()];
    assert!(
        truncated.malformed().contains("IB"),
        "a truncated RETH must be malformed InfiniBand, got {:?}",
        truncated.malformed()
    );
    let unknown = &frames[cases.len() + 1];
    assert!(
        unknown.info().contains("Unknown"),
        "opcode 0x15 must be unknown, got {:?}",
        unknown.info()
    );
    let wrong = Case {
        payload: vec![1, 2, 3],
        ..cases[0].clone()
    };
    assert!(
        !problems(&wrong, &frames[0]).is_empty(),
        "a different payload must be noticed"
    );

    assert!(
        failures.is_empty(),
        "{} of {} frames decode wrongly:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("tshark decoded {} frames as ours", cases.len());
}

/// With Wireshark's default settings (payload heuristics on), no frame may be
/// malformed in the InfiniBand layer itself; heuristic payload dissectors that throw
/// on our random payloads are reported, not failed.
#[test]
fn tshark_default_settings_find_nothing_wrong_in_headers() {
    let tshark = tshark();
    if let Err(why) = tshark_version(&tshark) {
        skip(&format!("tshark decode check: {why}"));
        return;
    }
    let cases = cases();
    let path = pcap_path("tshark_default.pcap");
    write_pcap(&cases, &path);
    let frames = decode(&tshark, &path, false);
    assert_eq!(frames.len(), cases.len() + control_frames().len());
    let mut payload_heuristic_errors = 0;
    for (case, f) in cases.iter().zip(&frames) {
        assert!(
            f.get("frame.protocols")
                .unwrap_or("")
                .contains(":infiniband"),
            "{}: not InfiniBand",
            case.label
        );
        assert_eq!(
            f.num("infiniband.bth.opcode"),
            Some(case.bth.opcode.value().into()),
            "{}",
            case.label
        );
        let malformed = f.malformed();
        assert!(
            !malformed.contains("Malformed Packet: IB]"),
            "{}: {malformed}",
            case.label
        );
        if !malformed.is_empty() {
            payload_heuristic_errors += 1;
        }
    }
    assert!(frames[cases.len()]
        .malformed()
        .contains("Malformed Packet: IB]"));
    eprintln!(
        "{payload_heuristic_errors} of {} frames malformed by a payload heuristic sub-dissector (not in the RoCE headers)",
        cases.len()
    );
}
