#!/usr/bin/env python3
"""mmap readers at source speed (issue 11): the measured bar, on the emulated PFS of the harness
(a throttled loop device, a memory cgroup smaller than the datasets; see bench/README.md).

    sudo python3 bench/mmap.py --size quick      # ~4 minutes  -> results/mmap-quick/report.md
    sudo python3 bench/mmap.py --size full       # ~15 minutes -> results/mmap/report.md

Workloads (every value and record checked against a manifest):
  records   the record shards walked through mmap (bench/clients/records.py --io mmap), 3 epochs
  lmdb-seq  an LMDB of 192 KiB values (python `lmdb`), cursor scans; 1 and 3 processes
  lmdb-rand the same LMDB, `get`s in a shuffled order
  lmdb-keyorder an LMDB of the same values written in random key order (its values' pages
            scattered over the file), cursor scans: granary with and without the record index
            (`[mmap] lmdb_index`), no tier room (every page from the source)
Setups: PFS-direct, Local (copied first), granary with prefetch off (`[mmap] mode = "watch"`:
mappings followed, nothing read ahead), granary, granary-noindex (`lmdb_index = false`). "half": a tier holding half the LMDB (a first,
unmeasured job fills it); "fits": a tier holding everything. Ratios are medians of paired runs
(alternating, caches dropped before each). A benchmark, not a test: it asserts nothing about
time; it exits 1 only when a job fails or a byte is wrong.
"""
import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from granary_bench import compact, dataset, granary, pfs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENTS = os.path.join(REPO, "bench", "clients")
MIB = 1 << 20

PRESETS = {
    # quick: 96 MiB, not the harness's 64: three Python readers (~30 MB each) would leave the
    # page cache next to nothing; the LMDB (~77 MiB) still does not fit beside them.
    "quick": dict(out="results/mmap-quick", shards=3, shard_min=32, shard_max=40, values=400,
                  mem_cap=96 * MIB, pairs=2),
    "full": dict(out="results/mmap", shards=8, shard_min=32, shard_max=96, values=2000,
                 mem_cap=256 * MIB, pairs=3),
}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Bench:
    def __init__(self, k, emu, g):
        self.k, self.emu, self.g = k, emu, g
        self.runs = []
        self.failed = False
        self.cfgdir = os.path.join(k.workdir, "configs")
        os.makedirs(self.cfgdir, exist_ok=True)
        self.configs = {}
        for name, mode, index in (("granary-off", "watch", True), ("granary", "prefetch", True),
                                  ("unwatched", "off", True),
                                  ("granary-noindex", "prefetch", False)):
            p = os.path.join(self.cfgdir, f"{name}.toml")
            with open(p, "w") as f:
                f.write(f'[mmap]\nmode = "{mode}"\nlmdb_index = {str(index).lower()}\n')
            self.configs[name] = p

    # ---- running one job ---------------------------------------------------

    def run(self, label, setup, root, cmd, tier=None, tier_size=None, drop=True, trace=None,
            quiet=False):
        """One job: the client `cmd` (its root already in it) under `setup`, inside the
        cgroups. Returns a dict with the client's events, device traffic and granary stats."""
        if setup.startswith("granary") or setup == "unwatched":
            left = self.g.stop(self.emu.groups())
            if left:
                raise RuntimeError(f"processes {left} left in the bench cgroups")
        if drop:
            self.emu.drop_caches()
        argv = list(cmd)
        if trace:
            argv = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace, *argv]
        stats_json = None
        if setup.startswith("granary") or setup == "unwatched":
            stats_json = os.path.join(self.k.workdir, "stats.json")
            if os.path.exists(stats_json):
                os.unlink(stats_json)
            argv = self.g.run_argv(self.emu.mount, [(tier, tier_size)], stats_json,
                                   ["--config", self.configs[setup], "-q"], argv)
        s0 = self.emu.stat()
        t0 = time.time()
        p = subprocess.run(self.emu.wrap(argv), capture_output=True, text=True, timeout=3600)
        secs = time.time() - t0
        if stats_json:
            self.g.stop(self.emu.groups())  # the agent's copies until it stops count too
        s1 = self.emu.stat()
        events = []
        for line in p.stdout.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        r = {"label": label, "setup": setup, "seconds": secs, "rc": p.returncode,
             "device_bytes": s1[1] - s0[1], "device_reads": s1[0] - s0[0],
             "epochs": [e for e in events if e.get("ev") == "epoch"],
             "ticks": [e for e in events if e.get("ev") == "tick"],
             "first_record": [e for e in events if e.get("ev") == "first_record"]}
        if stats_json and os.path.exists(stats_json):
            with open(stats_json) as f:
                r["stats"] = json.load(f)
        if p.returncode != 0:
            self.failed = True
            r["stderr"] = p.stderr[-3000:]
            log(f"  FAILED {label} / {setup}: rc {p.returncode}: {p.stderr[-500:]}")
        if not quiet:
            e1 = r["epochs"][0]["seconds"] if r["epochs"] else float("nan")
            log(f"  {label} / {setup}: epoch 1 {e1:.2f} s, job {secs:.1f} s, "
                f"source {r['device_bytes'] / 1e6:.1f} MB")
            self.runs.append(r)
        return r

    # ---- datasets ----------------------------------------------------------

    def local_copy(self, src):
        dst = os.path.join(self.k.workdir, "local", os.path.basename(src))
        if not os.path.exists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            subprocess.run(self.emu.wrap(["cp", "-a", src, dst]), check=True)
        return dst


