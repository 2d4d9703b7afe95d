"""Runs the matrix: every workload under every setup, cold, in one process.

For one job: the setup prepares (copy, cache dir, fresh tier, no agent left),
caches are dropped, the device sampler starts, the client runs inside the
cgroups and its JSON lines are collected, the setup finishes (granary stop,
stats), and the device counters are cut at the client's epoch boundaries.
"""

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from . import config, counters, packed, setups

CLIENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients")


@dataclass
class Job:
    workload: str      # e.g. "small"
    compute: str       # e.g. "lenet"
    dataset: str
    script: str
    args: list
    cacheable: bool
    # The setups the spec picked (`NAME[:COMPUTE]@SETUP+SETUP`), or None.
    setups: list = None

    @property
    def key(self):
        return f"{self.workload}-{self.compute}" if self.compute else self.workload

    @classmethod
    def parse(cls, spec):
        picked = config.spec_setups(spec)
        name, _, compute = spec.partition("@")[0].partition(":")
        dataset, script, args, cacheable = config.WORKLOADS[name]
        # FanStore's benchmark only reads: no model step unless asked for. DLIO has its own
        # (--dlio-computation-time).
        compute = compute or ("" if name.startswith("fanstore") or name == "dlio" else "lenet")
        if name == "hfds" and not compute[:1].isdigit():
            raise ValueError("hfds needs a memory cap: hfds:768M")
        return cls(name, compute, dataset, script, args, cacheable, picked)


