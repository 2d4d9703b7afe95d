"""A real Slurm cluster on one machine, for the end-to-end tests of docs/cluster.md's job script.

Slurm 22.05 and MUNGE from the distribution's packages (scripts/test.sh installs them), every
file under one temporary directory: munged with its own key and socket, slurmctld, and one
slurmd per emulated node. Each node's slurmd runs in namespaces of its own (`unshare`): its own
host name, its own /dev/shm (a tmpfs) and its own directory for the PMIx plugin, so each node
has node-local storage at the same paths as the others, as real nodes do, and the job script
runs unchanged: `granary serve --tier /dev/shm/…` on every node, `granary run --attach` finding
its node's agent in its node's /dev/shm. Everything else (processes, the network, the source
under the test's directory) is shared, as on a cluster whose nodes share a file system.

The configuration's choices are docs/cluster.md's ("Slurm"): every node declares this machine's
CPUs and memory (`slurmd -C`), so the nodes' tasks share its cores; proctrack/linuxproc and
task/affinity (no cgroups); CR_CPU; MpiDefault=none (the serve step asks for `--mpi=pmix`).
"""
import contextlib
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo",
           "squeue", "scancel", "unshare"]


def missing() -> list:
    """What this machine lacks to run the cluster (empty: nothing)."""
    out = [d for d in DAEMONS if shutil.which(d) is None]
    if not pathlib.Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so").exists() and \
            not list(pathlib.Path("/usr/lib").glob("*/slurm-wlm/mpi_pmix*.so")):
        out.append("slurm's mpi/pmix plugin")
    if os.getuid() != 0:
        out.append("root (slurmd starts jobs as their user; the nodes need namespaces)")
    return out


# Ports handed out in this process: a daemon's port is bound only when it starts.
_TAKEN: set = set()


def free_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range and never handed out
    before in this process. One the kernel picked (`bind(("", 0))`) was free only until the
    socket closed: an outgoing connection, or the next pick, could take it before slurmd bound
    it ("Unable to bind listen port: Address already in use", seen once in a CI run)."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        port = random.randint(max(1024, low - 12000), low - 1)
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port
    raise AssertionError("no free port below the ephemeral range")


