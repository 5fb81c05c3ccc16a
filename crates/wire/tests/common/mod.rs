//! Packets shared by the tests that check softverbs-wire against outside tools
//! (scapy, tshark): every opcode of the table, IPv4 and IPv6, payload sizes that need
//! 0 to 3 pad bytes, header fields drawn from a fixed seed.

#![allow(dead_code)] // each test binary uses its own part of this module

use softverbs_wire::headers::atomic_ack_eth::AtomicAckEthRepr;
use softverbs_wire::headers::atomic_eth::AtomicEthRepr;
use softverbs_wire::headers::deth::DethRepr;
use softverbs_wire::headers::reth::RethRepr;
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::opcode::{HeaderSet, OpcodeInfo, Position, CNP_PAYLOAD_LEN, OPCODE_TABLE};
use softverbs_wire::{
    AethRepr, AethSyndrome, BthRepr, NakCode, PacketRepr, Psn, Qkey, Qpn, Rkey, Transport,
};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// Whether a missing tool must fail the test instead of skipping it.
pub fn tools_required() -> bool {
    std::env::var("SOFTVERBS_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips loudly, or panics when `SOFTVERBS_REQUIRE_TOOLS=1`.
pub fn skip(why: &str) {
    if tools_required() {
        panic!("{why} (SOFTVERBS_REQUIRE_TOOLS=1, so this is an error)");
    }
    eprintln!("SKIPPED: {why}");
    eprintln!("SKIPPED: set SOFTVERBS_REQUIRE_TOOLS=1 to make this an error");
}

/// SplitMix64: a tiny deterministic generator, enough for test field values.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
    pub fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

/// One packet: its fields and the addresses it travels between.
#[derive(Debug, Clone)]
pub struct Case {
    /// Human-readable description for assertion messages.
    pub label: String,
    pub info: &'static OpcodeInfo,
    /// The context softverbs computes the ICRC with (IPv4 may be given IPv4-mapped,
    /// as a dual-stack socket reports it).
    pub ctx: IcrcContext,
    /// The same addresses in their plain family, for tools that build IP headers.
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub bth: BthRepr,
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<u32>,
    pub ieth: Option<Rkey>,
    pub payload: Vec<u8>,
}

impl Case {
    /// The repr to emit (pad count 0: emit computes it).
    pub fn repr(&self) -> PacketRepr<'_> {
        PacketRepr {
            bth: self.bth,
            deth: self.deth,
            reth: self.reth,
            atomic_eth: self.atomic_eth,
            aeth: self.aeth,
            atomic_ack_eth: self.atomic_ack_eth,
            immdt: self.immdt,
            ieth: self.ieth,
            payload: &self.payload,
        }
    }

    /// The repr a parser must return for the emitted packet.
    pub fn parsed_repr(&self) -> PacketRepr<'_> {
        let mut r = self.repr();
        r.bth.pad_count = self.pad() as u8;
        r
    }

    pub fn pad(&self) -> usize {
        (4 - self.payload.len() % 4) % 4
    }

    /// The packet as softverbs sends it: emitted, then the ICRC filled in.
    pub fn emit(&self) -> Vec<u8> {
        let repr = self.repr();
        let mut buf = vec![0xa5; repr.buffer_len()];
        let n = repr
            .emit(&mut buf)
            .unwrap_or_else(|e| panic!("{}: {e}", self.label));
        assert_eq!(n, buf.len(), "{}", self.label);
        icrc::fill(&self.ctx, &mut buf).unwrap();
        buf
    }

    pub fn is_ipv6(&self) -> bool {
        self.src_ip.is_ipv6()
    }

    /// The case as one line of JSON for tests/scapy_build.py. Names and numbers are
    /// the raw field values: the script encodes them itself.
    pub fn to_json(&self) -> String {
        let b = &self.bth;
        let mut s = String::new();
        write!(
            s,
            r#"{{"ip":{{"src":"{}","dst":"{}","id":{}}},"udp":{{"sport":{},"dport":{}}},"#,
            self.src_ip,
            self.dst_ip,
            self.ctx.ipv4_id,
            self.ctx.src.port(),
            self.ctx.dst.port()
        )
        .unwrap();
        write!(
            s,
            r#""bth":{{"opcode_name":"{}","se":{},"m":{},"pkey":{},"fecn":{},"becn":{},"dqpn":{},"a":{},"resv7":{},"psn":{}}}"#,
            self.info.name,
            u8::from(b.solicited),
            u8::from(b.mig_req),
            b.pkey,
            u8::from(b.fecn),
            u8::from(b.becn),
            b.dest_qp.value(),
            u8::from(b.ack_req),
            b.resv7,
            b.psn.value()
        )
        .unwrap();
        if let Some(h) = &self.deth {
            write!(
                s,
                r#","deth":{{"qkey":{},"srcqp":{}}}"#,
                h.qkey.0,
                h.src_qp.value()
            )
            .unwrap();
        }
        if let Some(h) = &self.reth {
            write!(
                s,
                r#","reth":{{"va":{},"rkey":{},"dlen":{}}}"#,
                h.va, h.rkey.0, h.dma_len
            )
            .unwrap();
        }
        if let Some(h) = &self.atomic_eth {
            write!(
                s,
                r#","atomiceth":{{"va":{},"rkey":{},"swap":{},"cmp":{}}}"#,
                h.va, h.rkey.0, h.swap_add, h.compare
            )
            .unwrap();
        }
        if let Some(h) = &self.aeth {
            let syndrome = match h.syndrome {
                AethSyndrome::Ack { credits } => format!(r#""kind":"ack","value":{credits}"#),
                AethSyndrome::RnrNak { timer } => format!(r#""kind":"rnr","value":{timer}"#),
                AethSyndrome::Nak(code) => {
                    let name = match code {
                        NakCode::PsnSequenceError => "psn_sequence_error",
                        NakCode::InvalidRequest => "invalid_request",
                        NakCode::RemoteAccessError => "remote_access_error",
                        NakCode::RemoteOperationalError => "remote_operational_error",
                        NakCode::InvalidRdRequest => "invalid_rd_request",
                    };
                    format!(r#""kind":"nak","nak":"{name}""#)
                }
            };
            write!(s, r#","aeth":{{{syndrome},"msn":{}}}"#, h.msn).unwrap();
        }
        if let Some(h) = &self.atomic_ack_eth {
            write!(s, r#","atomicacketh":{{"orig":{}}}"#, h.orig).unwrap();
        }
        if let Some(imm) = self.immdt {
            write!(s, r#","immdt":{imm}"#).unwrap();
        }
        if let Some(rkey) = self.ieth {
            write!(s, r#","ieth":{}"#, rkey.0).unwrap();
        }
        write!(s, r#","payload":"{}"}}"#, hex(&self.payload)).unwrap();
        s
    }
}

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").unwrap();
    }
    s
}

pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Payload sizes to try for an opcode: full MTU-sized packets for first and middle
/// packets, and sizes needing 0, 1, 2 and 3 pad bytes for packets that end a message.
fn payload_sizes(info: &OpcodeInfo) -> &'static [usize] {
    if !info.has_payload {
        &[0]
    } else if info.transport == Transport::Cnp {
        &[CNP_PAYLOAD_LEN]
    } else {
        match info.position {
            Position::First | Position::Middle => &[1024, 4096],
            Position::Last | Position::Only => &[0, 1, 2, 3, 4, 13, 1022, 4093],
        }
    }
}

/// Address pairs: IPv4, the same IPv4 given IPv4-mapped to softverbs, IPv6.
fn addresses(which: usize, rng: &mut Rng) -> (IcrcContext, IpAddr, IpAddr) {
    let sport = 49152 + rng.below(16384) as u16;
    let (src, dst, src_ctx, dst_ctx): (IpAddr, IpAddr, IpAddr, IpAddr) = match which {
        0 => {
            let (s, d) = (
                "192.0.2.1".parse().unwrap(),
                "198.51.100.7".parse().unwrap(),
            );
            (s, d, s, d)
        }
        1 => (
            "10.1.2.3".parse().unwrap(),
            "10.1.2.4".parse().unwrap(),
            "::ffff:10.1.2.3".parse().unwrap(),
            "::ffff:10.1.2.4".parse().unwrap(),
        ),
        _ => {
            let (s, d) = (
                "2001:db8::1".parse().unwrap(),
                "2001:db8:ffff::abcd:2".parse().unwrap(),
            );
            (s, d, s, d)
        }
    };
    let ctx = IcrcContext::new(
        SocketAddr::new(src_ctx, sport),
        SocketAddr::new(dst_ctx, 4791),
    );
    (ctx, src, dst)
}

fn aeth_for(info: &OpcodeInfo, n: usize, rng: &mut Rng) -> AethRepr {
    let msn = rng.u32() & 0xff_ffff;
    let syndrome = if info.opcode == softverbs_wire::Opcode::RcAcknowledge {
        // Cycle through every kind of acknowledgement.
        let all = [
            AethSyndrome::ACK_UNLIMITED,
            AethSyndrome::Ack {
                credits: rng.below(31) as u8,
            },
            AethSyndrome::RnrNak {
                timer: rng.below(32) as u8,
            },
            AethSyndrome::Nak(NakCode::PsnSequenceError),
            AethSyndrome::Nak(NakCode::InvalidRequest),
            AethSyndrome::Nak(NakCode::RemoteAccessError),
            AethSyndrome::Nak(NakCode::RemoteOperationalError),
            AethSyndrome::Nak(NakCode::InvalidRdRequest),
        ];
        all[n % all.len()]
    } else {
        AethSyndrome::Ack {
            credits: rng.below(32) as u8,
        }
    };
    AethRepr { syndrome, msn }
}

/// Every opcode, for each address pair and payload size.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut rng = Rng::new(0x0005_eed5_0f77_e4b5);
    for info in OPCODE_TABLE {
        // A plain ACK has 8 syndrome kinds to show: give it more rounds.
        let rounds = if info.opcode == softverbs_wire::Opcode::RcAcknowledge {
            3
        } else {
            1
        };
        for _ in 0..rounds {
            for family in 0..3 {
                for &len in payload_sizes(info) {
                    let n = out.len();
                    out.push(make_case(info, family, len, n, &mut rng));
                }
            }
        }
    }
    out
}

fn make_case(
    info: &'static OpcodeInfo,
    family: usize,
    len: usize,
    n: usize,
    rng: &mut Rng,
) -> Case {
    let (mut ctx, src_ip, dst_ip) = addresses(family, rng);
    if src_ip.is_ipv4() && n % 5 == 0 {
        // Segment k of a GSO batch carries IPv4 ID k (DESIGN.md).
        ctx.ipv4_id = 1 + (n % 3) as u16;
    }
    let h = info.headers;
    let cnp = info.transport == Transport::Cnp;
    let psn = match n % 7 {
        0 => 0xff_ffff,
        1 => 0,
        _ => rng.u32(),
    };
    let bth = BthRepr {
        solicited: !cnp && rng.bool(),
        mig_req: !cnp && rng.bool(),
        pad_count: 0,
        pkey: if rng.below(4) == 0 {
            rng.u32() as u16 | 0x8000
        } else {
            0xffff
        },
        fecn: !cnp && rng.below(8) == 0,
        becn: cnp || rng.below(8) == 0,
        ack_req: !cnp && rng.bool(),
        // The reserved bits softverbs peers negotiate selective repeat in (the
        // engine's qp/selective.rs): every value, on every opcode.
        resv7: if !cnp && n % 3 == 0 {
            rng.below(128) as u8
        } else {
            0
        },
        // Stay clear of QP 0 and 1 (SMI and GSI): tools decode their payload as MADs.
        ..BthRepr::new(
            info.opcode,
            Qpn::new(2 + rng.below(0xff_fffd)),
            Psn::new(if cnp { 0 } else { psn }),
        )
    };
    let payload: Vec<u8> = if cnp {
        vec![0; len]
    } else {
        (0..len).map(|_| rng.next() as u8).collect()
    };
    let family = if src_ip.is_ipv6() {
        "IPv6"
    } else if ctx.src.is_ipv6() {
        "IPv4 (mapped)"
    } else {
        "IPv4"
    };
    Case {
        label: format!(
            "case {n}: {} over {family}, id {}, payload {len}",
            info.name, ctx.ipv4_id
        ),
        info,
        ctx,
        src_ip,
        dst_ip,
        bth,
        deth: h.contains(HeaderSet::DETH).then(|| DethRepr {
            qkey: Qkey(if rng.bool() { 0x8001_0000 } else { rng.u32() }),
            src_qp: Qpn::new(2 + rng.below(0xff_fffd)),
        }),
        reth: h.contains(HeaderSet::RETH).then(|| RethRepr {
            va: rng.next(),
            rkey: Rkey(rng.u32()),
            dma_len: rng.u32(),
        }),
        atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then(|| AtomicEthRepr {
            va: rng.next() & !7,
            rkey: Rkey(rng.u32()),
            swap_add: rng.next(),
            compare: rng.next(),
        }),
        aeth: h.contains(HeaderSet::AETH).then(|| aeth_for(info, n, rng)),
        atomic_ack_eth: h
            .contains(HeaderSet::ATOMIC_ACK_ETH)
            .then(|| AtomicAckEthRepr { orig: rng.next() }),
        immdt: h.contains(HeaderSet::IMMDT).then(|| rng.u32()),
        ieth: h.contains(HeaderSet::IETH).then(|| Rkey(rng.u32())),
        payload,
    }
}

/// Checks that `cases` cover every opcode, every pad count, both IP versions and a
/// non-zero IPv4 ID, so that shrinking the case list cannot silently weaken a test.
pub fn assert_coverage(cases: &[Case]) {
    for row in OPCODE_TABLE {
        assert!(
            cases
                .iter()
                .any(|c| c.info.opcode == row.opcode && c.is_ipv6())
                && cases
                    .iter()
                    .any(|c| c.info.opcode == row.opcode && !c.is_ipv6()),
            "{} not covered over both IPv4 and IPv6",
            row.name
        );
    }
    for pad in 0..4 {
        assert!(
            cases.iter().any(|c| c.pad() == pad),
            "pad {pad} not covered"
        );
    }
    assert!(cases.iter().any(|c| c.ctx.ipv4_id != 0));
    assert!(cases
        .iter()
        .any(|c| c.ctx.src.is_ipv6() && c.src_ip.is_ipv4()));
}

/// The tshark binary to run (`SOFTVERBS_TSHARK` names another).
pub fn tshark() -> String {
    std::env::var("SOFTVERBS_TSHARK").unwrap_or_else(|_| "tshark".to_owned())
}

/// The first line of `tshark --version`, or why tshark cannot run.
pub fn tshark_version(tshark: &str) -> Result<String, String> {
    match std::process::Command::new(tshark).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()),
        Ok(out) => Err(format!("{tshark} --version failed: {}", out.status)),
        Err(e) => Err(format!("cannot run {tshark}: {e}")),
    }
}
