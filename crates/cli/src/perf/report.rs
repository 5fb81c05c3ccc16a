//! Results as perftest prints them, as JSON, and as an SVG chart.

use super::{Plan, Side};
use crate::json::Json;
use crate::plot::{self, Panel, Series};
use crate::stats::LatStats;
use crate::{Op, PerfArgs, Result};
use std::io::Write;
use std::path::PathBuf;

const RULE: &str =
    "---------------------------------------------------------------------------------------";

pub struct BwRow {
    pub bytes: u32,
    /// Per QP (the count reached, for a run of a given duration).
    pub iters: u64,
    pub peak_mbs: f64,
    pub avg_mbs: f64,
    pub msg_rate_mpps: f64,
    pub seconds: f64,
    /// UD: messages that arrived (all QPs) and those lost.
    pub received: Option<u64>,
    pub lost: Option<u64>,
}

pub struct LatRow {
    pub bytes: u32,
    pub iters: u32,
    pub stats: LatStats,
    /// UD SEND: pings sent again after a loss (their round trips give no sample).
    pub resent: Option<u64>,
}

pub struct Report {
    json: bool,
    plot: Option<PathBuf>,
    op: Op,
    modes: &'static str,
    plan: Plan,
    /// How the ends exchanged their parameters ("TCP port N" or "rdma_cm port N").
    exchange: String,
    bw: Vec<BwRow>,
    lat: Vec<LatRow>,
}

fn op_title(op: Op) -> &'static str {
    match op {
        Op::Write => "RDMA_Write",
        Op::Read => "RDMA_Read",
        Op::Send => "Send",
        Op::Atomic => "Atomic FETCH_AND_ADD",
    }
}

/// Write and send latency are half round trips, as ib_write_lat and ib_send_lat
/// report them.
fn half_rtt(op: Op) -> bool {
    matches!(op, Op::Write | Op::Send)
}

impl Report {
    pub fn new(a: &PerfArgs, plan: &Plan, port: u16) -> Report {
        Report {
            json: a.json,
            plot: a.plot.clone(),
            op: a.op,
            modes: match (a.bw, a.lat) {
                (_, false) => "BW",
                (false, true) => "Latency",
                (true, true) => "BW and Latency",
            },
            plan: *plan,
            exchange: if a.cm {
                format!("rdma_cm port {port}")
            } else {
                format!("TCP port {port}")
            },
            bw: Vec::new(),
            lat: Vec::new(),
        }
    }

