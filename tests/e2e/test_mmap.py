"""Programs that read through `mmap` (issue 11, docs/placement.md "Mappings"): every kind of
program that handles its own faults or hands mapped pages to the kernel reads a file that is
partly local exactly as without granary; a mapping of a file being fetched is usable before the
copy is; the agent reads ahead of a reader where it is, every pass, and losing the agent loses
nothing; read-only LMDB environments never open the source's lock file, and a writer appearing
mid-job leaves every reader correct.

The partly local file is the interesting one: granary maps the chunks a tier holds over the
source's mapping, so one mapping of the program is several in the kernel's eyes.
"""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, Granary
from probes import direct, run_job, wait_for
from test_source_device import device_reads, drop_caches, loop_source  # noqa: F401 (fixture)

MAPPER = [sys.executable, str(CLIENTS / "mapper.py")]
MIB = 1 << 20
SIZE = 24 * MIB


def config(tmp_path, **mmap) -> pathlib.Path:
    """An agent configuration: debug log (read-ahead windows are logged), small read-ahead
    windows so small files show several."""
    lines = ["[agent]", 'log_level = "debug"', "[mmap]"]
    lines += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {str(v).lower()}"
              for k, v in mmap.items()]
    p = tmp_path / "granary.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture
def own(tmp_path):
    """An agent of this test's own (its configuration and log are the test's)."""
    (tmp_path / "own").mkdir()
    g = Granary(tmp_path / "own")
    yield g
    g.stop()


