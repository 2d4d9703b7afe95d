"""Whatever goes wrong inside granary, the program gets the source's answer: same bytes, same
errno, same exit status."""
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, direct, make_dataset, source_opens, tier_files

LOADER = [sys.executable, str(CLIENTS / "loader.py")]


def test_exit_status_is_the_programs(granary, dataset, tier):
    for code in (0, 1, 3, 42):
        proc, _ = granary.run(dataset, ["sh", "-c", f"exit {code}"], tier=tier, check=False)
        assert proc.returncode == code
    proc, _ = granary.run(dataset, ["sh", "-c", "kill -TERM $$"], tier=tier, check=False)
    assert proc.returncode == 128 + signal.SIGTERM


def test_missing_file_and_permission_denied_errno(granary, tmp_path_factory):
    # Run as an unprivileged user: root would bypass the permission check.
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to switch to an unprivileged user")
    base = pathlib.Path("/tmp") / f"granary-errno-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    (base / "src" / "d").mkdir(parents=True)
    base.chmod(0o755)
    (base / "src").chmod(0o755)
    (base / "src" / "d").chmod(0o755)
    (base / "src" / "d" / "secret").write_bytes(b"root only")
    (base / "src" / "d" / "secret").chmod(0o600)
    (base / "src" / "d" / "public").write_bytes(b"anyone")
    (base / "src" / "d" / "public").chmod(0o644)
    (base / "tier").mkdir()
    os.chown(base / "tier", 65534, 65534)
    (base / "rt").mkdir(mode=0o700)
    os.chown(base / "rt", 65534, 65534)
    rt_env = {"GRANARY_RUNTIME_DIR": str(base / "rt")}
    paths = [base / "src" / "d" / n for n in ("secret", "public", "missing")]
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    # cat and stat report errno as text ("Permission denied"): the same text means the same errno.
    probes = [["cat", p] for p in paths] + [["stat", "-c", "%s %a", p] for p in paths]
    try:
        for probe in probes:
            want = direct([*as_nobody, *probe])
            cmd = [*as_nobody, granary.bin, "run", "--source", base / "src", "--tier",
                   f"{base / 'tier'}=64M", "-q", "--", *probe]
            for _ in range(2):
                got = direct(cmd, env=rt_env)
                program_err = b"".join(l for l in got.stderr.splitlines(True) if not l.startswith(b"granary: "))
                assert (got.returncode, got.stdout, program_err) == (want.returncode, want.stdout, want.stderr)
        assert b"Permission denied" in direct([*as_nobody, "cat", paths[0]]).stderr
        assert b"No such file" in direct([*as_nobody, "cat", paths[2]]).stderr
        # The agent of that user must not have cached what the user cannot read.
        objects = [p for p in (base / "tier").rglob("*") if p.is_file() and p.read_bytes() == b"root only"]
        assert objects == []
    finally:
        direct([*as_nobody, granary.bin, "stop"], env=rt_env)
        shutil.rmtree(base, ignore_errors=True)


def test_agent_killed_mid_epoch(granary, dataset, tier, tmp_path):
    marker = tmp_path / "half"
    cmd = [granary.bin, "run", "--source", dataset, "--tier", f"{tier}=1G", "--",
           *LOADER, dataset, "--epochs", "2", "--workers", "2", "--delay", "0.02", "--marker", marker]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=granary.env)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids = granary.agent_pids()
        assert pids, "no agent process found while a job runs"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode(errors="replace")
    assert [json.loads(l)["epoch"] for l in out.decode().splitlines()] == [0, 1]
    # The next job finds the stale socket, starts a new agent and still reads correct bytes.
    again, stats = granary.run(dataset, [*LOADER, dataset, "--epochs", "1"], tier=tier)
    assert again.returncode == 0
    assert granary.agent_pids(), "no agent was started again"


def test_full_tier_passes_through(granary, dataset, tier):
    cmd = [*LOADER, dataset, "--epochs", "2", "--workers", "2"]
    granary.run(dataset, cmd, tier=tier, tier_size="64K")
    granary.settle(dataset)
    _, stats = granary.run(dataset, cmd, tier=tier, tier_size="64K")
    assert source_opens(stats) > 0, "a 64 KiB tier cannot hold the dataset"
    used = sum(p.stat().st_size for p in tier.rglob("*") if p.is_file() and "objects" in p.parts)
    assert used <= 64 << 10


