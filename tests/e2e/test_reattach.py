"""Re-attach without a walk (issue "ImageNet scale"): a job that finds the catalog of an earlier
job — kept by the agent, or saved beside the cache and loaded by a new agent — starts at once and
never serves what changed in between, in any identity field, even when it reads a file before
the background validation reaches it; a damaged copy is never served either."""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from conftest import Granary, direct, source_meta, tier_files

READ_ALL = [sys.executable, "-c", """
import hashlib, os, sys
root = sys.argv[1]
for d, dirs, files in sorted(os.walk(root)):
    dirs.sort()
    for f in sorted(files):
        p = os.path.join(d, f)
        try:
            with open(p, 'rb') as fh:
                data = fh.read()
            st = os.stat(p)
            print(os.path.relpath(p, root), st.st_size, st.st_ino, st.st_mtime_ns,
                  hashlib.sha256(data).hexdigest())
        except OSError as e:
            print(os.path.relpath(p, root), 'error', e.errno)
"""]


def tree(root: pathlib.Path):
    for d in range(3):
        (root / f"d{d}").mkdir(parents=True, exist_ok=True)
        for i in range(6):
            (root / f"d{d}" / f"f{i}").write_bytes(bytes([65 + i]) * (3000 + 100 * i + d))
    return root


def config(tmp_path, **catalog):
    cfg = tmp_path / "granary.toml"
    lines = ["[catalog]"] + [f"{k} = {str(v).lower()}" for k, v in catalog.items()]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def restore_mtime(path, ns):
    os.utime(path, ns=(ns, ns))


def change_every_identity_field(src: pathlib.Path):
    """One file per identity field; each keeps size and mtime where the change allows."""
    # Same size, mtime restored (cp -p / rsync -t / touch -d): only ctime tells.
    p = src / "d0" / "f0"
    st = p.stat()
    p.write_bytes(b"Z" * st.st_size)
    restore_mtime(p, st.st_mtime_ns)
    # Replaced by rename, same size and mtime: another inode.
    p = src / "d0" / "f1"
    st = p.stat()
    tmp = src.parent / "replacement"
    tmp.write_bytes(b"Y" * st.st_size)
    restore_mtime(tmp, st.st_mtime_ns)
    os.rename(tmp, p)
    # chmod and back: only ctime.
    p = src / "d1" / "f2"
    mode = p.stat().st_mode
    p.chmod(0o600)
    p.chmod(mode & 0o7777)
    # Truncated (size), and mtime moved (touch).
    (src / "d1" / "f3").write_bytes(b"short")
    p = src / "d2" / "f4"
    os.utime(p, ns=(1, 10**18))
    # Removed, and a new name.
    (src / "d2" / "f5").unlink()
    (src / "d2" / "new").write_bytes(b"new file")


@pytest.mark.parametrize("restart", [False, True], ids=["agent-kept", "agent-restarted"])
@pytest.mark.parametrize("threads", [0, 4], ids=["no-background", "background"])
def test_changes_between_jobs_are_never_served(granary, tmp_path, restart, threads):
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    cfg = config(tmp_path, validate_threads=threads)
    extra = ["--config", str(cfg)]
    proc, stats = granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    assert proc.stdout == direct([*READ_ALL, src]).stdout
    granary.settle(src)
    proc, stats = granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    assert tier_files(stats) == 18, stats
    change_every_identity_field(src)
    if restart:
        granary.stop()
    proc, stats = granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    assert proc.stdout == direct([*READ_ALL, src]).stdout
    assert stats["catalog"]["walk_s"] < 30
    # The unchanged files still come from the tier: the catalog was reused, not thrown away.
    assert tier_files(stats) >= 12, stats