def evict(path):
    """Drops a file's pages from the page cache (what a cold PFS client has)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def agent_log(g: Granary) -> str:
    p = g.runtime / "agent.log"
    return p.read_text(errors="replace") if p.exists() else ""


def windows(g: Granary):
    """Every read-ahead window the agent logged: (start, end, reader position)."""
    return [tuple(map(int, m)) for m in re.findall(
        r"mmap read-ahead of entry \d+: \[(\d+), (\d+)\) for a reader at (\d+)", agent_log(g))]


@pytest.fixture
def partly_cached(own, tmp_path):
    """A 24 MiB file of which a tier holds the first half in chunks: a first job read it, the
    agent kept what fits (chunks from the start)."""
    src = tmp_path / "pfs"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(SIZE))
    tier = tmp_path / "tier"
    first, _ = run_job(own, src, ["cat", src / "big.bin"], tier, tier_size="13M")
    assert first.returncode == 0, first.stderr
    own.settle(src)
    chunks = list(tier.rglob("*.chunks"))
    assert chunks and chunks[0].stat().st_blocks * 512 >= 8 * MIB, "the tier kept no chunks"
    return src, tier


KINDS = {
    "scan": lambda p: [*MAPPER, "scan", p],
    "faulthandler": lambda p: [sys.executable, "-X", "faulthandler", CLIENTS / "mapper.py",
                               "scan", p],
    "syscalls": lambda p: [*MAPPER, "syscalls", p],
    "fork": lambda p: [*MAPPER, "fork", p],
    "threads": lambda p: [*MAPPER, "threads", p],
    "memcalls": lambda p: [*MAPPER, "memcalls", p],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_program_kinds_read_a_partly_cached_file_as_without_granary(own, partly_cached, kind):
    src, tier = partly_cached
    cmd = KINDS[kind](src / "big.bin")
    want = direct(cmd)
    assert want.returncode == 0, want.stderr
    got, _ = run_job(own, src, cmd, tier, tier_size="13M")
    assert got.returncode == 0, got.stderr.decode(errors="replace")
    assert json.loads(got.stdout) == json.loads(want.stdout)


def test_the_split_mapping_is_the_chunk_file_over_the_source(own, partly_cached):
    src, tier = partly_cached
    probe = ("import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
             "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); "
             "print(sum('.chunks' in l for l in open('/proc/self/maps')), "
             "sum(l.rstrip().endswith('big.bin') for l in open('/proc/self/maps')))")
    got, _ = run_job(own, src, [sys.executable, "-c", probe, src / "big.bin"], tier,
                     tier_size="13M")
    chunk_vmas, source_vmas = map(int, got.stdout.split())
    assert chunk_vmas >= 1 and source_vmas >= 1, got.stdout


def test_a_null_dereference_dies_as_without_granary(own, partly_cached):
    src, tier = partly_cached
    for fh in ([], ["-X", "faulthandler"]):
        cmd = [sys.executable, *fh, CLIENTS / "mapper.py", "segv", src / "big.bin"]
        want = direct(cmd)
        got, _ = run_job(own, src, cmd, tier, tier_size="13M")
        assert want.returncode == -signal.SIGSEGV
        assert got.returncode == 128 + signal.SIGSEGV, got.stderr  # granary run's 128 + signal
        assert got.stdout == want.stdout
        said = b"Fatal Python error: Segmentation fault"
        assert (said in got.stderr) == (said in want.stderr) == bool(fh)


@pytest.mark.skipif(shutil.which("cc") is None, reason="the test command installs gcc")
def test_a_program_with_its_own_segv_handler(own, partly_cached, tmp_path):
    src, tier = partly_cached
    exe = tmp_path / "segv_handler"
    subprocess.run(["cc", "-O2", "-o", exe, CLIENTS / "segv_handler.c"], check=True)
    want = direct([exe, src / "big.bin"])
    got, _ = run_job(own, src, [exe, src / "big.bin"], tier, tier_size="13M")
    assert want.returncode == got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(want.stdout)
    assert json.loads(got.stdout)["null_faults"] > 0


@pytest.mark.skipif(shutil.which("java") is None, reason="no JVM installed")
def test_a_jvm_reading_a_mapped_byte_buffer(own, partly_cached):
    src, tier = partly_cached
    cmd = ["java", CLIENTS / "MapReader.java", src / "big.bin"]
    want = direct(cmd, timeout=300)
    got, _ = run_job(own, src, cmd, tier, tier_size="13M", timeout=300)
    assert want.returncode == got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    assert json.loads(got.stdout) == json.loads(want.stdout)


@pytest.fixture
def uncached(own, tmp_path):
    """A 32 MiB file no tier has room for (every page comes from the source), and an agent that
    reads ahead in 4 MiB windows once a reader has read 1 MiB."""
    src = tmp_path / "pfs"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(32 * MIB))
    cfg = config(tmp_path, distance="1M", size="4M")
    return src, tmp_path / "tier", ("--config", str(cfg))


def test_a_reader_starting_mid_file_is_read_ahead_from_where_it_is(own, uncached):
    src, tier, extra = uncached
    cmd = [*MAPPER, "scan", src / "big.bin", "--start", str(16 * MIB), "--step", str(256 << 10)]
    want = direct(cmd)
    evict(src / "big.bin")
    got, stats = run_job(own, src, cmd, tier, tier_size="1M", extra=extra)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    w = windows(own)
    assert w, agent_log(own)[-3000:]
    assert all(start >= 16 * MIB for start, _, _ in w), w
    assert stats["mmap"]["source_bytes"] > 0, stats["mmap"]


def test_the_next_pass_is_read_ahead_again(own, uncached):
    src, tier, extra = uncached
    cmd = [*MAPPER, "scan", src / "big.bin", "--epochs", "2", "--drop", "--step", str(256 << 10),
           "--pace", "0.005"]
    want = direct(cmd)
    evict(src / "big.bin")
    got, _ = run_job(own, src, cmd, tier, tier_size="1M", extra=extra)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    # Each pass was followed from its start: a window near the top of the file per pass.
    starts = [s for s, _, _ in windows(own) if s < 8 * MIB]
    assert len(starts) >= 2, windows(own)


def test_kill_9_of_the_agent_during_read_ahead(own, uncached, tmp_path):
    src, tier, extra = uncached
    marker = tmp_path / "mapped"
    cmd = [*MAPPER, "scan", src / "big.bin", "--step", str(256 << 10), "--pace", "0.02",
           "--marker", marker]
    want = direct([*MAPPER, "scan", src / "big.bin", "--step", str(256 << 10)])
    args = [own.bin, "run", "--source", src, "--tier", f"{tier}=1M", "-q", *extra, "--", *cmd]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=own.env, start_new_session=True)
    try:
        wait_for(lambda: windows(own) or proc.poll() is not None, "a read-ahead window")
        assert proc.poll() is None, proc.communicate()
        for pid in own.agent_pids():
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert out == want.stdout


# -- LMDB ---------------------------------------------------------------------------------------

def lmdb_env(tmp_path, n=200, shuffled=False, src=None):
    pytest.importorskip("lmdb", reason="the test command installs the python lmdb binding")
    src = src or tmp_path / "pfs"
    src.mkdir()
    subprocess.run([sys.executable, CLIENTS / "lmdb_reader.py", "make", src / "db", str(n),
                    *(["shuffled"] if shuffled else [])], check=True)
    return src


def test_a_cursor_over_an_lmdb_in_random_key_order_is_read_ahead_in_key_order(tmp_path,
                                                                             loop_source):
    """An LMDB written in random key order: a cursor reads its values' pages in an order that
    jumps around the file, which the follower, in file order, takes for scattered reads (the
    program faults every value itself). With the record index (`lmdb_index`, the default) the
    agent follows the cursor in key order and reads ahead of it. On a loop device whose
    read-ahead is a PFS client's 128 KiB: the kernel reads that much around a fault (this
    machine's disk, 8 MiB, reads the whole file for the program in a few faults)."""
    dev, mnt = loop_source
    pathlib.Path(f"/sys/block/{os.path.basename(dev)}/queue/read_ahead_kb").write_text("128\n")
    src = lmdb_env(tmp_path, n=400, shuffled=True, src=mnt / "pfs")
    data = src / "db" / "data.mdb"
    cmd = [sys.executable, CLIENTS / "lmdb_reader.py", "read", src / "db", "nolock", "0.01"]
    faulted = {}
    for index in (False, True):
        (tmp_path / f"agent-{index}").mkdir()
        g = Granary(tmp_path / f"agent-{index}")
        try:
            cfg = config(tmp_path / f"agent-{index}", distance="1M", size="4M",
                         lmdb_index=index)
            evict(data)
            got, stats = run_job(g, src, cmd, tmp_path / f"tier-{index}", tier_size="1M",
                                 extra=("--config", str(cfg)))
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout) == {"records": 400, "bad": 0}
            m = stats["mmap"]
            assert m["source_bytes"] > data.stat().st_size // 2, m
            faulted[index] = m["faulted_bytes"]
            followed = "followed in key order" in agent_log(g)
            assert followed == index, agent_log(g)[-3000:]
            if index:
                assert m["read_ahead_bytes"] > data.stat().st_size // 2, m
        finally:
            g.stop()
    # Without the index the program faulted most of the file itself; with it, about one
    # distance before the first window, and what it outran.
    assert faulted[False] > data.stat().st_size // 2, faulted
    assert faulted[True] < faulted[False] // 3, faulted


