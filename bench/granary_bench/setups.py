"""The setups compared: what a user would do instead of granary, and granary.

A setup turns a job (workload on a dataset) into: the directory the client
reads, an optional framework cache directory, and a wrapper around the client
command. It prepares what it needs before the cold start and cleans up after.
"""

import json
import os
import shutil
import subprocess
import time

MIB = 1 << 20


class Skip(Exception):
    """The setup does not apply to this job; the message says why."""


class Setup:
    name = ""
    label = ""

    def __init__(self, bench):
        self.b = bench

    def prepare(self, job):
        """Returns (root, cache_dir). Runs before caches are dropped."""
        return self.b.source_dir(job.dataset), None

    def wrap(self, job, cmd):
        return cmd

    def finish(self, job, result):
        pass


class PFS(Setup):
    name, label = "pfs", "PFS"


class Local(Setup):
    """The dataset is copied to local disk before the job (cp -a, throttled like
    any source read); the copy time is reported on its own."""
    name, label = "local", "Local"

    def prepare(self, job):
        return self.b.local_copy(job.dataset), None


class Cache(Setup):
    """Framework cache (tf.data .cache(), copy-on-first-read): the client copies
    each file to local disk as epoch 1 reads it. Only when the dataset fits."""
    name, label = "cache", "Cache"

    def prepare(self, job):
        if not job.cacheable:
            raise Skip("mmap readers (DALI, LMDB) offer no framework cache")
        d = os.path.join(self.b.k.workdir, "cache", job.key)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return self.b.source_dir(job.dataset), d

    def finish(self, job, result):
        shutil.rmtree(os.path.join(self.b.k.workdir, "cache", job.key), ignore_errors=True)


class GranarySetup(Setup):
    """`granary run` with a fresh local tier of `fraction` x the dataset, and a
    freshly started agent (inside the throttle, because `granary run` spawns it
    from inside our cgroups)."""

    def __init__(self, bench, name, label, fraction):
        super().__init__(bench)
        self.name, self.label, self.fraction = name, label, fraction

    def tier_dir(self, job):
        return os.path.join(self.b.k.workdir, "tiers", f"{job.key}-{self.name}")

    def tier_bytes(self, job):
        total = self.b.datasets[job.dataset].total_bytes
        if self.fraction >= 1.0:
            # "Holds everything": room for the whole dataset plus slack.
            return int(total * self.fraction) + 16 * MIB
        return int(total * self.fraction)

    def prepare(self, job):
        g = self.b.granary
        if g is None:
            raise Skip(f"granary not available: {self.b.granary_reason}")
        left = g.stop(self.b.pfs.groups())
        if left:
            raise RuntimeError(f"processes {left} still in the bench cgroups after `granary stop`")
        outside = g.agents_outside(self.b.pfs.groups())
        if outside:
            raise RuntimeError(f"granary agent(s) {outside} on our runtime directory run outside "
                               "the bench cgroups: their reads would escape the throttle")
        d = self.tier_dir(job)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return self.b.source_dir(job.dataset), None

    def wrap(self, job, cmd):
        self.stats_json = os.path.join(self.b.k.workdir, f"stats-{job.key}-{self.name}.json")
        if os.path.exists(self.stats_json):
            os.unlink(self.stats_json)
        size = f"{max(1, self.tier_bytes(job) // MIB)}M"
        return self.b.granary.run_argv(self.b.source_dir(job.dataset), [(self.tier_dir(job), size)],
                                       self.stats_json, self.b.k.granary_extra, cmd)

    def finish(self, job, result):
        g = self.b.granary
        result["tier"] = {"path": self.tier_dir(job), "bytes": self.tier_bytes(job)}
        result["tier"]["used_bytes"] = _du(self.tier_dir(job))
        left = g.stop(self.b.pfs.groups())
        result["stop_left"] = left
        try:
            with open(self.stats_json) as f:
                result["granary_stats"] = json.load(f)
        except (OSError, ValueError) as e:
            result["granary_stats_error"] = str(e)
        if os.path.exists(self.stats_json):
            # Kept with the job's stderr: the raw counters (placement.page_cache_bytes,
            # duplicate_bytes, no_room, reuse_rejected, ...) as granary wrote them.
            kept = os.path.join(self.b.logdir, f"{job.key}-{self.name}{result['log_tag']}.stats.json")
            shutil.copyfile(self.stats_json, kept)
            result["granary_stats_file"] = os.path.relpath(kept, self.b.k.out)
        shutil.rmtree(self.tier_dir(job), ignore_errors=True)


def _du(path):
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(d, n)).st_blocks * 512
            except OSError:
                pass
    return total


def copy_tree(bench, src, dst):
    """cp -a inside the cgroups (so the copy pays the PFS price); returns stats."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    bench.pfs.drop_caches([src])
    s0 = bench.pfs.stat()
    t0 = time.time()
    subprocess.run(bench.pfs.wrap(["cp", "-a", src, dst]), check=True)
    secs = time.time() - t0
    s1 = bench.pfs.stat()
    return {"seconds": secs, "source_reads": s1[0] - s0[0], "source_bytes": s1[1] - s0[1]}
