"""docs/cluster.md's job script, run as written by a real Slurm (22.05, Debian's packages) on a
cluster of three nodes that tests/e2e/slurm.py starts on this machine: `sbatch` runs the serve
step (`srun --mpi=pmix granary serve`, an MPI job of three ranks, one per node) and the training
step (`granary run --attach` of a real reader on every node) side by side, and every byte the
readers read is compared with the source.

Skipped when Slurm, MUNGE or the granary binary's `mpi` feature is missing (scripts/test.sh
installs the packages as root and builds with the feature).
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

import slurm
from conftest import CLIENTS, REPO, granary_bin
from test_cluster import (built_with_mpi, direct, fanstore, files_under, proc_read_bytes,
                          small_files)
from test_source_device import device_reads, drop_caches, loop_source  # noqa: F401

pytestmark = [
    pytest.mark.skipif(bool(slurm.missing()), reason=f"no Slurm cluster here: needs "
                       f"{', '.join(slurm.missing())} (scripts/test.sh installs Slurm and MUNGE)"),
    pytest.mark.skipif(not built_with_mpi(), reason="granary was built without the `mpi` "
                       "feature: cargo build --workspace --features granary/mpi"),
]

TRAINER = CLIENTS / "slurm_trainer.py"
NODES = 3
# What `granary run --attach` prints while its node's serving rank is not up yet.
WAITING = "waiting for this node's granary agent"


def job_script() -> str:
    """The job script of docs/cluster.md, as written there (the fenced block after the marker)."""
    doc = (REPO / "docs" / "cluster.md").read_text()
    marker = doc.index("<!-- job script: tests/e2e/test_slurm.py")
    m = re.compile(r"```bash\n(.*?)```", re.S).search(doc, marker)
    assert m, "no job script in docs/cluster.md"
    return m.group(1)


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(**kw):
        c = slurm.Cluster(tmp_path / "slurm", nodes=NODES, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()
    for c in made:
        left = granary_processes(c)
        assert not left, f"granary processes left after the cluster stopped: {left}"


def granary_processes(c: slurm.Cluster) -> list:
    """Processes of the granary binary started by this cluster's jobs."""
    real = os.path.realpath(granary_bin())
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.path.realpath(d / "exe") != real:
                continue
            if f"SLURM_CONF={c.conf}".encode() in (d / "environ").read_bytes():
                out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ")))
        except OSError:
            continue
    return out


