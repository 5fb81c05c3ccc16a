#!/usr/bin/env python3
"""Per-step table of the receive-to-answer path from softverbs trace dumps.

Build with the `trace` feature (`cargo build --release --features softverbs/trace`), run
with SOFTVERBS_TRACE=/tmp/x set (every process dumps /tmp/x.<pid> when its device closes),
then:

    bench/trace-table.py /tmp/x.*

A path is, on one thread: `recvmmsg` returned (received), the engine handled the batch
(handled), the receive's pump and finish done (receive done), the application's poll found
the completion (polled), the engine's post_send entered (post), a batch queued in the
outbox (queued), the batch's send call entered (send). Paths with another receive before
the send, or missing a step, are left out. Prints median and p10 (us) per step, and,
the stamps being on the wall clock, what lay between the peer process's send call and the
path's receive.
"""
import bisect
import sys

NAMES = {1: "received", 2: "handled", 3: "receive done", 4: "polled", 5: "post",
         6: "queued", 7: "send", 8: "send returned", 9: "recvmmsg entered",
         10: "locked", 11: "datagram handled", 12: "pump", 13: "pump transmitted",
         14: "pumped", 15: "unlocked", 16: "post locked", 17: "engine posted",
         18: "batch taken"}
ORDER = [1, 2, 3, 4, 5, 6, 7]


def paths(stamps):
    """stamps: [(step, ns)] of one thread, in order. Returns (times, entered, stamps) per
    path: the times of the ORDER steps, when the `recvmmsg` that returned its datagrams
    was entered (None without that stamp), and every stamp from received to send."""
    out = []
    i = 0
    n = len(stamps)
    while i < n:
        if stamps[i][0] != 1:
            i += 1
            continue
        times = [stamps[i][1]]
        want = 1
        j = i + 1
        while j < n and want < len(ORDER):
            step, t = stamps[j]
            if step == 1:
                break
            if step == ORDER[want]:
                times.append(t)
                want += 1
            j += 1
        if want == len(ORDER):
            entered = stamps[i - 1][1] if i > 0 and stamps[i - 1][0] == 9 else None
            out.append((times, entered, stamps[i:j]))
        i = j
    return out


def split_path(stamps, splits):
    """Adds each pair of consecutive stamps of one path (the n-th time that pair comes
    in the path) to splits: {(from, to, n): ([us], [position])}."""
    seen = {}
    for k in range(1, len(stamps)):
        pair = (stamps[k - 1][0], stamps[k][0])
        seen[pair] = seen.get(pair, 0) + 1
        us, where = splits.setdefault(pair + (seen[pair],), ([], []))
        us.append((stamps[k][1] - stamps[k - 1][1]) / 1000)
        where.append(k)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def row(label, xs):
    print(f"{label:<34} {pct(xs, 0.5):>10.3f} {pct(xs, 0.1):>8.3f} {len(xs):>7}")


def main():
    by_process = {}
    for name in sys.argv[1:]:
        threads = {}
        with open(name) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                th, step, ns = line.split()
                threads.setdefault(th, []).append((int(step), int(ns)))
        by_process[name] = threads
    base = min(t for threads in by_process.values() for st in threads.values() for _, t in st)
    all_paths = []
    splits = {}
    cross_entered, cross_returned, send_call = [], [], []
    to_recv_entered, recv_call = [], []
    for name, threads in by_process.items():
        # The other processes' send calls, in time order: (entered, returned).
        sends = []
        for other, oth in by_process.items():
            if other == name:
                continue
            for st in oth.values():
                entered = None
                for step, t in st:
                    if step == 7:
                        entered = t
                    elif step == 8 and entered is not None:
                        sends.append((entered - base, t - base))
                        entered = None
        sends.sort()
        starts = [e for e, _ in sends]
        for st in threads.values():
            st = [(step, t - base) for step, t in st]
            for p, recv_entered, path_stamps in paths(st):
                all_paths.append(p)
                split_path(path_stamps, splits)
                if recv_entered is not None:
                    recv_call.append((p[0] - recv_entered) / 1000)
                k = bisect.bisect_left(starts, p[0]) - 1
                if k >= 0:
                    entered, returned = sends[k]
                    cross_entered.append((p[0] - entered) / 1000)
                    cross_returned.append((p[0] - returned) / 1000)
                    send_call.append((returned - entered) / 1000)
                    if recv_entered is not None:
                        to_recv_entered.append((recv_entered - returned) / 1000)
    if not all_paths:
        print("no complete path")
        return
    print(f"{'step':<34} {'median us':>10} {'p10 us':>8} {'paths':>7}")
    for k in range(1, len(ORDER)):
        d = [(p[k] - p[k - 1]) / 1000 for p in all_paths]
        row(f"{NAMES[ORDER[k - 1]]} -> {NAMES[ORDER[k]]}", d)
    row("received -> send", [(p[-1] - p[0]) / 1000 for p in all_paths])
    if send_call:
        row("peer's send call", send_call)
        row("peer's send returned -> received", cross_returned)
        row("peer's send entered -> received", cross_entered)
    if to_recv_entered:
        row("peer's send returned -> recvmmsg in", to_recv_entered)
    if recv_call:
        row("recvmmsg in -> received", recv_call)
    # Every pair of consecutive stamps on half the paths or more, in path order (the
    # finer steps; a pair that comes twice in a path, a post_recv's lock and the post's,
    # is numbered).
    print()
    print(f"{'between consecutive stamps':<34} {'median us':>10} {'p10 us':>8} {'paths':>7}")
    common = [(key, v) for key, v in splits.items() if len(v[0]) * 2 >= len(all_paths)]
    common.sort(key=lambda kv: sum(kv[1][1]) / len(kv[1][1]))
    for (a, b, n), (us, _) in common:
        label = f"{NAMES.get(a, a)} -> {NAMES.get(b, b)}" + (f" ({n})" if n > 1 else "")
        row(label, us)


main()
