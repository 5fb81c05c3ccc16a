"""The events of a `perf stat -x, -o FILE` file, for the bench scripts."""


def stat(path, strip=""):
    """{event: count} of a `perf stat -x,` file; `strip` is removed from event names
    (e.g. "syscalls:sys_enter_")."""
    r = {}
    for line in open(path):
        p = line.strip().split(",")
        if line.startswith("#") or len(p) < 3 or not p[0]:
            continue
        try:
            r[p[2].replace(strip, "") if strip else p[2]] = float(p[0])
        except ValueError:
            pass
    return r
