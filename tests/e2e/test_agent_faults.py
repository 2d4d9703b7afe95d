"""Faults around the agent and the CLI, tried as a careless and as a hostile user would: a stopped
agent, signals to `granary run`, another user's directories, planted symlinks, bad sizes, closed
pipes, a full or vanished tier, concurrent jobs. Each test drives the real `granary` binary with
real programs and compares every byte with the source; every wait is bounded."""
import contextlib
import hashlib
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import Granary, direct, make_dataset

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                               reason="needs root (another user's files, mounts)")
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]

# A reader in phases: reads every file of the manifest and checks it, says it is ready (its pid
# in `<sync>/ready`), waits for `<sync>/go`, reads everything again `epochs` more times, prints
# "ok" and exits with `code`. Bytes are checked against the manifest written with the dataset.
PHASED = r"""
import hashlib, json, os, sys, time
root, sync, epochs, code = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
names = sys.argv[5].split(",") if len(sys.argv) > 5 and sys.argv[5] else None
manifest = json.load(open(os.path.join(root, "MANIFEST.json")))
files = sorted(manifest) if names is None else names
def epoch():
    bad = [r for r in files
           if hashlib.sha256(open(os.path.join(root, r), "rb").read()).hexdigest() != manifest[r]]
    assert not bad, f"wrong bytes: {bad}"
epoch()
open(os.path.join(sync, "ready.tmp"), "w").write(str(os.getpid()))
os.rename(os.path.join(sync, "ready.tmp"), os.path.join(sync, "ready"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(sync, "go")):
    assert time.monotonic() < deadline, "never told to go on"
    time.sleep(0.02)
for _ in range(epochs):
    epoch()
print("ok", flush=True)
sys.exit(code)
"""


def wait_for(pred, what, timeout=60, proc=None):
    deadline = time.monotonic() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the job ended ({proc.returncode}): {err.decode(errors='replace')}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


def kill_quietly(pid, sig=signal.SIGKILL):
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.kill(pid, sig)


@pytest.fixture
def g(tmp_path):
    """A private agent per test (these tests stop and kill agents), quick to give up on one that
    does not answer (GRANARY_AGENT_TIMEOUT; the default is 5 s)."""
    gr = Granary(tmp_path)
    gr.env["GRANARY_AGENT_TIMEOUT"] = "2"
    yield gr
    for pid in gr.agent_pids():
        kill_quietly(pid, signal.SIGCONT)
    gr.stop()
    for pid in gr.agent_pids():
        kill_quietly(pid)


def run(g, source, cmd, tier, tier_size="1G", env=None, timeout=60):
    """`granary run` as `Granary.run` does it, but never waiting more than `timeout`."""
    stats = g.tmp / f"stats-{time.monotonic_ns()}.json"
    args = [g.bin, "run", "--source", source, "--tier", f"{tier}={tier_size}", "--stats-json", stats,
            "--", *cmd]
    p = subprocess.run(list(map(str, args)), capture_output=True, env={**g.env, **(env or {})},
                       timeout=timeout)
    return p, (json.loads(stats.read_text()) if stats.exists() else None)


def start_phased(g, dataset, sync, tier, epochs=1, code=0, names=None, extra=(), env=None):
    sync.mkdir(exist_ok=True)
    stats = sync / "stats.json"
    cmd = [g.bin, "run", "--source", dataset, "--tier", f"{tier}=1G", "--stats-json", stats, *extra,
           "--", sys.executable, "-c", PHASED, dataset, sync, str(epochs), str(code), ",".join(names or [])]
    return subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**g.env, **(env or {})})


def program_pid(sync):
    with contextlib.suppress(OSError, ValueError):
        return int((sync / "ready").read_text())
    return None


def stats_of(sync):
    return json.loads((sync / "stats.json").read_text())


# --- 10. A stopped agent --------------------------------------------------------------------

def test_stopped_agent_the_job_ends_with_the_programs_status(g, dataset, tier, tmp_path):
    sync = tmp_path / "sync"
    proc = start_phased(g, dataset, sync, tier, epochs=2, code=7)
    agent = None
    try:
        wait_for(lambda: (sync / "ready").exists(), "the first epoch", proc=proc)
        agent = g.status()["pid"]
        os.kill(agent, signal.SIGSTOP)
        (sync / "go").touch()
        out, err = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc.pid)
        kill_quietly(program_pid(sync))
        kill_quietly(agent)
    assert (proc.returncode, out) == (7, b"ok\n"), err.decode(errors="replace")
    assert b"did not answer" in err, err.decode(errors="replace")
    s = stats_of(sync)
    assert s["exit_status"] == 7 and any("did not answer" in w for w in s["warnings"]), s