def test_read_only_lmdb_readers_never_open_the_source_lock_file(own, tmp_path):
    src = lmdb_env(tmp_path)
    lock = src / "db" / "lock.mdb"
    before = (lock.stat().st_mtime_ns, lock.read_bytes())
    trace = tmp_path / "trace"
    # Three readers at once, each with the reader lock, traced from inside the job.
    script = ("import subprocess, sys\n"
              "ps = [subprocess.Popen([sys.executable, sys.argv[1], 'read', sys.argv[2], 'lock'],"
              " stdout=subprocess.PIPE) for _ in range(3)]\n"
              "print([p.communicate()[0].decode().strip() for p in ps])\n"
              "sys.exit(max(p.returncode for p in ps))\n")
    cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace,
           sys.executable, "-c", script, CLIENTS / "lmdb_reader.py", src / "db"]
    if shutil.which("strace") is None:
        pytest.skip("the test command installs strace")
    tier = tmp_path / "tier"
    for job in range(2):  # the data file fetched, then placed
        got, stats = run_job(own, src, cmd, tier)
        assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
        assert all(json.loads(r)["bad"] == 0 for r in eval(got.stdout)), got.stdout
        opens = [line for line in trace.read_text().splitlines() if "lock.mdb" in line]
        assert opens == [], opens
        # Counted through the request ring, a hint (a producer stalled by strace for a second
        # may see its request skipped): at least one.
        assert stats["mmap"]["lmdb_local_locks"] >= 1, stats["mmap"]
        own.settle(src)
    assert (lock.stat().st_mtime_ns, lock.read_bytes()) == before


