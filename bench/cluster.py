#!/usr/bin/env python3
"""Cluster mode on one machine: what a program sees reading files another rank holds, against
reading files in its own node's tier — FanStore's file sizes, the same reader, the same run.

Two serving ranks (`mpirun -np 2 granary serve`, shared-memory transport) serve a dataset of
FanStore's sizes. Rank 1 reads everything first, so rank 0's pool places rank 0's share in
rank 0's tier while rank 1's share is placed in rank 1's. Rank 0's files are then told apart by
content (its tier's copies hashed against the dataset), and a reader on rank 0 reads, per size:

  remote  the files rank 1 holds, for the first time (each one comes over MPI into the staging
          tier as the reader opens it), then
  local   the same number of files from rank 0's own tier,

alternating, with a fresh serve for every pair (so "remote" is always a first read), `--pairs`
times; the report gives medians and the ratio remote/local per size and reader. Two readers:
`read` (Python `f.read()`, a new buffer per file, like most loaders) and `readinto` (one buffer
reused per thread: memory-copy speed, the hardest baseline). From the same runs it derives the
per-file overhead and per-byte cost of a remote read, which docs/cluster.md's scaling model uses.

    python3 bench/cluster.py                 # ~3 minutes; results/cluster/report.md
    python3 bench/cluster.py --pairs 7 --tier-root /var/tmp   # tiers on disk instead of RAM
    python3 bench/cluster.py --compare OTHER_BINARY            # both binaries in every pair
    python3 bench/cluster.py --pack                            # a pack of the dataset served
"""
import argparse
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SIZES = {"128K": 128 << 10, "512K": 512 << 10, "2M": 2 << 20, "8M": 8 << 20}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_pml": "ob1"}

