//! Behaviour of the simulated network, driven by toy nodes.

mod toy;

use softverbs_engine::Instant;
use softverbs_sim::{Burst, Fate, Faults, Limits, NodeId, Sim, SimError, DEFAULT_DELAY};
use std::time::Duration;
use toy::{addr, number, numbered, Event, Toy};

fn limits() -> Limits {
    Limits::new(1_000_000, Duration::from_secs(60))
}

fn at_micros(us: u64) -> Instant {
    Instant::from_nanos(us * 1_000)
}

/// Node 1 sends `count` numbered datagrams to node 2, which echoes them back.
fn echo_pair(seed: u64, faults: Faults, count: u32) -> (Sim<Toy>, NodeId, NodeId) {
    let mut sim = Sim::new(seed, faults);
    let mut sender = Toy::new(1);
    sender.queue_numbered(addr(2), count, 64);
    let a = sim.add_node(sender);
    let b = sim.add_node(Toy::echo(2));
    (sim, a, b)
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let run = |seed| {
        let (mut sim, a, b) = echo_pair(seed, Faults::chaos(0.1), 2000);
        sim.set_tracing(true);
        let report = sim.run_until_idle(limits()).unwrap();
        let trace = sim.take_trace();
        assert!(!trace.is_empty());
        (
            sim.stats(),
            report,
            trace,
            sim.node(a).events.clone(),
            sim.node(b).events.clone(),
        )
    };
    let first = run(1);
    assert_eq!(first, run(1));
    let other = run(2);
    assert_ne!(first.0, other.0);
    assert_ne!(first.2, other.2);
    assert_ne!(first.4, other.4);
    // Chaos really happened.
    let stats = first.0;
    assert!(stats.lost > 0 && stats.duplicated > 0 && stats.reordered > 0);
    assert!(stats.corrupted > 0);
    assert_eq!(stats.in_flight(), 0);
}

#[test]
fn loss_rate_is_honoured() {
    for (seed, loss) in [(3, 0.2), (4, 0.5), (5, 0.01)] {
        let mut sim = Sim::new(seed, Faults::lossy(loss));
        let mut sender = Toy::new(1);
        sender.queue_numbered(addr(2), 10_000, 8);
        sim.add_node(sender);
        let b = sim.add_node(Toy::new(2));
        sim.run_until_idle(limits()).unwrap();
        let stats = sim.stats();
        assert_eq!(stats.sent, 10_000);
        assert_eq!(stats.lost + stats.delivered, 10_000);
        assert_eq!(sim.node(b).received().len() as u64, stats.delivered);
        // The standard deviation is at most 50 datagrams; allow eight of them.
        let expected = 10_000.0 * loss;
        assert!(
            (stats.lost as f64 - expected).abs() < 400.0,
            "loss {loss}: lost {} of 10000",
            stats.lost
        );
        // Nothing else happened, and order was kept.
        let numbers = sim.node(b).received_numbers();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
    }
}

#[test]
fn no_faults_delivers_everything_in_order_after_the_delay() {
    let (mut sim, a, b) = echo_pair(9, Faults::none(), 100);
    let report = sim.run_until_idle(limits()).unwrap();
    assert_eq!(report.now, Instant::ZERO + DEFAULT_DELAY * 2);
    assert_eq!(report.elapsed(), DEFAULT_DELAY * 2);
    assert_eq!(sim.node(b).received_numbers(), (0..100).collect::<Vec<_>>());
    assert_eq!(sim.node(a).received_numbers(), (0..100).collect::<Vec<_>>());
    for (at, src, data) in sim.node(a).received() {
        assert_eq!(at, Instant::ZERO + DEFAULT_DELAY * 2);
        assert_eq!(src, addr(2));
        assert_eq!(data, numbered(number(data), 64));
    }
    let stats = sim.stats();
    assert_eq!((stats.sent, stats.delivered), (200, 200));
    assert!(!sim.step(), "an idle network has nothing to do");
}

#[test]
fn partition_drops_everything_both_ways_until_healed() {
    let (mut sim, a, b) = echo_pair(11, Faults::none(), 50);
    sim.node_mut(b).queue_numbered(addr(1), 50, 16);
    sim.partition(b, a, true);
    assert!(sim.is_partitioned(a, b));
    sim.run_until_idle(limits()).unwrap();
    assert!(sim.node(a).events.is_empty());
    assert!(sim.node(b).events.is_empty());
    assert_eq!(sim.stats().partitioned, 100);
    assert_eq!(sim.stats().delivered, 0);

    // Datagrams already in flight when the cut happens are dropped too.
    sim.partition(a, b, false);
    sim.node_mut(a).queue_numbered(addr(2), 10, 16);
    assert!(sim.step());
    assert_eq!(sim.in_flight(), 10);
    sim.partition(a, b, true);
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(sim.stats().partitioned, 110);
    assert!(sim.node(b).events.is_empty());

    // Healed: traffic flows again.
    sim.partition(a, b, false);
    sim.node_mut(a).queue_numbered(addr(2), 10, 16);
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(sim.node(b).received().len(), 10);
    assert_eq!(sim.node(a).received().len(), 10);
}