class Job:
    """The documented job script submitted to `cluster`, its program the trainer."""

    def __init__(self, c: slurm.Cluster, tmp: pathlib.Path, data: pathlib.Path, options=(),
                 trainer_args=(), gate_serve=False):
        self.c, self.tmp, self.data = c, tmp, data
        tmp.mkdir(parents=True, exist_ok=True)
        self.script = tmp / "train.sbatch"
        self.script.write_text(job_script())
        self.out = tmp / "results"
        self.out.mkdir()
        self.hold = tmp / "hold"
        self.output = tmp / "job.out"
        # The programs' preload (and the agents) log here: a wait for the agent that gave up is
        # logged with the program's pid (`gave_up`).
        self.log = tmp / "granary.log"
        bindir = tmp / "bin"
        bindir.mkdir()
        real = os.path.realpath(granary_bin())
        if gate_serve:
            # The serve step's ranks start only once the test lets them: every training task
            # is then known to have started before its node's rank had a socket.
            self.gate = tmp / "serve-may-start"
            wrapper = bindir / "granary"
            wrapper.write_text(
                "#!/bin/sh\n"
                "# granary, its `serve` held back until the test creates the gate file.\n"
                'if [ "$1" = serve ]; then\n'
                f"  i=0; while [ ! -e {self.gate} ] && [ $i -lt 3000 ]; do sleep 0.1; "
                "i=$((i+1)); done\n"
                "fi\n"
                f'exec {real} "$@"\n')
            wrapper.chmod(0o755)
        else:
            (bindir / "granary").symlink_to(real)
        env = {
            "PATH": f"{bindir}:{os.environ['PATH']}",
            "DATA": str(data),
            "TIERS": "--tier /dev/shm/granary=1G",
            # MPI between nodes: TCP on the loopback (the nodes share no /dev/shm), through
            # UCX: OpenMPI's own TCP transport (ob1/tcp) can leave a survivor's MPI hung when a
            # peer dies in the middle of a message to it (docs/cluster.md, "Faults").
            "OMPI_MCA_pml": "ucx",
            "OMPI_MCA_btl": "self",
            "OMPI_MCA_opal_common_ucx_tls": "any",
            "OMPI_MCA_opal_common_ucx_devices": "any",
            "UCX_TLS": "tcp,self",
            "UCX_NET_DEVICES": "lo",
            "OMPI_MCA_oob_tcp_if_include": "lo",
            # The barrier's bound, generous: on a loaded machine the serve may start late.
            "GRANARY_ATTACH_WAIT": "600s",
            "GRANARY_LOG": f"debug:{self.log}",
        }
        self.started = time.monotonic()
        self.id = c.sbatch(self.script,
                           [f"--nodes={NODES}", f"--output={self.output}", *options],
                           [sys.executable, TRAINER, data, "--out", self.out,
                            "--hold", self.hold, *trainer_args],
                           env=env)

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def wait_for(self, pred, what: str, timeout: float = 180):
        def check():
            st = self.c.job(self.id).get("JobState")
            if st not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                raise AssertionError(f"job ended ({st}) while waiting for {what}:\n"
                                     f"{self.text()[-5000:]}")
        return slurm.wait_for(pred, what, timeout, check)

    def signal_soon(self):
        """Shortens the job's time limit to 2–3 minutes from now: Slurm sends the job's
        `--signal` (USR1@120) at its next check of the time limits (every 30 s)."""
        run = self.c.job(self.id)["RunTime"]  # [D-]HH:MM:SS
        days, _, hms = run.rpartition("-")
        h, m, sec = map(int, hms.split(":"))
        secs = int(days or 0) * 86400 + h * 3600 + m * 60 + sec
        limit = -(-secs // 60) + 2
        subprocess.run(["scontrol", "update", f"JobId={self.id}", f"TimeLimit={limit}"],
                       env=self.c.env, check=True, timeout=60, capture_output=True)

    def finish(self, timeout: float = 400) -> dict:
        j = self.c.wait_job(self.id, timeout)
        self.elapsed = time.monotonic() - self.started
        return j

    def node_status(self, node: str) -> dict:
        """`granary status --json` on `node` (inside its namespaces, as a user there would)."""
        pid = self.c.procs[f"slurmd-{node}"].pid
        p = subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", granary_bin(), "status",
                            "--json"], capture_output=True, timeout=60)
        return (json.loads(p.stdout or b"null") or {}) if p.returncode == 0 else {}

    def status_when(self, node: str, pred, what: str) -> dict:
        """`node_status` once `pred` holds for it; a status a loaded node could not give in
        time (an empty answer) is asked again, within `wait_for`'s bound."""
        got = {}

        def ready():
            st = self.node_status(node)
            if "sources" in st and "cluster" in st and pred(st):
                got.update(st)
                return True
            return False
        self.wait_for(ready, what)
        return got

    def settled_status(self, node: str) -> dict:
        """`node_status` once nothing is pending on `node` (its placement settled)."""
        return self.status_when(node, lambda st: sum(s["pending"] for s in st["sources"]) == 0,
                                f"placement settled on {node}")


def gave_up(job: Job, node: str) -> int:
    """Waits for its agent the program on `node` gave up (test_cluster.gave_up says why a
    loaded machine makes some): each is logged with the program's pid."""
    pid = results(job, "read.json")[node]["pid"]
    text = job.log.read_text(errors="replace") if job.log.exists() else ""
    return sum(1 for line in text.splitlines()
               if line.startswith(f"granary-preload[{pid}]") and "stopped waiting" in line)


def peer_story(job: Job) -> str:
    """What each node's agent says of its peers, and the agents' log lines about ranks (no
    debug lines): why a wait for the survivors to see each other did not end."""
    views = {node: job.node_status(node).get("cluster", {}) for node in job.c.names}
    text = job.log.read_text(errors="replace") if job.log.exists() else ""
    lines = [line for line in text.splitlines()
             if "rank" in line and " DEBUG " not in line and "granary-preload" not in line]
    return (f"each node's view: {json.dumps(views)}\n"
            "the agents' lines about ranks:\n" + "\n".join(lines[-60:]))


def results(job: Job, suffix: str) -> dict:
    return {p.name.split(".")[0]: json.loads(p.read_text())
            for p in job.out.glob(f"*.{suffix}")}


