"""Never wrong: whatever happened to the source or to a copy, the program reads exactly what a
direct run reads — bytes, stat fields, listings, errno (docs/reliability.md, "Wrong bytes").

Every test first gets its tree placed (a job reads it all, the agent copies it), so the job
under test would be served from the tier if granary trusted what it should not.
"""
import json
import os
import pathlib
import random
import shutil
import sqlite3
import subprocess

import pytest

from conftest import CLIENTS, source_opens, tier_files
from probes import (Holder, copy_of, copies, direct, fsprobe, make_tree, output, prime,
                    run_job, same_run, twin, wait_for)


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# ---- 1. same size, same mtime: a copy is valid only while the source's identity holds ----

def rewrite_restore_mtime(p: pathlib.Path):
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[:6] = b"fresh!"
    with open(p, "r+b") as f:
        f.write(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def rewrite_touch_d(p: pathlib.Path):
    ns = p.stat().st_mtime_ns
    data = bytearray(p.read_bytes())
    data[-6:] = b"touch!"
    p.write_bytes(bytes(data))
    subprocess.run(["touch", "-d", f"@{ns // 10**9}.{ns % 10**9:09d}", str(p)], check=True)


def cp_p(p: pathlib.Path):
    new = p.parents[2] / "cp-p-new.bin"
    new.write_bytes(rand(p.stat().st_size, 99))
    os.utime(new, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns))
    subprocess.run(["cp", "-p", str(new), str(p)], check=True)
    new.unlink()


def replace_by_rename(p: pathlib.Path):
    st = p.stat()
    tmp = p.with_name(".replacement")
    tmp.write_bytes(rand(st.st_size, 98))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(tmp, p)


def chmod_back_and_forth(p: pathlib.Path):
    mode = p.stat().st_mode & 0o7777
    p.chmod(0o600)
    p.chmod(mode)


def grow_restore_mtime(p: pathlib.Path):
    st = p.stat()
    with open(p, "ab") as f:
        f.write(b"grown")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def new_mtime_only(p: pathlib.Path):
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


CHANGES = {
    "inplace.bin": rewrite_restore_mtime,  # ctime differs
    "touched.bin": rewrite_touch_d,  # ctime differs
    "cp-p.bin": cp_p,  # ctime differs
    "renamed.bin": replace_by_rename,  # inode (and ctime) differ
    "chmodded.bin": chmod_back_and_forth,  # ctime only, same bytes
    "grown.bin": grow_restore_mtime,  # size
    "retimed.bin": new_mtime_only,  # mtime only, same bytes
}


def identity_tree(root: pathlib.Path) -> pathlib.Path:
    files = {f"d/{name}": rand(50_000 + i, i) for i, name in enumerate(CHANGES)}
    files["d/large.bin"] = rand(3 << 20, 50)  # fetched whole by the agent
    files["d/untouched.bin"] = rand(1000, 51)
    files["d/removed.bin"] = rand(1000, 52)
    return make_tree(root, files)


def change_everything(src: pathlib.Path):
    for name, change in CHANGES.items():
        change(src / "d" / name)
    rewrite_restore_mtime(src / "d" / "large.bin")
    (src / "d" / "removed.bin").unlink()
    (src / "d" / "added.bin").write_bytes(b"new file")


def identity_check(granary, src, tier):
    rels = [f"d/{n}" for n in [*CHANGES, "large.bin", "untouched.bin", "added.bin"]]
    got, want, stats = same_run(granary, src, tier, fsprobe("identity", src, *rels),
                                fsprobe("identity", src, *rels))
    assert json.loads(got) == json.loads(want)
    ls = ["ls", "-lai", "--full-time", src / "d", src / "d" / "removed.bin"]
    got, _ = run_job(granary, src, ls, tier)
    want = direct(ls)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    # The untouched file is still served from its copy: the check is per file, not a purge.
    assert tier_files(stats) >= 1, stats


def test_same_size_same_mtime_within_one_agent(granary, tmp_path, tier):
    src = identity_tree(tmp_path / "src")
    prime(granary, src, tier)
    agents = granary.agent_pids()
    assert len(copies(tier)) == len(CHANGES) + 3
    change_everything(src)
    identity_check(granary, src, tier)
    assert granary.agent_pids() == agents, "the second job must have used the same agent"


def test_same_size_same_mtime_after_agent_restart(granary, tmp_path, tier):
    src = identity_tree(tmp_path / "src")
    prime(granary, src, tier)
    granary.stop()
    change_everything(src)
    identity_check(granary, src, tier)


def test_changed_while_another_job_holds_the_source(granary, tmp_path, tier):
    """A change between two jobs that overlap (no re-walk in between): the copy is checked
    against the source when the next job opens it, not only at a walk."""
    src = identity_tree(tmp_path / "src")
    prime(granary, src, tier)
    holder = Holder(granary, src, tier)
    try:
        change_everything(src)
        identity_check(granary, src, tier)
    finally:
        holder.close()


# ---- 2. the program's own changes inside one job ----

