#!/usr/bin/env python3
"""Metadata at memory speed (issue 26): the tools people run over a dataset — `ls -lR`,
`find -ls`, `du -s`, `stat` of every file — in a later job, on the emulated PFS of the harness
(a throttled loop device, a memory cgroup; bench/README.md), against the same tools directly on
the PFS, on rclone's VFS cache mount of it (listings kept: the FUSE cache a user might mount
instead), and on a warm local copy (the tools' own time: the floor).

    sudo python3 bench/metadata.py                 # ~4 minutes -> results/metadata/report.md
    sudo python3 bench/metadata.py --runs 9 --files 3000

Each run drops the page cache, dentries and inodes first (`echo 3 > drop_caches`), as between two
jobs on a node with memory pressure; a "later job" is the second and next jobs of an agent that
served a first one (which read every file), its catalog kept and its inodes held between jobs
(`[catalog] pin_inodes`); rclone's mount stays up between runs, as a user's would. The setups
run in phases — direct and the local copy, then rclone, then granary — so that neither granary's
held inodes nor rclone's mount make the direct runs warm. Rows report
medians over `--runs` runs (setups alternating) of the wall time of the whole job (`granary run
... -- tool`; the tool alone for the others; granary's tool alone is timed inside its job in runs
of their own), and device reads of the PFS (`/sys/block/<loop>/stat`, every process included). Every output under
granary is compared with the direct one byte for byte (rclone's differs by design: its own inode
numbers and block counts; its line count is checked). The bar (issue 26): 0 device reads and
<= 0.15 s for `ls -lR` and `find -ls`, <= 0.3 x direct.

`--profile` also runs one later job of each tool under `strace -c -f` and `strace -f -tt` and
writes where the time goes to profile.md. A benchmark, not a test: it asserts nothing about
time; it exits 1 only when a job fails or an output differs.
"""
import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from granary_bench import granary, pfs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20

# The tools: name -> argv with {root} and {list} (a file naming every file, one per line).
TOOLS = {
    "ls -lR": ["ls", "-lR", "{root}"],
    "find -ls": ["find", "{root}", "-ls"],
    "du -s": ["du", "-s", "{root}"],
    "stat (every file)": ["xargs", "-d", "\\n", "-a", "{list}", "stat"],
}
# Issue 26's bar for these rows; `du` and `stat` are held to the same.
BAR_SECONDS = 0.15
BAR_RATIO = 0.3

# The tool alone inside a granary job (bash's `time`: no interpreter to start), in runs of
# their own: the job's wall time is measured without it.
INNER = ['TIMEFORMAT="tool-seconds %3R"; time "$@" > /dev/null']


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bench/metadata.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=1500, help="files in the dataset (1500)")
    p.add_argument("--classes", type=int, default=30, help="directories they are in (30)")
    p.add_argument("--kb", type=int, default=110, help="mean file size, KiB (110)")
    p.add_argument("--runs", type=int, default=5, help="runs of each tool and setup (5)")
    p.add_argument("--setups", default="direct,granary,rclone,local",
                   help="comma list among direct, granary, rclone, local")
    p.add_argument("--read-bps", type=int, default=64 * MIB, help="blkio read bandwidth cap")
    p.add_argument("--read-iops", type=int, default=150, help="blkio read IOPS cap")
    p.add_argument("--readahead-kb", type=int, default=128)
    p.add_argument("--mem-cap", type=int, default=256 * MIB,
                   help="memory cgroup cap of every process and its page cache (256 MiB)")
    p.add_argument("--granary", help="granary binary (default $GRANARY_BIN or "
                                     "target/release/granary)")
    p.add_argument("--workdir", default="/var/tmp/granary-bench-metadata")
    p.add_argument("--out", default=os.path.join(REPO, "results", "metadata"))
    p.add_argument("--profile", action="store_true",
                   help="also trace one later job of each tool (strace -c -f, strace -f -tt)")
    p.add_argument("--keep", action="store_true", help="keep the workdir")
    a = p.parse_args(argv)
    a.setups = a.setups.split(",")
    for s in a.setups:
        if s not in ("direct", "granary", "rclone", "local"):
            p.error(f"unknown setup {s}")
    if a.workdir.startswith(REPO + os.sep):
        p.error("--workdir must not be inside the repository")
    return a


