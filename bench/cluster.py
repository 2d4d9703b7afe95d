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

    python3 bench/cluster.py                 # ~3 minutes; report.md under --out
    python3 bench/cluster.py --pairs 7 --tier-root /var/tmp   # tiers on disk instead of RAM
    python3 bench/cluster.py --compare OTHER_BINARY            # both binaries in every pair
    python3 bench/cluster.py --pack                            # a pack of the dataset served
"""
import argparse
import hashlib
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SIZES = {"128K": 128 << 10, "512K": 512 << 10, "2M": 2 << 20, "8M": 8 << 20}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_pml": "ob1"}

READER = r'''
import json, os, sys, threading, time
# The serving agents (owner and requester): their CPU over the timed loop only.
pids = [p for p in os.environ.get("BENCH_AGENT_PIDS", "").split(",") if p]
def agents_cpu():
    """Each agent's CPU seconds so far, in the order of BENCH_AGENT_PIDS (rank 0 first)."""
    out = []
    for p in pids:
        total = 0
        for t in os.listdir(f"/proc/{p}/task"):
            try:
                total += int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        out.append(total / 1e9)
    return out
def agents_threads():
    """Each agent thread's CPU seconds so far, by "r<rank>:<thread name>" (threads of one name
    summed), and how many times each slept (voluntary context switches: each a wake-up)."""
    out, sleeps = {}, {}
    for i, p in enumerate(pids):
        for t in os.listdir(f"/proc/{p}/task"):
            try:
                name = open(f"/proc/{p}/task/{t}/comm").read().strip()
                ns = int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0])
                vol = [int(l.split()[1]) for l in open(f"/proc/{p}/task/{t}/status")
                       if l.startswith("voluntary_ctxt_switches")][0]
            except (OSError, ValueError, IndexError):
                continue
            out[f"r{i}:{name}"] = out.get(f"r{i}:{name}", 0) + ns / 1e9
            sleeps[f"r{i}:{name}"] = sleeps.get(f"r{i}:{name}", 0) + vol
    return out, sleeps
def switches():
    """This thread's context switches so far: voluntary (it slept), involuntary (preempted)."""
    got = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/thread-self/status") if "ctxt_switches" in l}
    return [got.get("voluntary_ctxt_switches", 0), got.get("nonvoluntary_ctxt_switches", 0)]