class Bench:
    def __init__(self, knobs, pfs, datasets, granary, granary_reason, log, clients=None):
        self.k = knobs
        self.clients = clients or {}  # real clients' environments (run.py)
        self.pfs = pfs
        self.datasets = datasets
        self.granary = granary
        self.granary_reason = granary_reason
        self.log = log
        self.copies = {}     # dataset -> copy stats
        self.logdir = os.path.join(knobs.out, "raw", "logs")  # stderr of each job (not committed)
        os.makedirs(self.logdir, exist_ok=True)

    def source_dir(self, dataset):
        return os.path.join(self.pfs.mount, dataset)

    def local_copy(self, dataset):
        dst = os.path.join(self.k.workdir, "local", dataset)
        if dataset not in self.copies:
            self.log(f"  copying {dataset} to local disk (cp -a, throttled)")
            self.copies[dataset] = setups.copy_tree(self, self.source_dir(dataset), dst)
            self.log(f"  copy took {self.copies[dataset]['seconds']:.1f}s")
        return dst

    # ---- one job -----------------------------------------------------------

    def client_argv(self, job, root, cache_dir, epochs):
        ds = self.datasets[job.dataset]
        if self.k.client_cmd:
            cmd = self.k.client_cmd.format(root=shlex.quote(root), manifest=shlex.quote(ds.manifest),
                                           epochs=epochs, workers=self.k.workers,
                                           cache_dir=shlex.quote(cache_dir or ""))
            return ["sh", "-c", cmd]
        python = sys.executable
        if job.workload in config.CLIENT_ENVS:
            python = self.clients[job.workload].get("python", sys.executable)
        argv = [python, os.path.join(CLIENTS, job.script), "--root", root,
                "--manifest", ds.manifest, "--epochs", str(epochs),
                "--workers", str(self.k.workers), "--seed", str(self.k.seed), *job.args]
        if job.compute and job.workload != "hfds":  # hfds: the compute slot is its cap
            argv += ["--compute", job.compute]
        if job.workload in ("small", "npz"):
            argv += ["--batch", str(self.k.batch)]
        if job.workload == "dlio":
            argv += ["--python", self.clients["dlio"]["python"],
                     "--scratch", os.path.join(self.k.workdir, "dlio-run"),
                     "--workers", str(self.k.dlio_read_threads), "--batch", str(self.k.dlio_batch),
                     "--computation-time", str(self.k.dlio_computation_time)]
            if self.k.dlio_shuffle:
                argv.append("--shuffle")
        if cache_dir:
            argv += ["--cache-dir", cache_dir]
        return argv

    def run_job(self, job, setup, epochs=None, tag=""):
        """Runs one job cold. `epochs` overrides --epochs (repetitions run more); `tag`
        suffixes its log names ("-rep2")."""
        epochs = epochs or self.k.epochs
        res = {"workload": job.key, "dataset": job.dataset, "setup": setup.name,
               "label": setup.label, "status": "ok", "log_tag": tag}
        try:
            root, cache_dir = setup.prepare(job)
        except setups.Skip as e:
            res.update(status="skipped", reason=str(e))
            self.log(f"  {setup.name}: skipped ({e})")
            return res
        argv = self.client_argv(job, root, cache_dir, epochs)
        env = dict(os.environ, BENCH_ROOT=root, BENCH_MANIFEST=self.datasets[job.dataset].manifest,
                   BENCH_EPOCHS=str(epochs), BENCH_WORKERS=str(self.k.workers),
                   BENCH_CACHE_DIR=cache_dir or "", PYTHONUNBUFFERED="1")
        strace_file = None
        if self.k.strace:
            # Inside the setup's wrapper: we count the job's own calls, and strace
            # must not follow (and wait for) the agent `granary run` spawns.
            strace_file = os.path.join(self.k.workdir, f"strace-{job.key}-{setup.name}.txt")
            argv = counters.strace_prefix(strace_file) + argv
        if setup.name == "local" and self.k.local_hog_mb:
            argv = _with_hog(self.k.local_hog_mb, argv)
        argv = self.pfs.wrap(setup.wrap(job, argv))
        res["argv"] = argv

        self.pfs.drop_caches([root, self.k.workdir])
        self.pfs.reset_memory_stats()
        events = {"epoch": [], "tick": [], "done": None, "mismatch": []}
        logpath = os.path.join(self.logdir, f"{job.key}-{setup.name}{tag}.log")
        marks = counters.EpochMarks(self.pfs.stat)
        disk = counters.disk_stat_fn(self.k.workdir)
        disk_marks = counters.EpochMarks(disk) if disk else None
        with open(logpath, "w") as logf, counters.DeviceSampler(self.pfs.stat) as dev:
            t0 = time.time()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=logf, env=env, text=True)
            killer = threading.Timer(self.k_timeout(), proc.kill)
            killer.daemon = True  # an interrupted run must not wait for it
            killer.start()
            try:
                for line in proc.stdout:
                    ev = self._event(line, events, logf)
                    if ev:
                        marks.on_event(ev)
                        if disk_marks:
                            disk_marks.on_event(ev)
                rc = proc.wait()
            finally:
                killer.cancel()
            t1 = time.time()
            setup.finish(job, res)
            res["source"] = marks.per_epoch()
            if disk_marks:
                # Reads of the local disk (Local's copy, granary's tiers): the page cache
                # misses of epochs >= 2, the usual reason a placed epoch differs from Local's.
                res["local_disk"] = disk_marks.per_epoch()
        res["wall"] = t1 - t0
        res["t_start"] = t0
        res["rc"] = rc
        res["epochs"] = events["epoch"]
        res["ticks"] = events["tick"]
        res["done"] = events["done"]
        res["source_total"] = dev.between(dev.samples[0][0], dev.samples[-1][0])
        res["source_series"] = dev.series(t0)
        res["memory"] = self.pfs.memory_stats()
        if strace_file:
            res["strace"] = counters.strace_counts(strace_file, self.source_dir(job.dataset),
                                                   events["epoch"])
        if events["mismatch"]:
            res.update(status="MISMATCH", reason=json.dumps(events["mismatch"][:5]))
        elif rc != 0:
            res.update(status="failed", reason=f"exit status {rc}; log: {logpath}\n" + _tail(logpath))
        elif not self.k.client_cmd and not events["done"]:
            res.update(status="failed", reason="client ended without its 'done' line")
        if res["memory"].get("oom_kill"):
            res["reason"] = res.get("reason", "") + f" (memory cgroup OOM kills: {res['memory']['oom_kill']})"
        self.log(f"  {setup.name}: {res['status']} in {res['wall']:.1f}s, epochs "
                 + " ".join(f"{e['seconds']:.1f}" for e in res["epochs"])
                 + f", source {res['source_total']['bytes'] / 1e6:.0f} MB "
                   f"in {res['source_total']['reads']} reads"
                 + (f" -- {res['reason']}" if res["status"] != "ok" else ""))
        return res

    def k_timeout(self):
        """A hung job must not hang the bench: generous bound from the data size."""
        total = sum(d.total_bytes for d in self.datasets.values())
        rate = self.k.read_bps or (50 << 20)
        return 120 + 4 * max(self.k.epochs, self.k.repeat_epochs) * total / rate

    @staticmethod
    def _event(line, events, logf):
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if not isinstance(ev, dict):
            logf.write("stdout: " + line)
            return None
        kind = ev.get("ev")
        if kind in ("epoch", "tick", "mismatch"):
            events[kind].append(ev)
        elif kind == "done":
            events["done"] = ev
        elif kind != "start":
            logf.write("stdout: " + line)
        return ev

    def run_all(self):
        """Returns (results, repeats): one result per job and setup, and the extra
        paired runs of Local and granary-full (slim: epochs and status only)."""
        results, repeats = [], []
        for spec in self.k.workloads:
            job = Job.parse(spec)
            self.log(f"workload {job.key} (dataset {job.dataset})")
            made = make_setups(self, job.setups)
            epoch1 = config.EPOCH1_WORKLOADS.get(job.workload)
            if job.setups is None:
                if job.workload == "npz":
                    made = [s for s in made if s.name in self.k.npz_setups]
                if job.workload == "dlio":
                    made = [s for s in made if s.name in self.k.dlio_setups]
                if job.workload == "hfds":
                    made = [s for s in made if s.name in self.k.hfds_setups]
            by = {}
            with self.memory_cap(job):
                for setup in made:
                    # PFS-direct's later epochs of an epoch-1 workload cost what its first did.
                    epochs = 1 if epoch1 and setup.name == "pfs" else None
                    if job.workload == "dlio":
                        epochs = 1 if setup.name == "pfs" else self.k.dlio_epochs
                    if job.workload == "hfds":
                        epochs = 1
                    by[setup.name] = self.run_job(job, setup, epochs)
                    results.append(by[setup.name])
                repeats += self.repeat_pairs(job, made, by)
                if epoch1:
                    repeats += self.epoch1_pairs(job, made, by, epoch1)
        return results, repeats

    @contextlib.contextmanager
    def memory_cap(self, job):
        """DLIO's jobs run under --dlio-mem-cap: its interpreter with torch and tensorflow
        imported holds more than the other clients' whole cap."""
        mem = self.pfs.memory
        cap = {"dlio": self.k.dlio_mem_cap,
               "hfds": config.parse_size(job.compute) if job.workload == "hfds" else 0
               }.get(job.workload)
        if not cap or mem is None or cap == self.k.mem_cap:
            yield
            return
        self.log(f"  memory cap {cap >> 20} MiB for {job.key}")
        mem.write("memory.limit_in_bytes", cap)
        try:
            yield
        finally:
            mem.write("memory.limit_in_bytes", self.k.mem_cap)

    def epoch1_pairs(self, job, made, by, which):
        """Runs the `which` setups again (PFS-direct and granary-full for npz, granary-full for
        DLIO), one cold epoch each, alternating: the epoch-1 bar takes the medians of
        `--epoch1-pairs` runs (the main run's included)."""
        pair = [s for s in made if s.name in which]
        if (self.k.epoch1_pairs <= 1 or len(pair) != len(which)
                or any(by.get(s.name, {}).get("status") != "ok" for s in pair)):
            return []
        out = []
        for rep in range(2, self.k.epoch1_pairs + 1):
            for setup in pair:
                self.log(f"  epoch-1 pair {rep}/{self.k.epoch1_pairs}:")
                r = self.run_job(job, setup, 1, f"-e1pair{rep}")
                out.append(_slim(r, rep, "epoch1"))
        return out

    def repeat_pairs(self, job, made, by):
        """Runs Local and granary-full again, alternating, so the steady-state
        criterion can take the median of paired ratios instead of one noisy pair."""
        pair = [s for s in made if s.name in ("local", "granary-full", "granary-packed",
                                              "granary-packed-zstd")
                and by.get(s.name, {}).get("status") != "skipped"]
        local = by.get("local") or {}
        eps = [e["seconds"] for e in local.get("epochs") or []][1:]
        if (self.k.repeat <= 1 or len(pair) < 2 or not by.get("local") or not eps
                or any(by.get(s.name, {}).get("status") != "ok" for s in pair)):
            return []
        if sum(eps) / len(eps) >= self.k.repeat_below:
            self.log(f"  no repetitions: Local's epochs take {sum(eps) / len(eps):.1f} s "
                     f"(>= --repeat-below {self.k.repeat_below:g})")
            return []
        out = []
        for rep in range(2, self.k.repeat + 1):
            for setup in pair:
                self.log(f"  repetition {rep}/{self.k.repeat}:")
                r = self.run_job(job, setup, self.k.repeat_epochs, f"-rep{rep}")
                out.append(_slim(r, rep, "steady"))
        return out


