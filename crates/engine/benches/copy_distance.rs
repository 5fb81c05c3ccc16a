//! The payload copy at the distances that matter (`softverbs_engine::copy`): the
//! platform's copy against `copy_bytes`, 4 KiB (a packet's payload) and 64 KiB (a
//! same-host message), source at the start of a page, destination 0, 16 and 2048
//! bytes further modulo 4096. On the host of session 18 (AMD EPYC, FSRM, glibc 2.36)
//! the platform's copy runs some 20x slower at 16 than at 0 or 2048, `copy_bytes` does
//! not.
//!
//! Run: `cargo bench -p softverbs-engine --bench copy_distance`.

use criterion::{BenchmarkId, Criterion, Throughput};
use softverbs_engine::copy::copy_bytes;
use std::time::Duration;

/// A pointer `offset` bytes into a page of `buf`, with `len` bytes after it.
fn at(buf: &mut [u8], offset: usize, len: usize) -> *mut u8 {
    let base = buf.as_mut_ptr() as usize;
    let start = softverbs_engine::copy::bytes_to_page_offset(base, offset);
    assert!(start + len <= buf.len());
    buf[start..].as_mut_ptr()
}

fn distances(c: &mut Criterion) {
    for len in [4096usize, 65536] {
        let mut g = c.benchmark_group(format!("copy_{len}"));
        g.throughput(Throughput::Bytes(len as u64))
            .measurement_time(Duration::from_secs(1))
            .warm_up_time(Duration::from_millis(300));
        let mut src = vec![7u8; len + 8192];
        let mut dst = vec![0u8; len + 8192];
        for distance in [0usize, 16, 2048] {
            let from = at(&mut src, 0, len).cast_const();
            let to = at(&mut dst, distance, len);
            g.bench_with_input(BenchmarkId::new("platform", distance), &distance, |b, _| {
                // SAFETY: `from` and `to` each have `len` bytes in their own vector.
                b.iter(|| unsafe { std::ptr::copy_nonoverlapping(from, to, len) })
            });
            g.bench_with_input(
                BenchmarkId::new("copy_bytes", distance),
                &distance,
                |b, _| {
                    // SAFETY: as above.
                    b.iter(|| unsafe { copy_bytes(from, to, len) })
                },
            );
        }
        g.finish();
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    distances(&mut c);
    c.final_summary();
}