def paired(pairs, setups, run):
    """`pairs` runs of each of `setups` (two), alternating which goes first; `run(setup)` makes
    one. Returns [{setup: result}]."""
    out = []
    for i in range(pairs):
        order = setups if i % 2 == 0 else setups[::-1]
        out.append({s: run(s) for s in order})
    return out


def median_ratio(pairs):
    vals = [a / b for a, b in pairs if b]
    return statistics.median(vals) if vals else float("nan")


def epoch1(r):
    return r["epochs"][0]["seconds"] if r.get("epochs") else float("nan")


def time_past(r, frac):
    """Seconds from the moment epoch 1 had delivered `frac` of its bytes to its end (the client's
    0.1 s timeline, interpolated)."""
    if not r.get("epochs"):
        return float("nan")
    e = r["epochs"][0]
    total = e["bytes"]
    pts = [(t["t"], t["bytes"]) for t in r["ticks"] if t.get("epoch") == 1]
    want = frac * total
    prev = (e["t0"], 0)
    for t, b in pts:
        if b >= want:
            (t0, b0) = prev
            at = t0 + (t - t0) * ((want - b0) / (b - b0) if b > b0 else 0)
            return e["t1"] - at
        prev = (t, b)
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(PRESETS), default="quick")
    ap.add_argument("--out")
    ap.add_argument("--workdir", default="/var/tmp/granary-bench-mmap")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--read-bps", type=int, default=64 * MIB)
    ap.add_argument("--read-iops", type=int, default=150)
    ap.add_argument("--granary", default=None, help="granary binary (default target/release)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--only", default=None,
                    help="comma-separated groups to run (default all): records (with PFS-direct "
                    "and Local), first (granary's records runs only: first record, source "
                    "bytes), half, rand, three (3 processes), three1 (its two one-pass granary runs only), "
                    "cached, keyorder (an LMDB in random key order, with and without the record "
                    "index); a subset's report goes "
                    "to <out>-only-<groups> unless --out is given")
    a = ap.parse_args()
    p = PRESETS[a.size]
    k = SimpleNamespace(**p)
    groups = ["records", "half", "rand", "three", "cached", "keyorder"]
    k.only = groups if a.only is None else a.only.split(",")
    bad = set(k.only) - set(groups) - {"first", "three1"}
    if bad:
        sys.exit(f"--only: unknown groups {sorted(bad)} (known: {groups + ['first']})")
    k.out = a.out or (p["out"] if a.only is None else f"{p['out']}-only-{'-'.join(k.only)}")
    k.pairs = a.pairs or p["pairs"]
    k.workdir, k.read_bps, k.read_iops, k.readahead_kb = a.workdir, a.read_bps, a.read_iops, 128
    if os.geteuid() != 0:
        sys.exit("needs root: the emulated PFS is a throttled loop device (see bench/README.md)")
    os.makedirs(k.out, exist_ok=True)
    t_start = time.time()
    with contextlib.ExitStack() as stack:
        os.makedirs(k.workdir, exist_ok=True)
        if not a.keep:
            stack.callback(shutil.rmtree, k.workdir, True)
        emu = pfs.EmulatedPFS(k, log)
        lmdb_bytes = k.values * (192 << 10) * 1.1
        emu.setup(stack, int(k.shards * k.shard_max * MIB * 1.1 + lmdb_bytes * 3) + (256 << 20))
        log(f"generating datasets on {emu.mount}")
        rng = random.Random(1)
        manifests = os.path.join(k.workdir, "manifests")
        os.makedirs(manifests)
        rec = dataset.gen_records(rng, os.path.join(emu.mount, "records"), k.shards,
                                  k.shard_min, k.shard_max, 110)
        with open(os.path.join(manifests, "records.json"), "w") as f:
            json.dump({"name": "records", "files": rec}, f)
        files, values = dataset.gen_lmdb(rng, os.path.join(emu.mount, "lmdb"), k.values, 192)
        with open(os.path.join(manifests, "lmdb.json"), "w") as f:
            json.dump({"name": "lmdb", "files": files, "values": values}, f)
        if "keyorder" in k.only:
            kfiles, kvalues = dataset.gen_lmdb(rng, os.path.join(emu.mount, "lmdb-keyorder"),
                                               k.values, 192, shuffled=True)
            with open(os.path.join(manifests, "lmdb-keyorder.json"), "w") as f:
                json.dump({"name": "lmdb-keyorder", "files": kfiles, "values": kvalues}, f)
        probe = os.path.join(emu.mount, ".probe")
        with open(probe, "wb") as f:
            f.write(os.urandom(64 << 20))
        # Not sealed read-only: a read-only LMDB environment opens its lock file for writing,
        # and on a real PFS it can.
        emu.probe(probe, sys.executable)
        os.unlink(probe)
        g, reason = granary.Granary.locate(a.granary, log)
        if g is None:
            sys.exit(f"granary not available: {reason}")
        stack.callback(g.cleanup, emu.groups())
        b = Bench(k, emu, g)
        data = measure(b, k, emu, manifests, rec, files)
        data.update(knobs=vars(k), probe=emu.measured, probe_numbers=emu.numbers,
                    emulation=emu.params, granary=g.version, wall_seconds=time.time() - t_start,
                    command=" ".join(["python3", "bench/mmap.py", *sys.argv[1:]]),
                    git=subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                       capture_output=True, text=True).stdout.strip(),
                    runs=b.runs)
        compact.write(data, k.out)
        write_report(data, k.out)
        failed = b.failed
    log(f"done in {time.time() - t_start:.0f} s: {k.out}/report.md")
    return 1 if failed else 0


