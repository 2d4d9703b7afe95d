"""An open's system call may come before its lookup (docs/decisions.md, "The copy bitmap"): a file
no copy of which was ever placed is opened on the source first, one that may have a copy has that
copy opened first and kept only if the lookup then names it. Whatever path the open takes, the
program gets what the kernel gives it directly: the fd number, errno (on success untouched), the
status and descriptor flags, the stat fields and every byte — for placed files, files never
placed, files changed, replaced, re-owned or removed since they were placed (their bits stay
set), symlinks, `..`, a trailing `/`, `openat` from a directory fd, a source root spelled through
a symlink, and a process at its fd limit (docs/reliability.md).
"""
import os
import subprocess
import sys

import pytest

from conftest import CLIENTS, tier_files
from probes import direct, make_tree, output, run_job


@pytest.fixture(scope="module")
def open_matrix(tmp_path_factory):
    exe = tmp_path_factory.mktemp("open_matrix") / "open_matrix"
    subprocess.run(["cc", "-O2", "-Wall", "-pthread", "-o", str(exe),
                    str(CLIENTS / "open_matrix.c")], check=True)
    return exe


def rand(n: int, seed: int) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


def no_background_validation(tmp_path):
    """The program reaches every changed entry before a validator could."""
    cfg = tmp_path / "granary.toml"
    cfg.write_text("[catalog]\nvalidate_threads = 0\n")
    return ["--config", str(cfg)]


def placed_tree(granary, root, tier, extra, spelled=None):
    """A tree whose files are all placed by a first job (every copy bit set); the jobs name it
    `spelled` (a symlink to it) if given."""
    files = {f"d/f{i}": rand(3000 + i, i) for i in range(10)}
    files["d/big.bin"] = rand(3 << 20, 99)
    files["e/g.txt"] = b"in e\n"
    src = make_tree(root, files)
    os.symlink("f0", src / "d" / "link")
    os.symlink("link", src / "d" / "chain")
    os.symlink("nothing", src / "d" / "dangling")
    os.symlink("d", src / "dirlink")
    os.symlink("../e/g.txt", src / "d" / "up")
    job = spelled or src
    reader = ["sh", "-c", f"cat {job}/d/f* {job}/d/big.bin {job}/e/g.txt > /dev/null"]
    proc, _ = run_job(granary, job, reader, tier, extra=extra)
    output(proc)
    granary.settle(job)
    proc, stats = run_job(granary, job, reader, tier, extra=extra)
    output(proc)
    assert tier_files(stats) == 12, stats
    return src


def change_behind_granarys_back(src):
    """Between jobs, each placed file changed in one identity field (their copy bits stay set),
    one removed, one added (its bit clear)."""
    # Same size, mtime restored: only ctime tells.
    p = src / "d" / "f1"
    st = p.stat()
    p.write_bytes(b"Z" * st.st_size)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Replaced by rename, same size and mtime: another inode.
    p = src / "d" / "f2"
    st = p.stat()
    tmp = src.parent / "replacement"
    tmp.write_bytes(b"Y" * st.st_size)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(tmp, p)
    # Another mode, then another owner (the test runs as root where it can).
    os.chmod(src / "d" / "f3", 0o600)
    if os.geteuid() == 0:
        os.chown(src / "d" / "f4", 65534, 65534)
    # Removed: its copy and its bit remain. Replaced by a directory, by a symlink.
    (src / "d" / "f5").unlink()
    (src / "d" / "f8").unlink()
    (src / "d" / "f8").mkdir()
    (src / "d" / "f9").unlink()
    os.symlink("f0", src / "d" / "f9")
    (src / "d" / "new").write_bytes(b"never placed\n")


ITEMS = ["d/f0", "d/f1", "d/f2", "d/f3", "d/f4", "d/f5", "d/f6", "d/f8", "d/f9", "d/new",
         "d/big.bin", "d//f0", "d/f0/.", "", "d/" + "x" * 300, "d/x/" * 1100 + "f0",
         "d/link", "d/chain", "d/dangling", "d/up", "dirlink/f0", "dirlink/../e/g.txt",
         "d/../d/f0", "./d/./f6", "d/f0/", "d/f5/", "d", "d/", "nothing",
         "at:d:f0", "at:d:f5", "at:d:link", "at:d:../d/f6", "at:dirlink:f7",
         "cd:d", "f0", "../d/f7", "../e/g.txt", "link", "../dirlink/f6", "cd:.."]


