"""Fixtures for end-to-end tests: real programs run through `granary run`, every byte compared
with the same program run directly on the source.

The binaries come from the cargo target directory (`GRANARY_BIN` overrides); the test command in
the README builds them first.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLIENTS = pathlib.Path(__file__).resolve().parent / "clients"


def granary_bin() -> str:
    path = os.environ.get("GRANARY_BIN") or str(REPO / "target" / "debug" / "granary")
    if not os.access(path, os.X_OK):
        pytest.exit(f"{path} not found: run `cargo build --workspace` first (or set GRANARY_BIN)", 2)
    return path


class Granary:
    """Drives the `granary` binary the way a user does."""

    def __init__(self, tmp: pathlib.Path):
        self.bin = granary_bin()
        self.tmp = tmp
        # A private agent: the tests never touch (or get stopped by) the user's own agent.
        self.runtime = tmp / "runtime"
        self.env = {**os.environ, "GRANARY_RUNTIME_DIR": str(self.runtime)}

    def run(self, source, cmd, tier=None, tier_size="1G", env=None, check=True, extra=()):
        """`granary run --source S --tier T=SIZE --stats-json F -- cmd`; returns (proc, stats)."""
        stats_path = self.tmp / f"stats-{time.monotonic_ns()}.json"
        tier = tier or (self.tmp / "tier")
        args = [self.bin, "run", "--source", str(source), "--tier", f"{tier}={tier_size}",
                "--stats-json", str(stats_path), *extra, "--", *map(str, cmd)]
        proc = subprocess.run(args, capture_output=True, env={**self.env, **(env or {})}, timeout=600)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"granary run failed ({proc.returncode}): {' '.join(args)}\n"
                f"stdout: {proc.stdout.decode(errors='replace')[-3000:]}\n"
                f"stderr: {proc.stderr.decode(errors='replace')[-3000:]}")
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
        return proc, stats

    def settle(self, source, timeout=120):
        """Waits until the agent has no placement pending for `source` (the first run's copies
        happen in the background). Fails once placement has not moved for `timeout` seconds, not
        at a deadline: on busy cores the idle-class copies come slowly (2,000 small files took
        43-67 s beside eight busy loops and a build), but they keep coming."""
        last, moved = None, time.monotonic()
        while time.monotonic() - moved < timeout:
            st = self.status() or {}
            mine = [s for s in st.get("sources", [])
                    if os.path.realpath(s.get("source", "")) == os.path.realpath(source)]
            now = [(s.get("pending"), s.get("files_placed_now"), s.get("bytes_placed_now"))
                   for s in mine]
            if now != last:
                last, moved = now, time.monotonic()
            if mine and all("pending" in s for s in mine):
                if all(s["pending"] == 0 and not s.get("busy") for s in mine):
                    return st
            elif mine and time.monotonic() - moved > 1.5:
                # An agent without `pending`: placement stopped moving.
                return st
            time.sleep(0.1)
        raise AssertionError(
            f"placement for {source} did not move in {timeout}s: {self.status()}")

    def status(self):
        proc = subprocess.run([self.bin, "status", "--json"], capture_output=True, timeout=60, env=self.env)
        if proc.returncode != 0:
            return {}
        return json.loads(proc.stdout or b"{}") or {}

    def stop(self):
        subprocess.run([self.bin, "stop"], capture_output=True, timeout=120, env=self.env)

    def agent_pids(self):
        out = subprocess.run(["pgrep", "-u", str(os.getuid()), "-f", f"{self.bin} agent"],
                             capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if self._is_ours(int(p))]

    def _is_ours(self, pid: int) -> bool:
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"GRANARY_RUNTIME_DIR={self.runtime}".encode() in environ


# Stats JSON accessors, in one place so the schema lives here only.
def tier_files(stats) -> int:
    return stats["files_served_from_tiers"]


def source_opens(stats) -> int:
    return stats["source_io"]["opens"]


def source_reads(stats) -> int:
    return stats["source_io"]["reads"]


def source_meta(stats) -> int:
    return stats["source_io"]["metadata_calls"]


def direct(cmd, cwd=None, env=None):
    """The same command without granary."""
    return subprocess.run(list(map(str, cmd)), capture_output=True, cwd=cwd, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def granary(tmp_path_factory):
    g = Granary(tmp_path_factory.mktemp("granary"))
    yield g
    g.stop()


def make_dataset(root: pathlib.Path, **kw) -> pathlib.Path:
    args = [sys.executable, CLIENTS / "make_dataset.py", root]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run(list(map(str, args)), check=True)
    return root


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path / "pfs" / "data")


@pytest.fixture
def tier(tmp_path):
    return tmp_path / "tier"
