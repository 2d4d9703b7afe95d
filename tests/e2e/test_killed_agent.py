"""An agent killed (SIGKILL) between two saves of its record of copies costs the user none of the
copies it made (docs/reliability.md): each copy's record is journaled as it lands
(`cache::journal`), the next job's table takes over every journaled copy that is still the one
on disk, of the file it holds in the same version, and the next sweep deletes none of them. A
file changed at the source after the kill is never served from its old copy; a torn, damaged,
foreign or oversized journal costs copies, never bytes. The dead agent's table is removed from
the runtime directory by the next `granary` command. Every byte a program reads is compared with
the source, and every copy on disk with the file it is a copy of."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import direct, source_reads, tier_files
from test_pack_serve import pack
from test_cache import (DIGEST, assert_copies_are_the_source, copies_in, dataset, files_of,  # noqa: F401 (g)
                        g, listing, run_quiet)

# The journal's record size (`cache::journal::ENTRY_LEN`).
ENTRY_LEN = 96


def gone(pid: int) -> bool:
    """True once `pid` no longer runs (gone, or a zombie)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(") ", 1)[1][0] == "Z"


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def killed_after_placing(g, src, tier):
    """A job reads every file of `src` (its digest checked) and stays attached; once the agent
    has nothing pending, the agent is killed with SIGKILL (nothing saved since the walk), then
    the job ends. Returns the dead agent's pid."""
    sync = g.tmp / f"sync-{time.monotonic_ns()}"
    sync.mkdir()
    out = sync / "digest.json"
    script = '"$0" "$1" "$2" > "$3" && touch "$3.ready" && read _'
    job = subprocess.Popen(
        [g.bin, "run", "-q", "--source", str(src), "--tier", f"{tier}=1G", "--",
         "sh", "-c", script, sys.executable, DIGEST[1], str(src), str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=g.env)
    try:
        wait_for(lambda: (sync / "digest.json.ready").exists() or job.poll() is not None,
                 "the job's first reads")
        assert job.poll() is None, job.communicate()
        assert out.read_bytes() == direct([*DIGEST, src]).stdout
        g.settle(src)
        pid = g.status()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: gone(pid), "the killed agent to go")
        _, err = job.communicate(input=b"\n", timeout=120)
        assert job.returncode == 0, err.decode(errors="replace")
    finally:
        if job.poll() is None:
            job.kill()
    return pid


def placed_then_killed(g, tmp_path):
    """The dataset, its file count, the tier, what a direct read of it digests, and the pid of
    its agent, killed once it had placed every file (`killed_after_placing`)."""
    src = dataset(tmp_path / "pfs" / "data")
    n = len(files_of(src))
    tier = tmp_path / "tier"
    want = direct([*DIGEST, src]).stdout
    return src, n, tier, want, killed_after_placing(g, src, tier)


def journal_of(tier: pathlib.Path) -> pathlib.Path:
    (j,) = tier.glob("*/copies.journal")
    return j


def log_since(g, start: int) -> str:
    return (g.runtime / "agent.log").read_bytes()[start:].decode(errors="replace")


def sweep_line(g, start: int) -> str:
    """The next agent's sweep of the tier (it runs in the background of the attach)."""
    wait_for(lambda: "sweep removed" in log_since(g, start), "the sweep")
    return next(l for l in log_since(g, start).splitlines() if "sweep removed" in l)


def test_a_killed_agents_copies_are_the_next_jobs(g, tmp_path):
    src, n, tier, want, dead = placed_then_killed(g, tmp_path)
    assert_copies_are_the_source(tier, src, n)
    # Nothing pending meant every copy was journaled, in whole records.
    assert journal_of(tier).stat().st_size == n * ENTRY_LEN
    # `granary cache` (no agent) counts them valid: its journal vouches for them.
    (listed,) = listing(g, "--tier", tier)["sources"]
    assert (listed["files"], listed["valid"], listed["unrecorded"]) == (n, n, 0), listed
    # The dead agent's table is left behind; the next command removes it (no agent runs).
    left = list(g.runtime.glob(f"*.{dead}.*.table"))
    assert left, list(g.runtime.iterdir())
    st = subprocess.run([g.bin, "status"], capture_output=True, env=g.env, timeout=60)
    assert b"removed 1 table(s) a killed agent left" in st.stdout, st
    assert not any(p.exists() for p in left)

    start = (g.runtime / "agent.log").stat().st_size
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == n, stats["catalog"]
    assert tier_files(stats) == n, stats
    assert source_reads(stats) == 0, stats["source_io"]
    assert stats["placement"]["files_placed"] == 0, stats["placement"]
    assert f"{n} of them journaled since the last save" in log_since(g, start)
    assert "sweep removed 0 files, 0 copies missing" in sweep_line(g, start)
    g.settle(src)
    assert_copies_are_the_source(tier, src, n)
    # The job's end saved the record and emptied the journal.
    assert journal_of(tier).stat().st_size == 0