def generate(root, files, classes, kb, seed=1):
    """`files` files of random bytes, log-normal sizes around `kb` KiB, in `classes` dirs."""
    r = random.Random(seed)
    paths = []
    for i in range(files):
        d = os.path.join(root, f"class{i % classes:03d}")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"img{i:06d}.jpg")
        size = max(512, min(int(r.lognormvariate(0, 0.5) * kb * 1024), 8 * kb * 1024))
        with open(p, "wb") as f:
            f.write(r.randbytes(size))
        paths.append(p)
    return paths


class Bench:
    def __init__(self, a, emu, g):
        self.a, self.emu, self.g = a, emu, g
        self.failed = False
        self.work = a.workdir
        self.outs = os.path.join(self.work, "outputs")
        os.makedirs(self.outs, exist_ok=True)
        self.cfg = os.path.join(self.work, "granary.toml")
        with open(self.cfg, "w") as f:
            # The agent must outlive the gaps between runs (other setups, cache drops).
            f.write('[agent]\nidle_timeout = "1h"\n')
        self.tier = os.path.join(self.work, "tier")
        self.rclone = None

    # ---- one run -----------------------------------------------------------

    def run(self, setup, tool, root, lst, drop=True, inner=False):
        """One job of `tool` under `setup` (its stdout kept for the comparison): wall time and
        device reads; with `inner`, the granary job times the tool alone inside it."""
        argv = [a.format(root=root, list=lst) for a in TOOLS[tool]]
        out = os.path.join(self.outs, f"{setup}-{tool.split()[0]}.out")
        if inner:
            argv = ["bash", "-c", *INNER, "bash", *argv]
        if setup == "granary":
            argv = self.granary_argv(argv)
        if drop:
            self.emu.drop_caches()
        s0 = self.emu.stat()
        with open(out, "wb") as f:
            t0 = time.monotonic()
            p = subprocess.run(self.emu.wrap(argv), stdout=f, stderr=subprocess.PIPE, text=True,
                               timeout=600)
            wall = time.monotonic() - t0
        s1 = self.emu.stat()
        r = {"setup": setup + ("-inner" if inner else ""), "tool": tool, "wall": wall,
             "device_reads": s1[0] - s0[0], "device_bytes": s1[1] - s0[1], "rc": p.returncode,
             "output": out}
        if inner:
            r["tool_seconds"] = next((float(line.split()[1]) for line in p.stderr.splitlines()
                                      if line.startswith("tool-seconds ")), float("nan"))
        if p.returncode != 0:
            self.failed = True
            r["stderr"] = p.stderr[-2000:]
            log(f"  FAILED {tool} / {setup}: rc {p.returncode}: {p.stderr[-500:]}")
        return r

    def granary_argv(self, cmd):
        return self.g.run_argv(self.emu.mount, [(self.tier, "1G")], None,
                               ["--config", self.cfg, "-q"], cmd)

    # ---- setups ------------------------------------------------------------

    def first_granary_job(self, root):
        """The job before: reads every file (placement), then the agent keeps the catalog and,
        once no job runs, holds the source's inodes."""
        left = self.g.stop(self.emu.groups())
        if left:
            raise RuntimeError(f"processes {left} left in the bench cgroups")
        shutil.rmtree(self.tier, ignore_errors=True)
        os.makedirs(self.tier)
        self.emu.drop_caches()
        t0 = time.monotonic()
        cmd = ["sh", "-c", 'find "$0" -type f -exec cat {} + > /dev/null', root]
        subprocess.run(self.emu.wrap(self.granary_argv(cmd)), check=True, timeout=1800)
        t1 = time.monotonic()
        # The agent is in our cgroups: it must stay for the later jobs.
        held = self.wait_agent_idle(root)
        log(f"  first granary job {t1 - t0:.1f} s, then placement done and {held} entries held "
            f"after {time.monotonic() - t1:.1f} s")

    def wait_agent_idle(self, root, timeout=120):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            st = self.status()
            mine = [s for s in st.get("sources", [])
                    if os.path.realpath(s.get("source", "")) == os.path.realpath(root)]
            if mine and all(s.get("pending", 1) == 0 for s in mine):
                held = sum(s.get("held_files", 0) + s.get("held_dirs", 0) for s in mine)
                if held and held == last:
                    return held
                last = held
            time.sleep(0.5)
        log(f"  WARNING: the agent did not settle (placement or held inodes) in {timeout} s: "
            + json.dumps([{k: v for k, v in s.items() if not isinstance(v, (dict, list))}
                          for s in self.status().get("sources", [])]))
        return 0

    def status(self):
        p = subprocess.run([self.g.path, "status", "--json"], capture_output=True, timeout=60)
        try:
            return json.loads(p.stdout or b"{}") or {}
        except ValueError:
            return {}

    def start_rclone(self, root):
        """rclone's VFS cache mount of the PFS, inside the cgroups (its reads are throttled and
        counted), listings and attributes kept for an hour; warmed by a listing and a read of
        every file through it (its 'first job')."""
        if shutil.which("rclone") is None or not os.path.exists("/dev/fuse"):
            return "rclone or /dev/fuse missing (apt-get install rclone fuse3)"
        mnt = os.path.join(self.work, "rclone-mnt")
        os.makedirs(mnt, exist_ok=True)
        conf = os.path.join(self.work, "rclone.conf")
        open(conf, "w").close()
        argv = ["rclone", "mount", root, mnt, "--config", conf,
                "--cache-dir", os.path.join(self.work, "rclone-cache"),
                "--vfs-cache-mode", "full", "--dir-cache-time", "1000h",
                "--attr-timeout", "1000h", "--poll-interval", "0", "--read-only",
                "--log-file", os.path.join(self.work, "rclone.log")]
        self.rclone = subprocess.Popen(self.emu.wrap(argv), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        self.rclone_mnt = mnt
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if self.rclone.poll() is not None or time.monotonic() > deadline:
                return f"rclone mount did not come up (see {self.work}/rclone.log)"
            time.sleep(0.1)
        self.emu.drop_caches()
        t0 = time.monotonic()
        subprocess.run(self.emu.wrap(["sh", "-c", 'ls -lR "$0" > /dev/null; '
                                      'find "$0" -type f -exec cat {} + > /dev/null', mnt]),
                       check=True, timeout=1800)
        log(f"  rclone mount warmed (listed, every file read): {time.monotonic() - t0:.1f} s")
        return None

    def stop_rclone(self):
        if self.rclone is None:
            return
        subprocess.run(["fusermount3", "-u", self.rclone_mnt], capture_output=True)
        try:
            self.rclone.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.rclone.pid, signal.SIGKILL)
            self.rclone.wait()
        self.rclone = None

    # ---- the matrix ---------------------------------------------------------

    def matrix(self, root, files, local_root, local_files):
        rows = []
        roots = {"direct": root, "granary": root, "local": local_root, "rclone": None}
        lists = {}
        for name, fl in (("pfs", files), ("local", local_files)):
            lists[name] = os.path.join(self.work, f"files-{name}.txt")
            with open(lists[name], "w") as f:
                f.write("\n".join(fl) + "\n")
        setups = [s for s in self.a.setups if s in roots]
        # Phases, each with only its own processes up: granary's agent holds the source's
        # inodes between jobs (nothing else then evicts them), which would make the direct
        # runs warm; rclone's mount holds its listings. Within a phase the setups alternate.
        phases = [[s for s in setups if s in ("direct", "local")],
                  [s for s in setups if s == "rclone"], [s for s in setups if s == "granary"]]
        for phase in phases:
            if not phase:
                continue
            if phase == ["rclone"]:
                why = self.start_rclone(root)
                if why:
                    log(f"rclone skipped: {why}")
                    self.rclone_note = why
                    continue
                roots["rclone"] = self.rclone_mnt
                lists["rclone"] = os.path.join(self.work, "files-rclone.txt")
                with open(lists["rclone"], "w") as f:
                    f.write("\n".join(self.rclone_mnt + p[len(root):] for p in files) + "\n")
            if phase == ["granary"]:
                self.first_granary_job(root)
            for tool in TOOLS:
                for rep in range(self.a.runs):
                    for setup in phase:
                        lst = lists.get(setup, lists["pfs"])
                        # The local copy is the floor: warm (one unmeasured run first).
                        warm = setup == "local"
                        if warm and rep == 0:
                            self.run(setup, tool, roots[setup], lst, drop=False)
                        r = self.run(setup, tool, roots[setup], lst, drop=not warm)
                        r["rep"] = rep
                        rows.append(r)
                        if setup == "granary":
                            self.compare(tool, r)
                            r = self.run(setup, tool, roots[setup], lst, inner=True)
                            r["rep"] = rep
                            rows.append(r)
                log(f"  {tool}: " + ", ".join(
                    f"{s} {med(rows, s, tool, 'wall'):.3f} s / "
                    f"{med(rows, s, tool, 'device_reads'):.0f} reads" for s in phase))
            if phase == ["rclone"]:
                self.stop_rclone()
        return rows

    def compare(self, tool, r):
        """The granary output against the direct one of the same tool (run just before)."""
        want = os.path.join(self.outs, f"direct-{tool.split()[0]}.out")
        if not os.path.exists(want):
            return
        with open(want, "rb") as a, open(r["output"], "rb") as b:
            same = a.read() == b.read()
        r["same_as_direct"] = same
        if not same:
            self.failed = True
            log(f"  MISMATCH: {tool} under granary differs from direct ({r['output']})")

    def attach_only(self, rows):
        """`granary run -- true`: the job's own cost, nothing asked of the source; then the same
        with granary's binary and library read back into the page cache after the drop (what
        loading them from the local disk costs)."""
        lib = os.path.join(os.path.dirname(self.g.path), "libgranary_preload.so")
        for rep in range(2 * self.a.runs):
            warm = rep >= self.a.runs
            argv = self.granary_argv(["true"])
            self.emu.drop_caches()
            if warm:
                for f in (self.g.path, lib):
                    if os.path.exists(f):
                        subprocess.run(["cat", f], stdout=subprocess.DEVNULL)
            s0 = self.emu.stat()
            t0 = time.monotonic()
            p = subprocess.run(self.emu.wrap(argv), capture_output=True, timeout=600)
            wall = time.monotonic() - t0
            s1 = self.emu.stat()
            tool = "true, binaries in page cache" if warm else "true (the job alone)"
            rows.append({"setup": "granary", "tool": tool, "wall": wall,
                         "device_reads": s1[0] - s0[0],
                         "device_bytes": s1[1] - s0[1], "rc": p.returncode, "rep": rep})

    def profile(self, root, lst):
        """One later job of each tool under strace: syscall counts and times (-c), and a
        timestamped trace (-tt) of where the wall time goes."""
        out = []
        for tool in TOOLS:
            argv = [x.format(root=root, list=lst) for x in TOOLS[tool]]
            tag = tool.split()[0]
            for mode, flags in (("count", ["-c", "-f"]), ("trace", ["-f", "-tt", "-T"])):
                trace = os.path.join(self.work, f"strace-{tag}-{mode}.txt")
                cmd = ["strace", *flags, "-o", trace, *self.granary_argv(argv)]
                self.emu.drop_caches()
                t0 = time.monotonic()
                subprocess.run(self.emu.wrap(cmd), capture_output=True, timeout=600)
                out.append((tool, mode, time.monotonic() - t0, trace))
        return out