WRITER_JOB = r"""
import json, subprocess, sys, time
import lmdb
db, sync = sys.argv[1], sys.argv[2]
def reader(tag, lock):
    return subprocess.Popen([sys.executable, sys.argv[3], tag, db, sync, lock],
                            stdout=subprocess.PIPE)
early = reader("early", "lock")
while True:  # the early reader holds its snapshot open
    try:
        open(sync + "/early-ready").close()
        break
    except FileNotFoundError:
        time.sleep(0.02)
env = lmdb.open(db, map_size=1 << 30)  # a writer appears
with env.begin(write=True) as txn:
    for i in range(1000, 1040):
        txn.put(f"{i:08d}".encode(), bytes([i % 251]) * (4000 + i))
    txn.put(b"00000003", b"rewritten")
env.close()
open(sync + "/written", "w").close()
late = reader("late", "lock")
print(json.dumps({"early": json.loads(early.communicate()[0]),
                  "late": json.loads(late.communicate()[0])}, sort_keys=True))
sys.exit(early.returncode or late.returncode)
"""

WRITER_READER = r"""
import hashlib, json, os, sys, time
import lmdb
tag, db, sync, lock = sys.argv[1:5]
env = lmdb.open(db, readonly=True, lock=lock == "lock")
h = hashlib.sha256()
n = 0
with env.begin() as txn:
    if tag == "early":
        open(sync + "/early-ready", "w").close()
        while not os.path.exists(sync + "/written"):
            time.sleep(0.02)
    for k, v in txn.cursor():  # the snapshot taken when the transaction began
        h.update(k + v)
        n += 1
print(json.dumps({"records": n, "digest": h.hexdigest()}))
"""


def test_lmdb_with_a_writer_appearing_mid_job(own, tmp_path):
    """A reader holds a read transaction (the reader lock), a writer of the same job commits,
    a later reader opens the environment: each sees what it sees without granary, and the
    source ends up exactly as without granary."""
    base = lmdb_env(tmp_path, n=300)
    (tmp_path / "scripts").mkdir()
    job = tmp_path / "scripts" / "job.py"
    rd = tmp_path / "scripts" / "reader.py"
    job.write_text(WRITER_JOB)
    rd.write_text(WRITER_READER)

    def run(where, through_granary, tier=None):
        sync = where / "sync"
        shutil.rmtree(sync, ignore_errors=True)
        sync.mkdir(parents=True)
        cmd = [sys.executable, job, where / "db", sync, rd]
        if through_granary:
            got, stats = run_job(own, where, cmd, tier)
            return got, stats
        return direct(cmd), None

    twin = tmp_path / "twin"
    subprocess.run(["cp", "-a", base, twin], check=True)
    want, _ = run(twin, False)
    assert want.returncode == 0, want.stderr
    tier = tmp_path / "tier"
    # A first job places data.mdb: the second one's early reader maps the copy.
    warm, _ = run_job(own, base, [sys.executable, CLIENTS / "lmdb_reader.py", "read",
                                  base / "db", "lock"], tier)
    assert warm.returncode == 0, warm.stderr
    own.settle(base)
    got, stats = run(base, True, tier)
    assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    assert json.loads(got.stdout) == json.loads(want.stdout)
    # The writer's commits reached the source as they do without granary.
    (tmp_path / "written").touch()
    a = direct([sys.executable, rd, "late", base / "db", tmp_path, "nolock"])
    b = direct([sys.executable, rd, "late", twin / "db", tmp_path, "nolock"])
    assert a.stdout == b.stdout and a.returncode == 0


# -- a file being fetched ------------------------------------------------------------------------

from test_waits import BLKIO, throttle  # noqa: E402,F401


@pytest.mark.skipif(os.getuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists(),
                    reason="needs root and the cgroup-v1 blkio controller")
