"""cgroup-v1 groups for the emulated PFS: blkio throttling and a memory cap.

Every process of a run (client, its workers, `granary run` and the agent it
spawns) joins both groups through `wrap()`: a tiny shell that writes its own pid
into each group's cgroup.procs and then execs the command, so everything the
command forks is inside too.
"""

import os
import signal
import time

V1_ROOT = "/sys/fs/cgroup"


class Group:
    def __init__(self, controller, name):
        self.path = os.path.join(V1_ROOT, controller, name)
        self.controller = controller

    def create(self):
        os.makedirs(self.path, exist_ok=True)

    def write(self, key, value):
        with open(os.path.join(self.path, key), "w") as f:
            f.write(str(value))

    def read(self, key):
        with open(os.path.join(self.path, key)) as f:
            return f.read()

    def pids(self):
        try:
            return [int(x) for x in self.read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    def kill_all(self, timeout=5.0):
        """Ends what is left in the group: only processes this harness started
        (the wrapper put them there). TERM first, KILL after `timeout`."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + timeout
            while self.pids() and time.time() < deadline:
                time.sleep(0.05)
            if not self.pids():
                return

    def remove(self):
        if not os.path.isdir(self.path):
            return
        self.kill_all()
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        os.rmdir(self.path)


def available(controller):
    return os.access(os.path.join(V1_ROOT, controller, "cgroup.procs"), os.W_OK)


def wrap(groups, argv):
    """argv, run inside `groups` (list of Group)."""
    if not groups:
        return list(argv)
    script = ('while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; '
              'shift; exec "$@"')
    return ["sh", "-c", script, "granary-bench-cgexec", *(g.path for g in groups), "--", *argv]
