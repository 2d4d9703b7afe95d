"""Cluster mode (`granary serve`, issue 13) on one machine: `mpirun -np 3` starts three serving
ranks, each with its own runtime directory and tiers ("nodes"), all serving one source; a reader
runs on every rank at once (`GRANARY_RUNTIME_DIR=…/rtN granary run --attach`) and every byte and
listing is compared with a direct read of the source.

Source traffic is counted outside granary: the source is a loop-mounted ext4 image (sectors read
in /sys/block/loopN/stat, page cache dropped first) and, for metadata, strace of the serving
ranks. Skipped only when the granary binary was built without the `mpi` feature.
"""
import contextlib
import hashlib
import json
import math
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import CLIENTS, granary_bin
from test_source_device import device_reads, drop_caches, loop_source  # noqa: F401

READER = CLIENTS / "cluster_reader.py"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           # One machine, several "nodes": shared memory between ranks, no network probing.
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_pml": "ob1"}
# The launcher (`GRANARY_MPIRUN=mpirun.mpich` with a binary built against MPICH); MPICH's
# Hydra starts more ranks than cores without being told, and keeps the others running when
# one dies with -disable-auto-cleanup (OpenMPI: --enable-recovery).
MPIRUN = os.environ.get("GRANARY_MPIRUN", "mpirun")


def hydra() -> bool:
    p = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True)
    return "HYDRA" in p.stdout


def launcher(ranks: int, flags) -> list:
    if hydra():
        flags = ["-disable-auto-cleanup" if f == "--enable-recovery" else f for f in flags]
        return [MPIRUN, "-np", str(ranks), *flags]
    return [MPIRUN, "-np", str(ranks), "--oversubscribe", *flags]


def built_with_mpi() -> bool:
    # A bad flag is refused before MPI starts; a build without MPI refuses `serve` itself.
    p = subprocess.run([granary_bin(), "serve", "--source", "/", "--peer-timeout", "x"],
                       capture_output=True, text=True, timeout=60)
    return "built without MPI" not in p.stderr


pytestmark = pytest.mark.skipif(
    not built_with_mpi(),
    reason="granary was built without the `mpi` feature: cargo build --workspace --features "
           "granary/mpi (needs OpenMPI or MPICH and libclang-dev)")


# ---------------------------------------------------------------------------------------------
# Datasets

