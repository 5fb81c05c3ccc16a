//! ICRC throughput: the CRC-32 kernels on one MTU's payload (4 KiB) and on a whole
//! 64 KiB message, and `icrc::compute` on a 4 KiB-payload RoCEv2 packet (the
//! masked pseudo-header, then the payload: what every sender and receiver does per
//! packet), and on the ACK and the 8-byte SEND of a latency ping-pong.
//!
//! Run: `cargo bench -p softverbs-wire --bench icrc`.

use criterion::{black_box, Criterion, Throughput};
use softverbs_wire::icrc::{self, IcrcContext};

fn buffer(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

fn kernels(c: &mut Criterion) {
    for len in [4096usize, 65536] {
        let data = buffer(len);
        let mut group = c.benchmark_group(format!("crc32 {} KiB", len / 1024));
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function("crc32fast", |b| {
            b.iter(|| crc32fast::hash(black_box(&data)))
        });
        group.finish();
    }
}

fn packet(c: &mut Criterion) {
    let ctx = IcrcContext::new(
        "192.0.2.1:49152".parse().unwrap(),
        "192.0.2.2:4791".parse().unwrap(),
    );
    // BTH (12) + RETH (16) + 4096 bytes of payload + ICRC (4).
    let mut p = buffer(12 + 16 + 4096 + 4);
    p[0] = 0x0a; // RDMA WRITE First
    let mut group = c.benchmark_group("icrc packet");
    group.throughput(Throughput::Bytes(p.len() as u64));
    group.bench_function("compute 4 KiB payload", |b| {
        b.iter(|| icrc::compute(&ctx, black_box(&p)).unwrap())
    });
    group.finish();
}

/// The packets of an 8-byte ping-pong, each checked by its receiver and sealed by its
/// sender: an ACK (BTH, AETH, ICRC: 20 bytes) and an 8-byte SEND Only (24 bytes).
fn small_packets(c: &mut Criterion) {
    let ctx = IcrcContext::new(
        "192.0.2.1:49152".parse().unwrap(),
        "192.0.2.2:4791".parse().unwrap(),
    );
    let mut ack = buffer(12 + 4 + 4);
    ack[0] = 0x11; // RC Acknowledge
    let mut send = buffer(12 + 8 + 4);
    send[0] = 0x04; // RC SEND Only
    let mut group = c.benchmark_group("icrc small packet");
    group.bench_function("compute ACK", |b| {
        b.iter(|| icrc::compute(&ctx, black_box(&ack)).unwrap())
    });
    group.bench_function("compute 8-byte SEND", |b| {
        b.iter(|| icrc::compute(&ctx, black_box(&send)).unwrap())
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .configure_from_args();
    kernels(&mut c);
    packet(&mut c);
    small_packets(&mut c);
    c.final_summary();
}
