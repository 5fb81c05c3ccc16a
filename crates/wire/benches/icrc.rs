//! ICRC throughput: the CRC-32 kernels on one MTU's payload (4 KiB) and on a whole
//! 64 KiB message, and `icrc::compute` on a 4 KiB-payload RoCEv2 packet (the
//! masked pseudo-header, then the payload: what every sender and receiver does per
//! packet).
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

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .configure_from_args();
    kernels(&mut c);
    packet(&mut c);
    c.final_summary();
}
