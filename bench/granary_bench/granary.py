"""Finding and driving the granary binary.

The granary setups need `granary run` and `granary stop`. The binary is taken
from --granary, $GRANARY_BIN, or target/release/granary (built with cargo when
missing). When none works the granary setups are skipped with the reason, so
the baselines still run.
"""

import os
import shutil
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Granary:
    def __init__(self, path, log):
        self.path = path
        self.log = log
        self.version = ""
        # A runtime directory of our own: our jobs only ever talk to the agent
        # we started (inside the cgroups), never to another user's test agent.
        self.runtime_dir = f"/dev/shm/granary-bench-{os.getpid()}"
        os.environ["GRANARY_RUNTIME_DIR"] = self.runtime_dir

    # ---- locating ----------------------------------------------------------

    @classmethod
    def locate(cls, explicit, log):
        """Returns (Granary or None, reason)."""
        path = explicit or os.environ.get("GRANARY_BIN")
        if not path:
            path = os.path.join(REPO, "target", "release", "granary")
            if not os.path.exists(path) and shutil.which("cargo"):
                log("building granary: cargo build --release --workspace")
                r = subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=REPO,
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    return None, "cargo build --release --workspace failed:\n" + r.stderr[-2000:]
        if not os.path.exists(path):
            return None, f"no granary binary at {path}"
        g = cls(os.path.abspath(path), log)
        r = subprocess.run([g.path, "run", "--help"], capture_output=True, text=True)
        if r.returncode != 0 or "--source" not in r.stdout + r.stderr:
            return None, f"{g.path} has no working `run` subcommand yet"
        v = subprocess.run([g.path, "--version"], capture_output=True, text=True)
        g.version = (v.stdout or v.stderr).strip().splitlines()[0] if v.returncode == 0 else "?"
        # A stale binary would be measured silently: say when it was built.
        g.version += time.strftime(", built %Y-%m-%d %H:%M", time.localtime(os.path.getmtime(g.path)))
        return g, ""

    # ---- driving -----------------------------------------------------------

    def run_argv(self, source, tiers, stats_json, extra, cmd):
        argv = [self.path, "run", "--source", source]
        for path, size in tiers:
            argv += ["--tier", f"{path}={size}"]
        if stats_json:
            argv += ["--stats-json", stats_json]
        return argv + list(extra) + ["--", *cmd]

    def stop(self, groups=(), timeout=10.0):
        """Stops this user's agents and waits until none is left in our cgroups,
        so the next setup starts with a fresh agent inside the throttle."""
        subprocess.run([self.path, "stop"], capture_output=True, timeout=60)
        deadline = time.time() + timeout
        while time.time() < deadline:
            left = [p for g in groups for p in g.pids()]
            if not left:
                return []
            time.sleep(0.1)
        return [p for g in groups for p in g.pids()]

    def agents_outside(self, groups):
        """`granary agent` processes on our runtime directory that are not in our
        cgroups: such an agent would serve our job from outside the throttle."""
        ours = {p for g in groups for p in g.pids()}
        mark = f"GRANARY_RUNTIME_DIR={self.runtime_dir}".encode()
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in ours:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] == b"agent" and mark in env:
                found.append(int(pid))
        return found

    def cleanup(self, groups):
        self.stop(groups)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