def test_a_new_job_replaces_a_stopped_agent(g, dataset, tier):
    files = sorted(p for p in dataset.rglob("*.jpg"))[:6]
    g.run(dataset, ["true"], tier=tier)
    old = g.status()["pid"]
    os.kill(old, signal.SIGSTOP)
    try:
        proc, stats = run(g, dataset, ["cat", *files], tier)
    finally:
        kill_quietly(old)
    assert proc.stdout == b"".join(f.read_bytes() for f in files)
    err = proc.stderr.decode(errors="replace")
    assert f"pid {old}, stopped) did not answer" in err and "killed it" in err, err
    assert not stats["disabled"], ("served by a new agent", err)
    wait_for(lambda: not alive(old), "the stopped agent to be gone", timeout=10)
    assert g.status()["pid"] != old


def test_a_stopped_agent_without_its_socket_is_replaced(g, dataset, tier):
    """An agent stopped while shutting down: its socket is gone, it still holds agent.alive."""
    g.run(dataset, ["true"], tier=tier)
    old = g.status()["pid"]
    os.kill(old, signal.SIGSTOP)
    (g.runtime / "agent.sock").unlink()
    try:
        proc, stats = run(g, dataset, ["cat", dataset / "edge/exactly-128k.bin"], tier)
    finally:
        kill_quietly(old)
    assert proc.stdout == (dataset / "edge/exactly-128k.bin").read_bytes()
    assert not stats["disabled"], proc.stderr.decode(errors="replace")
    assert not alive(old)


def test_status_and_stop_return_with_a_stopped_agent(g, dataset, tier):
    g.run(dataset, ["true"], tier=tier)
    old = g.status()["pid"]
    os.kill(old, signal.SIGSTOP)
    try:
        for args in (["status"], ["status", "--json"]):
            p = subprocess.run([g.bin, *args], capture_output=True, env=g.env, timeout=30)
            assert p.returncode == 1 and p.stdout == b"", p
            err = p.stderr.decode()
            assert f"(pid {old}, stopped) did not answer" in err and "granary stop" in err, err
        p = subprocess.run([g.bin, "stop"], capture_output=True, env=g.env, timeout=30)
    finally:
        kill_quietly(old)
    assert p.returncode == 0 and b"killed it" in p.stderr, p
    # The killed agent's table is removed with it, nothing else.
    assert b"agent stopped; removed 1 table(s) a killed agent left" in p.stderr, p
    assert not alive(old)
    assert subprocess.run([g.bin, "status"], capture_output=True, env=g.env, timeout=30).stdout \
        == b"granary: no agent running\n"


def test_a_busy_agent_is_not_taken_for_a_stopped_one(g, tier, tmp_path):
    """A walk that takes longer than the agent's allowed silence (here re-hashing 240 MB of
    reused copies, with GRANARY_AGENT_TIMEOUT at its 0.5 s minimum), and a second job waiting
    for that walk: both are served by the same agent, nobody is replaced."""
    src = tmp_path / "big"
    src.mkdir()
    files = []
    for i in range(8):
        files.append(src / f"f{i}")
        files[-1].write_bytes(os.urandom(30 << 20))
    env = {"GRANARY_AGENT_TIMEOUT": "0.5"}
    first, _ = run(g, src, ["cat", *files], tier, env=env)
    assert first.returncode == 0
    g.settle(src)
    pid = g.status()["pid"]
    jobs = [subprocess.Popen([g.bin, "run", "--source", str(src), "--tier", f"{tier}=1G", "--stats-json",
                              str(tmp_path / f"s{i}.json"), "--", "cat", str(files[i])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**g.env, **env}) for i in range(2)]
    results = [p.communicate(timeout=120) for p in jobs]
    walk = [json.loads((tmp_path / f"s{i}.json").read_text())["catalog"]["walk_s"] for i in range(2)]
    for i, (p, (out, err)) in enumerate(zip(jobs, results)):
        assert (p.returncode, out) == (0, files[i].read_bytes()), err
        assert b"did not answer" not in err and b"without granary" not in err, (walk, err)
    assert g.status()["pid"] == pid, f"the agent was replaced (walks of {walk} s)"