def hardware() -> dict:
    """This machine as slurmd sees it (`slurmd -C`): CPUs, sockets, cores, threads, memory."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60).stdout
    fields = dict(f.split("=", 1) for f in out.split("\n")[0].split() if "=" in f)
    keep = ["CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory"]
    return {k: fields[k] for k in keep if k in fields}


def wait_for(pred, what: str, timeout: float, proc_check=None):
    """Polls `pred` until true, at most `timeout` seconds (generous: the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc_check:
            proc_check()
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


class Cluster:
    def __init__(self, root: pathlib.Path, nodes: int = 3, shm_size: str = "4g"):
        self.root = root
        self.names = [f"n{i}" for i in range(nodes)]
        self.etc = root / "etc"
        self.log = root / "log"
        for d in [self.etc, self.log, root / "munge", root / "ctld"]:
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(root / "munge", 0o700)
        self.conf = self.etc / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        # Our own clients must never reach another cluster: no DNS SRV look-up, this file only.
        self.env.pop("SLURM_CONFIG_DIR", None)
        self.shm_size = shm_size
        try:
            self._munge()
            self._write_conf()
            self._start("slurmctld", ["slurmctld", "-D", "-f", self.conf])
            for name in self.names:
                self._node(name)
            wait_for(self._all_idle, "every node idle", 120, self._alive)
        except BaseException:
            self.stop()
            raise

    # -- start-up --------------------------------------------------------------------------

    def _start(self, key: str, cmd: list, env=None):
        out = open(self.log / f"{key}.out", "wb")
        self.procs[key] = subprocess.Popen(list(map(str, cmd)), stdout=out, stderr=out,
                                           env=env or self.env, start_new_session=True)
        out.close()

    def _alive(self):
        for key, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{key} exited ({p.returncode}):\n{self.logs()}")

    def _munge(self):
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", key], check=True, timeout=60,
                       capture_output=True)
        os.chmod(key, 0o600)
        self._start("munged", ["munged", "--foreground", "--force", "--key-file", key,
                               "--socket", self.munge_socket,
                               "--pid-file", self.root / "munge" / "munged.pid",
                               "--log-file", self.log / "munged.log",
                               "--seed-file", self.root / "munge" / "munged.seed"])

        def works():
            enc = subprocess.run(["munge", "-n", "-S", self.munge_socket], capture_output=True,
                                 timeout=30)
            return enc.returncode == 0 and subprocess.run(
                ["unmunge", "-S", self.munge_socket], input=enc.stdout, capture_output=True,
                timeout=30).returncode == 0
        wait_for(works, "munged answering", 60, self._alive)

    def _write_conf(self):
        hw = hardware()
        node_hw = " ".join(f"{k}={v}" for k, v in hw.items())
        ctl_port = free_port()
        lines = [
            "ClusterName=granary-test",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'ctld'}",
            f"SlurmctldPidFile={self.root / 'ctld' / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.log / 'slurmctld.log'}",
            # %n: each node's own spool, pid file and log.
            f"SlurmdSpoolDir={self.root / 'node-%n'}",
            f"SlurmdPidFile={self.root / 'node-%n' / 'slurmd.pid'}",
            f"SlurmdLogFile={self.log / 'slurmd-%n.log'}",
            "SlurmdDebug=verbose",
            "SlurmctldDebug=verbose",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/affinity",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            # Quick teardown of what a finished or cancelled job left: TERM, then KILL 5 s later.
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "MessageTimeout=30",
            # Each node's slurmd answers on a port of its own (they share one address).
        ]
        for name in self.names:
            port = free_port()
            (self.root / f"node-{name}").mkdir(exist_ok=True)
            lines.append(f"NodeName={name} NodeHostname={name} NodeAddr=127.0.0.1 Port={port} "
                         f"{node_hw} State=UNKNOWN")
        lines.append(f"PartitionName=batch Nodes={','.join(self.names)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # Debian's plugstack.conf includes a directory of SPANK plugins: none here.
        (self.etc / "plugstack.conf").write_text("")
        # The PMIx plugin's per-step directories (default /tmp, shared by the emulated nodes:
        # they would clash) go to a node-local directory: each node mounts its own over it.
        (self.root / "node-tmp").mkdir(exist_ok=True)
        (self.etc / "mpi.conf").write_text(f"PMIxCliTmpDirBase={self.root / 'node-tmp'}\n")

    def _node(self, name: str):
        # Its own host name, /dev/shm and PMIx directory: node-local storage, as on a real node.
        local = self.root / f"node-{name}" / "tmp"
        local.mkdir(parents=True, exist_ok=True)
        script = (f"hostname {name} && mount --make-rprivate / && "
                  f"mount -t tmpfs -o size={self.shm_size},mode=1777 tmpfs /dev/shm && "
                  f"mount --bind {local} {self.root / 'node-tmp'} && "
                  f"exec slurmd -D -N {name} -f {self.conf}")
        self._start(f"slurmd-{name}", ["unshare", "--uts", "--mount", "--propagation",
                                       "private", "sh", "-c", script])

    def _all_idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                           text=True, env=self.env, timeout=60)
        states = dict(l.split() for l in p.stdout.splitlines() if l.strip())
        return p.returncode == 0 and all(states.get(n) == "idle" for n in self.names)

    # -- jobs ------------------------------------------------------------------------------

    def sbatch(self, script: pathlib.Path, options=(), args=(), env=None) -> int:
        """Submits `script` with sbatch `options` (which override its #SBATCH lines) and
        `args` (the script's own); returns the job id."""
        p = subprocess.run(["sbatch", "--parsable", *map(str, options), str(script),
                            *map(str, args)],
                           capture_output=True, text=True, env={**self.env, **(env or {})},
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return int(p.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        p = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True,
                           text=True, env=self.env, timeout=60)
        if p.returncode != 0:
            return {}
        out = {}
        for field in p.stdout.split():
            k, _, v = field.partition("=")
            out.setdefault(k, v)
        return out

    def wait_job(self, job_id: int, timeout: float) -> dict:
        done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
        return wait_for(lambda: (lambda j: j if j.get("JobState") in done else None)(
            self.job(job_id)), f"job {job_id} finished", timeout, self._alive)

    def stepds(self) -> list:
        """Pids of slurmstepd processes of this cluster (their environment names our conf)."""
        out = []
        for d in pathlib.Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if not (d / "cmdline").read_bytes().startswith(b"slurmstepd"):
                    continue
                if f"SLURM_CONF={self.conf}".encode() in (d / "environ").read_bytes():
                    out.append(int(d.name))
        return out

    def logs(self) -> str:
        parts = []
        for f in sorted(self.log.iterdir()):
            text = f.read_text(errors="replace")
            parts.append(f"--- {f.name}\n{text[-3000:]}")
        return "\n".join(parts)

    # -- teardown --------------------------------------------------------------------------

    def stop(self):
        """Cancels every job, stops the daemons, and makes sure no process of the cluster is
        left (the step daemons included)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())],
                           capture_output=True, env=self.env, timeout=60)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not self.stepds(), "the jobs' step daemons ended", 60)
        for pid in self.stepds():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for key in sorted(self.procs, key=lambda k: k == "munged"):  # munged last
            p = self.procs[key]
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=30)
