#!/usr/bin/env python3
"""Per-thread scheduling summary of a two-process run, from the scheduler's tracepoints.

Reads `perf script -F comm,tid,pid,cpu,time,event,trace` of a `perf record -a -e
sched:sched_switch,sched:sched_wakeup,sched:sched_wakeup_new,sched:sched_migrate_task`
on stdin. The run's two main threads are the two processes named --comm (a thread whose
tid is its pid) with the most switch events. For every thread of those processes it
prints the CPU time on each CPU, the time it was runnable but waited for a CPU (from a
wake-up or a preemption to its next switch-in), sleeps, preemptions, migrations (and
whether the thread slept or waited when moved), and its wake-ups: by whom, and whether
they put it on the waker's CPU. Then, over the trace, how long both main threads were
runnable (running or waiting) on one CPU while another CPU was idle or busy (and with
what), or on different CPUs. Written for bench/rstream-sched.sh (docs/sockets.md,
session 18).
"""
import argparse
import collections
import re
import sys

EVENT = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")


def parse(lines):
    for line in lines:
        m = EVENT.match(line)
        if m:
            comm, pid, tid, cpu, t, event, rest = m.groups()
            yield comm.strip(), int(pid), int(tid), int(cpu), float(t), event, dict(FIELD.findall(rest))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comm", default="softverbs", help="the main threads' command name")
    args = ap.parse_args()
    events = list(parse(sys.stdin))
    if not events:
        sys.exit("sched-summary: no events on stdin")
    switches = collections.Counter(
        pid for comm, pid, tid, _, _, ev, _ in events
        if comm == args.comm and pid == tid and ev == "sched:sched_switch")
    mains = [pid for pid, _ in switches.most_common(2)]
    tgid, name = {}, {}
    state, since, where, running = {}, {}, {}, {}
    run_on = collections.defaultdict(collections.Counter)
    waited, waits = collections.Counter(), collections.Counter()
    sleeps, preempted = collections.Counter(), collections.Counter()
    migrations = collections.defaultdict(collections.Counter)
    wakers = collections.defaultdict(collections.Counter)
    landing = collections.defaultdict(collections.Counter)
    pair = collections.Counter()
    other_ran = collections.Counter()
    start, last = events[0][4], None

    def set_state(tid, new, t):
        old = state.get(tid, "sleep")
        if old == "wait" and tid in since:
            waited[tid] += t - since[tid]
            waits[tid] += 1
        if old == "run" and tid in since and tid in where:
            run_on[tid][where[tid]] += t - since[tid]
        state[tid], since[tid] = new, t

    def account(t):
        """Adds the time since the last event to the pair's placement."""
        if last is None or len(mains) < 2 or t <= last:
            return
        a, b = mains
        active = [x for x in (a, b) if state.get(x, "sleep") != "sleep"]
        if len(active) == 2 and where.get(a) == where.get(b):
            others = [c for c in running if c != where.get(a)]
            busy = [c for c in others if running.get(c, 0) != 0]
            if others and len(busy) == len(others):
                key = "both runnable on one CPU, the other busy"
                for c in busy:
                    o = running[c]
                    other_ran[("pair's " if tgid.get(o) in mains else "") + name.get(o, "?")] += t - last
            else:
                key = "both runnable on one CPU, another idle"
        elif len(active) == 2:
            key = "both runnable, on different CPUs"
        else:
            key = f"{len(active)} runnable"
        pair[key] += t - last

    for comm, pid, tid, cpu, t, ev, f in events:
        tgid[tid] = pid
        name.setdefault(tid, comm)
        account(t)
        last = t
        if ev == "sched:sched_switch":
            prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
            name[prev], name[nxt] = f["prev_comm"], f["next_comm"]
            if prev:
                if f["prev_state"].startswith("R"):
                    preempted[prev] += 1
                    set_state(prev, "wait", t)
                else:
                    sleeps[prev] += 1
                    set_state(prev, "sleep", t)
            where[nxt] = cpu
            if nxt:
                set_state(nxt, "run", t)
            running[cpu] = nxt
        elif ev in ("sched:sched_wakeup", "sched:sched_wakeup_new"):
            wakee, target = int(f["pid"]), int(f["target_cpu"])
            name.setdefault(wakee, f["comm"])
            if ev.endswith("new"):
                tgid.setdefault(wakee, pid)
            wakers[wakee][tid] += 1
            landing[wakee]["on the waker's CPU" if target == cpu else "elsewhere"] += 1
            where[wakee] = target
            if state.get(wakee, "sleep") == "sleep":
                set_state(wakee, "wait", t)
        elif ev == "sched:sched_migrate_task":
            moved, orig, dest = int(f["pid"]), int(f["orig_cpu"]), int(f["dest_cpu"])
            if orig != dest:
                migrations[moved]["while " + state.get(moved, "sleep")] += 1
            if state.get(moved) == "run" and moved in since:
                run_on[moved][orig] += t - since[moved]
                since[moved] = t
            where[moved] = dest

    secs = last - start
    print(f"  trace {secs:.3f} s; the pair's main threads {mains}:")
    for k, v in sorted(pair.items()):
        print(f"    {k:42s} {v * 1e3:8.1f} ms")
    if other_ran:
        print("    the other CPU ran meanwhile: "
              + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in other_ran.most_common(6)))

    def label(tid):
        pid = tgid.get(tid, tid)
        return f"{pid}/{'main' if pid == tid else name.get(tid, '?')}"

    for tid in sorted((x for x in run_on if tgid.get(x) in mains), key=lambda x: (tgid[x], x)):
        cpus = run_on[tid]
        total = sum(cpus.values())
        per_cpu = " ".join(f"cpu{c} {v * 1e3:.1f}" for c, v in sorted(cpus.items()))
        m = migrations[tid]
        print(f"    {label(tid):24s} ran {total * 1e3:7.1f} ms ({per_cpu}), waited for a CPU "
              f"{waited[tid] * 1e3:6.1f} ms ({waits[tid]} times), slept {sleeps[tid]}, preempted "
              f"{preempted[tid]}, migrated {sum(m.values())} ({dict(m)})")
        woke = ", ".join(f"{label(w)} {n}" for w, n in wakers[tid].most_common(3))
        print(f"      woken by {woke}; wake-ups {dict(landing[tid])}")


if __name__ == "__main__":
    main()