def med(rows, setup, tool, key):
    v = [r[key] for r in rows if r["setup"] == setup and r["tool"] == tool
         and r.get("rc") == 0 and key in r and r[key] == r[key]]
    return statistics.median(v) if v else float("nan")


def report(a, rows, emu, extra, out):
    lines = ["# Metadata in a later job (issue 26)", "",
             "Command: `sudo python3 bench/metadata.py " + " ".join(sys.argv[1:]) + "`", "",
             f"Dataset: {a.files} files ({a.kb} KiB mean) in {a.classes} directories on the "
             f"emulated PFS ({a.read_bps >> 20} MiB/s, {a.read_iops} IOPS, memory cap "
             f"{a.mem_cap >> 20} MiB); page cache, dentries and inodes dropped before every run "
             f"but the local floor's. Medians of {a.runs} runs; granary's seconds are the whole "
             "job's (`granary run ... -- tool`), its tool alone is timed inside the job.", ""]
    if extra.get("rclone"):
        lines += [f"rclone: {extra['rclone']}", ""]
    setups = [s for s in ("direct", "granary", "rclone", "local") if any(
        r["setup"] == s for r in rows)]
    head = ("| tool | " + " | ".join(f"{s} s | {s} reads" for s in setups)
            + (" | granary: tool alone s" if "granary" in setups else "") + " | bar | met |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for tool in list(TOOLS) + ["true (the job alone)", "true, binaries in page cache"]:
        if not any(r["tool"] == tool for r in rows):
            continue
        cells = []
        for s in setups:
            cells += [f"{med(rows, s, tool, 'wall'):.3f}", f"{med(rows, s, tool, 'device_reads'):.0f}"]
        if "granary" in setups:
            cells.append(f"{med(rows, 'granary-inner', tool, 'tool_seconds'):.3f}")
        g, d = med(rows, "granary", tool, "wall"), med(rows, "direct", tool, "wall")
        reads = med(rows, "granary", tool, "device_reads")
        if tool in TOOLS:
            bar = f"0 reads, ≤ {BAR_SECONDS} s, ≤ {BAR_RATIO} × direct"
            met = "yes" if reads == 0 and g <= BAR_SECONDS and g <= BAR_RATIO * d else (
                f"no ({g:.3f} s, {g / d:.2f} × direct, {reads:.0f} reads)" if d == d else "?")
        else:
            bar, met = "—", "—"
        lines.append(f"| {tool} | " + " | ".join(cells) + f" | {bar} | {met} |")
    mism = [r for r in rows if r.get("same_as_direct") is False]
    lines += ["", "Outputs under granary identical to direct: "
              + ("yes, every run" if not mism else f"NO ({len(mism)} runs differ)"), ""]
    if extra.get("profile"):
        lines += ["## Traces (one later job each, `--profile`)", ""]
        for tool, mode, secs, trace in extra["profile"]:
            lines.append(f"- {tool}, strace {mode}: {secs:.3f} s under strace, `{trace}`")
        lines.append("")
    lines += ["## Emulation", ""] + [f"- {k}: {v}" for k, v in emu.params.items()]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"rows": rows, "knobs": vars(a), "emulation": emu.params,
                   "extra": {k: v for k, v in extra.items() if k != "profile"}}, f, indent=1)
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: (_ for _ in ()).throw(KeyboardInterrupt(f"signal {s}")))
    knobs = SimpleNamespace(workdir=a.workdir, readahead_kb=a.readahead_kb, read_bps=a.read_bps,
                            read_iops=a.read_iops, mem_cap=a.mem_cap)
    extra = {}
    with contextlib.ExitStack() as stack:
        os.makedirs(a.workdir, exist_ok=True)
        if not a.keep:
            stack.callback(shutil.rmtree, a.workdir, True)
        emu = pfs.EmulatedPFS(knobs, log)
        emu.setup(stack, int(a.files * a.kb * 1024 * 1.6) + (64 << 20))
        root = os.path.join(emu.mount, "data")
        log(f"generating {a.files} files in {root}")
        files = generate(root, a.files, a.classes, a.kb)
        emu.seal()
        local_root = os.path.join(a.workdir, "local", "data")
        shutil.copytree(root, local_root)
        local_files = [local_root + p[len(root):] for p in files]
        g, reason = granary.Granary.locate(a.granary, log)
        b = None
        if g is None:
            log(f"granary skipped: {reason}")
            a.setups = [s for s in a.setups if s != "granary"]
        else:
            stack.callback(g.cleanup, emu.groups())
        b = Bench(a, emu, g)
        stack.callback(b.stop_rclone)
        rows = b.matrix(root, files, local_root, local_files)
        if "rclone" in a.setups:
            extra["rclone"] = getattr(b, "rclone_note", None) or (
                "rclone mount, --vfs-cache-mode full, --dir-cache-time and --attr-timeout "
                "1000h, warmed by a listing and a read of every file")
        if "granary" in a.setups:
            b.attach_only(rows)
            if a.profile:
                extra["profile"] = b.profile(root, os.path.join(a.workdir, "files-pfs.txt"))
        text = report(a, rows, emu, extra, a.out)
        print(text)
        if a.profile:
            for tool, mode, secs, trace in extra.get("profile", []):
                if mode == "count":
                    dst = os.path.join(a.out, os.path.basename(trace))
                    shutil.copyfile(trace, dst)
    return 1 if b is None or b.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); everything set up was torn down")
        sys.exit(130)