@pytest.mark.parametrize("root", ["real", "symlinked"])
def test_every_open_gets_the_kernels_fd_errno_flags_and_bytes(granary, tmp_path, open_matrix,
                                                              root):
    """Each item opened read-only with and without close-on-exec, non-blocking, no-follow, by an
    absolute path, a relative one and `openat`: every line (fd number, errno — a sentinel on
    success —, `F_GETFL`, `F_GETFD`, `fstat` fields, length and checksum of the bytes read) as
    directly. The changed, replaced, re-owned and removed files' copies are still on the tier
    with their bits set: their early opens must be dropped."""
    tier = tmp_path / "tier"
    extra = no_background_validation(tmp_path)
    real = tmp_path / "pfs" / "src"
    src = real
    if root == "symlinked":
        # Every job names the source through a symlink to it.
        src = tmp_path / "src-link"
        os.symlink(real, src)
    placed_tree(granary, real, tier, extra, spelled=src)
    change_behind_granarys_back(real)
    items = ITEMS + [f"{src}/d/f0", f"{real}/d/f6", f"{src}/d/f1", f"{real}/d/f5",
                     f"{src}/dirlink/f0", f"{src}/../src-link/d/f7" if root == "symlinked"
                     else f"{real}/../src/d/f7"]
    # Three placed files' opens before each item: early opens that miss pause the next four
    # (`EARLY_SCORE`), these bring the score back, so each item's first close-on-exec open is
    # tried early whatever the item before it was.
    warm = [f"{src}/d/f0", f"{src}/d/f6", f"{src}/d/f7"]
    cmd = [open_matrix, "matrix", src, *[x for item in items for x in (*warm, item)]]
    got, stats = run_job(granary, src, cmd, tier, extra=extra)
    want = direct(cmd)
    assert output(got).decode() == output(want).decode()
    for e in (2, 20, 21, 36, 40):  # ENOENT ENOTDIR EISDIR (a read) ENAMETOOLONG ELOOP
        assert f"errno {e}".encode() in want.stdout or f"read -{e} ".encode() in want.stdout, e
    # The unchanged placed files were served from the tier (the paths under test were taken).
    assert tier_files(stats) >= 3 * 3 * len(items), stats
    # No copy was reported damaged: the changed ones were never the entry's copy.
    assert stats["fallbacks"] == 0, stats


def test_threads_opening_while_another_forks_get_their_own_files(granary, tmp_path, open_matrix):
    """Four threads open (close-on-exec), read and close placed, changed, removed and never
    placed files and symlinks, 200 times each, while a fifth thread forks children that exit at
    once: an early open taken or closed in one thread never ends or replaces another thread's
    fd, and every outcome is each file's, as directly."""
    tier = tmp_path / "tier"
    extra = no_background_validation(tmp_path)
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, extra)
    change_behind_granarys_back(src)
    items = [f"d/f{i}" for i in range(10)] + ["d/new", "d/big.bin", "d/link", "d/dangling",
                                             "dirlink/f6", "nothing"]
    cmd = [open_matrix, "threads", src, 200, *items]
    got, stats = run_job(granary, src, cmd, tier, extra=extra)
    want = direct(cmd)
    assert output(got).decode() == output(want).decode()
    assert want.stdout.endswith(b"differed 0\n")
    assert tier_files(stats) >= 4 * 200 * 4, stats
    assert stats["fallbacks"] == 0, stats


def test_a_symlink_retargeted_between_jobs_leads_to_its_new_target(granary, tmp_path,
                                                                   open_matrix):
    """Between jobs, symlinks of the placed tree retargeted (`ln -sf`: to another placed file,
    a chain's first link, one whose target climbed out with `..`), one replaced by a regular
    file and a directory symlink by a directory; the program reaches them before any validator.
    Every open and stat through them is the new target's: the catalog's link led to its old
    target's copy (every open of `d/link` read `d/f0`'s bytes)."""
    tier = tmp_path / "tier"
    extra = no_background_validation(tmp_path)
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, extra)
    for link, target in [("d/link", "f1"), ("d/chain", "f2"), ("d/up", "f6")]:
        os.unlink(src / link)
        os.symlink(target, src / link)
    os.unlink(src / "d" / "dangling")
    (src / "d" / "dangling").write_bytes(b"a file now\n")
    os.unlink(src / "dirlink")
    (src / "dirlink").mkdir()
    (src / "dirlink" / "f0").write_bytes(b"not d/f0\n")
    cmd = [open_matrix, "matrix", src, "d/link", "d/chain", "d/up", "d/dangling", "dirlink/f0",
           "at:d:link", f"{src}/d/link"]
    got, stats = run_job(granary, src, cmd, tier, extra=extra)
    want = direct(cmd)
    assert output(got).decode() == output(want).decode()
    # And stat through them (the same lookup).
    stat = [sys.executable, "-c", "import os, sys\nfor p in sys.argv[1:]:\n"
            "    s = os.stat(p); print(p, s.st_ino, s.st_size)", *(src / p for p in
            ["d/link", "d/chain", "d/up", "d/dangling"])]
    got, _ = run_job(granary, src, stat, tier, extra=extra)
    assert output(got) == output(direct(stat))