def test_a_mapping_of_a_file_being_fetched_is_usable_at_once(own, loop_source, throttle,
                                                               tmp_path):
    """The agent's reads crawl (1.5 MiB/s: the 48 MiB copy would take half a minute); the program
    maps the file and reads all of it meanwhile: it never waits for the copy, gets the source's
    bytes, and the source device delivers each byte once (the agent's copy shares the program's
    pages)."""
    dev, mnt = loop_source
    src = mnt / "data"
    src.mkdir()
    size = 48 * MIB
    (src / "big.bin").write_bytes(os.urandom(size))
    want = direct([*MAPPER, "scan", src / "big.bin"])
    tier = tmp_path / "tier"
    started, _ = run_job(own, src, ["true"], tier)
    assert started.returncode == 0, started.stderr
    [agent] = own.agent_pids()
    throttle(agent, dev, 3 << 19)
    drop_caches()
    # The file's last MiB, mapped and read first: the copy (from the start) is far from it.
    tail = [*MAPPER, "scan", src / "big.bin", "--start", str(size - MIB)]
    got, _ = run_job(own, src, tail, tier, timeout=300)
    pending = [s.get("pending") for s in (own.status() or {}).get("sources", [])]
    assert got.returncode == 0, got.stderr
    assert got.stdout == direct(tail).stdout
    # The program is done while the copy is still being made: it did not wait for it.
    assert any(p for p in pending), pending
    # All of it, with the copy still in progress (and nothing of it in the page cache).
    drop_caches()
    before = device_reads(dev)
    cmd = [*MAPPER, "scan", src / "big.bin"]
    got, _ = run_job(own, src, cmd, tier, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    throttle(None, dev, 0)
    own.settle(src, timeout=300)
    after = device_reads(dev)
    # (Another program dropping the page cache meanwhile — `echo 3 > drop_caches` on a shared
    # machine — makes this count higher: what the reader had cached is then read again.)
    sectors = after[1] - before[1]
    assert sectors * 512 <= 1.01 * size + (1 << 20), f"{sectors * 512} bytes read for {size}"
    # The next job maps the complete copy.
    again, stats = run_job(own, src, cmd, tier)
    assert again.stdout == want.stdout
    assert stats["files_served_from_tiers"] >= 1, stats


MAP_EACH = r"""
import hashlib, mmap, os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)  # the open starts the fetch; the mapping follows at once
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    print(os.path.basename(p), hashlib.sha256(m).hexdigest())
    m.close()
    os.close(fd)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (a loop device)")
def test_mid_size_files_mapped_while_fetched_are_read_once(own, loop_source, tmp_path):
    """Files past one readahead window and up to 1 MiB are fetched whole in one direct read,
    which shares no pages with a mapping of the source. A program that maps each file the moment
    it opened it (the fetch just started) waits for the copy instead, gets the source's bytes,
    and the device delivers each byte once (mapping the source, its faults and the agent's
    read would each read it)."""
    dev, mnt = loop_source
    pathlib.Path(f"/sys/block/{os.path.basename(dev)}/queue/read_ahead_kb").write_text("128\n")
    src = mnt / "data"
    src.mkdir()
    files = []
    for i in range(24):
        p = src / f"s{i:02}.npz"
        p.write_bytes(os.urandom(700_000 + 977 * i))
        files.append(p)
    cmd = [sys.executable, "-c", MAP_EACH, *files]
    want = direct(cmd)
    assert want.returncode == 0, want.stderr
    for p in files:
        evict(p)
    before = device_reads(dev)
    got, stats = run_job(own, src, cmd, tmp_path / "tier", env={"GRANARY_LOG": "debug"})
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    own.settle(src)
    after = device_reads(dev)
    data = sum(p.stat().st_size for p in files)
    device = (after[1] - before[1]) * 512
    assert data <= device <= data + (1 << 20), f"{device} bytes read for {data}"
    # Every mapping was of the copy: opened from the tier (placed ahead of its open), or opened
    # on the source and mapped from the copy (the open counted on the source, as each open is
    # counted once where it went).
    log = got.stderr.decode(errors="replace")
    copies = log.count("open from tier: ") + log.count("mapped from the complete copy: ")
    assert copies == len(files), log[-3000:]
    assert stats["files_served_from_tiers"] + stats["source_io"]["opens"] == len(files), stats


SCATTERED = r"""
import hashlib, mmap, os, random, sys, time
path, dev, rec = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
order = list(range(len(m) // rec))
random.Random(7).shuffle(order)
h = hashlib.sha256()
for i in order:
    h.update(m[i * rec:(i + 1) * rec])  # one record, front to back, as Arrow rows are read
    time.sleep(0.004)
# Sectors the source device had delivered when the pass ended (the agent's copy goes on after).
print(h.hexdigest(), open(f"/sys/block/{os.path.basename(dev)}/stat").read().split()[2])
"""
MEMCG = pathlib.Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memcg():
    """A memory cgroup of `cap` bytes: `memcg(cap)` gives a command prefix that starts what
    follows inside it (page cache included: the mapped file does not fit)."""
    group = MEMCG / f"granary-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()

    def prefix(cap):
        (group / "memory.limit_in_bytes").write_text(f"{cap}\n")
        return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"]
    yield prefix
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), "the cgroup to empty")
    group.rmdir()


@pytest.mark.skipif(os.getuid() != 0 or not (MEMCG / "memory.limit_in_bytes").exists(),
                    reason="needs root and the cgroup-v1 memory controller")
def test_scattered_records_of_a_mapping_that_does_not_fit_are_not_read_for(own, loop_source,
                                                                              memcg, tmp_path):
    """A shuffled pass over 100 KB records of a mapped 128 MiB file under a 64 MiB memory cap
    (a shuffled Arrow reader whose shards do not fit): the program faults its records itself,
    as without granary, and the whole-file fetch does not read where it just read — under the
    cap those pieces were evicted before it came back, each a request of the source's for
    nothing (before: 93.5 of the 128 MiB read so during the pass, the source device 1.55 x
    direct). Every byte right; the copy is made once the reader stops."""
    dev, mnt = loop_source
    pathlib.Path(f"/sys/block/{os.path.basename(dev)}/queue/read_ahead_kb").write_text("128\n")
    src = mnt / "data"
    src.mkdir()
    size = 128 * MIB
    (src / "shard.arrow").write_bytes(os.urandom(size))
    cmd = [sys.executable, "-c", SCATTERED, src / "shard.arrow", dev, 100_000]
    cap = memcg(64 * MIB)

    def sectors_of_a_pass(run):
        drop_caches()
        before = device_reads(dev)[1]
        out = run()
        assert out.returncode == 0, out.stderr
        digest, at_end = out.stdout.split()
        return digest, (int(at_end) - before) * 512

    want, direct_bytes = sectors_of_a_pass(lambda: direct([*cap, *cmd]))
    jobs = []
    got, granary_bytes = sectors_of_a_pass(
        lambda: jobs.append(run_job(own, src, cmd, tmp_path / "tier", wrap=cap, timeout=300))
        or jobs[0][0])
    own.stop()
    assert got == want
    # The job's stats are taken when the program ends: what the agent read during the pass.
    # It may read its first pieces (in sequence, before the follower saw the mapping) and where
    # the reader was first seen, before its records showed it scattered: 19-24 MB measured here
    # (93.5 MB without the rule).
    agent = jobs[0][1]["placement"]["agent_source_bytes"]
    assert agent <= size // 3, (agent, granary_bytes, direct_bytes)


SEQ_FLAGS = r"""
import hashlib, json, mmap, os, sys
def vmas():
    # Every file-backed VMA of this process: its first line -> its VmFlags.
    out, cur = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
                cur = line if head[4] != "0" else None
            elif cur and line.startswith("VmFlags:"):
                out[cur] = line.split()[1:]
    return out
got = {}
for spec in sys.argv[1:]:
    name, mode, path = spec.split(":", 2)
    fd = os.open(path, os.O_RDONLY)
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if mode == "rw" else 0)
    before = vmas()
    m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=prot)
    # The mapping's VMAs (of the source, of tier files over it, or of a copy): those new.
    new = [v for k, v in vmas().items() if k not in before]
    digest = hashlib.sha256(m).hexdigest()  # every byte, as the program reads it
    got[name] = {"sr": [("sr" in v) for v in new], "sha256": digest}
    m.close()
    os.close(fd)
print(json.dumps(got, sort_keys=True))
"""


def test_sequential_advice_only_on_followed_read_only_mappings_that_are_not_lmdb(own, tmp_path):
    """The preload advises `MADV_SEQUENTIAL` (VmFlags `sr`, "sequential read advice") on a read-only mapping of a file
    the agent follows (large, not complete locally), so a fault reads ahead from the faulting
    page (a shuffled Arrow reader: half the requests), and on nothing else: not on an LMDB data
    file (its branch pages lose their recency at reclaim under that advice), not on a mapping
    that can write, not on a file too small to follow, not on a complete local copy."""
    src = lmdb_env(tmp_path, n=200)  # ~20 MB of values: a followed LMDB data file
    (src / "shards").mkdir()
    (src / "shards" / "a.arrow").write_bytes(os.urandom(SIZE))
    (src / "shards" / "b.arrow").write_bytes(os.urandom(SIZE))
    (src / "small.bin").write_bytes(os.urandom(64 << 10))
    script = tmp_path / "seq_flags.py"
    script.write_text(SEQ_FLAGS)
    cmd = [sys.executable, script, f"arrow:r:{src}/shards/a.arrow",
           f"arrow_rw:rw:{src}/shards/b.arrow", f"lmdb:r:{src}/db/data.mdb",
           f"small:r:{src}/small.bin"]
    want = direct(cmd)
    assert want.returncode == 0, want.stderr
    want = json.loads(want.stdout)
    assert not any(any(v["sr"]) for v in want.values()), want  # nothing advises without granary
    for p in (src / "shards" / "a.arrow", src / "shards" / "b.arrow", src / "db" / "data.mdb"):
        evict(p)
    tier = tmp_path / "tier"
    # No tier room for the large files: each mapping is of the source, followed.
    got, stats = run_job(own, src, cmd, tier, tier_size="1M")
    assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    got = json.loads(got.stdout)
    assert {k: v["sha256"] for k, v in got.items()} == {k: v["sha256"] for k, v in want.items()}
    assert stats["mmap"]["source_bytes"] > 0, stats["mmap"]  # the agent followed them
    assert got["arrow"]["sr"] and all(got["arrow"]["sr"]), got
    assert got["arrow_rw"]["sr"] and not any(got["arrow_rw"]["sr"]), got
    assert got["lmdb"]["sr"] and not any(got["lmdb"]["sr"]), got
    assert got["small"]["sr"] == [False], got
    # A complete copy in the tier: mapped from the copy, not advised.
    cmd_placed = [sys.executable, script, f"arrow:r:{src}/shards/a.arrow"]
    first, _ = run_job(own, src, ["cat", src / "shards" / "a.arrow"], tier, tier_size="1G")
    assert first.returncode == 0, first.stderr
    own.settle(src)
    placed, _ = run_job(own, src, cmd_placed, tier, tier_size="1G")
    assert placed.returncode == 0, placed.stderr.decode(errors="replace")[-2000:]
    placed = json.loads(placed.stdout)
    assert placed["arrow"]["sha256"] == want["arrow"]["sha256"]
    assert placed["arrow"]["sr"] and not any(placed["arrow"]["sr"]), placed


def test_sequential_advice_off_in_the_configuration_advises_nothing(own, tmp_path):
    """`[mmap] sequential_advice = false` in the agent's configuration: the mapping the advice is
    for (read-only, of a followed file that is not LMDB) gets none (no VmFlags `sr`), while the
    agent still follows it and every byte is the source's."""
    src = tmp_path / "pfs"
    (src / "shards").mkdir(parents=True)
    (src / "shards" / "a.arrow").write_bytes(os.urandom(SIZE))
    script = tmp_path / "seq_flags.py"
    script.write_text(SEQ_FLAGS)
    cmd = [sys.executable, script, f"arrow:r:{src}/shards/a.arrow"]
    want = direct(cmd)
    assert want.returncode == 0, want.stderr
    want = json.loads(want.stdout)
    evict(src / "shards" / "a.arrow")
    cfg = config(tmp_path, sequential_advice=False)
    got, stats = run_job(own, src, cmd, tmp_path / "tier", tier_size="1M",
                         extra=("--config", str(cfg)))
    assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    got = json.loads(got.stdout)
    assert got["arrow"]["sha256"] == want["arrow"]["sha256"]
    assert stats["mmap"]["source_bytes"] > 0, stats["mmap"]  # followed all the same
    assert got["arrow"]["sr"] and not any(got["arrow"]["sr"]), got
    assert "sequential advice off" in agent_log(own)
