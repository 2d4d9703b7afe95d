"""Nobody gets bytes they could not read on the source: access removed by a POSIX ACL (mode bits
unchanged) or by `chmod` is honoured — `open` fails with EACCES and `access(R_OK)` says so, exactly
as directly — whether the change happened before the first job or between two jobs
(docs/reliability.md, "Nobody else's bytes").

The jobs run as an unprivileged user (root bypasses permission checks), with their own agent.
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

from conftest import tier_files

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv") or not shutil.which("setfacl"),
    reason="needs root (to switch to an unprivileged user), setpriv and setfacl (package acl)")

PROBE = ("import errno,json,os,sys\nout={}\nfor p in sys.argv[2:]:\n"
         "    r={'access':os.access(p,os.R_OK)}\n"
         "    try:\n        r['read']=open(p,'rb').read().hex()\n"
         "    except OSError as e:\n        r['read']=errno.errorcode[e.errno]\n"
         "    out[os.path.relpath(p,sys.argv[1])]=r\nprint(json.dumps(out,sort_keys=True))")


def python_for_nobody():
    for exe in ("/usr/bin/python3", sys.executable):
        if subprocess.run([*AS_NOBODY, exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    pytest.skip("no python the unprivileged user can run")


class Nobody:
    def __init__(self, granary, base: pathlib.Path):
        self.bin = granary.bin
        self.base = base
        self.env = {**os.environ, "GRANARY_RUNTIME_DIR": str(base / "rt")}
        self.stats = base / "rt" / "stats.json"

    def job(self, src, cmd):
        args = [*AS_NOBODY, self.bin, "run", "--source", src, "--tier",
                f"{self.base / 'tier'}=64M", "-q", "--stats-json", self.stats, "--", *cmd]
        proc = subprocess.run(list(map(str, args)), capture_output=True, env=self.env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        return proc.stdout, json.loads(self.stats.read_text())

    def settle(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = subprocess.run([*AS_NOBODY, self.bin, "status", "--json"], capture_output=True,
                                env=self.env, timeout=60)
            srcs = json.loads(st.stdout or b"{}").get("sources", []) if st.returncode == 0 else []
            if srcs and all(s.get("pending") == 0 and not s.get("busy") for s in srcs):
                return
            time.sleep(0.1)
        raise AssertionError("placement did not settle")

    def jobs(self) -> int:
        st = subprocess.run([*AS_NOBODY, self.bin, "status", "--json"], capture_output=True,
                            env=self.env, timeout=60)
        srcs = json.loads(st.stdout or b"{}").get("sources", []) if st.returncode == 0 else []
        return sum(s.get("jobs") or 0 for s in srcs)

    def stop(self):
        subprocess.run([*AS_NOBODY, self.bin, "stop"], capture_output=True, env=self.env,
                       timeout=120)


@pytest.fixture
def nobody(granary):
    base = pathlib.Path("/tmp") / f"granary-access-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    (base / "src").mkdir(parents=True)
    for d in (base, base / "src"):
        d.chmod(0o755)
    for d in ("tier", "rt"):
        (base / d).mkdir(mode=0o700)
        os.chown(base / d, NOBODY, NOBODY)
    n = Nobody(granary, base)
    yield n
    n.stop()
    shutil.rmtree(base, ignore_errors=True)


def setfacl_none(path):
    subprocess.run(["setfacl", "-m", f"u:{NOBODY}:---", str(path)], check=True)


def test_revoked_access_is_honoured(nobody):
    src = nobody.base / "src"
    names = ("open.bin", "acl-before.bin", "acl-between.bin", "chmod-between.bin",
             "acl-dir/inner.bin", "acl-held.bin", "acl-held-dir/inner.bin")
    for i, name in enumerate(names):
        (src / name).parent.mkdir(exist_ok=True)
        (src / name).parent.chmod(0o755)
        (src / name).write_bytes(bytes([i]) * (1000 + i))
        (src / name).chmod(0o644)
    setfacl_none(src / "acl-before.bin")
    paths = [src / n for n in names]
    probe = [python_for_nobody(), "-c", PROBE, src, *paths]
    denied = {"access": False, "read": "EACCES"}

    def compare():
        got, stats = nobody.job(src, probe)
        want = subprocess.run(list(map(str, [*AS_NOBODY, *probe])), capture_output=True)
        assert json.loads(got) == json.loads(want.stdout)
        return json.loads(got), stats

    seen, _ = compare()
    assert seen["acl-before.bin"] == denied
    nobody.settle()
    seen, stats = compare()  # every readable file now served from its copy
    assert tier_files(stats) == len(names) - 1, stats
    # Between two jobs (the agent walks again for the second).
    setfacl_none(src / "acl-between.bin")
    (src / "chmod-between.bin").chmod(0o600)
    setfacl_none(src / "acl-dir")
    seen, stats = compare()
    assert seen["acl-between.bin"] == seen["chmod-between.bin"] == seen["acl-dir/inner.bin"] == denied
    assert tier_files(stats) >= 1, stats
    # While another job of the user holds the source (no walk for the next job).
    holder = subprocess.Popen(list(map(str, [
        *AS_NOBODY, nobody.bin, "run", "--source", src, "--tier", f"{nobody.base / 'tier'}=64M",
        "-q", "--", "sleep", "600"])), env=nobody.env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while nobody.jobs() < 1:
            assert holder.poll() is None and time.monotonic() < deadline, "holder not attached"
            time.sleep(0.05)
        setfacl_none(src / "acl-held.bin")
        setfacl_none(src / "acl-held-dir")
        seen, stats = compare()
        assert seen["acl-held.bin"] == seen["acl-held-dir/inner.bin"] == denied, seen
        assert tier_files(stats) >= 1, stats
    finally:
        os.killpg(holder.pid, signal.SIGTERM)
        holder.wait(timeout=60)
    nobody.stop()
    compare()