READER = r'''
import json, sys, threading, time
files = [l for l in open(sys.argv[1]).read().split("\n") if l]
threads, mode, size = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
it = iter(files); lock = threading.Lock(); total = [0]; lat = []
def work():
    buf = bytearray(size); view = memoryview(buf)
    while True:
        with lock:
            p = next(it, None)
        if p is None:
            return
        t = time.perf_counter()
        with open(p, "rb", buffering=0) as f:
            if mode == "readinto":
                n = 0
                while True:
                    k = f.readinto(view[n:])
                    if not k:
                        break
                    n += k
            else:
                n = len(f.read())
        t = time.perf_counter() - t
        with lock:
            total[0] += n
            lat.append(t)
t0 = time.perf_counter()
ts = [threading.Thread(target=work) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
s = time.perf_counter() - t0
print(json.dumps({"files": len(files), "bytes": total[0], "s": s, "lat": sorted(lat)}))
'''


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Serve:
    def __init__(self, g, source, work, tier_root, pack=None):
        self.g, self.work = g, work
        self.rt = work / "rt"
        self.tiers = tier_root / f"granary-cluster-bench-{os.getpid()}"
        shutil.rmtree(self.tiers, ignore_errors=True)
        shutil.rmtree(self.rt, ignore_errors=True)
        self.rt.mkdir(parents=True)
        env = {**os.environ, **MPI_ENV, "GRANARY_RUNTIME_DIR": f"{self.rt}/{{rank}}"}
        cmd = ["mpirun", "-np", "2", "--oversubscribe", g, "serve", "--source", source,
               "--tier", f"{self.tiers}/t{{rank}}=4G", "--staging", f"{self.tiers}/s{{rank}}=4G"]
        if pack:
            cmd += ["--pack", str(pack)]
        self.log = open(work / "mpirun.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + 120
        while not all((self.status(r).get("cluster") or {}).get("ready") for r in (0, 1)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"granary serve did not start; see {work / 'mpirun.log'}")
            time.sleep(0.2)

    def env(self, r):
        return {**os.environ, "GRANARY_RUNTIME_DIR": f"{self.rt}/{r}"}

    def status(self, r):
        p = subprocess.run([self.g, "status", "--json"], capture_output=True, env=self.env(r))
        return (json.loads(p.stdout or b"null") or {}) if p.returncode == 0 else {}

    def read(self, r, listing, threads, mode, size):
        p = subprocess.run([self.g, "run", "--attach", "-q", "--", sys.executable, "-c", READER,
                            listing, str(threads), mode, str(size)],
                           capture_output=True, text=True, env=self.env(r), timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"reader failed: {p.stderr[-2000:]}")
        return json.loads(p.stdout.splitlines()[-1])

    def settle(self):
        deadline = time.monotonic() + 120
        while any(s.get("pending") for r in (0, 1) for s in self.status(r).get("sources", [])):
            if time.monotonic() > deadline:
                raise SystemExit("placement did not settle")
            time.sleep(0.1)

    def stop(self):
        subprocess.run([self.g, "stop"], capture_output=True, env=self.env(0), timeout=120)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        shutil.rmtree(self.tiers, ignore_errors=True)


def uncache(root):
    """Drops the pages of every file under `root` from the page cache (written back first):
    only ours, so other jobs on the machine keep theirs."""
    for p in root.rglob("*"):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if os.path.isfile(p):
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_dataset(root, counts):
    sums = {}
    for d, size in SIZES.items():
        for i in range(counts.get(d, 0)):
            p = root / d / f"f{i:05d}"
            p.parent.mkdir(parents=True, exist_ok=True)
            data = os.urandom(size)
            p.write_bytes(data)
            sums[hashlib.sha256(data).hexdigest()] = str(p)
    return sums


def split(serve, sums):
    """Rank 0's share (copies in its own tier, matched by content) and the rest."""
    mine = set()
    for p in serve.tiers.glob("t0/*/objects/*"):
        if "." not in p.name and p.is_file():
            h = hashlib.sha256(p.read_bytes()).hexdigest()
            if h in sums:
                mine.add(sums[h])
    everything = set(sums.values())
    return mine, everything - mine


# FanStore's published scaling (Zhang et al., §6.5.1): aggregate bandwidth relative to a baseline.
FANSTORE = {(1, 4): "1.0–1.5× (25–38 %)", (4, 16): "76.3–83.1 %", (1, 64): "5.8–45.4× (9–71 %)",
            (64, 512): "81.4–88.2 %"}
NET_LATENCY = 2e-6        # s per message (stated network: 100 Gb/s, 2 µs)
NET_BANDWIDTH = 12.5e9    # bytes/s per node and direction
THREADS = 8               # reader threads per node (e.g. 4 GPUs × 2 loader processes)


def scaling(model, o, c):
    """The scaling model of docs/cluster.md: every node reads every file of one size (FanStore's
    benchmark), a file is local with probability 1/N, else it costs the measured remote overhead
    `o` (plus 3 network latencies: request, reply, data) and `c` s/byte more; a node reads with
    THREADS threads, and its link carries at most NET_BANDWIDTH each way."""
    out = ["Predicted on a 100 Gb/s, 2 µs network (docs/cluster.md), from the fit above and this "
           f"machine's local read times, {THREADS} reader threads per node:", "",
           "| size | nodes | files/s (all nodes) | efficiency vs 1 node | vs 4 | vs 64 | FanStore |",
           "|---|---|---|---|---|---|---|"]
    for d, m in model.items():
        if d == "fit":
            continue
        size, t_local = m["size"], m["local_s_per_file"]

        def per_node(n):
            f = (n - 1) / n
            t = t_local + f * (o + 3 * NET_LATENCY + size * c)
            cap = NET_BANDWIDTH / (f * size) if f > 0 else float("inf")
            return min(THREADS / t, cap)
        x1, x4, x64 = per_node(1), per_node(4), per_node(64)
        for n in (1, 2, 4, 16, 64, 128, 256, 512):
            x = per_node(n)
            fan = FANSTORE.get((4, n)) if n == 16 else FANSTORE.get((64, n)) if n == 512 else \
                FANSTORE.get((1, n))
            out.append(f"| {d} | {n} | {n * x:,.0f} | {x / x1:.0%} | "
                       f"{'' if n < 4 else f'{x / x4:.0%}'} | {'' if n < 64 else f'{x / x64:.0%}'} "
                       f"| {fan or ''} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--granary", default=os.environ.get("GRANARY_BIN") or str(REPO / "target" / "release" / "granary"))
    ap.add_argument("--work", default="/var/tmp/granary-cluster-bench")
    ap.add_argument("--tier-root", default="/dev/shm", help="where the ranks' tiers and staging go")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--cold", action="store_true",
                    help="drop the tiers' pages from the page cache before every read (fadvise, only "
                         "our files): tiers on a disk are then read from the device, a remote copy "
                         "from the owner's tier too")
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--modes", default="read,readinto")
    ap.add_argument("--counts", default="128K=512,512K=192,2M=96,8M=48",
                    help="files per size (each rank holds about half)")
    ap.add_argument("--compare", metavar="BIN",
                    help="a second granary binary, run in every pair too (alternating which goes "
                         "first): setups compared in the same run, under the same load")
    ap.add_argument("--pack", action="store_true",
                    help="serve a pack of the dataset (`granary pack`, made once) instead of the tree: "
                         "each rank streams its units of the pack, remote reads as for a tree")
    ap.add_argument("--out", default=str(REPO / "results" / "cluster"))
    args = ap.parse_args()
    bins = [args.granary] + ([args.compare] if args.compare else [])
    for g in bins:
        probe = subprocess.run([g, "serve", "--source", "/", "--peer-timeout", "x"], capture_output=True, text=True)
        if "built without MPI" in probe.stderr:
            raise SystemExit(f"{g} was built without the mpi feature: cargo build --release --workspace --features granary/mpi")
    work = pathlib.Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    counts = {k: int(v) for k, v in (c.split("=") for c in args.counts.split(","))}
    source = work / "source"
    log(f"dataset: {counts} in {source}")
    sums = make_dataset(source, counts)
    pack = None
    if args.pack:
        pack = work / "source.granary"
        p = subprocess.run([bins[0], "pack", str(source), str(pack)], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"granary pack failed: {p.stderr[-2000:]}")
        log(f"pack: {pack}")
    everything = work / "all.txt"
    everything.write_text("\n".join(sorted(sums.values())))
    threads = [int(t) for t in args.threads.split(",")]
    modes = args.modes.split(",")
    rows = {}
    for k in range(args.pairs):
        # With --compare, both binaries in every pair, alternating which goes first.
        for b in (range(len(bins)) if k % 2 == 0 else reversed(range(len(bins)))):
            one_pair(bins[b], b, k, args, source, pack, work, sums, everything, threads, modes, rows)
        log(f"pair {k + 1}/{args.pairs} done")
    report(rows, args, counts, bins)