def three_damaged_copies(granary, tmp_path):
    """The tree placed by a job, the agent stopped, then three of its 18 copies damaged behind
    granary's back: same size with a flipped byte, truncated, replaced by a FIFO. Returns the
    source, the tier and the job arguments (no background validation)."""
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    extra = ["--config", str(config(tmp_path, validate_threads=0))]
    granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    granary.settle(src)
    granary.stop()
    objects = sorted(p for p in tier.rglob("*") if p.is_file() and p.parent.name == "objects")
    assert len(objects) == 18
    data = bytearray(objects[0].read_bytes())
    data[10] ^= 0xFF
    objects[0].write_bytes(bytes(data))
    with open(objects[1], "r+b") as f:
        f.truncate(5)
    objects[2].unlink()
    os.mkfifo(objects[2], 0o600)
    return src, tier, extra


def test_a_damaged_copy_is_never_served(granary, tmp_path):
    src, tier, extra = three_damaged_copies(granary, tmp_path)
    proc, stats = granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    assert proc.stdout == direct([*READ_ALL, src]).stdout
    assert tier_files(stats) == 15, stats


# How a program first uses an fd of a copy: the copy's identity is checked at that first use
# (`open` with O_CLOEXEC defers it), whichever call it is.
FIRST_USES = {
    "fstat": "with open(p, 'rb') as f: data = f.read()",
    "read": "fd = os.open(p, os.O_RDONLY)\ndata = b''.join(iter(lambda: os.read(fd, 700), b''))\n"
            "os.close(fd)",
    "pread": "fd = os.open(p, os.O_RDONLY); data = os.pread(fd, 1 << 20, 0); os.close(fd)",
    "dup": "fd = os.open(p, os.O_RDONLY); fd2 = os.dup(fd); os.close(fd)\n"
           "data = os.read(fd2, 1 << 20); os.close(fd2)",
    "sendfile": "fd = os.open(p, os.O_RDONLY); r, w = os.pipe()\n"
                "n = os.sendfile(w, fd, None, 1 << 15); data = os.read(r, 1 << 16)\n"
                "os.close(fd); os.close(r); os.close(w)",
    "mmap": "import mmap\nfd = os.open(p, os.O_RDONLY)\n"
            "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); data = bytes(m); m.close(); os.close(fd)",
    # A forked child shares the fd before anybody used it: the copy cannot be swapped under a
    # shared offset, so the parent's reads are served from the source call by call.
    "fork": "fd = os.open(p, os.O_RDONLY); pid = os.fork()\nif pid == 0: os._exit(0)\n"
            "os.waitpid(pid, 0)\ndata = b''.join(iter(lambda: os.read(fd, 700), b''))\nos.close(fd)",
}


@pytest.mark.parametrize("first_use", FIRST_USES)
def test_a_copy_damaged_before_its_first_use_is_never_served(granary, tmp_path, first_use):
    """A copy is checked against what the agent recorded before the first byte or stat of it
    reaches the program, whether the program's first call on the fd is an `fstat` (CPython's
    `open`, where the check rides on it), a read, a positioned read, a `dup`, a `sendfile` or
    an `mmap`, or a `fork` shared it first."""
    src, tier, extra = three_damaged_copies(granary, tmp_path)
    prog = [sys.executable, "-c", "import hashlib, os, sys\nroot = sys.argv[1]\n"
            "for d, dirs, files in sorted(os.walk(root)):\n    dirs.sort()\n"
            "    for f in sorted(files):\n        p = os.path.join(d, f)\n"
            + "".join("        " + line + "\n" for line in FIRST_USES[first_use].split("\n"))
            + "        print(os.path.relpath(p, root), len(data), hashlib.sha256(data).hexdigest())\n",
            src]
    proc, stats = granary.run(src, prog, tier=tier, extra=extra)
    want = direct(prog).stdout
    assert want.count(b"\n") == 18
    assert proc.stdout == want
    assert tier_files(stats) == 15, stats


# A program that opens three dataset files, closes each fd by a raw system call (out of
# granary's sight) and gets its number back from `pipe()`; what follows uses `r` and `w`.
FD_REUSED_BY_A_PIPE = """
import ctypes, os, platform, stat, sys
SYS_close = {"x86_64": 3, "aarch64": 57}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
out = []
for name in ("d0/f1", "d1/f2", "d2/f3"):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    assert libc.syscall(SYS_close, fd) == 0
    r, w = os.pipe()
    assert r == fd, (r, fd)"""


