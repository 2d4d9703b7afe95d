"""The issue's acceptance check, on a real block device: once a dataset is placed, a second run
makes no read of the source device at all (counted by the kernel in /sys/block/loopN/stat, not by
granary), with the page cache dropped so nothing can come from RAM by accident."""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, direct, make_dataset, source_opens

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="loop devices and drop_caches need root")


def sh(*cmd):
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True).stdout.strip()


def device_reads(dev: str):
    fields = pathlib.Path(f"/sys/block/{os.path.basename(dev)}/stat").read_text().split()
    return int(fields[0]), int(fields[2])  # read requests, sectors read


def drop_caches():
    os.sync()
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")


def unmount(mnt):
    """A process of a failed test may still hold the mount for a moment: retry for a while, then
    detach it lazily, so a loop mount never outlives the test (and its image never fills /tmp)."""
    deadline = time.monotonic() + 10
    while subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "-l", mnt], check=False)
            return
        time.sleep(0.2)


@pytest.fixture
def loop_source(tmp_path):
    image = tmp_path / "pfs.img"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(256 << 20)
    sh("mkfs.ext4", "-q", "-F", image)
    dev = sh("losetup", "-f", "--show", "--direct-io=on", image)
    try:
        sh("mount", dev, mnt)
        try:
            yield dev, mnt
        finally:
            unmount(mnt)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def two_epochs(granary, dev, source, tmp_path):
    """The loader's two epochs of `source` (3 fork workers) under `granary run`, the agent
    settled and the page cache dropped between them: the loader's stdout and the source
    device's reads before and after epoch 2.

    Both counts are taken while the job runs (the loader waits after each epoch): once its last
    job has ended the agent holds the source's inodes (`[catalog] pin_inodes`), and those
    `openat`s read back from the device the inodes the drop above let go. Counted after `granary
    run` returned, the first came 5–21 ms later: a test process woken later than that on a busy
    machine counted them as epoch 2's."""
    sync = tmp_path / "sync"
    sync.mkdir()
    drop_caches()
    cmd = [granary.bin, "run", "--source", source, "--tier", f"{tmp_path / 'tier'}=1G", "--",
           sys.executable, CLIENTS / "loader.py", source, "--epochs", "2", "--workers", "3",
           "--sync-dir", sync]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=granary.env)

    def epoch_done(k):
        while not (sync / f"done-{k}").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)

    try:
        epoch_done(0)
        granary.settle(source)
        drop_caches()  # nothing of the source may come from RAM in epoch 2
        before = device_reads(dev)
        (sync / "go-0").touch()
        epoch_done(1)
        after = device_reads(dev)
        (sync / "go-1").touch()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode(errors="replace")
    return out, before, after


def test_second_epoch_reads_nothing_from_the_source_device(granary, loop_source, tmp_path):
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=8, per_class=50, mean_size=110_000, records=2,
                          record_size=8 << 20)
    out, before, after = two_epochs(granary, dev, source, tmp_path)
    assert [json.loads(l)["epoch"] for l in out.decode().splitlines()] == [0, 1]
    assert after == before, f"epoch 2 read the source device: {before} -> {after}"


def test_second_run_reads_nothing_from_the_source_device(granary, loop_source, tmp_path):
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=8, per_class=50, mean_size=110_000, records=2,
                          record_size=8 << 20)
    tier = tmp_path / "tier"
    cmd = [sys.executable, CLIENTS / "loader.py", source, "--epochs", "1", "--workers", "3"]
    drop_caches()
    before_first = device_reads(dev)
    granary.run(source, cmd, tier=tier)
    granary.settle(source)
    after_first = device_reads(dev)
    assert after_first[1] > before_first[1], "the first run must have read the device"

    granary.stop()  # a new agent and a new job: the catalog and the placed files are reused
    drop_caches()
    before = device_reads(dev)
    cmd[cmd.index("--epochs") + 1] = "2"
    proc, stats = granary.run(source, cmd, tier=tier)
    after = device_reads(dev)
    assert [json.loads(l)["epoch"] for l in proc.stdout.decode().splitlines()] == [0, 1]
    assert source_opens(stats) == 0, stats
    # The new agent walks the source again to validate (metadata only); file data: none.
    # ext4 metadata reads (inode tables, directories) are allowed, data reads are not: the
    # dataset is ~60 MB, so any data read would show up as thousands of sectors.
    sectors = after[1] - before[1]
    assert sectors < 2048, f"second run read {sectors} sectors from {dev}; stats {stats}"