# --- 12. Signals to `granary run` -----------------------------------------------------------

TRAPS = r"""
import os, signal, sys, time
sync, sigs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
log = os.path.join(sync, "seen")
def seen(s, _):
    with open(log, "a") as f:
        f.write(f"{s}\n")
for s in sigs:
    signal.signal(s, seen)
open(os.path.join(sync, "ready"), "w").write(str(os.getpid()))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    got = set(open(log).read().split()) if os.path.exists(log) else set()
    if got >= {str(s) for s in sigs}:
        sys.exit(0)
    time.sleep(0.02)
sys.exit(3)
"""

FORWARDED = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT, signal.SIGWINCH, signal.SIGPIPE,
             signal.SIGXCPU, signal.SIGXFSZ, signal.SIGVTALRM, signal.SIGPROF, signal.SIGPWR,
             signal.SIGURG, signal.SIGIO, signal.SIGRTMIN + 2]


def test_every_signal_a_wrapper_forwards_reaches_the_program(g, dataset, tier, tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    cmd = [g.bin, "run", "-q", "--source", dataset, "--tier", f"{tier}=1G", "--",
           sys.executable, "-c", TRAPS, sync, ",".join(str(int(s)) for s in FORWARDED)]
    proc = subprocess.Popen(list(map(str, cmd)), stderr=subprocess.PIPE, env=g.env)
    try:
        wait_for(lambda: (sync / "ready").exists(), "the program's handlers", proc=proc)
        for s in FORWARDED:
            os.kill(proc.pid, s)
            wait_for(lambda: str(int(s)) in (sync / "seen").read_text().split()
                     if (sync / "seen").exists() else False,
                     f"the program to see {signal.Signals(s).name if s in signal.Signals._value2member_map_ else s}",
                     timeout=15, proc=proc)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc.pid)
        kill_quietly(program_pid(sync))
    assert proc.returncode == 0, err.decode(errors="replace")


# The handler only sets a flag, as training loops do: an exception raised in a Python signal
# handler can be lost when it runs inside C code (seen here with plain Python, no granary).
CHECKPOINT = r"""
import hashlib, json, os, signal, sys, time
root, sync = sys.argv[1], sys.argv[2]
asked = []
signal.signal(signal.SIGUSR1, lambda s, _: asked.append(s))
manifest = json.load(open(os.path.join(root, "MANIFEST.json")))
open(os.path.join(sync, "ready"), "w").write(str(os.getpid()))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # "training": epochs until the time limit's warning
    for rel, h in sorted(manifest.items()):
        assert hashlib.sha256(open(os.path.join(root, rel), "rb").read()).hexdigest() == h, rel
        if asked:
            open(os.path.join(sync, "checkpoint"), "w").write("saved")
            sys.exit(0)
    time.sleep(0.05)
sys.exit(5)
"""


def test_slurm_signal_b_usr1_checkpoints_and_the_job_ends_cleanly(g, dataset, tier, tmp_path):
    """`sbatch --signal=B:USR1@T`: Slurm sends USR1 to the batch step, here `granary run`."""
    sync = tmp_path / "sync"
    sync.mkdir()
    cmd = [g.bin, "run", "-q", "--source", dataset, "--tier", f"{tier}=1G", "--",
           sys.executable, "-c", CHECKPOINT, dataset, sync]
    proc = subprocess.Popen(list(map(str, cmd)), stderr=subprocess.PIPE, env=g.env)
    try:
        wait_for(lambda: (sync / "ready").exists(), "the training loop", proc=proc)
        os.kill(proc.pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc.pid)
        kill_quietly(program_pid(sync))
    assert proc.returncode == 0, err.decode(errors="replace")
    assert (sync / "checkpoint").read_text() == "saved"


# --- 13. Another user's tier directories ----------------------------------------------------

@pytest.fixture
def shared(tmp_path):
    """A directory other users can reach (pytest's own is root-only)."""
    base = pathlib.Path("/tmp") / f"granary-e2e-{os.getpid()}-{tmp_path.name}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    base.chmod(0o1777)  # like /tmp
    yield base
    shutil.rmtree(base, ignore_errors=True)