def test_a_copy_fd_closed_behind_granarys_back_is_never_mistaken(granary, tmp_path):
    """A copy's fd closed by a raw system call before its first use, its number then reused by
    a pipe (both out of granary's sight): the pipe stays a pipe for reads and `fstat` — the
    first-use check sees it is no copy and forgets the number, it never puts a file under it."""
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    prog = [sys.executable, "-c", FD_REUSED_BY_A_PIPE + """
    os.write(w, b"pipe bytes " + name.encode())
    os.close(w)
    out.append((stat.S_ISFIFO(os.fstat(r).st_mode), os.read(r, 100)))
    os.close(r)
print(out)
""", src]
    proc, stats = granary.run(src, prog, tier=tier)
    assert proc.stdout == direct(prog).stdout
    assert b"(True, b'pipe bytes d0/f1')" in proc.stdout
    assert tier_files(stats) == 3, stats


# A reader of whole small files (open, read into a buffer larger than the file, close): its
# first read is the copy's check — the bytes it returns must be exactly as many as the file has
# and carry the checksum the agent recorded — so no `fstat` of its own.
WHOLE_READ = ("fd = os.open(p, os.O_RDONLY)\n"
              "data = b''.join(iter(lambda: os.read(fd, 1 << 16), b''))\nos.close(fd)")


def test_a_copy_damaged_before_a_whole_file_read_is_never_served(granary, tmp_path):
    """A small copy checked by the bytes of its first read, not by an `fstat`: a copy with a
    flipped byte, truncated, longer than the file, a FIFO or a directory in its place is never
    served — the reads come from the source — and the intact copies are."""
    src, tier, extra = three_damaged_copies(granary, tmp_path)
    objects = sorted(p for p in tier.rglob("*") if p.parent.name == "objects")
    assert len(objects) == 18
    with open(objects[3], "ab") as f:
        f.write(b"four")
    objects[4].unlink()
    objects[4].mkdir(mode=0o700)
    prog = [sys.executable, "-c", "import hashlib, os, sys\nroot = sys.argv[1]\n"
            "for d, dirs, files in sorted(os.walk(root)):\n    dirs.sort()\n"
            "    for f in sorted(files):\n        p = os.path.join(d, f)\n"
            + "".join("        " + line + "\n" for line in WHOLE_READ.split("\n"))
            + "        print(os.path.relpath(p, root), len(data), hashlib.sha256(data).hexdigest())\n",
            src]
    proc, stats = granary.run(src, prog, tier=tier, extra=extra)
    want = direct(prog).stdout
    assert want.count(b"\n") == 18
    assert proc.stdout == want
    assert tier_files(stats) == 13, stats


def test_a_whole_file_read_of_an_fd_reused_behind_granarys_back_is_the_programs(granary, tmp_path):
    """A copy's fd closed by a raw system call before its first use and its number reused by a
    pipe: a first read larger than the copy reads the pipe — its bytes are the program's, and
    the pipe stays a pipe for `fstat` after it."""
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    prog = [sys.executable, "-c", FD_REUSED_BY_A_PIPE + """
    os.write(w, b"pipe bytes " + name.encode())
    first = os.read(r, 1 << 16)
    os.write(w, b" and more")
    os.close(w)
    out.append((first, stat.S_ISFIFO(os.fstat(r).st_mode), os.read(r, 100)))
    os.close(r)
print(out)
""", src]
    proc, stats = granary.run(src, prog, tier=tier)
    assert proc.stdout == direct(prog).stdout
    assert b"(b'pipe bytes d0/f1', True, b' and more')" in proc.stdout
    assert tier_files(stats) == 3, stats


