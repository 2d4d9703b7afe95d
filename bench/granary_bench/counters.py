"""Source traffic, counted outside granary.

The block layer's own counters for the loop device (/sys/block/loopN/stat:
reads completed, sectors read) are sampled every 50 ms during a run. Epoch
boundaries are cut by reading the counters the moment the harness receives the
client's epoch-begin and epoch-end lines (EpochMarks), so each epoch gets the
device reads and bytes that happened during it, including background copying by
granary's agent. Traffic before the first epoch and after the last one (agent
still copying) is kept as separate buckets. The 50 ms samples only draw the
source-rate timeline.

Optionally, strace -f counts file and descriptor syscalls whose path argument
lies under the source (metadata calls such as open/stat/readdir).
"""

import bisect
import os
import collections
import re
import threading
import time


class DeviceSampler:
    def __init__(self, stat_fn, period=0.05):
        self.stat_fn = stat_fn
        self.period = period
        self.samples = []  # (t, reads, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.samples.append((time.time(), *self.stat_fn()))
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), *self.stat_fn()))

    def _run(self):
        while not self._stop.wait(self.period):
            self.samples.append((time.time(), *self.stat_fn()))

    def at(self, t):
        """Counters at time t (the last sample at or before t)."""
        i = bisect.bisect_right([s[0] for s in self.samples], t) - 1
        s = self.samples[max(i, 0)]
        return s[1], s[2]

    def between(self, t0, t1):
        r0, b0 = self.at(t0)
        r1, b1 = self.at(t1)
        return {"reads": r1 - r0, "bytes": b1 - b0}

    def series(self, t_origin):
        """[(t - t_origin, bytes since the start)] for the timeline plot."""
        b0 = self.samples[0][2]
        return [(round(t - t_origin, 3), b - b0) for t, _, b in self.samples]


class EpochMarks:
    """Device counters read when an epoch's first and last lines arrive."""

    def __init__(self, stat_fn):
        self.stat_fn = stat_fn
        self.first = stat_fn()
        self.begin = {}
        self.end = {}

    def on_event(self, ev):
        e = ev.get("epoch")
        if ev.get("ev") == "tick" and e is not None and e not in self.begin:
            self.begin[e] = self.stat_fn()
        elif ev.get("ev") == "epoch":
            self.end[e] = self.stat_fn()

    def per_epoch(self):
        """{bucket: {reads, bytes}} with buckets 'startup', 1..n, 'after'."""
        last = self.stat_fn()
        done = sorted(e for e in self.end if e in self.begin)
        if not done:
            return {"total": _diff(self.first, last)}
        out = {"startup": _diff(self.first, self.begin[done[0]])}
        for e in done:
            out[e] = _diff(self.begin[e], self.end[e])
        out["after"] = _diff(self.end[done[-1]], last)
        return out


def disk_stat_fn(path):
    """A stat function like EmulatedPFS.stat for the block device holding `path` (the local
    disk of the Local copies and granary's tiers), or None where sysfs does not say."""
    st = os.stat(path)
    f = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    if not os.path.exists(f):
        return None

    def stat():
        v = open(f).read().split()
        return (int(v[0]), int(v[2]) * 512)
    return stat


def _diff(a, b):
    return {"reads": b[0] - a[0], "bytes": b[1] - a[1]}


STRACE_LINE = re.compile(r'^(?:\[pid\s+)?(\d+)\]?\s+(\d+\.\d+)\s+(\w+)\((.*)')


def strace_prefix(out_file):
    return ["strace", "-f", "-qq", "-ttt", "-e", "trace=%file,%desc", "-o", out_file]


def strace_counts(out_file, source, epochs):
    """{bucket: {syscall: count}} for syscalls naming a path under source."""
    buckets = collections.defaultdict(collections.Counter)
    bounds = [(e["t0"], e["t1"], e["epoch"]) for e in epochs]
    needle = '"' + source.rstrip("/")
    with open(out_file, errors="replace") as f:
        for line in f:
            if needle not in line:
                continue
            m = STRACE_LINE.match(line)
            if not m:
                continue
            t, name = float(m.group(2)), m.group(3)
            bucket = "startup"
            for t0, t1, e in bounds:
                if t >= t0:
                    bucket = e if t <= t1 else "after"
            buckets[bucket][name] += 1
    return {k: dict(v) for k, v in buckets.items()}
