"""Shared pieces of the fault-matrix tests (docs/reliability.md): trees to probe, a twin of a tree
for scenarios that change it, placing a tree before the job under test, finding a file's copy in
a tier, and a job runner whose wait is bounded (a hung program is killed with its whole session).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from conftest import CLIENTS

FSPROBE = [sys.executable, str(CLIENTS / "fsprobe.py")]


def fsprobe(*args):
    return [*FSPROBE, *map(str, args)]


def make_tree(root: pathlib.Path, files: dict, dirs=()) -> pathlib.Path:
    """`files`: relative path -> bytes; `dirs`: extra (empty) directories."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for rel in dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    return root


def twin(tree: pathlib.Path, where: pathlib.Path) -> pathlib.Path:
    """An identical tree (names, contents, modes, mtimes) for the direct run of a scenario that
    changes its tree."""
    subprocess.run(["cp", "-a", str(tree), str(where)], check=True)
    return where


def run_job(granary, source, cmd, tier, tier_size="1G", env=None, timeout=120, extra=(),
            wrap=()):
    """`granary run` of `cmd`, bounded: on timeout the whole session (granary run and the
    program) is killed and the test fails saying so. `wrap`: a command that execs the rest (to
    start the job in a cgroup). Returns (proc, stats)."""
    stats_path = granary.tmp / f"stats-{time.monotonic_ns()}.json"
    args = [*map(str, wrap), granary.bin, "run", "--source", str(source), "--tier", f"{tier}={tier_size}",
            "--stats-json", str(stats_path), "-q", *extra, "--", *map(str, cmd)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**granary.env, **(env or {})}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the job did not finish in {timeout}s (killed): {cmd}\n"
                             f"stderr: {err.decode(errors='replace')[-2000:]}")
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    return subprocess.CompletedProcess(args, proc.returncode, out, err), stats


def direct(cmd, timeout=120, **kw):
    return subprocess.run(list(map(str, cmd)), capture_output=True, timeout=timeout, **kw)


def prime(granary, source, tier, tier_size="1G"):
    """A job that reads every file of `source`, then waits until the agent placed them: the
    next job is served from the tier."""
    proc, _ = run_job(granary, source, fsprobe("readall", source), tier, tier_size)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    granary.settle(source)


def copies(tier: pathlib.Path):
    """Complete copies in a tier (16-hex-digit names in an `objects` directory)."""
    return [p for p in tier.rglob("*") if p.parent.name == "objects" and len(p.name) == 16
            and not p.is_symlink() and p.is_file()]


def copy_of(tier: pathlib.Path, data: bytes) -> pathlib.Path:
    found = [p for p in copies(tier) if p.stat().st_size == len(data) and p.read_bytes() == data]
    assert len(found) == 1, f"expected one copy of a {len(data)}-byte file in {tier}: {found}"
    return found[0]


def output(proc) -> bytes:
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode(errors="replace")[-3000:])
    return proc.stdout


def same_run(granary, source, tier, cmd_granary, cmd_direct, **kw):
    """(what the program printed through granary, what it printed directly, stats)."""
    got, stats = run_job(granary, source, cmd_granary, tier, **kw)
    want = direct(cmd_direct)
    return output(got), output(want), stats


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def attached_jobs(granary, source) -> int:
    st = granary.status() or {}
    for s in st.get("sources", []):
        if os.path.realpath(s.get("source", "")) == os.path.realpath(source):
            return s.get("jobs") or 0
    return 0


class Holder:
    """A job that keeps `source` attached (`sleep`) while the test does something else."""

    def __init__(self, granary, source, tier, tier_size="1G"):
        args = [granary.bin, "run", "--source", str(source), "--tier", f"{tier}={tier_size}",
                "-q", "--", "sleep", "600"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=granary.env, start_new_session=True)
        wait_for(lambda: attached_jobs(granary, source) >= 1 or self.proc.poll() is not None,
                 "the holding job to attach")
        assert self.proc.poll() is None, self.proc.stderr.read()

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def position_encoded(size: int) -> bytes:
    """A file whose 8-byte big-endian words are their own offsets: any chunk read from it says
    where it came from."""
    import array
    a = array.array("Q", range(0, size, 8))
    if sys.byteorder == "little":
        a.byteswap()
    return a.tobytes()