#[test]
fn link_faults_apply_to_one_direction() {
    let (mut sim, a, b) = echo_pair(12, Faults::none(), 0);
    sim.set_link_faults(a, b, Faults::lossy(1.0));
    assert_eq!(sim.link_faults(a, b).loss, 1.0);
    assert_eq!(sim.link_faults(b, a).loss, 0.0);
    sim.node_mut(a).queue_numbered(addr(2), 20, 8);
    sim.node_mut(b).queue_numbered(addr(1), 20, 8);
    sim.run_until_idle(limits()).unwrap();
    assert!(sim.node(b).events.is_empty());
    assert_eq!(sim.node(a).received().len(), 20);
    assert_eq!(sim.stats().lost, 20);

    sim.clear_link_faults(a, b);
    sim.node_mut(a).queue_numbered(addr(2), 5, 8);
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(sim.node(b).received().len(), 5);
}

#[test]
fn ping_pong_forever_is_a_livelock() {
    for faults in [Faults::none(), Faults::none().with_delay(Duration::ZERO)] {
        let mut sim = Sim::new(13, faults);
        let mut a = Toy::echo(1);
        a.queue_numbered(addr(2), 1, 8);
        sim.add_node(a);
        let b = sim.add_node(Toy::echo(2));
        let tight = Limits::new(10_000, Duration::from_secs(3600));
        let err = sim
            .run_until(tight, |sim| sim.node(b).received().len() > 1_000_000)
            .unwrap_err();
        assert!(
            matches!(err, SimError::Livelock { steps: 10_000, .. }),
            "{err}"
        );
        assert!(matches!(
            sim.run_until_idle(tight),
            Err(SimError::Livelock { .. })
        ));
        if faults.delay.is_zero() {
            assert_eq!(err.now(), Instant::ZERO);
        }
    }
}

#[test]
fn waiting_for_what_never_comes_is_idle() {
    // The only datagram is lost and nobody retransmits: a hang.
    let mut sim = Sim::new(14, Faults::lossy(1.0));
    let mut a = Toy::new(1);
    a.queue_numbered(addr(2), 1, 8);
    sim.add_node(a);
    let b = sim.add_node(Toy::new(2));
    let err = sim
        .run_until(limits(), |sim| !sim.node(b).events.is_empty())
        .unwrap_err();
    assert_eq!(err, SimError::Idle { now: Instant::ZERO });
    assert_eq!(sim.stats().lost, 1);
    assert!(err.to_string().contains("hang"));
}

#[test]
fn endless_timers_hit_the_deadline() {
    let mut sim = Sim::new(15, Faults::none());
    let ms = Duration::from_millis(1);
    let a = sim.add_node(Toy::new(1).with_timer(Instant::ZERO + ms, Some(ms)));
    let ten_ms = Limits::new(1_000_000, ms * 10);
    let err = sim.run_until(ten_ms, |_| false).unwrap_err();
    assert_eq!(
        err,
        SimError::Deadline {
            now: Instant::ZERO + ms * 10
        }
    );
    assert_eq!(sim.now(), Instant::ZERO + ms * 10);
    let fired = sim.node(a).fired();
    assert_eq!(fired.len(), 10);
    assert!(fired
        .iter()
        .enumerate()
        .all(|(i, &at)| at == Instant::ZERO + ms * (i as u32 + 1)));
    assert_eq!(sim.stats().timeouts, 10);

    let err = sim.run_until_idle(ten_ms).unwrap_err();
    assert_eq!(
        err,
        SimError::Deadline {
            now: Instant::ZERO + ms * 20
        }
    );
}

#[test]
fn run_for_advances_the_clock_exactly() {
    let mut sim = Sim::new(16, Faults::none());
    let ms = Duration::from_millis(1);
    let a = sim.add_node(Toy::new(1).with_timer(Instant::ZERO + ms, Some(ms)));
    let report = sim.run_for(ms * 7 / 2, limits()).unwrap();
    assert_eq!(report.now, Instant::ZERO + ms * 7 / 2);
    assert_eq!(sim.node(a).fired().len(), 3);
    // A deadline exactly at the end of the run fires.
    sim.run_for(ms / 2, limits()).unwrap();
    assert_eq!(sim.node(a).fired().len(), 4);
    // Asking for more than the limits allow.
    let err = sim.run_for(ms * 10, Limits::new(100, ms)).unwrap_err();
    assert_eq!(
        err,
        SimError::Deadline {
            now: Instant::ZERO + ms * 5
        }
    );
    // An idle network just lets time pass.
    let mut idle = Sim::<Toy>::new(16, Faults::none());
    idle.run_for(ms, limits()).unwrap();
    assert_eq!(idle.now(), Instant::ZERO + ms);
}