def one_pair(g, b, k, args, source, pack, work, sums, everything, threads, modes, rows):
    """One fresh serve of binary `g` (number `b`): rank 1 reads everything, then rank 0 reads
    remote and local files of every size, alternating which goes first."""
    serve = Serve(g, source, work, pathlib.Path(args.tier_root), pack)
    try:
        serve.read(1, str(everything), 4, "read", 8 << 20)
        serve.settle()
        mine, theirs = split(serve, sums)
        for d, size in SIZES.items():
            rem = sorted(p for p in theirs if f"/{d}/" in p)
            loc = sorted(p for p in mine if f"/{d}/" in p)
            n = min(len(rem), len(loc))
            # Each (threads, mode) reads its own slice of the remote files: every remote
            # read is a first read.
            combos = [(t, m) for t in threads for m in modes]
            per = n // len(combos)
            for j, (t, m) in enumerate(combos):
                r_list, l_list = rem[j * per:(j + 1) * per], loc[j * per:(j + 1) * per]
                if not r_list:
                    continue
                (work / "r.txt").write_text("\n".join(r_list))
                (work / "l.txt").write_text("\n".join(l_list))
                # Alternate which goes first.
                order = [("remote", "r.txt"), ("local", "l.txt")]
                if k % 2:
                    order.reverse()
                for what, f in order:
                    if args.cold:
                        uncache(serve.tiers)
                    res = serve.read(0, str(work / f), t, m, size)
                    rows.setdefault((b, d, t, m, what), []).append(res)
    finally:
        serve.stop()


