"""The job report counts what the program read from the source, whichever way it read it: `read`,
stdio (`fread`), fds opened O_RDWR, files created after the walk (docs/reliability.md)."""
import random
import sys

import pytest

from probes import direct, make_tree, output, run_job

N = 300_000


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


READ = "import sys\nwith open(sys.argv[1], sys.argv[2]) as f: sys.stdout.write(str(len(f.read())))"


@pytest.mark.parametrize("how", ["cat", "python read", "fread", "O_RDWR", "created after the walk"])
def test_report_counts_source_bytes(granary, tmp_path, tier, how):
    src = make_tree(tmp_path / "src", {"data.bin": rand(N, 1)})
    path = src / "data.bin"
    cmd = {
        "cat": ["sh", "-c", 'cat "$0" | wc -c', path],
        "python read": [sys.executable, "-c", READ, path, "rb"],
        "fread": ["sha256sum", path],
        "O_RDWR": [sys.executable, "-c", READ, path, "r+b"],
        "created after the walk": ["sh", "-c", 'cp "$0" "$1" && cat "$1" | wc -c',
                                   tmp_path / "outside.bin", src / "new.bin"],
    }[how]
    if how == "created after the walk":
        (tmp_path / "outside.bin").write_bytes(rand(N, 2))
    got, stats = run_job(granary, src, cmd, tier)
    output(got)
    assert stats["source_io"]["bytes"] >= N, stats["source_io"]


# Opens a large file twice on the source (nothing placed yet), waits until the test has let the
# agent place it, then reads the first fd on (switched to the copy at that read) and maps the
# second (CPython's mmap dups it first, so a copy of its own backs the mapping); reads the small
# files last. Prints the digests of everything read and of the mapping.
SWITCH = r"""
import hashlib, mmap, os, sys
big, smalls = sys.argv[1], sys.argv[2:]
h = hashlib.sha256()
fa = os.open(big, os.O_RDONLY)
fb = os.open(big, os.O_RDONLY)
h.update(os.read(fa, 4096))
print("opened", flush=True)
sys.stdin.readline()
while chunk := os.read(fa, 1 << 20):
    h.update(chunk)
with mmap.mmap(fb, 0, prot=mmap.PROT_READ) as m:
    mapped = hashlib.sha256(m[:]).hexdigest()
for p in smalls:
    with open(p, "rb") as f:
        h.update(f.read())
print(h.hexdigest(), mapped)
"""


def test_opens_add_up_to_tier_and_source(granary, tmp_path, tier):
    """opens = files served from the tiers + opens of the source (or the pack): each open counted
    once, in the row that served it — an fd moved from the source to the copy mid-read included,
    and a mapping the copy backs, which is no open at all."""
    import hashlib
    import json
    import subprocess

    big = rand(8 << 20, 3)
    smalls = {f"s/{i:02}.bin": rand(1000 + i, 10 + i) for i in range(12)}
    src = make_tree(tmp_path / "src", {"big.bin": big, **smalls})
    args = [src / "big.bin", *(src / rel for rel in smalls)]
    want_all = hashlib.sha256(big + b"".join(smalls.values())).hexdigest()
    want = f"{want_all} {hashlib.sha256(big).hexdigest()}"

    def check(stats):
        assert stats["opens"] == stats["files_served_from_tiers"] + stats["source_io"]["opens"], (
            stats["opens"], [t["files_served"] for t in stats["tiers"]], stats["source_io"])
        # Two opens of the large file, one of each small one.
        assert stats["opens"] == 2 + len(smalls), stats["opens"]

    # First run: everything on the source, the large file placed while its fds are open.
    stats_path = tmp_path / "first.json"
    proc = subprocess.Popen(
        [granary.bin, "run", "--source", src, "--tier", f"{tier}=1G", "--stats-json", stats_path,
         "-q", "--", sys.executable, "-c", SWITCH, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**granary.env, "GRANARY_LOG": "debug"}, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"opened\n"
        granary.settle(src)
        out, err = proc.communicate(b"\n", timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    assert out.decode().strip() == want
    assert b"switched fd" in err, "the scenario must move an fd to the copy"
    stats = json.loads(stats_path.read_text())
    check(stats)
    assert stats["files_served_from_tiers"] == 1, stats["tiers"]
    # Second run: every open from the tier.
    granary.settle(src)
    got, stats = run_job(granary, src, [sys.executable, "-c", SWITCH.replace(
        'sys.stdin.readline()', ''), *args], tier)
    assert output(got).decode().split()[-2:] == want.split()
    check(stats)
    assert stats["source_io"]["opens"] == 0, stats["source_io"]


def test_what_is_still_being_placed_is_counted_in_files(granary, tmp_path, tier):
    """The report's "N more being placed" (`placing`) counts the files queued or being copied
    when the job ended, never placement requests: at most the files read that the agent had not
    placed for the job. Large files are fetched whole, in requests of their own."""
    files = {f"d/f{i:02}.bin": rand((3 << 20) + i if i % 4 == 0 else 30_000 + i, i)
             for i in range(24)}
    src = make_tree(tmp_path / "src", files)
    cmd = ["sh", "-c", 'cat "$0"/d/* "$0"/d/* | sha256sum', src]
    got, stats = run_job(granary, src, cmd, tier)
    assert output(got) == output(direct(cmd))
    assert stats["placing"] <= len(files) - stats["placement"]["files_placed"], (
        stats["placing"], stats["placement"])


def test_a_process_the_last_job_left_behind_does_not_count_in_the_next_jobs_report(
        granary, tmp_path, tier):
    """The first job starts a process in the background and ends; that process reads 19 files
    while the next job runs (files `go` and `done` order them). The next job's report counts
    its own open and bytes only: the straggler still counts in the first job's slot, which the
    next job does not take."""
    files = {f"d/{i:02}.bin": rand(5000 + 37 * i, 40 + i) for i in range(20)}
    src = make_tree(tmp_path / "src", files)
    paths = [src / rel for rel in sorted(files)]
    go, done = tmp_path / "go", tmp_path / "done"
    straggler = ('(i=0; while [ ! -e "$0" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; '
                 'cat "$@" > /dev/null; touch "$1.done") </dev/null >/dev/null 2>&1 & exit 0')
    got, _ = run_job(granary, src, ["sh", "-c", straggler.replace('"$1.done"', f'"{done}"'),
                                    go, *paths[1:]], tier)
    output(got)
    script = ('touch "$0"; i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.05; '
              'i=$((i+1)); done; [ -e "$1" ] && cat "$2"')
    got, stats = run_job(granary, src, ["sh", "-c", script, go, done, paths[0]], tier)
    assert output(got) == files["d/00.bin"]
    tier_bytes = sum(t["bytes_served"] for t in stats["tiers"])
    assert stats["opens"] == 1, (stats["opens"], stats["source_io"])
    assert stats["opens"] == stats["files_served_from_tiers"] + stats["source_io"]["opens"]
    assert stats["source_io"]["bytes"] + tier_bytes == len(files["d/00.bin"]), stats["source_io"]