def measure(b, k, emu, manifests, rec, lmdb_files):
    """Every row of the bar; returns {"rows": [...], ...}."""
    mount = emu.mount
    rows = []
    bw = emu.numbers.get("source_bandwidth_Bps") or k.read_bps
    data_mdb = next(s for n, s, _ in lmdb_files if n == "data.mdb")
    rec_bytes = sum(s for _, s, _ in rec)
    rec_stored = dataset._allocated(os.path.join(mount, "records"))
    lmdb_dir = os.path.join(mount, "lmdb")
    tiers = os.path.join(k.workdir, "tiers")
    man_rec = os.path.join(manifests, "records.json")
    man_lmdb = os.path.join(manifests, "lmdb.json")

    def records(root, epochs):
        return [sys.executable, os.path.join(CLIENTS, "records.py"), "--root", root,
                "--manifest", man_rec, "--epochs", str(epochs), "--io", "mmap", "--workers", "2"]

    def lmdb(root, epochs, *extra, manifest=man_lmdb):
        return [sys.executable, os.path.join(CLIENTS, "lmdbread.py"), "--root", root,
                "--manifest", manifest, "--epochs", str(epochs), *extra]

    def fresh(name):
        d = os.path.join(tiers, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    fits_rec = f"{(rec_bytes + 16 * MIB) // MIB}M"
    fits_lmdb = f"{(data_mdb + 16 * MIB) // MIB}M"
    half_lmdb = f"{data_mdb // 2 // MIB}M"

    # -- records through mmap: the file is being fetched when it is mapped ---------------------
    if "records" in k.only or "first" in k.only:
        measure_records(b, k, rows, mount, records, fresh, fits_rec, rec_stored)
    if "half" in k.only or "rand" in k.only:
        measure_half(b, k, rows, mount, lmdb, lmdb_dir, fresh, half_lmdb, data_mdb, bw)
    if "three" in k.only or "three1" in k.only:
        measure_three(b, k, rows, mount, lmdb, lmdb_dir, fresh, fits_lmdb, data_mdb)
    if "cached" in k.only:
        measure_cached(b, k, rows, emu, lmdb, lmdb_dir, fresh, data_mdb)
    if "keyorder" in k.only:
        measure_keyorder(b, k, rows, emu, lmdb, manifests, fresh, bw)
    return {"rows": [dict(zip(("criterion", "workload", "measured", "bar", "numbers"), r[:5]),
                          passed=bool(r[5](r[2]))) for r in rows]}


def measure_records(b, k, rows, mount, records, fresh, fits_rec, rec_stored):
    log("records through mmap (epoch 1: every shard mapped while the agent fetches it)")
    pairs, firsts, src_ratios = [], [], []
    only_first = "records" not in k.only

    def rec_run(s):
        root = os.path.join(mount, "records")
        if s == "pfs":
            return b.run("records", "pfs", mount, records(root, 1))
        return b.run("records", "granary", mount, records(root, 3), fresh("rec"), fits_rec)
    for got in paired(k.pairs, ["granary"] if only_first else ["pfs", "granary"], rec_run):
        if not only_first:
            pairs.append((epoch1(got["granary"]), epoch1(got["pfs"])))
        firsts += [f["after_mmap_s"] for f in got["granary"]["first_record"] if f["epoch"] == 1]
        src_ratios.append(got["granary"]["device_bytes"] / rec_stored)
    rows.append(("first record of a mapping of a file being fetched, after the mmap (s)",
                 "records", max(firsts) if firsts else float("nan"), "≤ 0.15",
                 f"max over {len(firsts)} epoch-1 mappings, median {statistics.median(firsts):.3f} s"
                 if firsts else "no data", lambda v: v <= 0.15))
    if not only_first:
        local = b.run("records", "local", mount,
                      records(b.local_copy(os.path.join(mount, "records")), 3))
        rows.append(("epoch 1 / PFS-direct epoch 1", "records", median_ratio(pairs), "≤ 0.20",
                 "median of paired runs: " + ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in pairs)
                 + f"; Local epoch 1 {epoch1(local):.2f} s", lambda v: v <= 0.20))
    rows.append(("source bytes over 3 epochs / dataset as stored", "records",
                 statistics.median(src_ratios), "≤ 1.01",
                 f"{rec_stored / 1e6:.1f} MB stored; each run: "
                 + ", ".join(f"{x:.3f}" for x in src_ratios), lambda v: v <= 1.01))