def test_unwritable_tier_passes_through(granary, dataset, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the tier directory should be")
    proc, _ = granary.run(dataset, [*LOADER, dataset, "--epochs", "1"], tier=blocker / "tier")
    assert proc.returncode == 0


def test_damaged_cache_file_is_never_served(granary, dataset, tier):
    cmd = [*LOADER, dataset, "--epochs", "1", "--workers", "2"]
    granary.run(dataset, cmd, tier=tier)
    granary.settle(dataset)
    objects = [p for p in tier.rglob("*") if p.is_file() and "objects" in p.parts and p.stat().st_size > 10]
    assert objects
    for p in objects[: len(objects) // 2]:
        with open(p, "r+b") as f:
            f.truncate(p.stat().st_size // 2)
    granary.run(dataset, cmd, tier=tier)  # the loader checks every byte


def test_disable_turns_interception_off(granary, dataset, tier):
    cmd = [*LOADER, dataset, "--epochs", "1"]
    granary.run(dataset, cmd, tier=tier)
    granary.settle(dataset)
    proc, stats = granary.run(dataset, cmd, tier=tier, env={"GRANARY_DISABLE": "1"})
    assert proc.returncode == 0
    assert stats is None or tier_files(stats) == 0


def test_write_passes_through_and_invalidates(granary, dataset, tier):
    rel = "train/class000/img00000.jpg"
    path = dataset / rel
    granary.run(dataset, ["cat", path], tier=tier)
    granary.settle(dataset)
    script = ("import os,sys\np=sys.argv[1]\nold=open(p,'rb').read()\n"
              "with open(p,'r+b') as f: f.write(b'NEW!')\n"
              "new=open(p,'rb').read()\nassert new[:4]==b'NEW!' and new[4:]==old[4:], 'stale read'\n"
              "assert os.stat(p).st_mtime_ns==os.fstat(os.open(p,os.O_RDONLY)).st_mtime_ns\n"
              "print('ok')")
    proc, _ = granary.run(dataset, [sys.executable, "-c", script, path], tier=tier)
    assert proc.stdout.strip() == b"ok"
    granary.settle(dataset)
    proc, _ = granary.run(dataset, ["cat", path], tier=tier)
    assert proc.stdout == path.read_bytes()
    assert proc.stdout[:4] == b"NEW!"


def test_changed_source_is_never_served_stale(granary, dataset, tier):
    rel = "edge/exactly-128k.bin"
    granary.run(dataset, ["cat", dataset / rel], tier=tier)
    granary.settle(dataset)
    data = bytearray((dataset / rel).read_bytes())
    data[:5] = b"fresh"
    (dataset / rel).write_bytes(bytes(data))  # same size, new mtime
    proc, _ = granary.run(dataset, ["cat", dataset / rel], tier=tier)
    assert proc.stdout == bytes(data)


def test_two_jobs_at_once_share_one_agent(granary, dataset, tier):
    cmd = [granary.bin, "run", "--source", dataset, "--tier", f"{tier}=1G", "--",
           *LOADER, dataset, "--epochs", "2", "--workers", "2"]
    procs = [subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=granary.env)
             for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode(errors="replace")
    assert len(granary.agent_pids()) == 1


@pytest.mark.parametrize("how", ["inside", "symlink-to-inside"])
def test_a_tier_inside_the_source_is_refused(granary, dataset, tmp_path, how):
    """A tier inside the dataset would show the cache in the dataset's own listings: refused
    with the fix, the program runs on the source, and nothing is created in the dataset."""
    before = sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*"))
    if how == "inside":
        tier = dataset / ".granary-cache"
    else:
        tier = tmp_path / "tier-link"
        tier.symlink_to(dataset)
        tier = tier / "cache"
    cmd = ["sh", "-c", f"cd {dataset} && find . -type f -print0 | sort -z | xargs -0 sha256sum"]
    want = direct(cmd)
    proc, _ = granary.run(dataset, cmd, tier=tier, check=False)
    assert proc.returncode == want.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout == want.stdout
    assert b"inside the source" in proc.stderr, proc.stderr.decode(errors="replace")
    assert sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*")) == before
