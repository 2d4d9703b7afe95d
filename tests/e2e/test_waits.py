"""Waits for the agent never hold a signal back: Ctrl-C reaches a program whose read waits for a
copy the agent is still making, as it would without granary (docs/reliability.md, "Failed or hung
jobs").

The agent has to look healthy and keep making progress — only slowly — or the library would stop
waiting for other reasons (a stopped agent's heartbeat goes stale within 2 s). So the source lives
on a loop device, and the agent alone is moved into a blkio cgroup that throttles its reads of
that device.
"""
import json
import os
import pathlib
import platform
import select
import shutil
import signal
import subprocess
import time

import pytest

from conftest import Granary
from probes import fsprobe, run_job, wait_for
from test_source_device import drop_caches, loop_source  # noqa: F401 (fixture)

BLKIO = pathlib.Path("/sys/fs/cgroup/blkio")
# The library's waits sleep in `ppoll` (signals let in only while asleep), a few in `nanosleep`.
SYS_NANOSLEEP = {"x86_64": 35, "aarch64": 101}.get(platform.machine())
SYS_PPOLL = {"x86_64": 271, "aarch64": 73}.get(platform.machine())

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists()
    or SYS_NANOSLEEP is None,
    reason="needs root, the cgroup-v1 blkio controller and x86-64 or aarch64")


@pytest.fixture
def throttle(tmp_path):
    """A blkio cgroup: `throttle(pid, dev, bps)` moves a process into it, slowed to `bps`
    reads of block device `dev` (0: no limit any more)."""
    group = BLKIO / f"granary-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()

    def put(pid, dev, bps):
        rdev = os.stat(dev).st_rdev
        (group / "blkio.throttle.read_bps_device").write_text(
            f"{os.major(rdev)}:{os.minor(rdev)} {bps}\n")
        if pid:
            (group / "cgroup.procs").write_text(f"{pid}\n")
    yield put
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            pass
    wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), "the cgroup to empty")
    group.rmdir()


def in_nanosleep(pid: int) -> bool:
    try:
        return (pathlib.Path(f"/proc/{pid}/syscall").read_text().split() or ["-"])[0] \
            in (str(SYS_NANOSLEEP), str(SYS_PPOLL))
    except OSError:
        return False


def where(pid: int) -> bytes:
    """Where a program that did not answer is: its system call and kernel stack, and its
    user stack (gdb, when installed), for the failure message."""
    out = []
    for name in ("syscall", "wchan", "stack", "status"):
        try:
            out.append(f"{name}: {pathlib.Path(f'/proc/{pid}/{name}').read_text()[:1500]}")
        except OSError as e:
            out.append(f"{name}: {e}")
    if shutil.which("gdb"):
        bt = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt"], capture_output=True,
                            text=True, timeout=60)
        out.append("gdb: " + bt.stdout[-3000:])
    return "\n".join(out).encode()


@pytest.mark.parametrize("how", ["pread", "mmap"])
def test_ctrl_c_reaches_a_read_waiting_for_the_agent(tmp_path, loop_source, throttle, how):
    dev, mnt = loop_source
    src = mnt / "data"
    src.mkdir()
    size = 96 << 20
    with open(src / "big.bin", "wb") as f:
        f.write(os.urandom(size))
    # The agent reads through the page cache: a cached file would never meet the throttle.
    drop_caches()
    (tmp_path / "own-agent").mkdir()
    g = Granary(tmp_path / "own-agent")  # this agent gets throttled: nobody else's
    tier = tmp_path / "tier"
    try:
        # An agent reading the source in 1 MiB blocks at 1.5 MiB/s: progress moves every
        # ~0.7 s (never "stalled"), the whole file would take ~64 s. With the mapping followed
        # and read ahead of (`[mmap] mode = "prefetch"`, the default): what the agent has in
        # flight at the throttled device is capped to a fraction of a second of its bandwidth,
        # so a read of a page the agent is reading waits that long at most (in the kernel,
        # killable only), not for a whole window.
        started, _ = run_job(g, src, ["true"], tier, extra=("--block-size", "1M"))
        assert started.returncode == 0, started.stderr
        [agent] = g.agent_pids()
        throttle(agent, dev, 3 << 19)
        marker = tmp_path / "reading"
        args = [g.bin, "run", "--source", src, "--tier", f"{tier}=1G", "-q", "--",
                *fsprobe("interrupted", src, "big.bin", marker, how)]
        proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=g.env, start_new_session=True)
        try:
            wait_for(lambda: marker.exists() or proc.poll() is not None, "the program to read")
            pid = int(marker.read_text())
            # The program is inside the library's wait for the agent's copy.
            wait_for(lambda: in_nanosleep(pid) or proc.poll() is not None,
                     "the read to wait for the agent")
            assert proc.poll() is None, proc.communicate()
            os.kill(pid, signal.SIGINT)
            # What the program says when the interrupt reaches it (its stdout is the pipe's,
            # whatever `granary run` itself still waits for).
            ready, _, _ = select.select([proc.stdout], [], [], 20)
            said = proc.stdout.readline() if ready else b"(nothing: still waiting) " + where(pid)
            throttle(None, dev, 0)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert said.startswith(b"{"), said.decode(errors="replace") + err.decode(errors="replace")
        assert json.loads(said) == {"interrupted": True}, err.decode(errors="replace")
        assert proc.returncode == 0, err.decode(errors="replace")
    finally:
        throttle(None, dev, 0)  # the agent finishes its copy at full speed, then stops
        g.stop()