def measure_half(b, k, rows, mount, lmdb, lmdb_dir, fresh, half_lmdb, data_mdb, bw):
    # -- LMDB larger than the page cache, tier holding half: sequential epoch 1 -----------------
    def half(label, *args):
        def one(s):
            t = fresh("half")
            b.run("fill", "granary", mount, lmdb(lmdb_dir, 1), t, half_lmdb, quiet=True)
            return b.run(label, s, mount, lmdb(lmdb_dir, 1, *args), t, half_lmdb)
        return one
    if "half" in k.only:
        measure_seq_half(b, k, rows, mount, lmdb, lmdb_dir, half, data_mdb, bw)
    if "rand" in k.only:
        # -- random gets: never slower than prefetch off --------------------------------------
        log("LMDB, random gets, tier holding half")
        pairs = [(epoch1(got["granary"]), epoch1(got["granary-off"]))
                 for got in paired(k.pairs, ["granary-off", "granary"],
                                   half("lmdb-rand half", "--access", "random"))]
        rows.append(("random gets, prefetch / prefetch off", "lmdb-rand half",
                     median_ratio(pairs), "≤ 1.02", "median of paired runs: "
                     + ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in pairs), lambda v: v <= 1.02))


def measure_seq_half(b, k, rows, mount, lmdb, lmdb_dir, half, data_mdb, bw):
    log("LMDB, sequential, tier holding half (a first job fills it), prefetch off vs on")
    pairs, streamed, faulted = [], [], []
    for got in paired(k.pairs, ["granary-off", "granary"], half("lmdb-seq half", "--lock")):
        pairs.append((epoch1(got["granary"]), epoch1(got["granary-off"])))
        r = got["granary"]
        st = r.get("stats", {})
        cached = sum(t.get("used", 0) for t in st.get("tiers", []))
        uncached = max(data_mdb - cached, 1)
        streamed.append((time_past(r, cached / data_mdb), uncached / bw))
        agent = st.get("placement", {}).get("agent_source_bytes", 0)
        faulted.append(max(r["device_bytes"] - agent, 0))
    pfs_seq = b.run("lmdb-seq", "pfs", mount, lmdb(lmdb_dir, 1, "--lock"))
    loc_seq = b.run("lmdb-seq", "local", mount, lmdb(b.local_copy(lmdb_dir), 1, "--lock"))
    rows.append(("sequential epoch 1, prefetch / prefetch off", "lmdb-seq half",
                 median_ratio(pairs), "≤ 0.68",
                 "median of paired runs: " + ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in pairs)
                 + f"; PFS-direct {epoch1(pfs_seq):.2f} s, Local {epoch1(loc_seq):.2f} s",
                 lambda v: v <= 0.68))
    rows.append(("uncached half: time / (its size / source bandwidth)", "lmdb-seq half",
                 median_ratio(streamed), "≤ 1.10",
                 ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in streamed)
                 + f" (bandwidth {bw / 1e6:.1f} MB/s)", lambda v: v <= 1.10))
    distance = 8 * MIB
    rows.append(("source bytes faulted by the program itself per pass (MiB)", "lmdb-seq half",
                 statistics.median(faulted) / MIB, "≤ 8.125 (distance + 128 KiB)",
                 "device bytes of the job minus the agent's source bytes: "
                 + ", ".join(f"{x / MIB:.2f}" for x in faulted),
                 lambda v: v <= (distance + 128 * 1024) / MIB))