def test_the_documented_job_script_runs_under_slurm(cluster, tmp_path):
    """The script of docs/cluster.md, submitted with the node count, a time limit and its
    signal on sbatch's command line: every node's program reads every byte right, from
    granary; each started before its node's serving rank (held back by the test) and waited
    for it; USR1 from `--signal=B:USR1@T` (the limit brought closer once the programs have
    read) reached every program; the job's end stopped every rank."""
    data = tmp_path / "pfs" / "data"
    small_files(data, n=120)
    fanstore(data, scale=4096)
    expected = direct(data)
    files = files_under(data)
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    c = cluster()
    # USR1 120 s before the end of a 10-minute limit; the test brings the end closer once the
    # programs have read everything (`signal_soon`).
    job = Job(c, tmp_path / "job", data, ["--time=10", "--signal=B:USR1@120"], gate_serve=True)
    # Every node's `granary run --attach` is up and waiting for its rank, which has not started.
    job.wait_for(lambda: job.text().count(WAITING) >= NODES,
                 f"{NODES} training tasks waiting for their node's rank")
    assert "granary serve: rank" not in job.text()
    job.gate.touch()
    job.wait_for(lambda: len(results(job, "read.json")) == NODES, "every node's reading")
    # While the programs wait for USR1, every serving rank is up and has read its share once.
    statuses = {}
    for node in c.names:
        statuses[node] = job.settled_status(node)["cluster"]
    job.hold.touch()
    job.signal_soon()
    j = job.finish()
    text = job.text()
    assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", (j, text[-5000:])
    print(f"job {job.id}: {job.elapsed:.1f} s from sbatch to its end")

    assert sorted(s["rank"] for s in statuses.values()) == list(range(NODES)), statuses
    assert all(p["alive"] and p["fallbacks"] == 0 for p in statuses["n0"]["peers"]), statuses
    # Each file held by one node, every node its share; everything else came from the others,
    # and a node read from the PFS only what it holds (less what the page cache had: the
    # dataset was just written). Each rank's own numbers.
    own = [s["peers"][s["rank"]] for s in statuses.values()]
    assert sum(p["bytes_held"] for p in own) == total, own
    for p in own:
        assert abs(p["bytes_held"] - total / NODES) <= largest, own
        assert p["remote_bytes"] == total - p["bytes_held"], own
        assert p["pfs_bytes"] <= p["bytes_held"], own

    got = results(job, "done.json")
    assert sorted(got) == c.names, sorted(got)
    for node, r in got.items():
        assert r["errors"] == [], (node, r["errors"][:5])
        assert r["listing"] == expected["listing"], f"{node}: listing differs"
        assert r["sha256"] == expected["sha256"], f"{node}: bytes differ"
        assert r["preload"] and r["table"], f"{node}: the program ran without granary"
        assert r["usr1"], f"{node}: USR1 did not reach the program"
    for r in range(NODES):
        assert f"granary serve: rank {r} of {NODES} ready" in text, text[-5000:]
    assert "without granary" not in text, text[-5000:]
    # The job's end stopped every rank: no process of the job is left (step daemons, agents).
    slurm.wait_for(lambda: not c.stepds(), "the job's step daemons ended", 60)
    assert not granary_processes(c)


def test_a_cancelled_job_stops_its_serve(cluster, tmp_path):
    """scancel while the programs read (as at the time limit): Slurm ends both steps, and no
    granary process of the job is left on any node."""
    data = tmp_path / "pfs" / "data"
    fanstore(data)
    c = cluster()
    job = Job(c, tmp_path / "job", data, ["--time=10"], trainer_args=["--every", "5"])
    job.wait_for(lambda: all(f"rank {r} of {NODES} ready" in job.text() for r in range(NODES))
                 and '"progress"' in job.text(), "the programs reading")
    assert granary_processes(c), "no granary process while the job runs: the test is broken"
    subprocess.run(["scancel", str(job.id)], env=c.env, check=True, timeout=60)
    j = job.finish()
    assert j["JobState"] == "CANCELLED", j
    # TERM, then KILL after KillWait (5 s here).
    slurm.wait_for(lambda: not granary_processes(c) and not c.stepds(),
                   "every process of the job gone", 60)


def agent_pid(c: slurm.Cluster, node: str) -> int:
    """The pid of `node`'s serving agent (its runtime directory, in the node's /dev/shm)."""
    root = pathlib.Path(f"/proc/{c.procs[f'slurmd-{node}'].pid}/root")
    return int((root / f"dev/shm/granary-{os.getuid()}/agent.alive").read_text())


