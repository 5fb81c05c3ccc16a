//! A per-step timestamp trace of the receive-to-answer path (feature `trace`; without it
//! every function here is empty and inlined away).
//!
//! Each thread that passes a traced step stamps it into a fixed ring of its own (the
//! time-stamp counter on x86-64, the monotonic clock elsewhere, with the step in the top
//! byte), with no lock and no allocation after the ring's first use. [`dump`] writes
//! every thread's ring as text, one `thread step ns` line per stamp, for
//! `bench/trace-table.py` to turn into a per-step table. `softverbs perf` and
//! `Driver::close` (so C programs on the drop-in) dump to `$SOFTVERBS_TRACE.<pid>` when
//! that variable is set.

/// A traced step. Discriminants are what the dump prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// `recvmmsg` returned datagrams.
    Received = 1,
    /// The engine handled them (before the pump).
    Handled = 2,
    /// The receive's pump and finish are done.
    ReceiveDone = 3,
    /// An application's poll returned completions.
    Polled = 4,
    /// The engine's `post_send` entered (the UDP path; the device lock is held).
    PostEntered = 5,
    /// A batch went into the outbox (under the device lock).
    Queued = 6,
    /// A sealed batch is about to be sent (`sendmsg`/`sendmmsg`).
    SendEntered = 7,
    /// Its send call returned.
    SendReturned = 8,
    /// A receive call (`recvmmsg`) is entered, found something or not: with
    /// [`Step::Received`] it splits the noticing of a datagram into the wait for the
    /// call and the call.
    RecvEntered = 9,
    /// The receive holds the device lock and read the clock.
    Locked = 10,
    /// The engine handled one datagram of what the receive read.
    DatagramHandled = 11,
    /// A pump (`Driver::pump_holding`) starts: the cm's pump and the engine's transmit.
    PumpEntered = 12,
    /// The pump's first cm pump and transmit are done (packets built, ACKs held or
    /// queued).
    PumpTransmitted = 13,
    /// The pump is done (events, same-host offers, the next timer).
    Pumped = 14,
    /// A receive or a post released the device lock (`Driver::finish` follows).
    Unlocked = 15,
    /// A post holds the device lock.
    PostLocked = 16,
    /// The engine's `post_send` returned.
    EnginePosted = 17,
    /// The sender took a batch from the outbox (fault injection, capture and the seal
    /// follow before the send call).
    BatchTaken = 18,
}

#[cfg(feature = "trace")]
mod on {
    use super::Step;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    /// Stamps kept per thread (the newest win).
    const RING: usize = 1 << 20;
    const TIME_MASK: u64 = (1 << 56) - 1;

    struct Ring {
        thread: u64,
        next: AtomicU64,
        stamps: Box<[AtomicU64]>,
    }

    struct Registry {
        rings: Mutex<Vec<&'static Ring>>,
        start: Instant,
        start_ticks: u64,
        /// The wall clock at `start` (ns since the epoch): the dump's times are on it, so
        /// that the two processes of a ping-pong compare.
        start_wall: u64,
        threads: AtomicU64,
    }

    fn registry() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| Registry {
            rings: Mutex::new(Vec::new()),
            start: Instant::now(),
            start_ticks: ticks(),
            start_wall: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            threads: AtomicU64::new(0),
        })
    }

    #[cfg(target_arch = "x86_64")]
    fn ticks() -> u64 {
        // SAFETY: `rdtsc` reads the time-stamp counter; it has no memory effects and every
        // x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn ticks() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    thread_local! {
        static MINE: Cell<Option<&'static Ring>> = const { Cell::new(None) };
    }

    fn ring() -> &'static Ring {
        MINE.with(|m| {
            if let Some(r) = m.get() {
                return r;
            }
            let reg = registry();
            // Kept for the process's life: a thread's ring outlives the thread so that
            // the dump still sees it.
            let r: &'static Ring = Box::leak(Box::new(Ring {
                thread: reg.threads.fetch_add(1, Ordering::Relaxed),
                next: AtomicU64::new(0),
                stamps: (0..RING).map(|_| AtomicU64::new(0)).collect(),
            }));
            reg.rings.lock().unwrap_or_else(|e| e.into_inner()).push(r);
            m.set(Some(r));
            r
        })
    }

    #[inline]
    pub fn stamp(step: Step) {
        let r = ring();
        let i = r.next.load(Ordering::Relaxed);
        r.next.store(i + 1, Ordering::Relaxed);
        r.stamps[(i as usize) & (RING - 1)].store(
            ((step as u64) << 56) | (ticks() & TIME_MASK),
            Ordering::Relaxed,
        );
    }

    pub(super) fn dump(path: &std::path::Path) -> std::io::Result<()> {
        use std::fmt::Write as _;
        let reg = registry();
        let elapsed = reg.start.elapsed().as_nanos() as f64;
        let per_ns = (ticks().wrapping_sub(reg.start_ticks)) as f64 / elapsed.max(1.0);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# thread step ns (wall clock, since {} ns; ticks per ns {per_ns:.4})",
            reg.start_wall
        );
        for r in reg.rings.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let n = r.next.load(Ordering::Relaxed) as usize;
            let first = n.saturating_sub(RING);
            for i in first..n {
                let v = r.stamps[i & (RING - 1)].load(Ordering::Relaxed);
                let t = (v & TIME_MASK).wrapping_sub(reg.start_ticks & TIME_MASK) & TIME_MASK;
                let ns = reg.start_wall + (t as f64 / per_ns) as u64;
                let _ = writeln!(out, "{} {} {ns}", r.thread, v >> 56);
            }
        }
        std::fs::write(path, out)
    }
}

/// Stamps `step` on the calling thread's ring.
#[inline(always)]
pub fn stamp(step: Step) {
    #[cfg(feature = "trace")]
    on::stamp(step);
    #[cfg(not(feature = "trace"))]
    let _ = step;
}

/// Writes every thread's stamps to `$SOFTVERBS_TRACE.<pid>` when that variable is set
/// and the feature is on; otherwise does nothing.
pub fn dump_to_env() {
    #[cfg(feature = "trace")]
    if let Some(base) = std::env::var_os("SOFTVERBS_TRACE") {
        let mut path = base;
        path.push(format!(".{}", std::process::id()));
        if let Err(e) = on::dump(std::path::Path::new(&path)) {
            tracing::warn!(error = %e, "could not write the trace");
        }
    }
}

#[cfg(all(test, feature = "trace"))]
mod tests {
    use super::*;

    #[test]
    fn stamps_come_out_in_order_per_thread() {
        let path = std::env::temp_dir().join(format!("softverbs-trace-{}", std::process::id()));
        stamp(Step::Received);
        stamp(Step::Handled);
        std::thread::spawn(|| stamp(Step::SendEntered))
            .join()
            .unwrap();
        stamp(Step::Polled);
        on::dump(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let rows: Vec<(u64, u64, u64)> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
                (v[0], v[1], v[2])
            })
            .collect();
        let mine: Vec<_> = rows.iter().filter(|r| r.0 == rows[0].0).collect();
        let steps: Vec<u64> = mine.iter().map(|r| r.1).collect();
        assert_eq!(steps, [1, 2, 4]);
        assert!(mine.windows(2).all(|w| w[0].2 <= w[1].2));
        assert!(rows.iter().any(|r| r.0 != rows[0].0 && r.1 == 7));
    }
}