LISTERS = {
    "ls -lR": lambda s: ["ls", "-lR", s],
    "find -ls": lambda s: ["find", s, "-ls"],
    "du": lambda s: ["du", "-a", s],
}


def listings(run, source):
    """Each lister's output over `source` as `run(cmd)` gives it, lines sorted (`find` prints a
    directory in the order it lists it: the source's order directly, the catalog's through
    granary)."""
    out = {}
    for name, cmd in LISTERS.items():
        proc = run(cmd(str(source)))
        assert proc.returncode == 0, (name, proc.stderr)
        out[name] = sorted(proc.stdout.decode(errors="replace").splitlines())
    return out


def wait_held(granary, source, files, timeout=120):
    """Waits until the agent holds the source's inodes (it takes them in the background, at idle
    priority, once the last job detached)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in granary.status().get("sources", []):
            if os.path.realpath(s["source"]) == os.path.realpath(source) \
                    and s.get("held_files", 0) >= files:
                return s
        time.sleep(0.1)
    raise AssertionError(f"the agent did not hold {source}'s inodes in {timeout}s: {granary.status()}")


def lister_job(source):
    """One program running every lister, its outputs separated by a marker line."""
    parts = [" ".join(cmd('"$1"')) + f"; echo ::{name}" for name, cmd in LISTERS.items()]
    return ["sh", "-c", "; ".join(parts), "sh", source]


def split_job_output(stdout: bytes):
    out, lines = {}, []
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith("::") and line[2:] in LISTERS:
            out[line[2:]] = sorted(lines)
            lines = []
        else:
            lines.append(line)
    return out


def test_a_later_jobs_listings_read_nothing_from_the_source_device(granary, loop_source, tmp_path):
    """`ls -lR`, `find -ls` and `du` of the dataset in a job after the first, with the kernel's
    caches dropped between the jobs, answer exactly as without granary and make no read of the
    source device: the attach's check of every entry against the source, the listings' own
    calls (`ls -l` asks for every file's ACL and security label) and the directory opens find
    what they need in the kernel's cache, whose inodes the agent holds while no job runs."""
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=8, per_class=50, mean_size=20_000, records=1,
                          record_size=1 << 20)
    files = sum(len(f) for _, _, f in os.walk(source))
    # Job 1 catalogs the source; when it ends the agent holds the inodes.
    granary.run(source, ["true"], tier=tmp_path / "tier")
    wait_held(granary, source, files)
    drop_caches()
    before = device_reads(dev)
    proc, _ = granary.run(source, lister_job(source), tier=tmp_path / "tier")
    after = device_reads(dev)
    through_granary = split_job_output(proc.stdout)
    expected = listings(lambda cmd: direct(cmd), source)
    assert through_granary == expected
    assert after == before, f"a later job's listings read the source device: {before} -> {after}"


def test_changes_behind_held_inodes_are_seen(granary, loop_source, tmp_path):
    """While the agent holds the source's inodes between jobs, a file rewritten in place, one
    renamed, one removed and one added are still seen by the next job: its listings match the
    source's and the rewritten file's bytes are the new ones."""
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=4, per_class=20, mean_size=20_000, records=1,
                          record_size=1 << 20)
    files = sum(len(f) for _, _, f in os.walk(source))
    tier = tmp_path / "tier"
    cat_all = ["sh", "-c", "find \"$1\" -type f -exec cat {} + > /dev/null", "sh", source]
    granary.run(source, cat_all, tier=tier)
    granary.settle(source)
    wait_held(granary, source, files)
    classes = sorted(p for p in source.iterdir() if p.is_dir() and not p.is_symlink())
    victims = sorted(p for p in classes[0].iterdir() if p.is_file() and not p.is_symlink())
    rewritten, renamed, removed = victims[:3]
    with open(rewritten, "r+b") as f:  # same inode, same size: only ctime/mtime tell
        f.write(b"rewritten behind the agent's back")
    os.rename(renamed, renamed.with_name(renamed.name + ".moved"))
    os.unlink(removed)
    (classes[1] / "added.bin").write_bytes(b"new file")
    drop_caches()
    proc, _ = granary.run(source, lister_job(source), tier=tier)
    assert split_job_output(proc.stdout) == listings(lambda cmd: direct(cmd), source)
    proc, _ = granary.run(source, ["cat", rewritten], tier=tier)
    assert proc.stdout == rewritten.read_bytes()
    assert proc.stdout.startswith(b"rewritten behind the agent's back")