def measure_three(b, k, rows, mount, lmdb, lmdb_dir, fresh, fits_lmdb, data_mdb):
    # -- 3 processes mapping one LMDB, tier fits it: source bytes and the lock file -------------
    log("LMDB, 3 processes (contiguous shares), tier holds it, lock=True and lock=False")
    trace = os.path.join(k.workdir, "trace")
    for lock in (["--lock"], []):
        name = "lock=True" if lock else "lock=False"
        r = b.run(f"lmdb-seq 3 procs {name}", "granary", mount,
                  lmdb(lmdb_dir, 1, "--procs", "3", *lock), fresh("fits"), fits_lmdb, trace=trace)
        opens = count_lock_opens(trace, lmdb_dir)
        rows.append((f"3 processes, {name}: source bytes / file", "lmdb-seq 3 procs",
                     r["device_bytes"] / data_mdb, "≤ 1.01",
                     f"one pass, the first job (the file fetched while mapped); epoch 1 "
                     f"{epoch1(r):.2f} s", lambda v: v <= 1.01))
        if lock:
            rows.append(("3 processes, lock=True: write-opens of the source's lock.mdb",
                         "lmdb-seq 3 procs", opens, "0",
                         "strace of the job (PFS-direct: {pfs_opens})", lambda v: v == 0))
    if "three" not in k.only:
        return
    pfs3 = b.run("lmdb-seq 3 procs lock=True", "pfs", mount,
                 lmdb(lmdb_dir, 1, "--procs", "3", "--lock"), trace=trace)
    pfs_opens = count_lock_opens(trace, lmdb_dir)
    rows[:] = [(c, w, m, bar, n.replace("{pfs_opens}", str(pfs_opens)), f)
               for c, w, m, bar, n, f in rows]
    # Two passes in one environment: the mapping made while the file was fetched keeps the
    # source behind what was not local yet (docs/placement.md, "Mappings": not done).
    two = b.run("lmdb-seq 3 procs lock=True, 2 passes", "granary", mount,
                lmdb(lmdb_dir, 2, "--procs", "3", "--lock"), fresh("fits"), fits_lmdb)
    rows.append(("3 processes, 2 passes in one environment: source bytes / file (limit, no bar)",
                 "lmdb-seq 3 procs", two["device_bytes"] / data_mdb, "–",
                 f"PFS-direct one pass: {epoch1(pfs3):.2f} s, "
                 f"{pfs3['device_bytes'] / data_mdb:.3f} × the file", lambda v: True))