def _slim(r, rep, kind):
    """What the report keeps of a repetition: `kind` is "steady" (Local and granary-full,
    epochs >= 2) or "epoch1" (PFS-direct and granary-full, one cold epoch)."""
    return {"workload": r["workload"], "setup": r["setup"], "rep": rep, "kind": kind,
            "status": r["status"], "reason": r.get("reason"), "epochs": r["epochs"],
            "wall": r["wall"], "source_total": r.get("source_total"),
            "local_disk": r.get("local_disk")}


def _with_hog(mb, argv):
    """argv with a process holding `mb` MiB of touched memory beside it, in its cgroups: a
    Local that has granary's resident memory taken from its page cache."""
    hog = f"import time; x = b'1' * ({int(mb)} << 20); time.sleep(86400)"
    return ["sh", "-c", 'python3 -c "$0" & h=$!; "$@"; r=$?; kill $h; exit $r', hog, *argv]


def _tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def make_setups(bench, names=None):
    """The setups named by `names` (default: --setups), in that order."""
    half = bench.k.granary_half
    all_setups = {
        "pfs": setups.PFS(bench),
        "local": setups.Local(bench),
        "cache": setups.Cache(bench),
        "granary-full": setups.GranarySetup(bench, "granary-full", "granary (tier fits all)",
                                            1.0),
        "granary-half": setups.GranarySetup(bench, "granary-half",
                                            f"granary (tier {half:.0%})", half),
    }
    all_setups.update(packed.make(bench))
    return [all_setups[s] for s in (bench.k.setups if names is None else names)]