def lat_summary(lat):
    return {"lat_median": lat[len(lat) // 2], "lat_p90": lat[int(len(lat) * 0.9)]} if lat else {}


def report(rows, args, counts, bins):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = {}
    for (b, d, t, m, what), rs in sorted(rows.items()):
        # Each file's time is summed up per run (median, 90th percentile), not kept.
        raw[f"{b}/{d}/{t}/{m}/{what}" if len(bins) > 1 else f"{d}/{t}/{m}/{what}"] = [
            {**{k: v for k, v in x.items() if k != "lat"}, **lat_summary(x.get("lat", []))}
            for x in rs]
    lines = ["# Cluster mode: remote reads against local tier reads (this machine)", "",
             f"`python3 bench/cluster.py {' '.join(sys.argv[1:])}`: 2 ranks, shared-memory "
             f"transport, {'a pack of the dataset (`--pack`), ' if args.pack else ''}tiers under {args.tier_root}"
             f"{' (their pages dropped before every read)' if args.cold else ''}, {args.pairs} pairs, medians; "
             f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."]
    combos = sorted({k[1:4] for k in rows}, key=lambda c: (list(SIZES).index(c[0]), c[1], c[2]))
    mb = lambda rs: statistics.median(x["bytes"] / x["s"] / 1e6 for x in rs)
    fs = lambda rs: statistics.median(x["files"] / x["s"] for x in rs)

    def lat(rs):
        """Open-to-close time of each file, over every run: the median and 90th percentile."""
        xs = sorted(v for x in rs for v in x.get("lat", []))
        if not xs:
            return "–"
        return f"{xs[len(xs) // 2] * 1e3:.2f}, {xs[int(len(xs) * 0.9)] * 1e3:.2f}"
    models = []
    for b, g in enumerate(bins):
        if len(bins) > 1:
            lines += ["", f"## {'A' if b == 0 else 'B'}: `{g}`"]
        lines += ["", "| size | reader | threads | remote MB/s | local MB/s | remote / local | remote files/s | local files/s | ms per file remote / local (median, p90) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        model = {}
        for d, t, m in combos:
            r, l = rows.get((b, d, t, m, "remote")), rows.get((b, d, t, m, "local"))
            if not r or not l:
                continue
            # Per pair: remote throughput over local (the same files per run).
            ratio = statistics.median((y["s"] / y["files"]) / (x["s"] / x["files"]) for x, y in zip(r, l))
            lines.append(f"| {d} | {m} | {t} | {mb(r):.0f} | {mb(l):.0f} | {ratio:.2f} | {fs(r):.0f} | {fs(l):.0f} | "
                         f"{lat(r)} / {lat(l)} |")
            if t == 1 and m == "read":
                model[d] = {"remote_s_per_file": statistics.median(x["s"] / x["files"] for x in r),
                            "local_s_per_file": statistics.median(x["s"] / x["files"] for x in l),
                            "size": SIZES[d]}
        # Remote read = local read + o + size / B: fitted on the single-thread `read` medians.
        if len(model) >= 2:
            xs = [v["size"] for v in model.values()]
            ys = [v["remote_s_per_file"] - v["local_s_per_file"] for v in model.values()]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            o = my - slope * mx
            lines += ["", f"Remote read = local read + {o * 1e6:.0f} µs + size / {1 / slope / 1e9:.2f} GB/s "
                      "(least squares over the single-thread `read` medians: the per-file overhead and "
                      "the per-byte cost of the remote path on this machine)."]
            model["fit"] = {"overhead_s": o, "bytes_per_s": 1 / slope}
            if b == 0:
                lines += ["", *scaling(model, o, slope)]
        models.append(model)
    if len(bins) > 1:
        lines += ["", "## B against A, pair by pair (the same pair's serves ran back to back)", "",
                  "| size | reader | threads | remote / local A | remote / local B | remote s per file B / A | local s per file B / A | median remote ms per file A / B |",
                  "|---|---|---|---|---|---|---|---|"]
        per_file = lambda x: x["s"] / x["files"]
        for d, t, m in combos:
            ra, la = rows.get((0, d, t, m, "remote")), rows.get((0, d, t, m, "local"))
            rb, lb = rows.get((1, d, t, m, "remote")), rows.get((1, d, t, m, "local"))
            if not (ra and la and rb and lb):
                continue
            q = lambda r, l: statistics.median(per_file(y) / per_file(x) for x, y in zip(r, l))
            lines.append(f"| {d} | {m} | {t} | {q(ra, la):.2f} | {q(rb, lb):.2f} | "
                         f"{statistics.median(per_file(y) / per_file(x) for x, y in zip(ra, rb)):.2f} | "
                         f"{statistics.median(per_file(y) / per_file(x) for x, y in zip(la, lb)):.2f} | "
                         f"{lat(ra).split(',')[0]} / {lat(rb).split(',')[0]} |")
    name = "report" + ("-pack" if args.pack else "") + ("-cold" if args.cold else "")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    model = models[0] if len(bins) == 1 else {"A": models[0], "B": models[1], "bins": bins}
    (out / f"{name}.json").write_text(json.dumps({"raw": raw, "model": model, "counts": counts}, indent=1))
    print("\n".join(lines))

if __name__ == "__main__":
    main()