def measure_keyorder(b, k, rows, emu, lmdb, manifests, fresh, bw):
    # -- an LMDB written in random key order: the record index ------------------------------
    log("LMDB in random key order, sequential, no tier room: record index on vs off")
    mount = emu.mount
    root = os.path.join(mount, "lmdb-keyorder")
    # The values lie scattered over the file: at best one request each, at the source's
    # request rate, or its bandwidth if that is the slower.
    iops = emu.numbers.get("random_4k_iops") or k.read_iops
    size = os.path.getsize(os.path.join(root, "data.mdb"))
    floor = max(size / bw, k.values / iops)
    man = os.path.join(manifests, "lmdb-keyorder.json")
    pairs, faulted, streamed = [], [], []

    def one(s):
        if s == "pfs":
            return b.run("lmdb-keyorder", "pfs", mount, lmdb(root, 1, "--lock", manifest=man))
        return b.run("lmdb-keyorder", s, mount, lmdb(root, 1, "--lock", manifest=man),
                     fresh("none"), "4K")
    for got in paired(k.pairs, ["granary-noindex", "granary"], one):
        pairs.append((epoch1(got["granary"]), epoch1(got["granary-noindex"])))
        r = got["granary"]
        agent = r.get("stats", {}).get("placement", {}).get("agent_source_bytes", 0)
        faulted.append(max(r["device_bytes"] - agent, 0))
        streamed.append((epoch1(r), floor))
    pfs_run = one("pfs")
    rows.append(("random key order, sequential epoch 1, record index / no index (no bar)",
                 "lmdb-keyorder", median_ratio(pairs), "–",
                 "median of paired runs: " + ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in pairs)
                 + f"; PFS-direct {epoch1(pfs_run):.2f} s", lambda v: True))
    rows.append(("random key order, with the index: epoch 1 / the source's floor (one request "
                 "per value, or the bandwidth) (no bar)",
                 "lmdb-keyorder", median_ratio(streamed), "–",
                 ", ".join(f"{a:.2f}/{c:.2f} s" for a, c in streamed)
                 + f" ({k.values} values at {iops:.0f} requests/s; {size / 1e6:.0f} MB at "
                 f"{bw / 1e6:.1f} MB/s)", lambda v: True))
    rows.append(("random key order, with the index: source bytes faulted by the program per "
                 "pass (MiB; no bar)", "lmdb-keyorder", statistics.median(faulted) / MIB, "–",
                 "device bytes of the job minus the agent's source bytes: "
                 + ", ".join(f"{x / MIB:.2f}" for x in faulted), lambda v: True))