def test_a_bad_buffer_at_a_whole_file_first_read_is_the_kernels_error(granary, tmp_path):
    """A first read of a small copy into a buffer the kernel cannot write gets `EFAULT`, as
    directly, and the intact copy stays in use: the next read is served from it."""
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    prog = [sys.executable, "-c", """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = []
for name in ("d0/f1", "d1/f2"):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    r = libc.read(fd, ctypes.c_void_p(8), 1 << 16)
    out.append((r, ctypes.get_errno(), os.read(fd, 1 << 16)))
    os.close(fd)
print(out)
""", src]
    proc, stats = granary.run(src, prog, tier=tier)
    assert proc.stdout == direct(prog).stdout
    assert b"(-1, 14, b'BBB" in proc.stdout
    assert tier_files(stats) == 2, stats


def test_immutable_validates_directories_only(granary, tmp_path):
    """Declared immutable: a directory whose identity holds vouches for its files, so a job
    re-attaching makes one metadata call per directory; names added, removed or replaced (the
    directory changes) are still seen."""
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    cfg = config(tmp_path, validate_threads=0, immutable=True)
    extra = ["--config", str(cfg)]
    granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    granary.settle(src)
    (src / "d2" / "new").write_bytes(b"new file")
    (src / "d1" / "f1").unlink()
    tmp = src.parent / "replacement"
    tmp.write_bytes(b"R" * 3000)
    os.rename(tmp, src / "d0" / "f0")
    proc, stats = granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    assert proc.stdout == direct([*READ_ALL, src]).stdout
    assert tier_files(stats) >= 14, stats


def test_strace_counts_source_metadata_calls_per_reattach(granary, tmp_path):
    """Counted outside granary: a job re-attaching to a kept catalog makes at most one metadata
    call per file and per directory on the source (agent and program together), one per
    directory (+ a few) when immutable."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    files, dirs = 18, 4
    for immutable, bound in ((False, files + dirs), (True, dirs + 10)):
        cfg = config(tmp_path, validate_threads=4, immutable=immutable)
        extra = ["--config", str(cfg)]
        granary.stop()
        granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
        granary.settle(src)
        agent = granary.agent_pids()[0]
        log = tmp_path / f"strace-{immutable}.log"
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-o", str(log),
                                   "-p", str(agent)], stderr=subprocess.DEVNULL)
        try:
            import time
            time.sleep(0.5)
            prog = ["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-o", str(log) + ".prog",
                    *READ_ALL, src]
            granary.run(src, prog, tier=tier, extra=extra)
            granary.settle(src)
            time.sleep(0.5)
        finally:
            tracer.terminate()
            tracer.wait(timeout=30)
        calls = 0
        for f in (log, pathlib.Path(str(log) + ".prog")):
            for line in f.read_text(errors="replace").splitlines():
                if str(src) in line and any(c in line for c in ("statx(", "stat(", "lstat(",
                                                                "newfstatat(", "access(")):
                    calls += 1
        assert calls <= bound, (immutable, calls)



def test_an_unused_agent_finishes_placing_the_last_jobs_files_before_it_exits(tmp_path):
    """A job of small files ends on a node whose cores are all busy: their copies wait for a free
    core (they are made at idle priority, one now and then while none frees), so many are still
    queued when the agent's idle timeout expires. The agent stays until they are placed (at most
    ten minutes) instead of leaving them, and the next job, started after it exited, reads every
    file from the tier."""
    (tmp_path / "own").mkdir()
    g = Granary(tmp_path / "own")
    src = tmp_path / "pfs" / "data"
    for d in range(6):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(100):
            (src / f"d{d}" / f"f{i:03d}").write_bytes(os.urandom(1000 + 7 * i + d))
    files = 600
    want = direct([*READ_ALL, src]).stdout
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range((os.cpu_count() or 1) + 1)]
    try:
        proc, _ = g.run(src, [*READ_ALL, src], extra=("--idle-timeout", "1s"))
        assert proc.stdout == want
        deadline = time.monotonic() + 900
        while g.agent_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not g.agent_pids(), "the agent did not exit"
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    proc, stats = g.run(src, [*READ_ALL, src])
    g.stop()
    assert proc.stdout == want
    assert tier_files(stats) == files, stats