def own_changes_tree(root: pathlib.Path) -> pathlib.Path:
    files = {f"f/{n}.bin": rand(16, i) for i, n in enumerate(
        ("trunc", "target", "gone", "linked", "timed", "utimes", "moded", "rewritten"))}
    files.update({f"g/{n}.bin": rand(3000 + i, 100 + i) for i, n in enumerate(
        ("trunc", "from", "to", "rm", "chmod", "touch", "ln", "over", "dotdot", "via-link"))})
    files["f/replacement.bin"] = b"the replacement!!!!!"
    files["d/full/x.bin"] = rand(3000, 40)
    files["d/full/y.bin"] = rand(3000, 41)
    return make_tree(root, files, dirs=("d/empty",))


def test_program_reads_back_its_own_changes(granary, tmp_path, tier):
    src = own_changes_tree(tmp_path / "a" / "src")
    prime(granary, src, tier)
    other = twin(src, tmp_path / "b")
    got, want, stats = same_run(granary, src, tier, fsprobe("own_changes", src),
                                fsprobe("own_changes", other))
    assert tier_files(stats) >= 1, "the first reads must come from the copies"
    got, want = json.loads(got), json.loads(want)
    for key in want:
        assert got.get(key) == want[key], key
    assert got == want


def test_fds_on_a_copy_read_the_programs_change(granary, tmp_path, tier):
    src = make_tree(tmp_path / "a" / "src", {"alone.bin": rand(5000, 1),
                                             "shared.bin": rand(5000, 2)})
    prime(granary, src, tier)
    other = twin(src, tmp_path / "b")
    got, want, stats = same_run(
        granary, src, tier,
        fsprobe("open_fds_see_changes", src, tmp_path, "alone.bin", "shared.bin"),
        fsprobe("open_fds_see_changes", other, tmp_path, "alone.bin", "shared.bin"))
    assert tier_files(stats) == 2, "both fds must start on the copies"
    assert json.loads(got) == json.loads(want)


# ---- 3b. a signal handler that reads the fd a first read is checking ----

@pytest.mark.skipif(shutil.which("cc") is None, reason="the test command installs gcc")
def test_a_signal_handler_reading_the_fd_of_a_first_read(granary, tmp_path, tier):
    """The first read of a small copy is checked by its bytes under the fd's lock
    (`tracked::first_read`): a SIGALRM handler reading the same fd meanwhile must neither wait
    for that lock (its holder is the read it interrupted: it would wait forever) nor make the
    interrupted read give bytes twice. Every file's bytes arrive once, in order, as directly."""
    n, passes = 64, 40
    src = make_tree(tmp_path / "a" / "src",
                    {f"f{i:04d}.bin": rand(100 + 61 * i, 300 + i) for i in range(n)})
    prime(granary, src, tier)
    other = twin(src, tmp_path / "b")
    exe = tmp_path / "signal_reader"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(CLIENTS / "signal_reader.c")], check=True)
    got, stats = run_job(granary, src, [exe, src, n, passes], tier, timeout=120)
    want = direct([exe, other, n, passes])
    assert want.returncode == 0, want.stderr
    assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    got, want = json.loads(got.stdout), json.loads(want.stdout)
    assert want["wrong"] == 0, want
    assert got == want
    assert tier_files(stats) >= n, "the files must be read from their copies"


def test_the_tables_are_their_users_alone(granary, tmp_path, tier):
    """The live table and the catalog saved beside the copies hold the secret seed of the
    paths' second hash (docs/reliability.md): no other user may read them."""
    src = make_tree(tmp_path / "src", {"a.bin": rand(1000, 1)})
    prime(granary, src, tier)
    tables = list(granary.runtime.glob("*.table"))
    wait_for(lambda: list(tier.glob("*/catalog.table")), "the saved catalog")
    saved = list(tier.glob("*/catalog.table"))
    assert tables and saved, (list(granary.runtime.iterdir()), list(tier.rglob("*")))
    for p in [*tables, *saved]:
        st = p.stat()
        assert (oct(st.st_mode & 0o777), st.st_uid) == ("0o600", os.getuid()), p
    for d in [granary.runtime, *{p.parent for p in saved}]:
        assert d.stat().st_mode & 0o077 == 0, d


# ---- 4. a copy damaged while another job on the same source is attached ----

def test_damaged_copy_never_served_while_attached(granary, tmp_path, tier):
    files = {f"d/{n}.bin": rand(40_000, i) for i, n in enumerate(
        ("flipped", "truncated", "fifo", "symlink", "swapped"))}
    files["d/large.bin"] = rand(3 << 20, 9)
    src = make_tree(tmp_path / "src", files)
    decoy = tmp_path / "decoy.bin"  # somebody else's bytes, the size of the copy it replaces
    decoy.write_bytes(rand(40_000, 77))
    prime(granary, src, tier)
    holder = Holder(granary, src, tier)
    try:
        c = copy_of(tier, files["d/flipped.bin"])
        data = bytearray(c.read_bytes())
        data[20_000] ^= 0xFF
        with open(c, "r+b") as f:  # same inode, same size
            f.write(bytes(data))
        c = copy_of(tier, files["d/large.bin"])
        with open(c, "r+b") as f:
            f.seek(2 << 20)
            f.write(b"\0" * 4096)
        c = copy_of(tier, files["d/truncated.bin"])
        os.truncate(c, 10_000)
        c = copy_of(tier, files["d/fifo.bin"])
        c.unlink()
        os.mkfifo(c, 0o600)
        c = copy_of(tier, files["d/symlink.bin"])
        c.unlink()
        c.symlink_to(decoy)
        c = copy_of(tier, files["d/swapped.bin"])
        c.unlink()
        shutil.copyfile(decoy, c)
        c.chmod(0o600)
        rels = sorted(files)
        for cmd in (fsprobe("identity", src, *rels), ["cat", *[src / r for r in rels]]):
            got, want, _ = same_run(granary, src, tier, cmd, cmd, timeout=60)
            assert got == want, cmd[:2]
    finally:
        holder.close()