@pytest.mark.parametrize("warm", [0, 1], ids=["first-copy-open-at-the-limit", "warm"])
def test_at_the_fd_limit_opens_succeed_and_fail_as_directly(granary, tmp_path, open_matrix, warm):
    """The fd limit lowered to 64 and filled but for one slot: the open of a placed file gets
    that slot (it failed with EMFILE when granary's first open of a copy took it for the tier's
    directory fd, and every later open then too); with no slot free it fails with EMFILE; then,
    one slot free again, it succeeds. A copy that could not be opened for want of an fd is not
    reported damaged (the agent withdrew healthy copies)."""
    tier = tmp_path / "tier"
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, [])
    cmd = [open_matrix, "emfile", src, warm, "d/f0", "d/f1"]
    got, stats = run_job(granary, src, cmd, tier)
    want = direct(cmd)
    assert output(got).decode() == output(want).decode()
    assert b"one slot: fd =freed" in want.stdout and b"no slot -> fd -1 errno 24" in want.stdout
    assert stats["fallbacks"] == 0, stats
    if warm:
        # The directory fd was opened while the limit was high: the copies themselves served.
        assert tier_files(stats) >= 2, stats
    # Every copy is still placed: none was withdrawn as damaged.
    proc, stats = run_job(granary, src, ["sh", "-c", f"cat {src}/d/f* > /dev/null"], tier)
    output(proc)
    assert tier_files(stats) == 10, stats


def test_a_vfork_child_reopening_a_number_never_changes_the_parents_fd(granary, tmp_path):
    """A vfork child (its own fd table, its parent's memory) closes an inherited fd and opens
    another placed file with close-on-exec, which gets the same number. The parent's fd is still
    its file (fstat and bytes as directly), used before the vfork or not: the child's copy was
    recorded in the parent's table under that number, and the parent's next use found "its"
    copy damaged and put the other file's source under its fd (wrong bytes, wrong inode)."""
    tier = tmp_path / "tier"
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, [])
    exe = tmp_path / "vfork_open"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(CLIENTS / "vfork_open.c")],
                   check=True)
    cmd = [exe, src / "d" / "f0", src / "d" / "f1"]
    got, stats = run_job(granary, src, cmd, tier)
    want = direct(cmd)
    assert output(got).decode() == output(want).decode()
    assert want.stdout.count(b"got the parent's number: yes") == 2, want.stdout
    assert tier_files(stats) >= 2, stats
    assert stats["fallbacks"] == 0, stats


@pytest.fixture(scope="module")
def vfork_open(tmp_path_factory):
    exe = tmp_path_factory.mktemp("vfork_open") / "vfork_open"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(CLIENTS / "vfork_open.c")],
                   check=True)
    return exe


def test_a_vfork_child_reads_and_resolves_through_its_own_fds(granary, tmp_path, vfork_open):
    """A vfork child runs in its parent's memory, so the fd table granary keeps there is the
    parent's: a number the child closed and opened again names another file in the child. Its
    reads of that number were served from the parent's file's copy (wrong bytes), and `fstatat`,
    `openat` and the read through a directory fd it reopened resolved against the parent's
    directory. Now a record of the parent's holds in such a child only while the child's fd is
    the file it names (an fd it inherited and kept `fstat`s as in its parent)."""
    tier = tmp_path / "tier"
    src = make_tree(tmp_path / "pfs" / "src", {"big.bin": rand(4 << 20, 7),
                                              "d/a": rand(5000, 8)})
    other = make_tree(tmp_path / "other", {"big.bin": rand(4 << 20, 9), "a": rand(700, 10)})
    # The big file is fetched whole by the agent from its open on: its source fd (inheritable,
    # so served call by call) then reads from the copy.
    cmd = [vfork_open, src / "big.bin", other / "big.bin", tier, "read"]
    got, stats = run_job(granary, src, cmd, tier)
    assert b"placed while open: yes" in got.stderr, got.stderr
    assert output(got) == output(direct(cmd))
    granary.settle(src)
    cmd = [vfork_open, src / "d", other, "a", "dirfd"]
    got, stats = run_job(granary, src, cmd, tier)
    assert output(got) == output(direct(cmd))
    # What it did not reopen is its parent's: the copy's fd `fstat`s as the source (the
    # catalog's answer), the directory as itself, the bytes are the file's.
    output(run_job(granary, src, ["cat", src / "d" / "a"], tier)[0])
    granary.settle(src)
    cmd = [vfork_open, src / "d" / "a", src / "d", "-", "inherit"]
    got, stats = run_job(granary, src, cmd, tier)
    assert output(got) == output(direct(cmd)) == b"child's view of the inherited fds: 0 " \
        b"(0: as the parent's)\n"
    assert tier_files(stats) == 1, stats


