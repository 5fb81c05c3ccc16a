//! `softverbs stat`: engine and driver counters.
//!
//! Every open softverbs device publishes its counters in a small file (see
//! `softverbs::published`); without options this command shows those of every
//! live device on the host. `--open` opens a device of its own instead and
//! shows its counters (all zero: useful to check the configuration and the
//! counter set).

use crate::conn::open_device;
use crate::json::Json;
use crate::Result;
use softverbs::published::{read_published, stats_dir, PublishedCounters};
use softverbs::Context;

/// The counters of `ctx` as (name, value) pairs: the engine's, then the
/// driver's, named as devices publish them.
pub fn counters(ctx: &Context) -> Vec<(&'static str, u64)> {
    let d = ctx.device_counters();
    let mut v = ctx.counters().named().to_vec();
    v.extend([
        ("udp_tx_datagrams", d.tx_datagrams),
        ("udp_rx_datagrams", d.rx_datagrams),
        ("udp_rx_by_progress_thread", d.rx_by_progress_thread),
        ("udp_rx_single_reads", d.rx_single_reads),
        ("udp_tx_errors", d.tx_errors),
        ("udp_tx_syscalls", d.tx_syscalls),
        ("udp_tx_single_sends", d.tx_single_sends),
        ("posts_joined_batch", d.posts_joined_batch),
        ("progress_timer_wakeups", d.timer_wakeups),
        ("progress_wakes", d.progress_wakes),
        ("progress_sleeps", d.progress_sleeps),
        ("poll_yields", d.poll_yields),
        ("poll_cpu_moves", d.poll_cpu_moves),
        ("poll_waits", d.poll_waits),
        ("poll_yield_waits", d.poll_yield_waits),
        ("handoff_pushes", d.handoff_pushes),
        ("socket_taken_from_progress", d.socket_taken_from_progress),
        ("acks_held", d.acks_held),
        ("acks_after_requests", d.acks_after_requests),
        ("acks_held_for_memory", d.acks_held_for_memory),
        ("ack_holds_expired", d.ack_holds_expired),
        ("sock_writes_blocked", d.sock_writes_blocked),
        ("sock_ack_looks", d.sock_ack_looks),
        ("sock_cpu_moves", d.sock_cpu_moves),
        ("sock_cpu_looks", d.sock_cpu_looks),
        ("sock_small_in_packet", d.sock_small_in_packet),
        ("sock_grants_from_memory", d.sock_grants_from_memory),
        ("sock_grants_from_message", d.sock_grants_from_message),
        ("sock_bytes_read_ahead", d.sock_bytes_read_ahead),
        ("sock_messages_read_ahead", d.sock_messages_read_ahead),
        ("sock_messages_announced", d.sock_messages_announced),
        ("injected_drops", d.injected_drops),
    ]);
    v
}

/// The counters as a JSON object, the same-host path's (`same_host_*`) included.
pub fn counters_json(ctx: &Context) -> Json {
    let j = counters(ctx)
        .into_iter()
        .fold(Json::obj(), |j, (k, v)| j.with(k, v));
    ctx.same_host_counters()
        .into_iter()
        .fold(j, |j, (k, v)| j.with(&k, v))
}

fn published_json(p: &PublishedCounters) -> Json {
    let counters = p
        .counters
        .iter()
        .fold(Json::obj(), |j, (k, v)| j.with(k, *v));
    Json::obj()
        .with("pid", p.pid)
        .with("address", p.addr.as_str())
        .with("counters", counters)
}

fn print_lines<'a>(lines: impl IntoIterator<Item = (&'a str, u64)>) {
    for (name, value) in lines {
        println!("{name:<28}{value}");
    }
}

pub fn run(json: bool, open: bool) -> Result<()> {
    if open {
        let ctx = open_device(None, None)?;
        if json {
            let doc = Json::obj()
                .with("pid", std::process::id())
                .with("address", ctx.local_addr().to_string())
                .with("counters", counters_json(&ctx));
            println!("{}", doc.pretty());
        } else {
            println!(
                "# device {} at {} (opened by this command)",
                ctx.name(),
                ctx.local_addr()
            );
            print_lines(counters(&ctx));
        }
        return Ok(());
    }
    let devices = read_published();
    if json {
        let list: Vec<Json> = devices.iter().map(published_json).collect();
        println!("{}", Json::Arr(list).pretty());
        return Ok(());
    }
    if devices.is_empty() {
        println!(
            "# no open softverbs device on this host (none publishes in {})",
            stats_dir().display()
        );
        return Ok(());
    }
    for (i, d) in devices.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("# device at {} (pid {})", d.addr, d.pid);
        print_lines(d.counters.iter().map(|(k, v)| (k.as_str(), *v)));
    }
    Ok(())
}