#[test]
fn datagrams_arrive_before_timers_due_at_the_same_instant() {
    let mut sim = Sim::new(17, Faults::none());
    let mut a = Toy::new(1).with_timer(at_micros(10), None);
    a.queue_numbered(addr(2), 1, 8);
    let a = sim.add_node(a);
    let b = sim.add_node(Toy::new(2).with_timer(at_micros(10), None));
    sim.node_mut(b).queue_numbered(addr(1), 1, 8);
    sim.run_until_idle(limits()).unwrap();
    for id in [a, b] {
        let kinds: Vec<&str> = sim
            .node(id)
            .events
            .iter()
            .map(|e| match e {
                Event::Datagram { at, .. } => {
                    assert_eq!(*at, at_micros(10));
                    "datagram"
                }
                Event::Timer { at } => {
                    assert_eq!(*at, at_micros(10));
                    "timer"
                }
            })
            .collect();
        assert_eq!(kinds, ["datagram", "timer"]);
    }
}

#[test]
fn corruption_flips_one_to_three_bits() {
    let (mut sim, _, b) = echo_pair(18, Faults::none().with_corrupt(1.0), 500);
    sim.node_mut(b).echo = false;
    sim.run_until_idle(limits()).unwrap();
    let received = sim.node(b).received();
    assert_eq!(received.len(), 500);
    assert_eq!(sim.stats().corrupted, 500);
    let mut spread = [0usize; 4];
    for (i, (_, _, data)) in received.iter().enumerate() {
        // Corruption may hit the number, so compare with what was sent in order.
        let sent = numbered(i as u32, 64);
        let flipped: u32 = sent
            .iter()
            .zip(data.iter())
            .map(|(x, y)| (x ^ y).count_ones())
            .sum();
        assert!((1..=3).contains(&flipped), "datagram {i}: {flipped} bits");
        spread[flipped as usize] += 1;
    }
    assert!(
        spread[1] > 0 && spread[2] > 0 && spread[3] > 0,
        "{spread:?}"
    );
}

#[test]
fn duplication_delivers_twice() {
    let (mut sim, _, b) = echo_pair(19, Faults::none().with_duplicate(1.0), 100);
    sim.node_mut(b).echo = false;
    sim.set_tracing(true);
    sim.run_until_idle(limits()).unwrap();
    let stats = sim.stats();
    assert_eq!(
        (stats.sent, stats.duplicated, stats.delivered),
        (100, 100, 200)
    );
    let mut counts = vec![Vec::new(); 100];
    for (at, _, data) in sim.node(b).received() {
        assert_eq!(data, numbered(number(data), 64));
        counts[number(data) as usize].push(at);
    }
    for times in counts {
        assert_eq!(times.len(), 2);
        assert!(times[0] < times[1]);
    }
    let trace = sim.trace();
    assert_eq!(trace.iter().filter(|e| e.duplicate).count(), 100);
    assert!(trace.iter().all(|e| e.fate == Fate::Delivered));
}

#[test]
fn reordering_delays_some_datagrams_past_later_ones() {
    let (mut sim, _, b) = echo_pair(20, Faults::none().with_reorder(0.3), 1000);
    sim.node_mut(b).echo = false;
    sim.run_until_idle(limits()).unwrap();
    let numbers = sim.node(b).received_numbers();
    assert_eq!(numbers.len(), 1000);
    assert!(numbers.windows(2).any(|w| w[0] > w[1]));
    let mut sorted = numbers.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    let reordered = sim.stats().reordered;
    assert!((200..400).contains(&reordered), "{reordered}");
}

#[test]
fn jitter_stays_within_bounds() {
    let faults = Faults::none().with_jitter(Duration::from_micros(5));
    let (mut sim, _, b) = echo_pair(21, faults, 500);
    sim.node_mut(b).echo = false;
    sim.run_until_idle(limits()).unwrap();
    let times: Vec<Instant> = sim.node(b).received().iter().map(|r| r.0).collect();
    assert_eq!(times.len(), 500);
    assert!(times
        .iter()
        .all(|&t| t >= at_micros(10) && t <= at_micros(15)));
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(times.first() != times.last());
}