# ---- 6. readers and writers of one file in one job (sqlite) ----

def make_db(path: pathlib.Path, mode: str):
    db = sqlite3.connect(path)
    db.execute(f"pragma journal_mode={mode}")
    db.execute("create table t (id integer primary key, v integer)")
    db.executemany("insert into t values (?, ?)", ((i, i % 97) for i in range(25_000)))
    db.commit()
    db.close()


@pytest.mark.parametrize("writer", ["process", "child"])
@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_sqlite_reader_sees_commits_of_the_same_job(granary, tmp_path, tier, mode, writer):
    src = tmp_path / "a" / "src"
    src.mkdir(parents=True)
    make_db(src / "db.sqlite", mode)
    prime(granary, src, tier)
    other = twin(src, tmp_path / "b")
    got, want, stats = same_run(granary, src, tier, fsprobe("sqlite_rw", src, "db.sqlite", mode, writer),
                                fsprobe("sqlite_rw", other, "db.sqlite", mode, writer))
    assert tier_files(stats) >= 1, "the read-only connection must start on the copy"
    assert json.loads(got) == json.loads(want)


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 CLI")
def test_sqlite_cli_read_mostly_sessions(granary, tmp_path, tier):
    """docs/reliability.md: `sqlite3 -readonly` is served from the copy; a plain `sqlite3`
    session peeks at the header read-only, then opens the database O_RDWR, which granary treats
    as a write: passed through, the file voided for the rest of the job and its copy dropped
    (a later job places it again). Same answers every time."""
    src = tmp_path / "src"
    src.mkdir()
    make_db(src / "db.sqlite", "delete")
    db = (src / "db.sqlite").read_bytes()
    prime(granary, src, tier)
    query = "select count(*), sum(v) from t;"
    ro = ["sqlite3", "-readonly", src / "db.sqlite", query]
    rw = ["sqlite3", src / "db.sqlite", query]
    got, want, stats = same_run(granary, src, tier, ro, ro)
    assert got == want
    assert tier_files(stats) == 1 and source_opens(stats) == 0, stats
    got, want, stats = same_run(granary, src, tier, rw, rw)
    assert got == want
    granary.settle(src)
    assert [c for c in copies(tier) if c.stat().st_size == len(db)] == []
    got, want, stats = same_run(granary, src, tier, ro, ro)
    assert got == want
    assert source_opens(stats) == 1, stats


# ---- 7. holes ----

def sparse(path: pathlib.Path, size: int, islands):
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in islands:
            f.seek(off)
            f.write(data)


def test_sparse_file_keeps_its_holes(granary, tmp_path, tier):
    src = tmp_path / "src"
    src.mkdir()
    mib = 1 << 20
    sparse(src / "sparse.bin", 50 * mib, [(20 * mib, rand(mib, 1)), (33 * mib, rand(70_000, 2)),
                                          (50 * mib - 8, b"the end!")])
    (src / "dense.bin").write_bytes(rand(5000, 3))
    prime(granary, src, tier)
    for cmd in (fsprobe("holes", src, "sparse.bin"),
                ["tar", "-C", src, "-cSf", "-", "sparse.bin", "dense.bin"]):
        got, stats = run_job(granary, src, cmd, tier)
        want = direct(cmd)
        assert got.returncode == want.returncode == 0
        assert got.stdout == want.stdout, cmd[:2]
        assert tier_files(stats) >= 1, stats
    [copy] = [c for c in copies(tier) if c.stat().st_size == 50 * mib]
    assert copy.stat().st_blocks * 512 < 4 * mib, "the copy must keep the source's holes"


def test_reading_the_end_of_a_huge_sparse_file_writes_little(granary, tmp_path, tier):
    src = tmp_path / "src"
    src.mkdir()
    sparse(src / "huge.bin", 1 << 30, [(10 << 20, b"island"), ((1 << 30) - 8, b"the end!")])
    cmd = fsprobe("tail", src, "huge.bin")
    got, _ = run_job(granary, src, cmd, tier, tier_size="4G")
    assert output(got) == output(direct(cmd))
    granary.settle(src)
    written = sum(p.stat().st_blocks * 512 for p in tier.rglob("*") if p.is_file())
    assert written < 16 << 20, f"the tier holds {written} bytes for 14 bytes of data"