def write(root: pathlib.Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def fanstore(root: pathlib.Path, scale: int = 1024) -> None:
    """FanStore's micro-benchmark (Zhang et al., §6.2): 128K × 128 KiB, 32K × 512 KiB, 8K × 2 MiB,
    2K × 8 MiB files, the counts divided by `scale` (as bench/ does)."""
    for d, size, n in [("128K", 128 << 10, 128 << 10), ("512K", 512 << 10, 32 << 10),
                       ("2M", 2 << 20, 8 << 10), ("8M", 8 << 20, 2 << 10)]:
        for i in range(max(1, n // scale)):
            write(root, f"fanstore/{d}/f{i:06d}", os.urandom(size))


def small_files(root: pathlib.Path, n: int = 300, seed: int = 3) -> None:
    """ImageNet-like: log-normal sizes around 110 KB in class directories, a few empty files."""
    rng = random.Random(seed)
    mu = math.log(110_000) - 0.125
    for i in range(n):
        size = 0 if i % 97 == 5 else int(min(1 << 20, max(1, rng.lognormvariate(mu, 0.5))))
        write(root, f"small/c{i % 12:03d}/img_{i:05d}.jpg", os.urandom(size))


def direct(root: pathlib.Path) -> dict:
    out = subprocess.run([sys.executable, READER, root], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    return json.loads(out.splitlines()[-1])


def files_under(root: pathlib.Path):
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def stored_bytes(root: pathlib.Path) -> int:
    """What the dataset occupies on the source device (st_blocks, like du)."""
    total = root.lstat().st_blocks * 512
    for p in root.rglob("*"):
        total += p.lstat().st_blocks * 512
    return total


# ---------------------------------------------------------------------------------------------
# A serving job

class Cluster:
    def __init__(self, tmp: pathlib.Path, source: pathlib.Path, ranks: int = 3, extra=(),
                 mpirun=(), wrap=(), tier_size="2G", staging_size="2G", pack=None,
                 mount=False):
        """Serves `source`; from `pack` if given, with the tree at `source` or (`mount`) the
        pack alone, the programs expecting the tree at `source`."""
        self.tmp, self.source, self.ranks = tmp, source, ranks
        self.bin = granary_bin()
        tmp.mkdir(parents=True, exist_ok=True)
        self.log = tmp / "mpirun.log"
        what = ["--source", source]
        if pack is not None:
            what = ["--pack", pack, "--mount" if mount else "--source", source]
        cmd = [*launcher(ranks, mpirun), *wrap, self.bin, "serve",
               *what, "--tier", f"{tmp}/t{{rank}}={tier_size}",
               "--staging", f"{tmp}/s{{rank}}={staging_size}", *extra]
        env = {**os.environ, **MPI_ENV, "GRANARY_RUNTIME_DIR": f"{tmp}/rt{{rank}}"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(list(map(str, cmd)), stdout=log, stderr=log, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + 180
        while not all((self.status(r).get("cluster") or {}).get("ready") for r in range(ranks)):
            assert self.proc.poll() is None, f"mpirun exited:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"not ready in time:\n{self.log.read_text()}"
            time.sleep(0.2)

    def env(self, r: int) -> dict:
        return {**os.environ, "GRANARY_RUNTIME_DIR": f"{self.tmp}/rt{r}"}

    def status(self, r: int) -> dict:
        p = subprocess.run([self.bin, "status", "--json"], capture_output=True, env=self.env(r),
                           timeout=60)
        return (json.loads(p.stdout or b"null") or {}) if p.returncode == 0 else {}

    def agent_pid(self, r: int) -> int:
        return int((self.tmp / f"rt{r}" / "agent.alive").read_text())

    def start_reader(self, r: int, root: pathlib.Path, every: int = 0, env=None, seed=None,
                     extra=()):
        """`granary run --attach` of the reader on rank r; its preload logs beside its stats
        (`gave_up` counts the waits for the agent it gave up)."""
        stats = self.tmp / f"stats-{r}-{time.monotonic_ns()}.json"
        env = {"GRANARY_LOG": f"debug:{stats}.preload.log", **(env or {})}
        cmd = [self.bin, "run", "--attach", "-q", "--stats-json", stats, "--", sys.executable,
               READER, root, "--seed", r if seed is None else seed, "--every", every, *extra]
        # Unbuffered: `first_progress` reads one line and `finish` the rest through the fd; a
        # buffered reader would keep what it read past that line (the final JSON) to itself.
        p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**self.env(r), **env}, bufsize=0)
        return p, stats

    def read_everywhere(self, root: pathlib.Path):
        """A reader on every rank at once; their final JSON and job reports, by rank."""
        started = [self.start_reader(r, root) for r in range(self.ranks)]
        return [finish(p, stats) for p, stats in started]

    def run(self, r: int, *cmd):
        return subprocess.run([self.bin, "run", "--attach", "-q", "--", *map(str, cmd)],
                              capture_output=True, env=self.env(r), timeout=300)

    def wait(self, pred, what: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"{what} not within {timeout} s"
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            subprocess.run([self.bin, "stop"], capture_output=True, env=self.env(0), timeout=180)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def first_progress(p, timeout=120) -> int:
    """The reader's first progress line (bounded: a reader that prints nothing fails the test)."""
    import select
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, "the reader printed no progress"
    return json.loads(p.stdout.readline())["progress"]


def finish(p, stats_path):
    """The reader's final JSON and its job report, with `gave_up` added to the report."""
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode(errors="replace")[-3000:]
    result = json.loads(out.decode().splitlines()[-1])
    stats = json.loads(pathlib.Path(stats_path).read_text()) if pathlib.Path(stats_path).exists() else None
    if stats is not None:
        stats["gave_up"] = gave_up(stats_path)
    return result, stats


def gave_up(stats_path) -> int:
    """Waits for its agent the reader's preload gave up (its log, `start_reader`). On a loaded
    machine an agent can miss its heartbeat (2 s) — with both cores busy all of its threads
    were seen waiting for a core for up to 3 s — and the program then reads the source (rule
    13: slower, never wrong): what a test may count on is that the program touches the source
    only after such a give-up, each logged."""
    log = pathlib.Path(f"{stats_path}.preload.log")
    if not log.exists():
        return 0
    return log.read_text(errors="replace").count("stopped waiting for the agent")


def fallbacks(statuses) -> int:
    """Files the ranks read from the source (or the pack) themselves because the owner was
    written off meanwhile: on a loaded machine a starved agent misses its peer timeout (1 s,
    then 1 s to answer an `Ask`) and is written off until heard from again (docs/cluster.md,
    "Faults"), a bounded wait that costs speed and a read of the file, never a wrong byte."""
    return sum(s["peers"][s["rank"]]["fallbacks"] for s in statuses)


def off_the_source(stats) -> None:
    """The program made no metadata call on the source, and opened it (a file of the tree, or
    of the pack extracted itself) only where a wait for its agent gave up."""
    io = stats["source_io"]
    assert io["metadata_calls"] == 0 and io["opens"] <= stats["gave_up"], (io, stats["gave_up"])
    if stats["gave_up"]:
        print(f"{stats['gave_up']} waits for the agent gave up (machine loaded): "
              f"{io['opens']} source opens, {io['bytes']} bytes")


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(*args, at=None, **kw):
        """A serving job; `at`: the directory (runtime, tiers) of an earlier one, reused."""
        c = Cluster(at or tmp_path / f"c{len(made)}", *args, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()


# A loop-mounted ext4 source (test_source_device's fixture): its device counts what is read.
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="a loop-mounted source needs root")


def tier_copies(c: Cluster, r: int):
    """Complete copies in rank r's own tier (its share; staging not included)."""
    return [p for p in (c.tmp / f"t{r}").glob("*/objects/*") if p.is_file() and "." not in p.name]


def tier_bytes(c: Cluster, r: int) -> int:
    return sum(p.stat().st_size for p in tier_copies(c, r))


def tier_count(c: Cluster, r: int) -> int:
    return len(tier_copies(c, r))


# ---------------------------------------------------------------------------------------------
# Tests

@needs_root
def test_every_rank_reads_everything_and_the_source_once(cluster, loop_source, tmp_path):
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data)
    small_files(data)
    expected = direct(data)
    files = [p for p in files_under(data)]
    nonempty = [p for p in files if p.stat().st_size > 0]
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    drop_caches()
    before = device_reads(dev)[1]
    c = cluster(data)
    results = c.read_everywhere(data)
    c.wait(lambda: all(sum(p["pending"] for p in c.status(r)["sources"]) == 0
                       for r in range(3)), "placement settled")
    pfs = (device_reads(dev)[1] - before) * 512
    statuses = [c.status(r)["cluster"] for r in range(3)]
    held = [tier_bytes(c, r) for r in range(3)]
    # Loaded, a rank written off for a moment: its files asked for meanwhile were read from the
    # source by the asking rank, and kept there (the shares below are then not exact).
    fb = fallbacks(statuses)
    for r, (got, stats) in enumerate(results):
        assert got["listing"] == expected["listing"], f"rank {r}: listing differs"
        assert got["sha256"] == expected["sha256"], f"rank {r}: bytes differ"
        # Every file came from this node's tiers; the program touched the source not once (but
        # after a wait for its agent gave up).
        off_the_source(stats)
        assert stats["cluster"] == {"rank": r, "ranks": 3}
        if fb:
            continue
        remote = stats["placement"]["remote_files"] / len(nonempty)
        assert abs(remote - 2 / 3) <= 0.05, f"rank {r}: {remote:.3f} of the reads remote"
        # Its share of the dataset, within one file.
        assert abs(held[r] - total / 3) <= largest, f"rank {r} holds {held[r]} of {total}"
    for r, (_, stats) in enumerate(results):
        print(f"rank {r}: remote {stats['placement']['remote_files']}/{len(nonempty)} files, "
              f"holds {held[r]} of {total} bytes (share {total / 3:.0f}, largest file {largest})")
    print(f"source device: {pfs} bytes read for {stored_bytes(data)} stored ({total} in files)")
    agent_pfs = sum(s["peers"][s["rank"]]["pfs_bytes"] for s in statuses)
    print(f"the agents read {agent_pfs} bytes of the source; {fb} files read again after a "
          "rank was written off (loaded)")
    assert total <= agent_pfs <= total + fb * largest, \
        f"the agents read {agent_pfs} bytes of the source for {total} ({fb} fallbacks)"
    programs = sum(stats["source_io"]["bytes"] for _, stats in results)
    assert pfs <= 1.01 * stored_bytes(data) + programs + fb * largest, \
        f"{pfs} bytes read from the source device"
    assert all(p["alive"] for p in statuses[0]["peers"])


def strace_count(prefix: pathlib.Path, source: pathlib.Path) -> int:
    """Calls naming the source (or a path under it) in every traced process."""
    needle = str(source)
    n = 0
    for f in prefix.parent.glob(prefix.name + ".*"):
        n += sum(1 for line in f.read_text(errors="replace").splitlines() if needle in line)
    return n


def test_source_metadata_calls_with_three_ranks_are_those_of_one(cluster, tmp_path):
    data = tmp_path / "pfs" / "data"
    small_files(data, n=240)
    fanstore(data, scale=4096)
    expected = direct(data)
    calls = {}
    for ranks in (1, 3):
        trace = tmp_path / f"strace-{ranks}" / "t"
        trace.parent.mkdir()
        c = cluster(data, ranks=ranks,
                    wrap=["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=%file",
                          "-ff", "-o", trace])
        logs = [trace.parent / f"preload-{r}.log" for r in range(ranks)]
        results = [finish(*c.start_reader(r, data, env={"GRANARY_LOG": f"debug:{logs[r]}"}))
                   for r in range(ranks)]
        for (got, stats), log in zip(results, logs):
            assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
            # After the start, no metadata call on the source from the programs: the catalog
            # answers them, however slow the agent.
            assert stats["source_io"]["metadata_calls"] == 0
            # Nor an open, but where a wait for the agent gave up (the preload logs each):
            # loaded, the strace-wrapped agent can miss its heartbeat (2 s) and the program
            # then reads the source (rule 13: slower, never wrong). Unloaded: none.
            gave_up = log.read_text(errors="replace").count("stopped waiting for the agent")
            assert stats["source_io"]["opens"] <= gave_up, (stats["source_io"], gave_up)
            if gave_up:
                print(f"{ranks} ranks: {gave_up} waits for the agent gave up (machine loaded)")
        c.stop()
        calls[ranks] = strace_count(trace, data)
    print(f"calls naming the source: 1 rank {calls[1]}, 3 ranks {calls[3]}")
    assert calls[1] > 0
    assert calls[3] <= 1.05 * calls[1], calls


@needs_root
@pytest.mark.parametrize("packed", [False, True], ids=["tree", "pack"])
def test_a_replicated_directory_is_on_every_rank_read_once(loop_source, cluster, packed):
    """With a pack, the directory is marked at packing (`granary pack --replicate`)."""
    dev, mnt = loop_source
    data = mnt / "data"
    for i in range(12):
        write(data, f"train/t{i:03d}", os.urandom(300_000))
    for i in range(48):
        write(data, f"val/a/v{i:03d}", os.urandom(256 << 10))
    for i in range(12):
        write(data, f"val/b/w{i:03d}", os.urandom(2 << 20))
    val = data / "val"
    expected = direct(val)
    # With a pack every rank streams its units at start, the training set's too: each byte of
    # the pack once.
    stored = stored_bytes(val)
    if packed:
        pack(data, mnt / "data.granary", "--replicate", "val/**")
        stored = stored_bytes(mnt / "data.granary")
    drop_caches()
    before = device_reads(dev)[1]
    if packed:
        c = cluster(data, pack=mnt / "data.granary")
    else:
        c = cluster(data, extra=["--replicate", "val/**"])
    c.wait(lambda: all(c.status(r)["cluster"]["copies_pending"] == 0 for r in range(3)),
           "copies of the replicated directory", timeout=120)
    results = c.read_everywhere(val)
    pfs = (device_reads(dev)[1] - before) * 512
    for r, (got, stats) in enumerate(results):
        assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
        assert stats["placement"]["remote_files"] == 0, f"rank {r} read remotely"
        off_the_source(stats)
        assert stats["files_served_from_tiers"] >= len(expected["sha256"]) - stats["gave_up"]
    print(f"replicated directory: {pfs} bytes read from the source device, {stored} stored")
    programs = sum(stats["source_io"]["bytes"] for _, stats in results)
    assert pfs <= 1.01 * stored + programs, f"{pfs} bytes read for {stored}"


def served_as(data: pathlib.Path, how: str) -> dict:
    """cluster() arguments serving `data` as `how`: the tree itself ("tree"), a pack of it
    beside the tree ("pack"), or the pack alone where the tree was ("pack-mount": the tree is
    moved away)."""
    if how == "tree":
        return {}
    packed = data.parent / "data.granary"
    pack(data, packed, "--partitions", "3")
    if how == "pack-mount":
        os.rename(data, data.parent / "gone")
    return {"pack": packed, "mount": how == "pack-mount"}


@pytest.mark.parametrize("how,mpirun", [("tree", []), ("tree", ["--enable-recovery"]),
                                        ("pack", []), ("pack-mount", ["--enable-recovery"])],
                         ids=["default", "recovery", "pack-default", "pack-mount-recovery"])
def test_a_rank_killed_mid_epoch_costs_no_reader(cluster, tmp_path, how, mpirun):
    if mpirun and hydra():
        pytest.skip("MPICH's Hydra ends the serving job when a rank dies, -disable-auto-cleanup "
                    "or not (every reader still byte-exact: the default variants)")
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    expected = direct(data)
    c = cluster(data, mpirun=mpirun, **served_as(data, how))
    readers = [c.start_reader(r, data, every=5) for r in range(3)]
    # Mid-epoch: every reader has attached and read some files, and none has finished (on a
    # loaded machine rank 1's reader could still be attaching when its agent died: with only
    # the pack, it then has nothing to run on; `granary run` says so and fails).
    assert all(first_progress(p) == 5 for p, _ in readers)
    os.kill(c.agent_pid(1), signal.SIGKILL)
    for r, (p, stats) in enumerate(readers):
        got, _ = finish(p, stats)
        assert got["sha256"] == expected["sha256"], f"rank {r}"
        assert got["listing"] == expected["listing"], f"rank {r}"
    if mpirun:
        # The job survived: the others wrote rank 1 off and still serve (a pack: they read its
        # units from the pack themselves and keep them).
        c.wait(lambda: not c.status(0)["cluster"]["peers"][1]["alive"], "rank 1 written off")
        got, stats = finish(*c.start_reader(2, data))
        assert got["sha256"] == expected["sha256"]
        if how != "tree":
            off_the_source(stats)


@needs_root
def test_a_dead_rank_costs_its_share_once_not_once_per_node(cluster, loop_source):
    """`mpirun --enable-recovery`, rank 1 killed mid-epoch: ranks 0 and 2 keep serving what their
    tiers hold, and rank 1's files are read from the source once for both of them, by their
    stand-in (the next live rank), not once by each node that wants them."""
    if hydra():
        pytest.skip("MPICH's Hydra ends the serving job when a rank dies")
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data, scale=512)
    expected = direct(data)
    files = files_under(data)
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    drop_caches()
    before = device_reads(dev)[1]
    c = cluster(data, mpirun=["--enable-recovery"], extra=["--peer-timeout", "500ms"])
    readers = {r: c.start_reader(r, data, every=5) for r in (0, 2)}
    assert all(first_progress(p) == 5 for p, _ in readers.values())
    # What rank 1 read before it died (stopped first, so the count is final): every byte it
    # read, of the source and anything else (its copies die with it: read again).
    dead = c.agent_pid(1)
    os.kill(dead, signal.SIGSTOP)
    dead_pfs = proc_read_bytes(dead)
    os.kill(dead, signal.SIGKILL)
    survivors_programs = 0
    for r, (p, stats_path) in readers.items():
        got, stats = finish(p, stats_path)
        assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"], r
        # Their files came from their own agents (but where a wait for it gave up, loaded).
        off_the_source(stats)
        survivors_programs += stats["source_io"]["bytes"]
    c.wait(lambda: settled_on(c, (0, 2)), "placement settled")
    st = c.status(0)["cluster"]
    assert not st["peers"][1]["alive"]
    agents = sum(c.status(r)["cluster"]["peers"][r]["pfs_bytes"] for r in (0, 2))
    pfs = (device_reads(dev)[1] - before) * 512
    print(f"survivors read {agents} bytes (agents) + {survivors_programs} (programs) of the source "
          f"for {total}; rank 1 had read {dead_pfs}; the device served {pfs} for "
          f"{stored_bytes(data)} stored")
    # Each byte once across the survivors (every node's copy of rank 1's files came from one
    # stand-in), but for the file each survivor was receiving from rank 1 when it died.
    assert agents <= total + 2 * largest, (agents, survivors_programs, total)
    # The device: the dataset once, what rank 1 had read again (its copies died with it), and
    # one file of slack (and what the programs read themselves, loaded). Without stand-ins
    # both survivors read the rest of rank 1's share (about a third of the dataset, ~40 MiB
    # here) from the source: far above.
    assert pfs <= 1.01 * stored_bytes(data) + dead_pfs + largest + survivors_programs, \
        (pfs, dead_pfs, survivors_programs)


@needs_root
def test_a_restarted_serve_reuses_every_rank_s_tiers(cluster, loop_source):
    """A serve stopped and started again on the same tiers: every rank keeps the copies it
    placed in the first (rank 0 through its saved catalog, the others through theirs, checked
    against the catalog rank 0 validated in this attach), so the second serve's agents read
    nothing from the source, and every reader on every rank gets every byte right — the bytes
    of a file changed in between included (rank 0's check voids it: it passes through, as on
    one node, and no rank serves its old copy)."""
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data)
    small_files(data, n=60)
    c = cluster(data)
    for r, (got, _) in enumerate(c.read_everywhere(data)):
        assert got["sha256"] == direct(data)["sha256"], r
    c.wait(lambda: settled(c), "placement settled")
    held = {r: sorted(p.name for p in tier_copies(c, r)) for r in range(3)}
    assert all(held.values()), held
    c.stop()
    # Changed while no serve ran, in place (same inode): a file rank 1 holds.
    by_content = {hashlib.sha256(p.read_bytes()).hexdigest(): p
                  for p in files_under(data) if p.stat().st_size > 0}
    victim = next(by_content[hashlib.sha256(p.read_bytes()).hexdigest()]
                  for p in tier_copies(c, 1)
                  if hashlib.sha256(p.read_bytes()).hexdigest() in by_content)
    victim.write_bytes(os.urandom(victim.stat().st_size))
    expected = direct(data)
    drop_caches()
    before = device_reads(dev)[1]
    c2 = cluster(data, at=c.tmp)
    agents_before = {r: c2.status(r)["cluster"]["peers"][r]["pfs_bytes"] for r in range(3)}
    programs, opens, given_up = 0, 0, 0
    for r, (got, stats) in enumerate(c2.read_everywhere(data)):
        assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"], r
        programs += stats["source_io"]["bytes"]
        opens += stats["source_io"]["opens"]
        given_up += stats["gave_up"]
    c2.wait(lambda: settled(c2), "placement settled")
    pfs = (device_reads(dev)[1] - before) * 512
    agents = {r: c2.status(r)["cluster"]["peers"][r]["pfs_bytes"] - agents_before[r]
              for r in range(3)}
    reused = {r: c2.status(r)["sources"][0]["catalog"]["reused_files"] for r in range(3)}
    size = victim.stat().st_size
    print(f"second serve: copies reused {reused} (held {[len(h) for h in held.values()]}); "
          f"agents read {agents} of the source, the programs {programs}; the device served "
          f"{pfs} bytes (the changed file: {size})")
    # Every rank reused its copies (but the changed one) …
    for r in range(3):
        assert reused[r] >= len(held[r]) - (r == 1), (r, reused, held)
    # … so no agent read the source again; the programs read only the changed file, which
    # passes through on every node (and, loaded, what they read after a wait for their agent
    # gave up).
    assert agents == {0: 0, 1: 0, 2: 0}, agents
    assert opens <= 3 + given_up, (opens, given_up)
    if not given_up:
        assert programs <= 3 * size, programs
    # The device: that file and rank 0's check of the catalog (inodes, directories).
    assert pfs <= size + (4 << 20) + (programs if given_up else 0), pfs


def proc_read_bytes(pid: int) -> int:
    """Every byte process `pid` has read so far (`rchar` of /proc/PID/io: read calls of any
    kind, so at least what it read from the source)."""
    for line in pathlib.Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no rchar for {pid}")


def settled_on(c: "Cluster", ranks) -> bool:
    return all(sum(s["pending"] for s in c.status(r)["sources"]) == 0 for r in ranks)


@pytest.mark.parametrize("how", ["tree", "pack", "pack-mount"])
def test_a_rank_stopped_mid_epoch_costs_no_reader(cluster, tmp_path, how):
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    expected = direct(data)
    c = cluster(data, extra=["--peer-timeout", "500ms"], **served_as(data, how))
    readers = [c.start_reader(r, data, every=5) for r in range(3)]
    # Every reader attached before the stop (see the kill test above).
    assert all(first_progress(p) == 5 for p, _ in readers)
    stopped = c.agent_pid(1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        for r, (p, stats) in enumerate(readers):
            got, _ = finish(p, stats)
            assert got["sha256"] == expected["sha256"], f"rank {r}"
            assert got["listing"] == expected["listing"], f"rank {r}"
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Back: heard from again, asked again.
    c.wait(lambda: c.status(0)["cluster"]["peers"][1]["alive"], "rank 1 heard from again")
    got, _ = finish(*c.start_reader(0, data))
    assert got["sha256"] == expected["sha256"]


class ThreadHeld:
    """One thread of a process held (ptrace), the process's other threads running on: to that
    process, a communication thread stuck in the MPI library."""

    def __init__(self, pid: int, name: str):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                     ctypes.c_void_p]
        tids = [int(t.name) for t in pathlib.Path(f"/proc/{pid}/task").iterdir()
                if (t / "comm").read_text().strip() == name]
        assert len(tids) == 1, (name, tids)
        self.tid = tids[0]
        for req in (0x4206, 0x4207):  # PTRACE_SEIZE, PTRACE_INTERRUPT
            assert self.libc.ptrace(req, self.tid, None, None) == 0, \
                os.strerror(ctypes.get_errno())
        os.waitpid(self.tid, 0x40000000)  # __WALL: it is stopped

    def release(self):
        if self.tid is not None:
            self.libc.ptrace(17, self.tid, None, None)  # PTRACE_DETACH: it runs on
            self.tid = None


def test_a_rank_whose_mpi_was_stuck_counts_on_its_peers_again(cluster, tmp_path):
    """Rank 0's communication thread held for 22 s (stuck in MPI as far as the rank can tell:
    its other threads run) while its program reads: its watch writes its predecessors off, every
    rank told (rank 2 at 4 s, rank 1 at 8 s); at 10 s it says MPI is stuck and writes every peer
    off by itself alone; the others write it off. Once the thread moves again it learns it was
    written off and announces a new life, its peers answer theirs, and it counts on them again:
    every byte right, and rank 0 served by its peers again."""
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    expected = direct(data)
    c = cluster(data, extra=["--peer-timeout", "8s"])
    held = ThreadHeld(c.agent_pid(0), "mpi")
    try:
        p, stats = c.start_reader(0, data, every=5)
        c.wait(lambda: (c.status(0)["cluster"].get("mpi_stuck_ms") or 0) > 0,
               "rank 0's MPI seen stuck", timeout=60)
        # Past the second timeout of the transfers asked for before the cut-off (16 s).
        time.sleep(12)
        cut = c.status(0)["cluster"]["peers"]
        assert not cut[1]["alive"] and not cut[2]["alive"], cut
    finally:
        held.release()
    got, _ = finish(p, stats)
    assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
    c.wait(lambda: all(c.status(r)["cluster"]["peers"][q]["alive"]
                       for r in range(3) for q in range(3)),
           "every rank counted on by every rank again", timeout=60)
    got, _ = finish(*c.start_reader(0, data))
    assert got["sha256"] == expected["sha256"]


@pytest.mark.parametrize("packed", [False, True], ids=["tree", "pack"])
def test_with_two_replicas_a_stopped_rank_costs_no_source_read(cluster, tmp_path, packed):
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    small_files(data, n=60)
    expected = direct(data)
    total = sum(p.stat().st_size for p in files_under(data))
    largest = max(p.stat().st_size for p in files_under(data))
    extra = {}
    if packed:
        pack(data, tmp_path / "pfs" / "data.granary")
        extra = {"pack": tmp_path / "pfs" / "data.granary"}
    c = cluster(data, extra=["--replicas", "2", "--peer-timeout", "500ms"], **extra)
    c.wait(lambda: all(c.status(r)["cluster"]["copies_pending"] == 0 for r in range(3)),
           "replicas copied", timeout=180)
    # Every rank placed its first-owner share from the source and copied its replicas.
    c.wait(lambda: all(sum(s["pending"] for s in c.status(r)["sources"]) == 0 for r in range(3)),
           "placement settled")
    for r in range(3):
        assert abs(tier_bytes(c, r) - 2 * total / 3) <= 2 * largest, r
    pfs_before = c.status(0)["cluster"]["peers"][0]["pfs_bytes"]
    stopped = c.agent_pid(1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        c.wait(lambda: not c.status(0)["cluster"]["peers"][1]["alive"], "rank 1 written off")
        got, stats = finish(*c.start_reader(0, data))
        assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
        # Rank 1's files came from their other owner, not from the source.
        assert stats["placement"]["remote_fallbacks"] == 0
        assert c.status(0)["cluster"]["peers"][0]["pfs_bytes"] == pfs_before
    finally:
        os.kill(stopped, signal.SIGCONT)


@pytest.mark.parametrize("packed", [False, True], ids=["tree", "pack"])
def test_a_write_on_one_rank_is_seen_on_every_rank(cluster, tmp_path, packed):
    data = tmp_path / "pfs" / "data"
    small_files(data, n=60)
    extra = {}
    if packed:
        pack(data, tmp_path / "pfs" / "data.granary")
        extra = {"pack": tmp_path / "pfs" / "data.granary"}
    c = cluster(data, **extra)
    for got, _ in c.read_everywhere(data):
        assert got["sha256"] == direct(data)["sha256"]
    victim = sorted(p for p in files_under(data) if p.stat().st_size > 0)[7]
    rel = str(victim.relative_to(data))
    new = b"written on rank 1\n" * 1000
    script = f"open({str(victim)!r}, 'wb').write({new!r}); open({str(victim.parent / 'added')!r}, 'wb').write(b'x')"
    p = c.run(1, sys.executable, "-c", script)
    assert p.returncode == 0, p.stderr
    for r in (0, 2):
        c.wait(lambda: c.status(r)["cluster"]["invalidations"] >= 2, f"rank {r} told")
        got, stats = finish(*c.start_reader(r, data))
        want = direct(data)
        assert got["sha256"][rel] == want["sha256"][rel]
        assert got["sha256"] == want["sha256"] and got["listing"] == want["listing"]


@needs_root
def test_a_dataset_larger_than_the_nodes_is_read_from_the_source_once(cluster, loop_source,
                                                                     tmp_path):
    """Each rank's tier holds a sixth of the dataset: half of it is held nowhere. The ranks
    read every file, the same files in the same order a step at a time (as the ranks of a
    model-parallel group do): a file held nowhere is still read from the source once, by its
    owner into its staging tier, and passed on to the others — not read by every node that
    wants it. Counted by the agents and the programs (what each read of the source) and by
    the source's device."""
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data)
    expected = direct(data)
    files = files_under(data)
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    stored = stored_bytes(data)
    drop_caches()
    before = device_reads(dev)[1]
    # Staging: room for a step of remote and staged copies (4 files of at most 8 MiB).
    c = cluster(data, tier_size=str(total // 6), staging_size="48M")
    group = tmp_path / "group"
    group.mkdir()
    readers = [c.start_reader(r, data, seed=7, extra=["--step", 4, "--barrier", group,
                                                      "--group", 3, "--member", r])
               for r in range(3)]
    programs = 0
    for r, (p, stats_path) in enumerate(readers):
        got, stats = finish(p, stats_path)
        assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"], r
        assert stats["placement"]["failures"] == 0, (r, stats["placement"])
        # Every file from this node's agent (but where a wait for it gave up, loaded).
        off_the_source(stats)
        programs += stats["source_io"]["bytes"]
    c.wait(lambda: settled(c), "placement settled")
    peers = [c.status(r)["cluster"]["peers"][r] for r in range(3)]
    agents = sum(p["pfs_bytes"] for p in peers)
    held = sum(p["bytes_held"] for p in peers)
    pfs = (device_reads(dev)[1] - before) * 512
    print(f"the nodes hold {held} bytes of {total}; the agents read {agents} bytes of the "
          f"source, the programs {programs}; the device served {pfs} for {stored} stored")
    assert held <= total // 2 + largest, held
    # Each byte read from the source once for the job, by the agents (and as the device counts
    # it, but for what the programs read themselves, loaded): a file held nowhere read by each
    # of the 3 nodes would make it twice the dataset.
    assert agents <= total + largest, (agents, programs, total)
    assert pfs <= 1.01 * stored + largest + programs, (pfs, stored, programs)


HOLDER = r"""
import hashlib, json, mmap, os, sys, time
root = sys.argv[1]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
sha = lambda b: hashlib.sha256(b).hexdigest()
# Copies this process keeps open (an fd, or only a mapping) while the staging tier drops and
# reuses copies around them.
held = [(p, open(p, "rb")) for p in files[:6]]
maps = []
for p in files[6:10]:
    with open(p, "rb") as f:
        maps.append((p, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)))
got = {}
for _ in range(3):
    time.sleep(0.3)  # older than the recycling age
    for p in files[10:]:
        with open(p, "rb") as f:
            got[p] = sha(f.read())
        time.sleep(0.02)
for p, f in held:
    got[p] = sha(f.read())
for p, m in maps:
    got[p] = sha(m[:])
for p in files:  # and each once more, through new opens
    with open(p, "rb") as f:
        assert sha(f.read()) == got[p], p
print(json.dumps({os.path.relpath(p, root): h for p, h in got.items()}))
"""


def test_a_staged_copy_a_program_holds_is_never_reused(cluster, tmp_path):
    """Dropped staging copies are reused (their pages, for the next copy) only when no process
    has them open: a program holding some by fd or by mapping reads its bytes intact while the
    staging tier, a few files large, drops and reuses every other copy several times over."""
    data = tmp_path / "pfs" / "data"
    rng = random.Random(13)
    for i in range(48):
        write(data, f"d/f{i:02d}", rng.randbytes(1 << 20))
    expected = direct(data)
    c = cluster(data, ranks=2, staging_size="6M")
    p = c.run(0, sys.executable, "-c", HOLDER, data)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    got = json.loads(p.stdout.decode().splitlines()[-1])
    assert got == expected["sha256"]
    st = c.status(0)
    assert st["cluster"]["staging_recycled"] > 0, st["cluster"]
    placement = st["sources"][0]["placement"]
    assert placement["remote_files"] > 24 and placement["failures"] == 0, placement


@pytest.mark.parametrize("how", ["direct", "mpi"])
def test_ranks_of_one_host_copy_each_other_s_files_directly(cluster, tmp_path, how):
    """Ranks on one host read each other's copies straight from the owner's mapping of them
    (tiers in memory; `cluster::direct`), each copy checked against the owner's checksum: every
    byte right, no MPI transfer. A copy changed in place behind its owner's back (its mapping
    shows the new bytes) is never served: that read goes the MPI way, and from there to the
    source. With `--no-direct` every copy comes over MPI."""
    data = tmp_path / "pfs" / "data"
    rng = random.Random(21)
    for i in range(30):
        write(data, f"d/f{i:02d}", rng.randbytes(rng.choice([1000, 130_000, 1 << 20, 5 << 20])))
    expected = direct(data)
    # The tiers in memory, as the warming pass maps only those (tmp_path is on a disk here).
    at = pathlib.Path(tempfile.mkdtemp(prefix="granary-test-direct-", dir="/dev/shm"))
    c = None
    try:
        c = cluster(data, ranks=2, at=at, extra=() if how == "direct" else ("--no-direct",))
        got, stats = finish(*c.start_reader(1, data))
        assert got["sha256"] == expected["sha256"]
        mine = tier_copies(c, 1)
        assert mine, "rank 1 holds nothing"
        if how == "direct":
            c.wait(lambda: c.status(0)["cluster"]["direct_known"] >= len(mine),
                   "rank 1's mappings announced to rank 0")
        # One of rank 1's copies changed in place, its size kept (the agent is not told).
        victim = max(mine, key=lambda q: q.stat().st_size)
        with open(victim, "r+b") as f:
            f.seek(100)
            f.write(b"\x00not the source's bytes\x00")
        got, stats = finish(*c.start_reader(0, data))
        assert got["listing"] == expected["listing"]
        assert got["sha256"] == expected["sha256"], "rank 0 read other bytes than the source's"
        st = c.status(0)["cluster"]
        print(f"{how}: rank 1 holds {len(mine)} copies; rank 0 read {st['direct_files']} "
              f"({st['direct_bytes']} bytes) directly, remote {stats['placement']['remote_files']}")
        if how == "direct":
            # Every copy of rank 1's but the changed one (and any rank 0 staged meanwhile).
            assert st["direct_files"] >= len(mine) - 1 - stats["gave_up"], st
            assert st["direct_files"] <= len(mine) - 1, "the changed copy was read directly"
        else:
            assert st["direct_files"] == 0 and st["direct_known"] == 0, st
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(at, ignore_errors=True)


def shared_read_only_maps(pid: int) -> set:
    """The files process `pid` maps shared and read-only (`/proc/PID/maps`)."""
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[1].startswith("r--s"):
                    out.add(parts[5].strip())
    except OSError:
        pass
    return out


@contextlib.contextmanager
def rank_1_s_copies_known_to_rank_0(cluster, data, prefix, staging_size):
    """Two ranks with tiers in memory (`/dev/shm`): rank 1 has read every file of `data` (its
    share placed in its tier, every byte right) and rank 0 has learned where at least half of
    its copies are. Yields the cluster, the tiers' directory, rank 1's copies and the direct
    reading of `data`; stops the ranks and removes the tiers after."""
    expected = direct(data)
    at = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    c = None
    try:
        c = cluster(data, ranks=2, at=at, staging_size=staging_size)
        got, _ = finish(*c.start_reader(1, data))
        assert got["sha256"] == expected["sha256"]
        mine = tier_copies(c, 1)
        c.wait(lambda: c.status(0)["cluster"]["direct_known"] >= len(mine) // 2,
               "rank 1's mappings announced to rank 0")
        yield c, at, mine, expected
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(at, ignore_errors=True)


def test_copies_removed_by_hand_from_a_rank_s_tier_never_make_another_file_a_mirror(
        cluster, tmp_path):
    """A careless user removes rank 1's copies from its tier (in memory) after rank 0 learned
    where they are; rank 1 places them again while rank 0 reads. Rank 1 closes the removed
    copies' descriptors and their numbers name other files (source files it copies from,
    staging files it reuses for smaller copies, which a mirror read would fault on once cut
    short): rank 0 maps nothing of rank 1's but its copies, and every byte is right on both.
    (Whether a number is reused before rank 0 reads is chance: the build before failed in each
    of 3 runs; `cluster::direct`'s unit test forces it.)"""
    data = tmp_path / "pfs" / "data"
    rng = random.Random(5)
    for i in range(60):
        write(data, f"d/f{i:03d}", rng.randbytes(rng.choice([130_000, 1 << 20, 3 << 20])))
    with rank_1_s_copies_known_to_rank_0(cluster, data, "granary-test-removed-", "8M") as (
            c, at, mine, expected):
        for p in mine:
            p.unlink()
        # Its warming pass (at least every 30 s) lets go of them: their descriptors are closed.
        c.wait(lambda: c.status(1)["cluster"]["maps_kept"] == 0, "rank 1 letting go of its copies",
               timeout=120)
        pid0 = c.agent_pid(0)
        seen, done = set(), threading.Event()

        def watch():
            while not done.is_set():
                seen.update(shared_read_only_maps(pid0))
                time.sleep(0.002)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            started = [c.start_reader(1, data, seed=3), c.start_reader(0, data, seed=4)]
            results = [finish(p, stats) for p, stats in started]
            results.append(finish(*c.start_reader(0, data, seed=6)))
        finally:
            done.set()
            watcher.join()
        for got, _ in results:
            assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
        # Rank 1's files other than its tier's copies (its staging, runtime) and the source's.
        others = sorted(m for m in seen
                        if m.startswith((f"{at}/s1/", f"{at}/rt1/", f"{data}/")))
        assert others == [], f"rank 0 mapped files of rank 1's that are not copies: {others}"
        assert all(os.path.exists(f"/proc/{c.agent_pid(r)}") for r in range(2))


def test_copies_cut_short_by_hand_in_their_owner_s_tier_cost_no_reader_a_byte(cluster, tmp_path):
    """docs/reliability.md, "Documented limits": a person cuts rank 1's copies (tiers in memory)
    short and writes them back, over and over, while rank 0 reads them. A rank reading such a
    copy through its mapping (the owner sending it over MPI, a mirror of it) faults and ends, and
    with OpenMPI's default every rank's agent with it; rank 0's programs go on from the source
    (or their staged copies) with every byte right, the later one without an agent at all."""
    data = tmp_path / "pfs" / "data"
    rng = random.Random(8)
    for i in range(24):
        write(data, f"d/f{i:02d}", rng.randbytes(rng.choice([8 << 20, 16 << 20])))
    with rank_1_s_copies_known_to_rank_0(cluster, data, "granary-test-cut-", "64M") as (
            c, _, mine, expected):
        done, cuts = threading.Event(), [0]

        def cut():
            while not done.is_set():
                for p in mine:
                    try:
                        with open(p, "r+b") as f:
                            whole = f.read()
                            os.ftruncate(f.fileno(), len(whole) // 2)
                            time.sleep(0.001)
                            f.seek(0)
                            f.write(whole)
                        cuts[0] += 1
                    except OSError:
                        pass
        cutter = threading.Thread(target=cut)
        cutter.start()
        try:
            for seed in (4, 5, 6, 7):
                got, _ = finish(*c.start_reader(0, data, seed=seed,
                                                env={"GRANARY_ATTACH_WAIT": "2"}))
                assert got["sha256"] == expected["sha256"], "rank 0 read other bytes"
                assert got["listing"] == expected["listing"]
        finally:
            done.set()
            cutter.join()
        print(f"{cuts[0]} cuts; serving job: {'running' if c.proc.poll() is None else 'ended'}")


@pytest.mark.parametrize("limit", ["1024:1024", "1024:"], ids=["hard", "soft"])
def test_a_low_open_file_limit_leaves_placement_its_descriptors(cluster, tmp_path, limit):
    """Each kept mapping of a rank's own copies (`cluster::maps`) and each mirror of another's
    (`cluster::direct`) holds a descriptor. Under an open-file limit of 1,024 (`ulimit -n`; soft:
    the common default under a higher hard limit, which the agent raises it to), with ~750 small
    copies per rank on tiers in memory, they leave placement its own: every copy is received and
    placed (no "Too many open files"), every job attaches, every byte right; the staging
    filler's free files hold at most a 32nd of the limit."""
    data = tmp_path / "pfs" / "data"
    rng = random.Random(31)
    for i in range(1500):
        write(data, f"d{i % 10}/f{i:04d}", rng.randbytes(rng.choice([2000, 20_000])))
    expected = direct(data)
    at = pathlib.Path(tempfile.mkdtemp(prefix="granary-test-nofile-", dir="/dev/shm"))
    c = None
    try:
        c = cluster(data, ranks=2, at=at, staging_size="16M",
                    wrap=("prlimit", f"--nofile={limit}", "--"))
        for r in (1, 0, 0):
            p, stats_path = c.start_reader(r, data)
            got, stats = finish(p, stats_path)
            assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
            assert not stats["disabled"], f"rank {r}'s job ran without granary: {stats}"
        for r in range(2):
            st = c.status(r)
            placement = st["sources"][0]["placement"]
            pid = c.agent_pid(r)
            fds = []
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    fds.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
            free = sum("/.tmp-free-" in f for f in fds)
            soft = next(int(l.split()[3]) for l in open(f"/proc/{pid}/limits")
                        if l.startswith("Max open files"))
            print(f"rank {r}: {st['cluster']['maps_kept']} mappings kept, {len(fds)} descriptors "
                  f"({free} free staging files) of {soft}, {placement}")
            assert placement["failures"] == 0, placement
            # The staging filler's free files hold a descriptor each: a share of the limit.
            assert free <= soft // 32, f"{free} free staging files open under a limit of {soft}"
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(at, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Packs (`granary serve --pack`): rank 0 reads the index, each rank streams its units of the pack

def pack(src: pathlib.Path, out: pathlib.Path, *args) -> None:
    p = subprocess.run([granary_bin(), "pack", str(src), str(out), "-q", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def unit(total: int, ranks: int) -> int:
    """The most a rank's share of a pack may be off by: one unit (cluster/ownership.rs), at
    least 8 MiB, or the largest file."""
    return max(total // (ranks * 16), 8 << 20)


def settled(c: Cluster) -> bool:
    return all(sum(s["pending"] for s in c.status(r)["sources"]) == 0 for r in range(c.ranks))


@needs_root
@pytest.mark.parametrize("ranks", [1, 3])
def test_a_pack_is_read_on_every_rank_each_of_its_bytes_once(loop_source, cluster, ranks):
    # (loop_source first: torn down after the serve, which holds the partitions open, stops.)
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data)
    small_files(data)
    packed = mnt / "data.granary"
    pack(data, packed, "--partitions", "2")
    expected = direct(data)
    files = files_under(data)
    nonempty = [p for p in files if p.stat().st_size > 0]
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    drop_caches()
    before = device_reads(dev)[1]
    c = cluster(data, ranks=ranks, pack=packed)
    results = c.read_everywhere(data)
    c.wait(lambda: settled(c), "placement settled")
    pfs = (device_reads(dev)[1] - before) * 512
    statuses = [c.status(r)["cluster"] for r in range(ranks)]
    held = [tier_bytes(c, r) for r in range(ranks)]
    # Loaded, a rank written off for a moment: its files asked for meanwhile were read from the
    # pack by the asking rank, and kept there (the shares below are then not exact).
    fb = fallbacks(statuses)
    for r, (got, stats) in enumerate(results):
        assert got["listing"] == expected["listing"], f"rank {r}: listing differs"
        assert got["sha256"] == expected["sha256"], f"rank {r}: bytes differ"
        # Every file from this node's tiers; the program touched the tree not once (but after
        # a wait for its agent gave up, loaded).
        off_the_source(stats)
        assert stats["files_served_from_tiers"] >= len(files) - stats["gave_up"], stats
        assert stats["cluster"] == {"rank": r, "ranks": ranks}
        if fb:
            continue
        # Whatever this rank does not hold came from the rank that does, none from the pack.
        mine = tier_count(c, r) - (len(files) - len(nonempty))
        # (A file whose wait gave up, loaded, the program extracted itself.)
        assert len(nonempty) - mine - stats["gave_up"] <= stats["placement"]["remote_files"] \
            <= len(nonempty) - mine, (r, stats["placement"], stats["gave_up"])
        assert abs(held[r] - total / ranks) <= max(unit(total, ranks), largest), \
            f"rank {r} holds {held[r]} of {total}"
        print(f"rank {r}: holds {held[r]} of {total} bytes (share {total / ranks:.0f}), "
              f"{stats['placement']['remote_files']} of {len(nonempty)} files from other ranks")
    stored = stored_bytes(packed)
    agent_pfs = sum(s["peers"][s["rank"]]["pfs_bytes"] for s in statuses)
    print(f"source device: {pfs} bytes read for a pack of {stored} stored ({total} in files); "
          f"the agents read {agent_pfs}")
    # Each byte of every partition (and the index) read once for the job, not once per rank
    # (but for the files read again after a rank was written off, loaded).
    print(f"{fb} files read again after a rank was written off (loaded)")
    assert total <= agent_pfs <= 1.01 * total + fb * largest, agent_pfs
    programs = sum(stats["source_io"]["bytes"] for _, stats in results)
    assert pfs <= 1.01 * stored + programs + fb * largest, \
        f"{pfs} bytes read from the source device for {stored}"


def test_a_pack_costs_the_tree_one_rank_s_calls_and_the_programs_none(cluster, tmp_path):
    """strace of the serving ranks (every call naming the tree) and of each rank's program: the
    tree is checked per directory once for the job, by rank 0; the programs name it only in
    their own opens of the directories they list (real directory fds, preload rule 16)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    data = tmp_path / "pfs" / "data"
    small_files(data, n=240)
    fanstore(data, scale=4096)
    packed = tmp_path / "pfs" / "data.granary"
    pack(data, packed)
    expected = direct(data)
    dirs = sum(1 for p in data.rglob("*") if p.is_dir()) + 1
    calls = {}
    for ranks in (1, 3):
        trace = tmp_path / f"strace-{ranks}" / "t"
        trace.parent.mkdir()
        c = cluster(data, ranks=ranks, pack=packed,
                    wrap=["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=%file",
                          "-ff", "-o", trace])
        for r in range(ranks):
            log = tmp_path / f"strace-{ranks}" / f"program-{r}.log"
            stats_path = tmp_path / f"strace-{ranks}" / f"stats-{r}.json"
            p = subprocess.run(
                ["strace", "-f", "-qq", "-s", "4096", "-e", "trace=%file", "-o", log,
                 c.bin, "run", "--attach", "-q", "--stats-json", stats_path, "--",
                 sys.executable, READER, data, "--seed", str(r)],
                capture_output=True, timeout=600,
                env={**c.env(r), "GRANARY_LOG": f"debug:{stats_path}.preload.log"})
            assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
            got = json.loads(p.stdout.decode().splitlines()[-1])
            assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
            lines = log.read_text(errors="replace").splitlines()
            start = next(i for i, l in enumerate(lines) if f'execve("{sys.executable}"' in l)
            after = [l for l in lines[start + 1:] if f'"{data}"' in l or f'"{data}/' in l]
            dir_opens = [l for l in after if "openat(" in l and "O_DIRECTORY" in l]
            # But for an open of a file after a wait for the agent gave up (loaded, `gave_up`).
            others = [l for l in after if l not in dir_opens]
            given_up = gave_up(stats_path)
            assert all("openat(" in l for l in others), others[:20]
            assert len(others) <= given_up, (others[:20], given_up)
            assert len(dir_opens) <= 2 * dirs, dir_opens
            stats = json.loads(stats_path.read_text())
            stats["gave_up"] = given_up
            off_the_source(stats)
        c.stop()
        lines = [l for f in trace.parent.glob("t.*") for l in f.read_text(errors="replace").splitlines()]
        calls[ranks] = sum(1 for l in lines if f'"{data}"' in l or f'"{data}/' in l)
        index = [l for l in lines if f'"{packed}/index"' in l and "open" in l and "= -1" not in l]
        assert len(index) == 1, index
    print(f"calls naming the tree: 1 rank {calls[1]}, 3 ranks {calls[3]} ({dirs} directories)")
    assert calls[1] > 0
    assert calls[3] <= 1.05 * calls[1], calls


def test_a_pack_alone_is_served_where_the_tree_was(cluster, tmp_path):
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    small_files(data, n=60)
    packed = tmp_path / "pfs" / "data.granary"
    pack(data, packed, "--compress", "zstd:1")
    expected = direct(data)
    files = files_under(data)
    os.rename(data, tmp_path / "pfs" / "gone")
    c = cluster(data, pack=packed, mount=True)
    for r, (got, stats) in enumerate(c.read_everywhere(data)):
        assert got["listing"] == expected["listing"], f"rank {r}"
        assert got["sha256"] == expected["sha256"], f"rank {r}"
        # Every file from this node's tiers (a copy from its owner, or, loaded, one this rank
        # extracted from the pack itself while the owner was written off: `fallbacks`).
        off_the_source(stats)
        assert stats["files_served_from_tiers"] >= len(files) - stats["gave_up"], stats
    assert c.status(1)["cluster"]["mount"] is True


def test_a_pack_larger_than_the_nodes_is_read_from_its_partitions(cluster, tmp_path):
    """Only the pack exists and the ranks hold a third of it: a file nobody can hold is
    extracted from its partition by the program itself (by its offset, checked)."""
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    packed = tmp_path / "pfs" / "data.granary"
    pack(data, packed, "--partitions", "2")
    expected = direct(data)
    total = sum(p.stat().st_size for p in files_under(data))
    os.rename(data, tmp_path / "pfs" / "gone")
    c = cluster(data, tier_size=str(total // 9), staging_size="16M", pack=packed, mount=True)
    extracted = 0
    for r, (got, stats) in enumerate(c.read_everywhere(data)):
        assert got["sha256"] == expected["sha256"], f"rank {r}"
        assert got["listing"] == expected["listing"], f"rank {r}"
        assert stats["placement"]["failures"] == 0
        extracted += stats["source_io"]["opens"]
    assert extracted > 0, "every file was held somewhere: the test is broken"
    st = c.status(0)["cluster"]
    assert sum(p["bytes_held"] for p in st["peers"]) <= total // 3 + (16 << 20)


@pytest.mark.parametrize("mode", ["source", "mount"])
def test_a_damaged_file_of_a_pack_is_never_served_on_any_rank(cluster, tmp_path, mode):
    data = tmp_path / "pfs" / "data"
    small_files(data, n=60)
    victim = max(files_under(data), key=lambda p: p.stat().st_size)
    rel = str(victim.relative_to(data))
    packed = tmp_path / "pfs" / "data.granary"
    pack(data, packed)
    part = packed / "part-00000"
    blob = part.read_bytes()
    at = blob.index(victim.read_bytes()) + 777
    with open(part, "r+b") as f:
        f.seek(at)
        f.write(bytes([blob[at] ^ 0x5A]))
    expected = direct(data)
    if mode == "mount":
        os.rename(data, tmp_path / "pfs" / "gone")
    c = cluster(data, pack=packed, mount=mode == "mount")
    for r in range(3):
        p = c.run(r, sys.executable, "-c", f"open({str(data / rel)!r}, 'rb').read()")
        if mode == "mount":
            # Nothing else to read it from: the open fails, on every rank, never wrong bytes.
            assert p.returncode != 0 and b"Errno 5" in p.stderr, p.stderr
        else:
            assert p.returncode == 0, p.stderr
    if mode == "mount":
        return
    for r, (got, stats) in enumerate(c.read_everywhere(data)):
        assert got["sha256"] == expected["sha256"], f"rank {r}"
        # The damaged file from the tree, everything else from the tiers.
        assert stats["source_io"]["opens"] == 1, stats["source_io"]


def test_serve_refuses_what_it_cannot_do(tmp_path):
    g = granary_bin()
    src = ["--source", str(tmp_path)]
    for args, msg in [([*src, "--pack", "/x"], "pack /x: no index"),
                      ([*src, "--replicate", "a["], "bad --replicate"),
                      ([*src, "--replicas", "0"], "--replicas must be at least 1"),
                      (["--mount", str(tmp_path / "m")], "--pack <PACK>"),
                      ([*src, "--pack", str(tmp_path), "--mount", "/m"], "cannot be used with"),
                      (["--pack", str(tmp_path), "--mount", "/"], "--mount /")]:
        p = subprocess.run([g, "serve", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)


def test_attach_without_a_serving_agent_runs_the_program_without_granary(tmp_path):
    """It waits for the node's agent first (bounded: --attach-wait, GRANARY_ATTACH_WAIT)."""
    env = {**os.environ, "GRANARY_RUNTIME_DIR": str(tmp_path / "rt"), "GRANARY_ATTACH_WAIT": "1s"}
    for flags, waits in [([], True), (["--attach-wait", "0"], False)]:
        p = subprocess.run([granary_bin(), "run", "--attach", *flags, "--", "sh", "-c", "exit 7"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 7
        assert "no granary agent runs on this node" in p.stderr
        assert ("waiting for this node's granary agent" in p.stderr) == waits, p.stderr
    p = subprocess.run([granary_bin(), "run", "--attach", "--attach-wait", "soon", "--", "true"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "bad --attach-wait `soon`" in p.stderr, p.stderr


def test_an_attach_started_before_its_rank_waits_for_it(tmp_path):
    """`granary run --attach` started before the serving job: it waits until its node's rank
    has started, then the program reads everything through granary."""
    data = tmp_path / "pfs" / "data"
    small_files(data, n=40)
    expected = direct(data)
    rt = tmp_path / "c" / "rt1"
    rt.parent.mkdir()
    stats = tmp_path / "stats.json"
    reader = subprocess.Popen(
        [granary_bin(), "run", "--attach", "-q", "--stats-json", stats, "--", sys.executable,
         READER, data], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "GRANARY_RUNTIME_DIR": str(rt), "GRANARY_ATTACH_WAIT": "600s",
             "GRANARY_LOG": f"debug:{stats}.preload.log"})
    first = reader.stderr.readline().decode()
    assert "waiting for this node's granary agent" in first, first
    c = Cluster(tmp_path / "c", data, ranks=2)
    try:
        got, st = finish(reader, stats)
    finally:
        c.stop()
    assert got["sha256"] == expected["sha256"] and got["listing"] == expected["listing"]
    assert st["disabled"] is False and st["cluster"] == {"rank": 1, "ranks": 2}, st
    off_the_source(st)


def cpus_of_threads(pid: int, prefix: str) -> list:
    """The CPUs each thread of `pid` whose name starts with `prefix` may run on."""
    out = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread may end between the listing and the read (a connection's)
            if not (task / "comm").read_text().strip().startswith(prefix):
                continue
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue
        line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
        out.append(line.split(":", 1)[1].strip())
    return out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("keep", [False, True], ids=["default", "keep-binding"])
def test_the_serving_agent_is_not_held_to_the_launchers_binding(cluster, tmp_path, keep):
    """OpenMPI binds each of two ranks to one core: every thread of a node's agent on it, and a
    program woken on that core waited for them (docs/cluster.md, "The agent's CPUs"). The agent
    runs on every CPU the test may use; with --keep-binding, where the launcher put it."""
    data = tmp_path / "pfs" / "data"
    small_files(data, n=20)
    c = cluster(data, ranks=2, extra=["--keep-binding"] if keep else [])
    ours = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    for r in range(2):
        fetchers = cpus_of_threads(c.agent_pid(r), "fetch-")
        assert fetchers, "no fetcher threads"
        bound = {f for f in fetchers if f != ours and "-" not in f}
        if keep and not hydra():
            # OpenMPI's default for two ranks: one core each.
            assert bound and len(set(fetchers)) == 1, fetchers
        elif not keep:
            assert not bound and all(len(cpus(f)) == len(os.sched_getaffinity(0))
                                     for f in fetchers), fetchers


def cpus(spec: str) -> set:
    """A Cpus_allowed_list ("0-3,8") as a set of CPU numbers."""
    out = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def test_a_batch_log_shows_each_rank_staging_its_share(cluster, tmp_path, monkeypatch):
    """mpirun's output is a file, as in a Slurm job: rank 0's walk and each rank's share are
    reported while they move (a rank places its share as the programs first read it), then that
    each rank holds its share, with the count its status gives."""
    data = tmp_path / "pfs" / "data"
    small_files(data, n=600)
    monkeypatch.setenv("GRANARY_PROGRESS_EVERY", "1ms")
    c = cluster(data, ranks=2)
    expected = direct(data)
    for got, _ in c.read_everywhere(data):
        assert got["sha256"] == expected["sha256"]
    done = {r: f"granary serve: rank {r}: holds its share, " for r in range(2)}
    c.wait(lambda: all(d in c.log.read_text() for d in done.values()),
           f"both ranks' shares in {c.log}", timeout=180)
    text = c.log.read_text()
    assert "granary serve: rank 0: catalogued " in text and "600 files, " in text, text
    for r in range(2):
        owned = c.status(r)["cluster"]["files_owned"]
        assert f"{done[r]}{owned} files (" in text, text
        assert f"granary serve: rank {r}: holds " in text.split(done[r])[0], text
    # Every non-empty file is some rank's (an empty one is every rank's, owned by none).
    empty = sum(1 for p in data.rglob("*") if p.is_file() and p.stat().st_size == 0)
    assert empty > 0 and sum(c.status(r)["cluster"]["files_owned"] for r in range(2)) == 600 - empty