#[test]
fn unknown_addresses_are_counted_and_dropped() {
    let mut sim = Sim::new(22, Faults::none());
    let mut a = Toy::new(1);
    a.queue_numbered(addr(2), 1, 8);
    a.queue_numbered(addr(9), 3, 8);
    let a = sim.add_node(a);
    let b = sim.add_node(Toy::new(2));
    assert_eq!(sim.node_at(addr(2)), Some(b));
    assert_eq!(sim.node_at(addr(9)), None);
    assert_eq!(sim.addr(a), addr(1));
    sim.set_tracing(true);
    sim.run_until_idle(limits()).unwrap();
    let stats = sim.stats();
    assert_eq!(
        (stats.sent, stats.delivered, stats.undeliverable),
        (4, 1, 3)
    );
    let dropped: Vec<_> = sim
        .trace()
        .iter()
        .filter(|e| e.fate == Fate::Undeliverable)
        .collect();
    assert_eq!(dropped.len(), 3);
    assert!(dropped.iter().all(|e| e.to.is_none() && e.dst == addr(9)));
}

#[test]
fn run_until_stops_as_soon_as_done() {
    let (mut sim, _, b) = echo_pair(23, Faults::none(), 10);
    let report = sim
        .run_until(limits(), |sim| sim.node(b).received().len() == 3)
        .unwrap();
    assert_eq!(sim.node(b).received().len(), 3);
    assert_eq!(report.now, at_micros(10));
    let again = sim.run_until(limits(), |_| true).unwrap();
    assert_eq!(again.steps, 0);
}

#[test]
#[should_panic(expected = "loss")]
fn invalid_faults_are_refused() {
    let _ = Sim::<Toy>::new(1, Faults::lossy(1.5));
}

#[test]
#[should_panic(expected = "already has address")]
fn duplicate_addresses_are_refused() {
    let mut sim = Sim::new(1, Faults::none());
    sim.add_node(Toy::new(1));
    sim.add_node(Toy::new(1));
}

#[test]
fn bursty_loss_comes_in_runs_at_its_mean_rate() {
    // Good state loses nothing; bursts of 1 / 0.25 = 4 datagrams on average, each
    // lost with probability 0.8; 1.25 % of the time spent entering bursts.
    let burst = Burst {
        enter: 0.0125,
        leave: 0.25,
        loss: 0.8,
    };
    let mean = burst.mean_loss(0.0);
    let mut sim = Sim::new(21, Faults::none().with_burst(burst));
    sim.set_tracing(true);
    let mut sender = Toy::new(1);
    sender.queue_numbered(addr(2), 20_000, 8);
    sim.add_node(sender);
    sim.add_node(Toy::new(2));
    sim.run_until_idle(limits()).unwrap();
    let stats = sim.stats();
    assert_eq!(stats.lost + stats.delivered, 20_000);
    let rate = stats.lost as f64 / 20_000.0;
    assert!((rate - mean).abs() < 0.4 * mean, "lost {rate}, mean {mean}");
    // Losses cluster: a loss is followed by another far more often than the mean
    // rate would give if they were independent.
    let fates: Vec<bool> = sim.trace().iter().map(|t| t.fate == Fate::Lost).collect();
    let after_loss = fates.windows(2).filter(|w| w[0]).count() as f64;
    let pairs = fates.windows(2).filter(|w| w[0] && w[1]).count() as f64;
    assert!(pairs / after_loss > 3.0 * mean, "{pairs} of {after_loss}");
}

#[test]
fn a_rated_link_serialises_and_drops_past_its_queue() {
    // 1 MB/s: a 1000-byte datagram takes 1 ms on the wire.
    let faults = Faults::none().with_rate(1_000_000, 0);
    let mut sim = Sim::new(22, faults);
    let mut sender = Toy::new(1);
    sender.queue_numbered(addr(2), 10, 1000);
    sim.add_node(sender);
    let b = sim.add_node(Toy::new(2));
    sim.run_until_idle(limits()).unwrap();
    let arrivals: Vec<Instant> = sim.node(b).received().iter().map(|r| r.0).collect();
    let expected: Vec<Instant> = (1..=10)
        .map(|k| Instant::ZERO + Duration::from_millis(k) + DEFAULT_DELAY)
        .collect();
    assert_eq!(arrivals, expected);

    // A queue of 3000 bytes holds three datagrams (the one being serialised
    // counts): the rest of the burst is dropped.
    let mut sim = Sim::new(23, Faults::none().with_rate(1_000_000, 3000));
    let mut sender = Toy::new(1);
    sender.queue_numbered(addr(2), 10, 1000);
    sim.add_node(sender);
    let b = sim.add_node(Toy::new(2));
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(sim.node(b).received_numbers(), vec![0, 1, 2]);
    assert_eq!(sim.stats().queue_full, 7);
    assert_eq!(sim.stats().in_flight(), 0);
}