@pytest.mark.skipif(os.getuid() != 0, reason="a loop-mounted source needs root")
def test_a_rank_killed_mid_epoch_costs_its_share_once(loop_source, cluster, tmp_path):
    """Issue 25's bar: under Slurm, a node's serving rank killed mid-epoch costs the PFS that
    rank's share once, not once per node. Slurm keeps the step's other tasks running (srun's
    default: no `--kill-on-bad-exit`); the surviving ranks write the dead one off, keep serving
    what their tiers hold, and the dead rank's files come from its stand-in, which reads each
    from the source once for both survivors. Every node's program reads every file (the dead
    node's through to the source: its agent is gone) and every byte is checked."""
    dev, mnt = loop_source
    data = mnt / "data"
    fanstore(data)
    expected = direct(data)
    files = files_under(data)
    total = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    stored = sum(p.lstat().st_blocks * 512 for p in [data, *data.rglob("*")])
    drop_caches()
    before = device_reads(dev)[1]
    c = cluster()
    job = Job(c, tmp_path / "job", data, ["--time=10"],
              trainer_args=["--every", "5", "--wait", "600", "--no-usr1"])
    job.wait_for(lambda: all(f"rank {r} of {NODES} ready" in job.text() for r in range(NODES))
                 and job.text().count('"progress"') >= NODES, "the programs reading")
    assert not results(job, "read.json"), "a program finished before the kill: too little data"
    # What rank 1 had read when it died (stopped first, so the count is final).
    dead = agent_pid(c, "n1")
    os.kill(dead, signal.SIGSTOP)
    dead_read = proc_read_bytes(dead)
    os.kill(dead, signal.SIGKILL)
    job.wait_for(lambda: len(results(job, "read.json")) == NODES, "every node's reading")
    # What each survivor read of the source (its agent and its program), once its placement
    # settled; and what it holds of the dataset.
    survivors, owned, fb = {}, {}, 0
    for node in ("n0", "n2"):
        job.settled_status(node)
        # Rank 1 written off; the survivors still serve each other. Loaded, a starved survivor
        # can be written off for a moment too (it missed its watcher's timeout); it is back as
        # soon as it is heard from again (docs/cluster.md, "Faults"), hence the bounded wait.
        seen = []

        def peers_alive(node=node, seen=seen):
            seen.append(job.node_status(node).get("cluster", {}).get("peers", []))
            return [p["alive"] for p in seen[-1]] == [True, False, True]
        try:
            job.wait_for(peers_alive, f"{node} seeing rank 1 written off, ranks 0 and 2 alive")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {seen[-1] if seen else None}\n"
                                 f"{peer_story(job)}") from None
        st = job.status_when(node, lambda st: True, f"the status of {node}")
        cl = st["cluster"]
        # Files whose owner was written off meanwhile this rank read from the source itself.
        fallbacks = cl["peers"][cl["rank"]]["fallbacks"]
        fb += fallbacks
        served = st["sources"][0]["served"]
        survivors[node] = (cl["peers"][cl["rank"]]["pfs_bytes"], served["source_bytes"])
        owned[node] = cl["bytes_owned"]
        # Its program read from the source only where a wait for its agent gave up (loaded), or
        # where its agent left the file to the program (`State::SourceOnly`, counted in its
        # fallbacks). Either way its bytes are in the budget below.
        assert served["source_opens"] <= gave_up(job, node) + fallbacks, (node, served, fallbacks)
    job.hold.touch()
    j = job.finish()
    pfs = (device_reads(dev)[1] - before) * 512
    got = results(job, "done.json")
    assert sorted(got) == c.names, (j, job.text()[-5000:])
    for node, r in got.items():
        assert r["errors"] == [], (node, r["errors"][:5])
        assert r["sha256"] == expected["sha256"] and r["listing"] == expected["listing"], node
    dead_share = total - sum(owned.values())
    read = {node: a for node, (a, _) in survivors.items()}
    print(f"job {j['JobState']}: the survivors read (agent, program) {survivors} bytes of the "
          f"source; they hold {owned}, rank 1 held {dead_share}, of {total}; rank 1 had read "
          f"{dead_read} bytes when it died; the device served {pfs} bytes for {stored} stored "
          "(the dead node's program read what it had not read yet through to the source)")
    # Each survivor's agent read its own share and at most the dead rank's, never the whole
    # dataset; together they read the dead rank's share once (every node's copy of a file of rank 1's
    # came from one stand-in), but for the file each was receiving from rank 1 when it died.
    # Without stand-ins both survivors read the rest of rank 1's share (a third of the dataset,
    # 22 MB here); with a serve that ends when a rank dies, every node reads the whole dataset.
    # Loaded, a survivor written off for a moment made the other read the files it asked for
    # meanwhile (`fallbacks`, at most one file each).
    print(f"{fb} files read again by a survivor after the other was written off for a moment")
    for node in survivors:
        assert read[node] <= owned[node] + dead_share + largest + fb * largest, \
            (node, survivors, owned, fb)
    assert sum(read.values()) <= total + 2 * largest + fb * largest, (survivors, owned, total, fb)