ctxt = [0, 0]
files = [l for l in open(sys.argv[1]).read().split("\n") if l]
threads, mode, size = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
it = iter(files); lock = threading.Lock(); total = [0]; lat = []
def work():
    buf = bytearray(size); view = memoryview(buf)
    sw0 = switches()
    while True:
        with lock:
            p = next(it, None)
        if p is None:
            sw = switches()
            with lock:
                ctxt[0] += sw[0] - sw0[0]; ctxt[1] += sw[1] - sw0[1]
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
a0, (th0, sl0) = agents_cpu(), agents_threads()
t0, c0 = time.perf_counter(), time.process_time()
ts = [threading.Thread(target=work) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
s, cpu = time.perf_counter() - t0, time.process_time() - c0
agents = [b - a for a, b in zip(a0, agents_cpu())]
th1, sl1 = agents_threads()
threads_cpu = {k: v - th0.get(k, 0) for k, v in th1.items()}
threads_sleeps = {k: v - sl0.get(k, 0) for k, v in sl1.items()}
print(json.dumps({"files": len(files), "bytes": total[0], "s": s, "cpu": cpu,
                  "agent_cpu": sum(agents), "agent_cpus": agents, "agent_threads": threads_cpu,
                  "agent_sleeps": threads_sleeps,
                  "ctxt": ctxt, "lat": sorted(lat)}))
'''


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def threads_cpu_s(pids):
    """CPU seconds so far of every thread of the agents `pids`, by "r<rank>:<thread name>"
    (as the reader's `agents_threads`)."""
    out = {}
    for i, pid in enumerate(pids):
        for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
            try:
                name = (t / "comm").read_text().strip()
                ns = int((t / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            out[f"r{i}:{name}"] = out.get(f"r{i}:{name}", 0) + ns / 1e9
    return out


def cpu_s(pid):
    """CPU time of every thread of `pid` so far (user + system, ns-exact: schedstat), seconds."""
    total = 0
    for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


# Extra arguments for every `granary serve` (`--serve-arg`), e.g. `--no-direct`.
SERVE_EXTRA = []


class Serve:
    def __init__(self, g, source, work, tier_root, pack=None, ranks=2, staging="4G"):
        self.g, self.work = g, work
        self.rt = work / "rt"
        self.tiers = tier_root / f"granary-cluster-bench-{os.getpid()}"
        shutil.rmtree(self.tiers, ignore_errors=True)
        shutil.rmtree(self.rt, ignore_errors=True)
        self.rt.mkdir(parents=True)
        env = {**os.environ, **MPI_ENV, "GRANARY_RUNTIME_DIR": f"{self.rt}/{{rank}}"}
        self.ranks = ranks
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", g, "serve", "--source", source,
               "--tier", f"{self.tiers}/t{{rank}}=4G", "--staging", f"{self.tiers}/s{{rank}}={staging}"]
        if pack:
            cmd += ["--pack", str(pack)]
        cmd += SERVE_EXTRA
        self.log = open(work / "mpirun.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + 120
        while not all((self.status(r).get("cluster") or {}).get("ready") for r in range(ranks)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"granary serve did not start; see {work / 'mpirun.log'}")
            time.sleep(0.2)

    def env(self, r):
        return {**os.environ, "GRANARY_RUNTIME_DIR": f"{self.rt}/{r}"}

    def pid(self, r):
        return int((self.rt / str(r) / "agent.alive").read_text())

    def cpu(self):
        """Every agent's CPU seconds so far, summed."""
        return sum(cpu_s(self.pid(r)) for r in range(self.ranks))

    def idle_rates(self, seconds=3.0):
        """Each agent's CPU (cores, by rank) while nothing reads, after their start-up work
        (placement, the staging filler's reserve) has stopped moving."""
        time.sleep(1.0)
        pids = [self.pid(r) for r in range(self.ranks)]
        c0, t0 = [cpu_s(p) for p in pids], time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        return [(cpu_s(p) - c) / dt for p, c in zip(pids, c0)]

    def idle_rate(self, seconds=3.0):
        """`idle_rates` summed over the ranks."""
        return sum(self.idle_rates(seconds))

    def status(self, r):
        p = subprocess.run([self.g, "status", "--json"], capture_output=True, env=self.env(r))
        return (json.loads(p.stdout or b"null") or {}) if p.returncode == 0 else {}

    def fresh(self, r):
        """Copies rank `r` received into new staging files so far (none ready: their pages
        were allocated while the program waited)."""
        return (self.status(r).get("cluster") or {}).get("staging_fresh", 0)

    def read(self, r, listing, threads, mode, size):
        env = {**self.env(r), "BENCH_AGENT_PIDS": ",".join(str(self.pid(k)) for k in range(self.ranks))}
        p = subprocess.run([self.g, "run", "--attach", "-q", "--", sys.executable, "-c", READER,
                            listing, str(threads), mode, str(size)],
                           capture_output=True, text=True, env=env, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"reader failed: {p.stderr[-2000:]}")
        return json.loads(p.stdout.splitlines()[-1])

    def settle(self):
        deadline = time.monotonic() + 120
        while any(s.get("pending") for r in range(self.ranks) for s in self.status(r).get("sources", [])):
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


BAR_SIZES = ("128K", "2M", "8M")
SLACK = 150e-6   # the bar's allowance per file beyond the transfer's floor and the checksum


def t_mpi(reps, cold=False):
    """t_mpi(s): one-way time of a plain MPI ping-pong of s bytes between two ranks, same MPI,
    launcher and environment as the serving ranks (bench/floor/mpi_pingpong.c). `cold`: each
    round trip from buffers not touched since a GiB of others was (from memory, as a first
    read's bytes are; the bar's t_mpi reuses one buffer, which stays in the CPU's caches)."""
    with tempfile.TemporaryDirectory() as d:
        exe = pathlib.Path(d) / "pingpong"
        subprocess.run(["mpicc", "-O2", "-o", exe, REPO / "bench" / "floor" / "mpi_pingpong.c"], check=True)
        p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", exe, str(reps),
                            *(["--cold"] if cold else []), *(str(SIZES[d]) for d in BAR_SIZES)],
                           capture_output=True, text=True, env={**os.environ, **MPI_ENV}, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"ping-pong failed: {p.stderr[-2000:]}")
        got = json.loads(p.stdout.strip().splitlines()[-1])
    return {d: got[str(SIZES[d])] for d in BAR_SIZES}


def epochs(g, args, source, work, sums, sizes=("2M", "8M", "128K")):
    """Agent CPU per remote GiB in epoch 1 (fresh staging pages) and in a later epoch (the
    staging tier full, dropped copies' pages reused): rank 0 reads rank 1's files of one size
    twice through a staging tier of a third of them, 1 reader thread."""
    out = {}
    for d in sizes:
        theirs_bytes = None
        serve = None
        try:
            # The staging tier holds a third of the remote files: every read of epoch 2 is a
            # new transfer into a recycled file.
            n_remote = sum(1 for p in sums.values() if f"/{d}/" in p) // 2
            if not n_remote:
                continue  # not in --counts
            staging = max(n_remote * SIZES[d] // 3, 16 << 20)
            serve = Serve(g, source, work, pathlib.Path(args.tier_root), None, staging=str(staging))
            serve.read(1, str(work / "all.txt"), 4, "read", 8 << 20)
            serve.settle()
            mine, theirs = split(serve, sums)
            rem = sorted(p for p in theirs if f"/{d}/" in p)
            (work / "e.txt").write_text("\n".join(rem))
            theirs_bytes = len(rem) * SIZES[d]
            pids = [serve.pid(r) for r in range(serve.ranks)]
            th0, tt0 = threads_cpu_s(pids), time.monotonic()
            idles = serve.idle_rates()
            idle = sum(idles)
            dt = time.monotonic() - tt0
            th_idle = {k: (v - th0.get(k, 0)) / dt for k, v in threads_cpu_s(pids).items()}
            for e in (1, 2):
                r = serve.read(0, str(work / "e.txt"), 1, "read", SIZES[d])
                agent = r["agent_cpu"] - idle * r["s"]
                gib = r["bytes"] / 2**30
                requester = r["agent_cpus"][0] - idles[0] * r["s"]
                out.setdefault(d, {})[e] = {"agent_cpu": agent, "bytes": r["bytes"], "s": r["s"],
                                            "reader_cpu": r["cpu"], "idle": idle,
                                            "per_gib": agent / gib,
                                            "requester_per_gib": requester / gib,
                                            # Each agent thread's CPU per remote file (idle rate
                                            # subtracted), µs; the reader's context switches per file.
                                            "threads_us": {k: (v - th_idle.get(k, 0) * r["s"]) / r["files"] * 1e6
                                                           for k, v in r.get("agent_threads", {}).items()},
                                            "ctxt_per_file": [c / r["files"] for c in r.get("ctxt", [0, 0])],
                                            # Each agent thread's sleeps (wake-ups) per remote file.
                                            "sleeps_per_file": {k: v / r["files"]
                                                                for k, v in r.get("agent_sleeps", {}).items()}}
            c = serve.status(0).get("cluster") or {}
            out[d]["recycled"] = c.get("staging_recycled", 0)
            out[d]["bounce"] = sum(p.get("bounce_bytes", 0) for p in c.get("peers", []))
        finally:
            if serve:
                serve.stop()
        log(f"epochs {d}: {out.get(d)}")
    return out


def idle3(g, args, source, work, seconds=10.0):
    """Each rank's CPU (cores) with 3 ranks serving and nothing reading, after start-up."""
    serve = Serve(g, source, work, pathlib.Path(args.tier_root), None, ranks=3)
    try:
        serve.settle()
        time.sleep(3.0)
        pids = [serve.pid(r) for r in range(3)]
        c0, t0 = [cpu_s(p) for p in pids], time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        return [(cpu_s(p) - c) / dt for p, c in zip(pids, c0)]
    finally:
        serve.stop()


def bar(rows, side, extra, b=0):
    """The bar's rows (docs/cluster.md): Δ(s) = median remote − median local read (1 reader,
    first reads) against t_mpi(s) + t_hash(s) + 150 µs; agent and reader CPU; idle ranks. `b`:
    which binary's rows (`--compare`: 1); the epoch and idle phases run the first one only."""
    hash_s_per_b = statistics.median(side.get((b, "hash")) or [float("nan")])
    tm = extra["t_mpi"]
    cold = extra.get("t_mpi_cold") or {}
    lines = ["## The bar (one run)", "",
             "| size | Δ = remote − local, median (ms) | t_mpi | t_hash | bound t_mpi + t_hash + 0.150 | Δ / bound | "
             "agent CPU s per remote GiB (idle subtracted): owner + requester | requester | "
             "reader CPU remote / local | t_mpi from memory | Δ / its bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    costs = {"hash_s_per_byte": hash_s_per_b, "t_mpi": tm, "sizes": {}}
    med = lambda xs: xs[len(xs) // 2] if xs else float("nan")
    for d in BAR_SIZES:
        r, l = rows.get((b, d, 1, "read", "remote")), rows.get((b, d, 1, "read", "local"))
        if not r or not l:
            continue
        rem = sorted(v for x in r for v in x["lat"])
        loc = sorted(v for x in l for v in x["lat"])
        delta = med(rem) - med(loc)
        th = SIZES[d] * hash_s_per_b
        bound = tm[d] + th + SLACK
        gib = sum(x["bytes"] for x in r) / 2**30
        agent = sum(x["agent_cpu"] - x["idle"] * x["s"] for x in r) / gib
        requester = sum(x["agent_cpus"][0] - x["idles"][0] * x["s"] for x in r) / gib
        reader = sum(x["cpu"] for x in r) / max(sum(x["cpu"] for x in l), 1e-9)
        lines.append(f"| {d} | {delta * 1e3:.3f} | {tm[d] * 1e3:.3f} | {th * 1e3:.3f} | {bound * 1e3:.3f} | "
                     f"{delta / bound:.2f} | {agent:.2f} | {requester:.2f} | {reader:.2f} | "
                     f"{cold.get(d, float('nan')) * 1e3:.3f} | "
                     f"{delta / (cold.get(d, float('nan')) + th + SLACK):.2f} |")
        costs["sizes"][d] = {"size": SIZES[d], "local": med(loc), "remote": med(rem),
                             "remote_p90": rem[int(len(rem) * 0.9)], "remote_p99": rem[int(len(rem) * 0.99)],
                             "delta": delta, "t_hash": th, "agent_cpu_per_gib": agent,
                             "requester_cpu_per_gib": requester,
                             "files": len(rem)}
    lines += ["", f"t_mpi: bench/floor/mpi_pingpong.c, 2 ranks, this run's launcher and environment, "
              f"one buffer reused (it stays in the CPU's caches); from memory: `--cold`, each round "
              f"trip from buffers last touched a GiB ago, as a first read's bytes are (information: "
              f"the bar is the first); "
              f"t_hash: the requester's own checksum time per byte in this run ({hash_s_per_b * 1e9:.3f} ns/B, "
              f"`granary status --json` `cluster.hashing_ns / hashed_bytes`). Bytes through buffers "
              f"(`bounce_bytes`, every pair): {sorted(set(side.get((b, 'bounce'), [])))}. Remote reads "
              f"whose copy found no staging file ready (`staging_fresh`: pages allocated while the "
              f"program waited), of all: " + ", ".join(
                  f"{d} {sum(x.get('fresh', 0) for x in rows.get((b, d, 1, 'read', 'remote'), []))}"
                  f"/{sum(len(x['lat']) for x in rows.get((b, d, 1, 'read', 'remote'), []))}"
                  for d in BAR_SIZES) + "."]
    ep = extra.get("epochs" if b == 0 else "epochs_b")
    if ep:
        lines += ["", "| size | agent CPU s per remote GiB (owner + requester), epoch 1 | later epoch | requester's, epoch 1 / later | reader CPU s per GiB, epoch 1 / later | staging copies recycled | bytes through buffers |",
                  "|---|---|---|---|---|---|---|"]
        for d, e in ep.items():
            g1, g2 = e[1]["bytes"] / 2**30, e[2]["bytes"] / 2**30
            lines.append(f"| {d} | {e[1]['per_gib']:.2f} | {e[2]['per_gib']:.2f} | "
                         f"{e[1]['requester_per_gib']:.2f} / {e[2]['requester_per_gib']:.2f} | "
                         f"{e[1]['reader_cpu'] / g1:.2f} / {e[2]['reader_cpu'] / g2:.2f} | {e['recycled']} | {e['bounce']} |")
        costs["epochs"] = {d: {k: e[k]["per_gib"] for k in (1, 2)} for d, e in ep.items()}
        lines += ["", "Where it goes, per remote file: each agent thread's CPU (µs, idle rate subtracted; r0 the "
                  "requester, r1 the owner; threads under 1 µs left out), how often each slept (each sleep a "
                  "wake-up; threads under 0.1 left out), and the reader's context switches (voluntary: it "
                  "slept; involuntary: preempted).", "",
                  "| size | epoch | agent threads, µs per file | agent threads, sleeps per file | reader switches per file, voluntary / involuntary |",
                  "|---|---|---|---|---|"]
        for d, e in ep.items():
            for k in (1, 2):
                th = sorted(((v, n) for n, v in e[k].get("threads_us", {}).items() if v >= 1), reverse=True)
                cs = e[k].get("ctxt_per_file", [0, 0])
                sl = sorted(((v, n) for n, v in e[k].get("sleeps_per_file", {}).items() if v >= 0.1), reverse=True)
                lines.append(f"| {d} | {k if k == 1 else 'later'} | {', '.join(f'{n} {v:.0f}' for v, n in th)} | "
                             f"{', '.join(f'{n} {v:.2f}' for v, n in sl)} | {cs[0]:.2f} / {cs[1]:.2f} |")
    idle = extra.get("idle3") if b == 0 else None
    if idle:
        lines += ["", f"Idle ranks (3 ranks serving, nothing reading, {extra['idle_seconds']:.0f} s): "
                  f"{', '.join(f'{c:.4f}' for c in idle)} cores."]
        costs["idle_cores"] = max(idle)
    idles = side.get((0, "idle")) or []
    if idles:
        costs["idle_pair_cores"] = statistics.median(idles)
    return lines, costs


# The model's cluster (stated, not measured): a node's link, one-way latency per message, the
# PFS's aggregate read bandwidth, reader threads per node, files per step per node.
NET_BANDWIDTH = 12.5e9    # bytes/s per node and direction (100 Gb/s)
NET_LATENCY = 2e-6        # s per message
PFS_BANDWIDTH = 50e9      # bytes/s, the whole file system
THREADS = 8               # reader threads per node (e.g. 4 GPUs × 2 loader processes)
BATCH = 256               # files one node reads per training step
BEAT_COST = 20e-6         # CPU s per liveness message, sent or received (upper bound: below)
BEAT_HZ = 4               # heartbeats a rank sends per second (cluster/peers.rs: every 250 ms)


def scaling(costs):
    """A model of one training step, data-parallel over N nodes, every file read once per epoch
    by one node in a global shuffle (each node reads BATCH files per step with THREADS threads).
    Its terms, per node and step (seconds), fed by this run's measurements:

      local    files this node holds (1/N of them): the local read, measured
      remote   the others ((N−1)/N): the requester's fixed cost per file (Δ − t_mpi − t_hash,
               measured), the checksum (t_hash), 3 messages (request, reply, data) on the stated
               network — spread over THREADS threads
      link     the remote bytes through this node's link (NET_BANDWIDTH)
      hot spot the busiest owner serves more than the average: with m = BATCH·(N−1)/N requests
               per owner per step, the most loaded of N owners gets ≈ m + √(2·m·ln N)
               (balls into bins); its excess bytes through its link delay the step
      incast   a node receives from min(THREADS, N−1) owners at once into one port: the last
               file of each wave waits for the others' bytes, half a wave on average
      liveness heartbeats per rank per second (ring: BEAT_HZ sent, as many received;
               all-to-all: 2·BEAT_HZ·(N−1))
               × BEAT_COST of CPU, taken from the step's time
      epoch 1  the dataset's first read from the PFS: N nodes · BATCH files share PFS_BANDWIDTH
               (one read per byte per job); only in the first epoch
      tail     a synchronous step waits for the slowest of N nodes: (p99 − median) of a remote
               read, measured, × the chance some node draws a p99 file in a step, spread over
               the threads

    Wrong where: the hot-spot and incast terms assume a non-blocking fat tree and no switch
    drops; the remote fixed cost is this 2-core machine's, where every wake-up waits for a core."""
    out = ["## Scaling model (`scaling()`: a step of data-parallel training, terms by node count)", "",
           f"Stated cluster: {NET_BANDWIDTH * 8 / 1e9:.0f} Gb/s and {NET_LATENCY * 1e6:.0f} µs per message, PFS "
           f"{PFS_BANDWIDTH / 1e9:.0f} GB/s, {THREADS} reader threads and {BATCH} files per step per node. "
           "Measured here: local and remote read times (medians, p99), Δ, t_mpi, t_hash. Each term's "
           "share of the step (later epochs; epoch 1 adds its PFS term).", "",
           "| size | nodes | step ms (later / epoch 1) | local | remote | link | hot spot | incast | liveness | tail | epoch-1 PFS (of epoch-1 step) | efficiency vs 1 node |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d, m in costs["sizes"].items():
        s = m["size"]
        fixed = max(m["delta"] - costs["t_mpi"][d] - m["t_hash"], 0.0)

        def terms(n):
            f = (n - 1) / n
            t = {}
            t["local"] = BATCH / n * m["local"] / THREADS
            t["remote"] = BATCH * f * (fixed + m["t_hash"] + 3 * NET_LATENCY) / THREADS
            t["link"] = BATCH * f * s / NET_BANDWIDTH
            mean = BATCH * f
            t["hot spot"] = (math.sqrt(2 * mean * math.log(n)) if n > 1 else 0) * s / NET_BANDWIDTH
            fan = min(THREADS, n - 1)
            t["incast"] = BATCH * f / THREADS * max(fan - 1, 0) / 2 * s / NET_BANDWIDTH / max(fan, 1)
            base = sum(t.values())
            beats = 2.0 * BEAT_HZ if n > 1 else 0.0  # ring: BEAT_HZ sent, as many received
            t["liveness"] = base * beats * BEAT_COST
            p_tail = 1 - 0.99 ** (BATCH * f * n) if n > 1 else 0
            t["tail"] = p_tail * (m["remote_p99"] - m["remote"]) / THREADS
            t["epoch 1"] = BATCH * n * s / PFS_BANDWIDTH
            return t
        t1 = sum(v for k, v in terms(1).items() if k != "epoch 1")
        for n in (1, 4, 16, 64, 512):
            t = terms(n)
            later = sum(v for k, v in t.items() if k != "epoch 1")
            first = later + t["epoch 1"]
            share = lambda k: f"{t[k] / later:.0%}"
            out.append(f"| {d} | {n} | {later * 1e3:.1f} / {first * 1e3:.1f} | "
                       + " | ".join(share(k) for k in ("local", "remote", "link", "hot spot", "incast", "liveness", "tail"))
                       + f" | {t['epoch 1'] / first:.0%} | {t1 / later:.0%} |")
    a2a = 2 * BEAT_HZ * 511 * BEAT_COST
    out += ["", f"Liveness at 512 nodes: the ring costs a rank {2 * BEAT_HZ * BEAT_COST * 1e3:.2f} ms of CPU per "
            f"second ({2 * BEAT_HZ} messages, whatever the node count); all-to-all heartbeats would cost "
            f"{a2a * 1e3:.1f} ms ({2 * BEAT_HZ * 511} messages). BEAT_COST is an upper bound "
            f"from this run's idle rank ({costs.get('idle_cores', float('nan')):.4f} cores, every wake-up counted as a message)."]
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
    ap.add_argument("--no-epochs", dest="epochs", action="store_false",
                    help="skip the epoch-1 / later-epoch CPU phase (a small staging tier, the "
                         "remote files read twice)")
    ap.add_argument("--no-idle", dest="idle", action="store_false",
                    help="skip the idle-rank phase (3 ranks, nothing reading)")
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="how long the idle-rank phase measures")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="an extra argument for every `granary serve` (repeatable); "
                         "`--serve-arg=--no-direct` measures the MPI path ranks on different hosts take")
    ap.add_argument("--tmp-mpi-reps", type=int, default=41, help=argparse.SUPPRESS)
    args = ap.parse_args()
    SERVE_EXTRA.extend(args.serve_arg)
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
    extra = {"t_mpi": t_mpi(args.tmp_mpi_reps), "t_mpi_cold": t_mpi(args.tmp_mpi_reps, cold=True),
             "load_start": os.getloadavg()[0]}
    if args.epochs:
        # With --compare, both builds, size by size, alternating which goes first.
        for i, d in enumerate(("2M", "8M", "128K")):
            for b in (range(len(bins)) if i % 2 == 0 else reversed(range(len(bins)))):
                got = epochs(bins[b], args, source, work, sums, (d,))
                extra.setdefault("epochs" if b == 0 else "epochs_b", {}).update(got)
    if args.idle:
        extra["idle3"] = idle3(bins[0], args, source, work, args.idle_seconds)
        extra["idle_seconds"] = args.idle_seconds
    report(rows, args, counts, bins, extra)


def one_pair(g, b, k, args, source, pack, work, sums, everything, threads, modes, rows):
    """One fresh serve of binary `g` (number `b`): rank 1 reads everything, then rank 0 reads
    remote and local files of every size, alternating which goes first."""
    serve = Serve(g, source, work, pathlib.Path(args.tier_root), pack)
    try:
        serve.read(1, str(everything), 4, "read", 8 << 20)
        serve.settle()
        mine, theirs = split(serve, sums)
        idles = serve.idle_rates()
        idle = sum(idles)
        rows.setdefault((b, "idle"), []).append(idle)
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
                    fresh0 = serve.fresh(0) if what == "remote" else 0
                    res = serve.read(0, str(work / f), t, m, size)
                    if what == "remote":
                        res["fresh"] = serve.fresh(0) - fresh0
                    res["idle"] = idle
                    res["idles"] = idles
                    rows.setdefault((b, d, t, m, what), []).append(res)
        c = serve.status(0).get("cluster") or {}
        if c.get("hashed_bytes"):
            rows.setdefault((b, "hash"), []).append(c["hashing_ns"] / 1e9 / c["hashed_bytes"])
        rows.setdefault((b, "bounce"), []).append(
            sum(p.get("bounce_bytes", 0) for p in c.get("peers", [])))
    finally:
        serve.stop()


def lat_summary(lat):
    return {"lat_median": lat[len(lat) // 2], "lat_p90": lat[int(len(lat) * 0.9)]} if lat else {}


def report(rows, args, counts, bins, extra):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    side = {k: v for k, v in rows.items() if len(k) != 5}
    rows = {k: v for k, v in rows.items() if len(k) == 5}
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
            bar_rows, costs = bar(rows, side, extra)
            lines += ["", *bar_rows, "", *scaling(costs)]
            model["bar"] = costs
        else:
            bar_rows, costs = bar(rows, side, extra, b)
            lines += ["", *bar_rows]
            model["bar"] = costs
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