    /// The QPs' transport.
    fn connection(&self) -> &'static str {
        if self.plan.ud {
            "UD"
        } else {
            "RC"
        }
    }

    /// The parameters and both ends' addresses.
    pub fn header(&self, side: &Side) {
        if self.json {
            return;
        }
        let p = &self.plan;
        println!("{RULE}");
        println!(
            "                    {} {} Test (softverbs)",
            op_title(self.op),
            self.modes
        );
        println!(
            " Number of qps   : {:<14} Transport type : RoCEv2 in UDP (softverbs)",
            p.qps
        );
        println!(
            " Connection type : {:<14} Using SRQ      : OFF",
            self.connection()
        );
        println!(
            " TX depth        : {:<14} CQ Moderation  : {}",
            p.tx_depth, p.cq_mod
        );
        println!(
            " Mtu             : {:<14} Link type      : Ethernet",
            format!("{}[B]", p.mtu)
        );
        println!(
            " Max inline data : {}[B] (latency tests only)",
            super::INLINE_MAX
        );
        println!(
            " Data ex. method : {:<14} GID index      : 0",
            self.exchange
        );
        println!(" BW units        : MB/sec with MB = 2^20 bytes; MsgRate in 10^6 msgs/sec");
        println!("{RULE}");
        for (q, e) in side.qps.iter().enumerate() {
            let local = side.local_info(q);
            for (what, i) in [("local", &local), ("remote", &e.remote)] {
                println!(
                    " {what} address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
                    i.lid, i.qpn, i.psn, i.rkey, i.vaddr
                );
                println!(" GID: {}", i.gid);
            }
        }
        let _ = std::io::stdout().flush();
    }

    pub fn bw_row(&mut self, r: BwRow) {
        if !self.json {
            // UD: what arrived and what was lost (all QPs); the figures are of what arrived.
            let ud = r.received.zip(r.lost);
            if self.bw.is_empty() {
                println!("{RULE}");
                println!(
                    " {:<10} {:<14} {:<18} {:<21} {:<15}{}",
                    "#bytes",
                    "#iterations",
                    "BW peak[MB/sec]",
                    "BW average[MB/sec]",
                    "MsgRate[Mpps]",
                    if ud.is_some() {
                        " #received      #lost"
                    } else {
                        ""
                    }
                );
            }
            let counts = ud.map_or(String::new(), |(got, lost)| format!(" {got:<14} {lost}"));
            println!(
                " {:<10} {:<14} {:<18.2} {:<21.2} {:<15.6}{counts}",
                r.bytes, r.iters, r.peak_mbs, r.avg_mbs, r.msg_rate_mpps
            );
            let _ = std::io::stdout().flush();
        }
        self.bw.push(r);
    }

    pub fn lat_row(&mut self, r: LatRow) {
        if !self.json {
            if self.lat.is_empty() {
                println!("{RULE}");
                if half_rtt(self.op) {
                    println!(" latency = half the round trip (RTT/2), on the first QP");
                } else {
                    println!(" latency = post to completion, on the first QP");
                }
                println!(
                    " {:<8} {:<12} {:<14} {:<14} {:<16} {:<14} {:<15} {:<22} {}",
                    "#bytes",
                    "#iterations",
                    "t_min[usec]",
                    "t_max[usec]",
                    "t_typical[usec]",
                    "t_avg[usec]",
                    "t_stdev[usec]",
                    "99% percentile[usec]",
                    if r.resent.is_some() {
                        // UD: pings sent again after a loss.
                        "99.9% percentile[usec]  #resent"
                    } else {
                        "99.9% percentile[usec]"
                    }
                );
            }
            let s = &r.stats;
            let p999 = format!("{:.2}", s.p999);
            let last = r.resent.map_or(p999.clone(), |n| format!("{p999:<23} {n}"));
            println!(
                " {:<8} {:<12} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {last}",
                r.bytes, r.iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99
            );
            let _ = std::io::stdout().flush();
        }
        self.lat.push(r);
    }

    /// The closing rule, the JSON document, the chart.
    pub fn finish(&self, side: &Side) -> Result<()> {
        let counters = crate::stat::counters(&side.ctx);
        let get = |name: &str| {
            counters
                .iter()
                .find(|(k, _)| *k == name)
                .map_or(0, |(_, v)| *v)
        };
        if self.json {
            println!("{}", self.to_json(side).pretty());
        } else {
            println!("{RULE}");
            println!(
                " client counters: {} packets sent, {} received, {} retransmitted, {} ACK timeouts",
                get("tx_packets"),
                get("rx_packets"),
                get("retransmitted_packets"),
                get("ack_timeouts")
            );
            let same_host = side.ctx.same_host_counters();
            let sh = |name: &str| {
                same_host
                    .iter()
                    .find(|(k, _)| k == name)
                    .map_or(0, |(_, v)| *v)
            };
            if sh("same_host_qps") > 0 {
                println!(
                    " same-host path: {} QP(s), {} bytes written, {} read, {} WRs by UDP",
                    sh("same_host_qps"),
                    sh("same_host_bytes_written"),
                    sh("same_host_bytes_read"),
                    sh("same_host_fallbacks")
                );
            }
        }
        if let Some(path) = &self.plot {
            std::fs::write(path, self.svg())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            if self.json {
                eprintln!("chart written to {}", path.display());
            } else {
                println!(" chart written to {}", path.display());
            }
        }
        Ok(())
    }

    fn to_json(&self, side: &Side) -> Json {
        let p = &self.plan;
        let bw: Vec<Json> = self
            .bw
            .iter()
            .map(|r| {
                let row = Json::obj()
                    .with("bytes", r.bytes)
                    .with("iterations", r.iters)
                    .with("bw_peak_mb_per_sec", r.peak_mbs)
                    .with("bw_avg_mb_per_sec", r.avg_mbs)
                    .with("msg_rate_mpps", r.msg_rate_mpps)
                    .with("seconds", r.seconds);
                match r.received.zip(r.lost) {
                    Some((got, lost)) => row.with("received", got).with("lost", lost),
                    None => row,
                }
            })
            .collect();
        let lat: Vec<Json> = self
            .lat
            .iter()
            .map(|r| {
                let s = &r.stats;
                let row = Json::obj()
                    .with("bytes", r.bytes)
                    .with("iterations", r.iters)
                    .with("t_min_usec", s.min)
                    .with("t_max_usec", s.max)
                    .with("t_typical_usec", s.typical)
                    .with("t_avg_usec", s.avg)
                    .with("t_stdev_usec", s.stdev)
                    .with("p99_usec", s.p99)
                    .with("p99_9_usec", s.p999);
                match r.resent {
                    Some(n) => row.with("resent", n),
                    None => row,
                }
            })
            .collect();
        Json::obj()
            .with("tool", "softverbs perf")
            .with("version", env!("CARGO_PKG_VERSION"))
            .with("test", self.op.name())
            .with("connection", self.connection())
            .with("exchange", self.exchange.as_str())
            .with("qps", p.qps)
            .with("mtu", p.mtu)
            .with("tx_depth", p.tx_depth)
            .with("cq_mod", p.cq_mod)
            .with(
                "units",
                Json::obj()
                    .with("bw", "MB/sec, MB = 2^20 bytes")
                    .with("msg_rate", "10^6 messages/sec")
                    .with("latency", "usec")
                    .with(
                        "latency_is",
                        if half_rtt(self.op) {
                            "half round trip"
                        } else {
                            "post to completion"
                        },
                    ),
            )
            .with("bw", bw)
            .with("lat", lat)
            .with("client_counters", crate::stat::counters_json(&side.ctx))
    }

    fn svg(&self) -> String {
        let pts = |f: &dyn Fn(&BwRow) -> f64| -> Vec<(u64, f64)> {
            self.bw.iter().map(|r| (r.bytes as u64, f(r))).collect()
        };
        let lpts = |f: &dyn Fn(&LatStats) -> f64| -> Vec<(u64, f64)> {
            self.lat
                .iter()
                .map(|r| (r.bytes as u64, f(&r.stats)))
                .collect()
        };
        let series = |name: &str, color, dashed, points| Series {
            name: name.to_string(),
            color,
            dashed,
            points,
        };
        let bw = Panel {
            title: format!("{} bandwidth", op_title(self.op)),
            y_label: "MB/sec (MB = 2^20 bytes)".into(),
            log_y_if_wide: false,
            series: vec![
                series("BW average", "#1f77b4", false, pts(&|r| r.avg_mbs)),
                series("BW peak", "#1f77b4", true, pts(&|r| r.peak_mbs)),
            ],
        };
        let lat = Panel {
            title: format!(
                "{} latency{}",
                op_title(self.op),
                if half_rtt(self.op) { " (RTT/2)" } else { "" }
            ),
            y_label: "usec".into(),
            log_y_if_wide: true,
            series: vec![
                series("t_typical", "#d62728", false, lpts(&|s| s.typical)),
                series("t_avg", "#2ca02c", false, lpts(&|s| s.avg)),
                series("99% percentile", "#ff7f0e", true, lpts(&|s| s.p99)),
            ],
        };
        let title = format!(
            "softverbs perf {}: {} QP(s), MTU {}",
            self.op.name(),
            self.plan.qps,
            self.plan.mtu
        );
        plot::svg(&title, &[bw, lat])
    }
}