def test_after_a_kill_a_file_changed_at_the_source_is_never_served_from_its_copy(g, tmp_path):
    src = dataset(tmp_path / "pfs" / "data")
    n = len(files_of(src))
    tier = tmp_path / "tier"
    killed_after_placing(g, src, tier)
    # Same size, other bytes; and one replaced by a larger file under the same name.
    same_size = src / "class1" / "img3.bin"
    same_size.write_bytes(os.urandom(same_size.stat().st_size))
    replaced = src / "class2" / "img7.bin"
    tmp = src / "class2" / ".new"
    tmp.write_bytes(os.urandom(replaced.stat().st_size + 5000))
    tmp.rename(replaced)
    want = direct([*DIGEST, src]).stdout
    for _ in range(2):
        proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
        assert proc.stdout == want, "a byte of a copy of the file before it changed"
        g.settle(src)
    # No copy of the files before they changed is left; every other copy was kept.
    assert_copies_are_the_source(tier, src)
    assert len(copies_in(tier)) >= n - 2


def test_a_copy_replaced_or_gone_after_its_journal_record_is_not_taken(g, tmp_path):
    """Between the kill and the next job, one copy is rewritten in place (other bytes, its inode
    kept, its ctime not) and another is deleted: neither is the copy its journal record names."""
    src, n, tier, want, _ = placed_then_killed(g, tmp_path)
    rewritten, deleted = sorted(copies_in(tier), key=lambda p: p.stat().st_size)[:2]
    with open(rewritten, "r+b") as f:
        f.write(os.urandom(len(f.read())))
    deleted.unlink()
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want, "a byte of a copy nobody vouches for"
    assert stats["catalog"]["reused_files"] == n - 2, stats["catalog"]
    g.settle(src)
    assert_copies_are_the_source(tier, src, n)


@pytest.mark.parametrize("damage", ["torn-and-flipped", "garbage", "oversized"])
def test_a_damaged_journal_costs_copies_never_bytes(g, tmp_path, damage):
    src, n, tier, want, _ = placed_then_killed(g, tmp_path)
    j = journal_of(tier)
    b = bytearray(j.read_bytes())
    assert len(b) == n * ENTRY_LEN
    if damage == "torn-and-flipped":
        b[5 * ENTRY_LEN + 40] ^= 0x20
        j.write_bytes(bytes(b) + os.urandom(50))
        reused, said = n - 1, "1 damaged or foreign records skipped"
    elif damage == "garbage":
        j.write_bytes(os.urandom(len(b)))
        reused, said = 0, f"{n} damaged or foreign records skipped"
    else:
        with open(j, "r+b") as f:
            f.truncate(64 << 20)
        reused, said = 0, "more than a journal of this table can hold"
    start = (g.runtime / "agent.log").stat().st_size
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == reused, stats["catalog"]
    assert said in log_since(g, start), log_since(g, start)
    # The copies nobody vouches for any more are deleted or placed again, never served.
    g.settle(src)
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == n, stats["catalog"]
    assert_copies_are_the_source(tier, src, n)


@pytest.mark.parametrize("what", ["directory", "fifo", "symlink"])
def test_something_else_at_the_journals_path_costs_copies_never_bytes_nor_the_record(
        g, tmp_path, what):
    """After the kill, the journal is replaced by a directory, a FIFO, or a symlink to a file of
    the user's: the journaled copies are placed again, every byte is the source's, the file the
    symlink names is untouched, and the record of copies is still saved at the job's end (the
    next agent takes every copy), with no save reported as failed."""
    src, n, tier, want, _ = placed_then_killed(g, tmp_path)
    j = journal_of(tier)
    j.unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * (2 * ENTRY_LEN))
    {"directory": j.mkdir, "fifo": lambda: os.mkfifo(j),
     "symlink": lambda: j.symlink_to(victim)}[what]()
    start = (g.runtime / "agent.log").stat().st_size
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == 0, stats["catalog"]
    g.settle(src)
    g.stop()
    log = log_since(g, start)
    assert "cannot record the copies" not in log, log
    # A new agent: what it takes is the record the last job's end saved.
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == n, stats["catalog"]
    assert victim.read_bytes() == b"x" * (2 * ENTRY_LEN)
    assert j.is_symlink() or (j.exists() and not j.is_file())
    assert_copies_are_the_source(tier, src, n)


def test_another_way_of_serving_the_dataset_takes_a_killed_agents_copies(g, tmp_path):
    """The plain run's agent is killed with every copy journaled, none recorded; the dataset is
    then read from its pack, mounted elsewhere: it takes those copies (one copy per file), and
    the plain run's journal is emptied with its record saved again."""
    src = dataset(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    elsewhere = tmp_path / "mnt" / "data"
    n = len(files_of(src))
    tier = tmp_path / "tier"
    want = direct([*DIGEST, src]).stdout
    killed_after_placing(g, src, tier)
    proc, stats = run_quiet(g, ["--pack", packed, "--mount", elsewhere], [*DIGEST, elsewhere], tier)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == n, stats["catalog"]
    g.settle(elsewhere)
    by_source = {s["source"]: s for s in listing(g, "--tier", tier)["sources"]}
    assert by_source[str(src)]["files"] == 0, by_source
    assert by_source[str(elsewhere)]["files"] == n, by_source
    assert_copies_are_the_source(tier, src, n)
    plain = tier / by_source[str(src)]["id"] / "copies.journal"
    assert plain.stat().st_size == 0