def my_name():
    return pwd.getpwuid(os.getuid()).pw_name


def test_default_tier_is_named_from_the_uid_not_user(g, dataset, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    stats = tmp_path / "s.json"
    p = subprocess.run([g.bin, "run", "--source", dataset, "--stats-json", stats, "--", "true"],
                       capture_output=True, timeout=60,
                       env={**g.env, "GRANARY_CACHE_DIR": str(cache), "USER": "mallory"})
    assert p.returncode == 0, p.stderr
    path = json.loads(stats.read_text())["tiers"][0]["path"]
    assert path == str(cache / f"granary-{my_name()}"), path
    assert not (cache / "granary-mallory").exists()


def squat_and_swap(tier_root: pathlib.Path, dataset: pathlib.Path, planted: bytes):
    """What another user with write access to `tier_root` can do during a job: move the
    source's directory aside and put one of theirs in its place, each object replaced by their
    bytes of the same size (object names are computable from the catalog; here they are read)."""
    ids = [d for d in tier_root.iterdir() if d.is_dir() and (d / "objects").is_dir()]
    swapped = 0
    for d in ids:
        names = {o.name: o.stat().st_size for o in (d / "objects").iterdir() if not o.name.startswith(".")}
        script = ("import os,sys,json\nd,names,planted=sys.argv[1],json.loads(sys.argv[2]),sys.argv[3].encode()\n"
                  "os.rename(d, d + '.moved')\nos.makedirs(os.path.join(d, 'objects'), mode=0o777)\n"
                  "for n,size in names.items():\n"
                  "    open(os.path.join(d, 'objects', n), 'wb').write((planted * size)[:size])\n")
        subprocess.run([*AS_NOBODY, sys.executable, "-c", script, str(d), json.dumps(names),
                        planted.decode()], check=True)
        swapped += len(names)
    return swapped


@ROOT_ONLY
@pytest.mark.parametrize("squat", ["default tier owned by another user", "tier owned by another user",
                                   "own tier open to everyone"])
def test_a_squatted_tier_never_serves_planted_bytes(g, shared, squat):
    dataset = make_dataset(shared / "data", classes=2, per_class=4, records=0)
    subprocess.run(["chmod", "-R", "a+rX", shared / "data"], check=True)
    sync = shared / "sync"
    env = {}
    if squat == "default tier owned by another user":
        cache = shared / "cache"
        cache.mkdir(mode=0o1777)
        cache.chmod(0o1777)
        tier = cache / f"granary-{my_name()}"
        subprocess.run([*AS_NOBODY, "mkdir", "-m", "777", tier], check=True)
        # USER as a login shell sets it (older versions named the default tier after it).
        env.update(GRANARY_CACHE_DIR=str(cache), USER=my_name())
        sync.mkdir()
        stats = sync / "stats.json"
        cmd = [g.bin, "run", "--source", dataset, "--stats-json", stats, "--",
               sys.executable, "-c", PHASED, dataset, sync, "2", "0", ""]
        proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**g.env, **env})
    else:
        tier = shared / "tier"
        if squat == "tier owned by another user":
            subprocess.run([*AS_NOBODY, "mkdir", "-m", "777", tier], check=True)
        else:
            tier.mkdir()
            tier.chmod(0o777)
        proc = start_phased(g, dataset, sync, tier, epochs=2)
    try:
        wait_for(lambda: (sync / "ready").exists(), "the first epoch", proc=proc)
        if g.status():
            g.settle(dataset)
        squat_and_swap(tier, dataset, b"PLANTED!")
        (sync / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        kill_quietly(proc.pid)
        kill_quietly(program_pid(sync))
    err = err.decode(errors="replace")
    assert (proc.returncode, out) == (0, b"ok\n"), err  # the reader checked every byte, twice
    assert "not using" in err and ("another user" in err or "other users" in err), err


# --- 15. The runtime directory --------------------------------------------------------------

def test_planted_symlinks_in_the_runtime_dir_are_never_followed(g, dataset, tier, tmp_path):
    g.runtime.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    created = tmp_path / "created-through-a-link"
    (g.runtime / "agent.log").symlink_to(victim)
    (g.runtime / "agent.lock").symlink_to(created)
    (g.runtime / "agent.alive").symlink_to(victim)
    f = dataset / "edge/exactly-128k.bin"
    proc, stats = run(g, dataset, ["sh", "-c", f'cat "{f}"; exit 3'], tier)
    assert (proc.returncode, proc.stdout) == (3, f.read_bytes())
    assert victim.read_bytes() == b"precious\n"
    assert not created.exists()
    err = proc.stderr.decode(errors="replace")
    assert "is a symlink; refusing to follow it" in err, err
    assert stats["disabled"] and "symlink" in stats["fallback"], stats


def test_a_planted_socket_symlink_is_never_connected_to(g, dataset, tier, tmp_path):
    """`agent.sock` pointing at someone else's server: never connected to; it is stale, and
    replaced by a real agent."""
    import socket
    g.runtime.mkdir(mode=0o700)
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fake.bind(str(tmp_path / "impostor.sock"))
    fake.listen(8)
    fake.setblocking(False)
    (g.runtime / "agent.sock").symlink_to(tmp_path / "impostor.sock")
    try:
        f = dataset / "edge/exactly-128k.bin"
        proc, stats = run(g, dataset, ["cat", f], tier)
        with pytest.raises(BlockingIOError):
            fake.accept()
    finally:
        fake.close()
    assert (proc.returncode, proc.stdout) == (0, f.read_bytes()), proc.stderr
    assert not stats["disabled"], "served by a real agent"
    assert not (g.runtime / "agent.sock").is_symlink()


@pytest.mark.parametrize("how", ["mode 0777", "mode 0755", "owned by another user"])
def test_a_runtime_dir_not_private_is_refused(g, dataset, tier, how):
    if how == "owned by another user" and os.getuid() != 0:
        pytest.skip("needs root to chown")
    g.runtime.mkdir()
    if how == "owned by another user":
        os.chown(g.runtime, NOBODY, NOBODY)
        g.runtime.chmod(0o700)
    else:
        g.runtime.chmod(int(how.split()[1], 8))
    f = dataset / "edge/exactly-128k.bin"
    proc, stats = run(g, dataset, ["cat", f], tier)
    assert (proc.returncode, proc.stdout) == (0, f.read_bytes())
    err = proc.stderr.decode(errors="replace")
    assert f"runtime directory {g.runtime}" in err and "refusing to use it" in err, err
    assert stats["disabled"]
    assert not (g.runtime / "agent.sock").exists()


# --- Small things -----------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["1.5", "0", "12", "2000P", "-1", "lots"])
def test_bad_tier_sizes_are_clear_errors(g, dataset, tier, tmp_path, size):
    marker = tmp_path / "ran"
    p = subprocess.run([g.bin, "run", "--source", dataset, "--tier", f"{tier}={size}", "--",
                        "touch", marker], capture_output=True, timeout=60, env=g.env)
    assert p.returncode == 2 and not marker.exists(), p
    err = p.stderr.decode()
    assert err.startswith(f"granary: bad --tier `{tier}={size}`: ") and err.count("\n") == 1, err


def test_a_bad_config_capacity_names_the_key(g, dataset, tier, tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[[tier]]\npath = "{tier}"\ncapacity = 0\n')
    p = subprocess.run([g.bin, "run", "--source", dataset, "--config", cfg, "--", "true"],
                       capture_output=True, timeout=60, env=g.env)
    assert p.returncode == 2, p
    assert "`tier[0].capacity` (line 3)" in p.stderr.decode(), p.stderr


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_an_unusable_source_runs_the_program_without_granary(g, tmp_path, tier, kind):
    source = tmp_path / "no-such-dir"
    if kind == "a file":
        source.write_bytes(b"not a directory")
    stats = tmp_path / "s.json"
    p = subprocess.run([g.bin, "run", "--source", source, "--tier", tier, "--stats-json", stats, "--",
                        "sh", "-c", "echo ran; exit 3"], capture_output=True, timeout=60, env=g.env)
    assert (p.returncode, p.stdout) == (3, b"ran\n"), p
    err = p.stderr.decode()
    assert err.splitlines()[0].startswith(f"granary: source {source}") and \
        "running the program without granary" in err.splitlines()[0], err
    assert "GRANARY_DISABLE" not in err, err
    s = json.loads(stats.read_text())
    assert s["disabled"] and str(source) in s["fallback"] and s["exit_status"] == 3, s


def test_the_fallback_report_states_the_real_reason(g, dataset, tier, tmp_path):
    """A tier inside the dataset: the job runs without granary, and every line that says so
    names that cause and its fix (never GRANARY_DISABLE)."""
    inside = dataset / "cache"
    p = subprocess.run([g.bin, "run", "--source", dataset, "--tier", inside, "--", "true"],
                       capture_output=True, timeout=60, env=g.env)
    assert p.returncode == 0
    err = p.stderr.decode()
    assert "GRANARY_DISABLE" not in err, err
    first, report = err.splitlines()[0], [l for l in err.splitlines() if "NOT SERVED" in l]
    assert f"tier {inside} is inside the source" in first and "fix:" in first, err
    assert report and f"tier {inside} is inside the source" in report[0], err
    assert not inside.exists(), "no cache made inside the dataset"


def test_a_runtime_directory_that_is_a_file_is_refused_naming_the_variable(g, dataset, tier,
                                                                            tmp_path):
    not_a_dir = tmp_path / "runtime-file"
    not_a_dir.write_text("")
    marker = tmp_path / "ran"
    p = subprocess.run([g.bin, "run", "--source", dataset, "--tier", tier, "--", "touch", marker],
                       capture_output=True, timeout=60,
                       env={**g.env, "GRANARY_RUNTIME_DIR": str(not_a_dir)})
    assert p.returncode == 2 and not marker.exists(), p
    assert f"GRANARY_RUNTIME_DIR={not_a_dir}: exists and is not a directory" in p.stderr.decode(), p


def test_the_default_tier_never_complains_about_its_capacity(g, dataset, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**g.env, "GRANARY_CACHE_DIR": str(cache)}
    for i in range(3):
        # The free space of the file system changes between jobs, and with it 90 % of it.
        (tmp_path / f"filler{i}").write_bytes(os.urandom(8 << 20))
        p = subprocess.run([g.bin, "run", "--source", dataset, "--", "true"], capture_output=True,
                           timeout=60, env=env)
        assert p.returncode == 0
        assert b"capacity" not in p.stderr, p.stderr
        q = subprocess.run([g.bin, "run", "-q", "--source", dataset, "--", "true"], capture_output=True,
                           timeout=60, env=env)
        assert (q.returncode, q.stderr) == (0, b""), q.stderr


def closed_pipe_run(args, env, stream):
    """Runs `args` with `stream` ("stdout" or "stderr") a pipe nobody reads any more."""
    r, w = os.pipe()
    os.close(r)
    try:
        kw = {stream: w, "stdout" if stream == "stderr" else "stderr": subprocess.PIPE}
        p = subprocess.run(args, env=env, timeout=60, **kw)
    finally:
        os.close(w)
    return p


def test_closed_pipes_end_commands_quietly(g, dataset, tier):
    g.run(dataset, ["true"], tier=tier)
    for args in (["status"], ["status", "--json"]):
        p = closed_pipe_run([g.bin, *args], g.env, "stdout")
        assert p.returncode in (0, -signal.SIGPIPE) and b"panicked" not in p.stderr, p
    # `granary run`'s report into a closed pipe: the status is still the program's.
    p = closed_pipe_run([g.bin, "run", "--source", dataset, "--tier", tier, "--", "sh", "-c", "exit 3"],
                        g.env, "stderr")
    assert p.returncode == 3, p


@ROOT_ONLY
def test_a_tier_larger_than_its_file_system_keeps_its_copies(g, tmp_path):
    dataset = make_dataset(tmp_path / "data", classes=2, per_class=12, mean_size=700_000, records=0)
    tier = tmp_path / "tmpfs"
    tier.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8M,mode=0700", "tmpfs", tier], check=True)
    try:
        files = sorted(dataset.rglob("*.jpg"))
        first, _ = run(g, dataset, ["cat", *files], tier)
        assert first.stdout == b"".join(f.read_bytes() for f in files)
        g.settle(dataset)
        g.stop()
        copies = [o for o in tier.rglob("objects/*") if not o.name.startswith(".")]
        assert 0 < len(copies) < len(files), "the 8 MiB file system holds some, not all"
        again, stats = run(g, dataset, ["cat", *files], tier)
        assert again.stdout == first.stdout
        assert stats["catalog"]["reused_files"] == len(copies), (stats["catalog"], again.stderr)
    finally:
        g.stop()
        subprocess.run(["umount", tier], check=False)


@pytest.mark.parametrize("how", ["removed", "renamed"])
def test_a_tier_lost_during_a_job_is_abandoned(g, dataset, tier, tmp_path, how):
    sync = tmp_path / "sync"
    proc = start_phased(g, dataset, sync, tier, epochs=3)
    try:
        wait_for(lambda: (sync / "ready").exists(), "the first epoch", proc=proc)
        g.settle(dataset)
        before = g.status()["sources"][0]["placement"]
        if how == "removed":
            shutil.rmtree(tier)
        else:
            tier.rename(tmp_path / "tier.moved")
        wait_for(lambda: any("removed or renamed" in w
                             for w in g.status()["sources"][0].get("warnings", [])),
                 "the agent to notice", timeout=15, proc=proc)
        (sync / "go").touch()
        out, err = proc.communicate(timeout=120)
        g.settle(dataset)
        after = g.status()["sources"][0]["placement"]
    finally:
        kill_quietly(proc.pid)
        kill_quietly(program_pid(sync))
    err = err.decode(errors="replace")
    assert (proc.returncode, out) == (0, b"ok\n"), err
    for k in ("files_placed", "agent_source_opens", "failures"):
        assert after[k] == before[k], f"{k}: {after[k] - before[k]} more after the tier was {how}"
    assert "was removed or renamed while in use" in err, err
    assert any("removed or renamed" in w for w in stats_of(sync)["warnings"])


def test_concurrent_jobs_report_only_their_own_placements(g, dataset, tier, tmp_path):
    manifest = json.loads((dataset / "MANIFEST.json").read_text())
    small = sorted(r for r in manifest if r.startswith("train/") and os.path.getsize(dataset / r) > 0)
    halves = [small[0::2], small[1::2]]
    syncs = [tmp_path / "a", tmp_path / "b"]
    procs = [start_phased(g, dataset, s, tier, epochs=0, names=h) for s, h in zip(syncs, halves)]
    try:
        for s, p in zip(syncs, procs):
            wait_for(lambda: (s / "ready").exists(), "both jobs to read their half", proc=p)
        g.settle(dataset)  # every copy made while both jobs are attached
        for s in syncs:
            (s / "go").touch()
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for s, p in zip(syncs, procs):
            kill_quietly(p.pid)
            kill_quietly(program_pid(s))
    # Both read MANIFEST.json too: its copy counts for one of them.
    extra = {"files": 1, "bytes": os.path.getsize(dataset / "MANIFEST.json")}
    mine = []
    for (out, err), p, s, half in zip(results, procs, syncs, halves):
        assert p.returncode == 0, err
        st = stats_of(s)
        files, size = len(half), sum(os.path.getsize(dataset / r) for r in half)
        got = (st["placement"]["files_placed"], st["bytes_placed"])
        assert got in ((files, size), (files + extra["files"], size + extra["bytes"])), (got, files, size)
        assert st["tiers"][0]["files_placed"] == got[0], st["tiers"]
        mine.append(got[0] - files)
    assert sum(mine) == 1, "the manifest's copy counts once"


def test_status_numbers_tiers_only_per_source(g, tmp_path):
    a = make_dataset(tmp_path / "a", classes=1, per_class=2, records=0)
    b = make_dataset(tmp_path / "b", classes=1, per_class=2, records=0)
    x, y = tmp_path / "x", tmp_path / "y"
    for src, tiers in ((a, [x, y]), (b, [y])):
        args = [g.bin, "run", "--source", src]
        for t in tiers:
            args += ["--tier", f"{t}=64M"]
        assert subprocess.run(list(map(str, [*args, "--", "true"])), env=g.env, timeout=60).returncode == 0
    text = subprocess.run([g.bin, "status"], capture_output=True, env=g.env, timeout=30).stdout.decode()
    js = g.status()
    current = None
    listed = {}
    for line in text.splitlines():
        m = re.match(r"source (\S+) ", line)
        if m:
            current = m.group(1)
            listed[current] = []
            continue
        m = re.match(r"(\s*)tier (\d+): (\S+)", line)
        if m:
            assert m.group(1) and current, f"a tier numbered outside a source's list: {line!r}\n{text}"
            listed[current].append((int(m.group(2)), m.group(3)))
    for s in js["sources"]:
        assert listed[s["source"]] == [(i, t["path"]) for i, t in enumerate(s["tiers"])], text