HAND_ON = {
    # CPython's subprocess: a vfork child dup2s the fd onto 0 and execs.
    "vfork-child": "subprocess.run(['cat'], stdin=fd, check=True)",
    # The process itself.
    "itself": "os.dup2(fd, 0); os.execvp('cat', ['cat'])",
}


@pytest.mark.parametrize("who", HAND_ON)
def test_an_unchecked_copy_handed_to_a_program_is_checked_first(granary, tmp_path, who):
    """A copy damaged behind granary's back (a byte flipped, same size, while no agent ran),
    opened close-on-exec and never used, then `dup2`ed onto 0 for `cat`, which is exec'd: the
    copy is checked before the `dup2` shares it, and `cat` prints the source's bytes. The check
    came after the `dup2` (0 kept the damaged copy, read raw by `cat`), and a vfork child made
    none at all."""
    tier = tmp_path / "tier"
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, [])
    granary.stop()
    want = (src / "d" / "f3").read_bytes()
    copy = [p for p in tier.rglob("*") if p.parent.name == "objects" and p.is_file()
            and p.read_bytes() == want]
    assert len(copy) == 1, copy
    data = bytearray(want)
    data[100] ^= 0xFF
    copy[0].write_bytes(bytes(data))
    prog = ("import os, subprocess, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"  # close-on-exec: checked at first use
            + HAND_ON[who])
    cmd = [sys.executable, "-c", prog, src / "d" / "f3"]
    got, stats = run_job(granary, src, cmd, tier, extra=no_background_validation(tmp_path))
    assert output(got) == want
    # The check found it damaged: its open moved from the tier's row to the source's.
    assert tier_files(stats) == 0 and stats["fallbacks"] >= 1, stats


CWD_SUBPROCESSES = """
import os, subprocess, sys
os.chdir(sys.argv[1])
for _ in range(5):
    with open("d/f0", "rb") as f:
        f.read()
    subprocess.run(["true"], cwd="/")
"""


def test_a_child_started_in_another_directory_leaves_the_parents_paths_served(granary, tmp_path):
    """`subprocess.run(cwd=...)` vforks a child that changes its working directory: that
    change was noted in the parent's memory, and the parent's relative paths into the dataset
    were taken for outside it (not served, not counted) for the rest of the job."""
    tier = tmp_path / "tier"
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, [])
    got, stats = run_job(granary, src, [sys.executable, "-c", CWD_SUBPROCESSES, src], tier)
    output(got)
    assert tier_files(stats) == 5, stats


SUBPROCESSES = """
import os, subprocess, sys
def fds():
    return len(os.listdir("/proc/self/fd"))
def read_and_spawn():
    with open(sys.argv[1], "rb") as f:
        f.read()
    subprocess.run(["true"])
read_and_spawn()
first = fds()
for _ in range(10):
    read_and_spawn()
print("fds grew by", fds() - first)
"""


@pytest.mark.parametrize("program", ["vfork-close_range", "python-subprocess"])
def test_vfork_children_closing_every_fd_leak_no_fd_in_the_parent(granary, tmp_path, program):
    """Children that run in the parent's memory until exec (`vfork`: CPython's subprocess,
    here with `close_range` in the child) close every fd of their own table: the parent's tier
    directory fd was forgotten in the shared memory, another opened at the next copy — one fd
    leaked per child (ten children: ten fds), until the program's opens fail with EMFILE."""
    tier = tmp_path / "tier"
    src = placed_tree(granary, tmp_path / "pfs" / "src", tier, [])
    if program == "vfork-close_range":
        exe = tmp_path / "vfork_open"
        subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(CLIENTS / "vfork_open.c")],
                       check=True)
        cmd = [exe, src / "d" / "f0", src / "d" / "f1", "leak"]
    else:
        cmd = [sys.executable, "-c", SUBPROCESSES, src / "d" / "f0"]
    got, stats = run_job(granary, src, cmd, tier)
    assert output(got) == output(direct(cmd)) == b"fds grew by 0\n"
    assert tier_files(stats) == 11, stats