def measure_cached(b, k, rows, emu, lmdb, lmdb_dir, fresh, data_mdb):
    mount = emu.mount
    # -- nothing to gain: everything in the page cache, watched vs unwatched ---------------------
    log("LMDB in the page cache, nothing to gain: watched vs unwatched")
    cap = emu.memory.read("memory.limit_in_bytes").strip()
    emu.memory.write("memory.limit_in_bytes", 8 * data_mdb)
    try:
        pairs = []

        def cached(s):
            # Warm: one pass reads it into the page cache; then the timed passes.
            subprocess.run(emu.wrap(["cat", os.path.join(lmdb_dir, "data.mdb")]),
                           stdout=subprocess.DEVNULL, check=True)
            return b.run("lmdb-seq cached", s, mount, lmdb(lmdb_dir, 6), fresh("none"), "4K",
                         drop=False)
        for got in paired(k.pairs, ["unwatched", "granary"], cached):
            w = statistics.mean(e["seconds"] for e in got["granary"]["epochs"][1:])
            u = statistics.mean(e["seconds"] for e in got["unwatched"]["epochs"][1:])
            pairs.append((w, u))
        rows.append(("nothing to gain (all in RAM): watched / unwatched", "lmdb-seq cached",
                     median_ratio(pairs), "≤ 1.02", "mean of passes 2-6, median of paired runs: "
                     + ", ".join(f"{a:.3f}/{c:.3f} s" for a, c in pairs), lambda v: v <= 1.02))
    finally:
        emu.memory.write("memory.limit_in_bytes", cap)


def count_lock_opens(trace_prefix, lmdb_dir):
    """Opens of the source's lock.mdb for writing in an strace -f -o output."""
    path = os.path.join(lmdb_dir, "lock.mdb")
    n = 0
    d = os.path.dirname(trace_prefix)
    for f in os.listdir(d):
        if not f.startswith(os.path.basename(trace_prefix)):
            continue
        with open(os.path.join(d, f), errors="replace") as fh:
            for line in fh:
                if "lock.mdb" in line and ("O_RDWR" in line or "O_WRONLY" in line) and (
                        path in line or re.search(r'"[^"]*lock\.mdb"', line)):
                    n += 1
    return n


def write_report(data, out):
    rows = data["rows"]
    lines = [f"# granary: mmap readers at source speed — {data['knobs']['out']}", "",
             f"git `{data['git']}` · {data['granary']} · whole run {data['wall_seconds']:.0f} s · "
             f"{os.cpu_count()} CPUs (shared with other work: timings vary ±10 %)", "",
             f"Command: `{data['command']}`", "",
             "| criterion | workload | measured | bar |  | numbers |", "|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured"]
        ms = f"{m:.3f}" if isinstance(m, float) else str(m)
        lines.append(f"| {r['criterion']} | {r['workload']} | {ms} | {r['bar']} | "
                     f"{'**pass**' if r['passed'] else '**FAIL**'} | {r['numbers']} |")
    lines += ["", f"{sum(r['passed'] for r in rows)} pass, {sum(not r['passed'] for r in rows)} fail.",
              "", "## Every run", "",
              "| workload | setup | epoch 1 (s) | epochs (s) | job (s) | source MB | mapped from "
              "tiers / source / faulted (MB) | read ahead (MB) |", "|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        m = r.get("stats", {}).get("mmap", {})
        mb = lambda x: f"{x / 1e6:.1f}"  # noqa: E731
        eps = " ".join("%.2f" % e["seconds"] for e in r["epochs"])
        lines.append(
            f"| {r['label']} | {r['setup']} | {epoch1(r):.2f} | {eps} | {r['seconds']:.1f} | "
            f"{mb(r['device_bytes'])} | "
            + (f"{mb(m.get('tier_bytes', 0))} / {mb(m.get('source_bytes', 0))} / "
               f"{mb(m.get('faulted_bytes', 0))} | {mb(m.get('read_ahead_bytes', 0))} |"
               if m else "– | – |"))
    lines += ["", "## Emulation", ""]
    lines += [f"- {k}: {v}" for k, v in data["emulation"].items()]
    lines += [f"- probe, {k}: {v}" for k, v in data["probe"].items()]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; everything set up was torn down")
        sys.exit(130)
