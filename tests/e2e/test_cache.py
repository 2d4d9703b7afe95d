"""The cache is the user's (issue "A user's first hour", point 3), through the real binary: a job
on other tiers keeps the old tier's copies and a later job there reuses them, with the agent
kept or restarted; plain, `--pack` and `--pack --mount` runs of one dataset share one copy of
each file; `granary cache` lists, verifies and cleans copies with and without an agent, never
one a job is served from, never through a symlink; a mistyped `GRANARY_CACHE_DIR` is named and
costs no copy. Every byte a program reads is compared with the source, and every copy on disk
with the file it is a copy of."""
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, Granary, direct, source_opens, source_reads, tier_files
from test_pack_serve import pack

DIGEST = [sys.executable, str(CLIENTS / "tree_digest.py")]


def dataset(root: pathlib.Path) -> pathlib.Path:
    """Class directories of small files and two files fetched whole (above 1 MiB)."""
    for c in range(3):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(12):
            (d / f"img{i}.bin").write_bytes(os.urandom(20_000 + 1000 * i + c))
    (root / "big1.bin").write_bytes(os.urandom(3 << 20))
    (root / "big2.bin").write_bytes(os.urandom((2 << 20) + 12345))
    return root


def files_of(root: pathlib.Path):
    return sorted(p for p in root.rglob("*") if p.is_file())


def sha(p: pathlib.Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def copies_in(tier: pathlib.Path):
    """Every complete copy in a tier: `<tier>/<source id>/objects/<16 hex digits>`."""
    return [p for p in tier.glob("*/objects/*")
            if p.is_file() and not p.is_symlink() and len(p.name) == 16 and all(c in "0123456789abcdef" for c in p.name)]


def assert_copies_are_the_source(tier: pathlib.Path, src: pathlib.Path, n=None):
    """Each copy in `tier` holds exactly the bytes of one file of `src`, no file twice."""
    want = {sha(p): p for p in files_of(src)}
    got = [sha(p) for p in copies_in(tier)]
    assert len(got) == len(set(got)), "a file has two copies"
    assert set(got) <= set(want), "a copy that is no file of the source"
    if n is not None:
        assert len(got) == n, (len(got), n)


@pytest.fixture
def g(tmp_path):
    """A private agent and a private list of tiers used (`~/.cache/granary/tiers`)."""
    g = Granary(tmp_path)
    g.env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    yield g
    g.stop()
    # An agent a test killed and one a later job of it started: none outlives the test.
    for pid in g.agent_pids():
        os.kill(pid, signal.SIGKILL)


def cache(g, *args, check=True):
    proc = subprocess.run([g.bin, "cache", *map(str, args)], capture_output=True, env=g.env,
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc


def listing(g, *args):
    return json.loads(cache(g, "--json", *args).stdout)


def run_quiet(g, args, cmd, tier, extra=()):
    """`granary run ARGS --tier T` (args: --source or --pack/--mount); returns (proc, stats)."""
    stats_path = g.tmp / f"stats-{time.monotonic_ns()}.json"
    argv = [g.bin, "run", *map(str, args), "--tier", f"{tier}=1G", "--stats-json",
            str(stats_path), *extra, "--", *map(str, cmd)]
    proc = subprocess.run(argv, capture_output=True, env=g.env, timeout=600)
    assert proc.returncode == 0, (argv, proc.stderr.decode(errors="replace")[-3000:])
    return proc, json.loads(stats_path.read_text())


@pytest.mark.parametrize("restart", [False, True], ids=["agent-kept", "agent-restarted"])
def test_a_tier_switch_keeps_the_old_tiers_copies(g, tmp_path, restart):
    src = dataset(tmp_path / "pfs" / "data")
    n = len(files_of(src))
    ta, tb = tmp_path / "tA", tmp_path / "tB"
    want = direct([*DIGEST, src]).stdout
    proc, _ = g.run(src, [*DIGEST, src], tier=ta)
    assert proc.stdout == want
    g.settle(src)
    assert_copies_are_the_source(ta, src, n)
    if restart:
        g.stop()

    proc, stats = g.run(src, [*DIGEST, src], tier=tb)
    assert proc.stdout == want
    g.settle(src)
    # tA's copies stay, every byte the source's; the job was told.
    assert_copies_are_the_source(ta, src, n)
    assert_copies_are_the_source(tb, src, n)
    err = proc.stderr.decode()
    assert "copies were removed" not in err, err
    if not restart:
        assert f"moved from tier {ta}: its {n} copies there" in err, err
    if restart:
        g.stop()

    # Back on tA: every file from its copy there, nothing placed again, nothing from the source.
    proc, stats = g.run(src, [*DIGEST, src], tier=ta)
    assert proc.stdout == want
    assert stats["catalog"]["reused_files"] == n, stats["catalog"]
    assert tier_files(stats) == n, stats
    assert source_reads(stats) == 0, stats["source_io"]
    assert stats["placement"]["files_placed"] == 0, stats["placement"]
    assert_copies_are_the_source(ta, src, n)


def test_one_copy_per_file_whatever_the_mode(g, tmp_path):
    src = dataset(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed, "--partitions", "2")
    n, size = len(files_of(src)), sum(p.stat().st_size for p in files_of(src))
    tier = tmp_path / "tier"
    elsewhere = tmp_path / "mnt" / "data"
    want = direct([*DIGEST, src]).stdout
    runs = [
        ("plain", ["--source", src], src),
        ("pack", ["--source", src, "--pack", packed], src),
        ("mount", ["--pack", packed, "--mount", elsewhere], elsewhere),
        ("plain again", ["--source", src], src),
    ]
    for k, (mode, args, root) in enumerate(runs):
        proc, stats = run_quiet(g, args, [*DIGEST, root], tier)
        assert proc.stdout == want, mode
        g.settle(root)
        # One copy of each file in the tier, whichever way the last job read it.
        assert_copies_are_the_source(tier, src, n)
        assert sum(p.stat().st_size for p in copies_in(tier)) == size, mode
        if k > 0:
            assert tier_files(stats) == n, (mode, stats)
            assert stats["catalog"]["reused_files"] == n, (mode, stats["catalog"])
            assert source_opens(stats) == 0 and source_reads(stats) == 0, (mode, stats)
            assert stats["placement"]["files_placed"] == 0, (mode, stats["placement"])
    listed = listing(g, "--tier", tier)["sources"]
    assert sum(s["files"] for s in listed) == n, listed
    assert sum(s["bytes"] for s in listed) == size, listed
    assert {s["source"] for s in listed} == {str(src), str(elsewhere)}, listed


def test_a_copy_goes_to_another_mode_only_for_the_same_file(g, tmp_path):
    """A file changed after packing: the plain run's copy holds its new bytes, the pack its old
    ones. The mounted pack takes every other copy, never that one: its program reads the
    pack's bytes, and the new copy stays where it was."""
    src = dataset(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    elsewhere = tmp_path / "mnt" / "data"
    as_packed = direct([*DIGEST, src]).stdout
    changed = src / "class2" / "img5.bin"
    changed.write_bytes(os.urandom(changed.stat().st_size))
    n = len(files_of(src))
    tier = tmp_path / "tier"
    proc, _ = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == direct([*DIGEST, src]).stdout
    g.settle(src)
    proc, stats = run_quiet(g, ["--pack", packed, "--mount", elsewhere], [*DIGEST, elsewhere], tier)
    assert proc.stdout == as_packed, "a byte that is not the pack's"
    assert stats["catalog"]["reused_files"] == n - 1, stats["catalog"]
    g.settle(elsewhere)
    by_source = {s["source"]: s for s in listing(g, "--tier", tier)["sources"]}
    assert by_source[str(src)]["files"] == 1, by_source
    assert by_source[str(elsewhere)]["files"] == n, by_source
    kept = [p for p in copies_in(tier) if p.parent.parent.name == by_source[str(src)]["id"]]
    assert [sha(p) for p in kept] == [sha(changed)]


def test_two_ways_at_once_each_keep_a_copy_until_the_next_job(g, tmp_path):
    """A plain job is running when a job of the same dataset's pack starts: the plain copies are
    in use, so the pack places its own. The next job to start after both ended keeps one copy
    of each file."""
    src = dataset(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    n = len(files_of(src))
    tier = tmp_path / "tier"
    want = direct([*DIGEST, src]).stdout
    run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    g.settle(src)
    job = hold(g, src, tier)
    try:
        proc, stats = run_quiet(g, ["--source", src, "--pack", packed], [*DIGEST, src], tier)
        assert proc.stdout == want
        assert stats["catalog"]["reused_files"] == 0, stats["catalog"]
        g.settle(src)
        assert len(copies_in(tier)) == 2 * n
    finally:
        job.stdin.close()
        assert job.wait(timeout=60) == 0
    proc, stats = run_quiet(g, ["--source", src], [*DIGEST, src], tier)
    assert proc.stdout == want
    assert tier_files(stats) == n and source_reads(stats) == 0, stats
    g.settle(src)
    assert_copies_are_the_source(tier, src, n)


def test_granary_cache_lists_and_verifies_with_and_without_an_agent(g, tmp_path):
    src = dataset(tmp_path / "pfs" / "data")
    files = files_of(src)
    n, size = len(files), sum(p.stat().st_size for p in files)
    tier = tmp_path / "tier"
    g.run(src, [*DIGEST, src], tier=tier)
    g.settle(src)
    for agent in (True, False):
        if not agent:
            g.stop()
        # The tier is found without being named: the agent used it (~/.cache/granary/tiers).
        s = [x for x in listing(g)["sources"] if x["tier"] == str(tier)]
        assert len(s) == 1, s
        s = s[0]
        assert (s["source"], s["files"], s["bytes"], s["valid"]) == (str(src), n, size, n), s
        assert s["unrecorded"] == s["missing"] == s["changed"] == 0, s
        assert time.time() - s["last_use"] < 600, s
        assert s["source_present"] is True, s
        text = cache(g, "--tier", tier).stdout.decode()
        assert str(src) in text and f"tier {tier}: {n} files" in text, text
        assert "valid" in text and ("agent running" in text) == agent, text
        out = cache(g, "verify", "--tier", tier).stdout.decode()
        assert f"granary cache verify: {n} copies valid" in out, out
    # A copy written behind granary's back and a file changed on the source: named, exit 1,
    # nothing removed.
    copy = sorted(copies_in(tier))[0]
    with open(copy, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    (src / "class1" / "img3.bin").write_bytes(os.urandom(1000))
    proc = cache(g, "verify", "--tier", tier, check=False)
    out = proc.stdout.decode()
    assert proc.returncode == 1, out
    assert "class1/img3.bin" in out and "changed on the source" in out, out
    assert "gone or replaced" in out, out
    assert "2 copies are not valid" in out, out
    assert len(copies_in(tier)) == n
    text = cache(g, "--tier", tier).stdout.decode()
    assert "1 changed since placed" in text, text
    # The next job never serves either and replaces them.
    proc, stats = g.run(src, [*DIGEST, src], tier=tier)
    assert proc.stdout == direct([*DIGEST, src]).stdout


def hold(g, src, tier):
    """A job attached to `src` until its stdin closes."""
    p = subprocess.Popen([g.bin, "run", "-q", "--source", str(src), "--tier", f"{tier}=1G", "--",
                          sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE, env=g.env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(os.path.realpath(s.get("source", "")) == os.path.realpath(src)
               and s.get("jobs", 0) > 0 for s in g.status().get("sources", [])):
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError("the holding job never attached")


def test_clean_never_removes_what_a_job_is_served_from(g, tmp_path):
    a = dataset(tmp_path / "pfs" / "a")
    b = dataset(tmp_path / "pfs" / "b")
    tier = tmp_path / "tier"
    for src in (a, b):
        g.run(src, [*DIGEST, src], tier=tier)
        g.settle(src)
    assert len(copies_in(tier)) == 2 * len(files_of(a))
    job = hold(g, a, tier)
    try:
        held = {s["source"]: s["jobs"] for s in listing(g, "--tier", tier)["sources"]}
        assert held == {str(a): 1, str(b): 0}, held
        assert "in use by 1 job(s)" in cache(g, "--tier", tier).stdout.decode()
        proc = cache(g, "clean", "--all", "--tier", tier, check=False)
        assert proc.returncode == 1, proc
        err = proc.stderr.decode()
        assert "kept" in err and f"in use by a job of {a}" in err, err
        listed = listing(g, "--tier", tier)["sources"]
        assert [s["source"] for s in listed] == [str(a)], listed
        assert_copies_are_the_source(tier, a, len(files_of(a)))
        # The job still reads every byte from its copies.
        proc, stats = g.run(a, [*DIGEST, a], tier=tier)
        assert proc.stdout == direct([*DIGEST, a]).stdout
        assert tier_files(stats) == len(files_of(a)), stats
    finally:
        job.stdin.close()
        assert job.wait(timeout=60) == 0
    # Once no job uses it: --dry-run says, removes nothing; then it goes.
    out = cache(g, "clean", "--source", a, "--tier", tier, "--dry-run").stdout.decode()
    assert f"would remove {tier}/" in out and str(a) in out, out
    assert len(copies_in(tier)) == len(files_of(a))
    out = cache(g, "clean", "--source", a, "--tier", tier).stdout.decode()
    assert "1 directory removed" in out, out
    assert copies_in(tier) == [] and listing(g, "--tier", tier)["sources"] == []
    # The next job starts afresh, every byte right.
    proc, _ = g.run(a, [*DIGEST, a], tier=tier)
    assert proc.stdout == direct([*DIGEST, a]).stdout


def test_a_clean_right_after_a_job_finds_it_ended(g, tmp_path):
    """`granary run` returns once the agent has counted its job out, and a clean waits out the
    catalog's save that follows: a script's `granary run …; granary cache clean …` is never
    refused as "in use". (The save of 20,000 files' catalog made 4 of 5 such cleans fail.)"""
    src = tmp_path / "pfs" / "many"
    for i in range(20_000):
        d = src / f"d{i // 1000:02d}"
        if i % 1000 == 0:
            d.mkdir(parents=True)
        (d / f"f{i}").write_bytes(b"%d " % i * 20)
    tier = tmp_path / "tier"
    one = src / "d00" / "f7"
    for _ in range(3):
        proc, _ = g.run(src, ["cat", one], tier=tier)
        assert proc.stdout == one.read_bytes()
        out = cache(g, "clean", "--source", src, "--tier", tier).stdout.decode()
        assert "1 directory removed" in out, out
        assert copies_in(tier) == []


def test_clean_without_an_agent_and_never_through_a_symlink(g, tmp_path):
    src = dataset(tmp_path / "pfs" / "data")
    tier = tmp_path / "tier"
    g.run(src, [*DIGEST, src], tier=tier)
    g.settle(src)
    g.stop()
    # Somebody's files behind links: one named like a source directory in the tier root, one
    # inside the source's objects directory.
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_bytes(b"keep me")
    (tier / "evil-0123456789abcdef").symlink_to(precious)
    objects = next(tier.glob("*/objects"))
    (objects / "0000000000000bad").symlink_to(precious / "keep")
    (objects / "dir-link").symlink_to(precious)
    out = cache(g, "clean", "--older-than", "1h", "--tier", tier).stdout.decode()
    assert "nothing to remove" in out, out
    assert len(copies_in(tier)) == len(files_of(src))
    proc = cache(g, "clean", "--all", "--tier", tier)
    assert "1 directory removed" in proc.stdout.decode(), proc.stdout
    assert copies_in(tier) == []
    assert (precious / "keep").read_bytes() == b"keep me"
    assert (tier / "evil-0123456789abcdef").is_symlink()
    assert g.agent_pids() == [], "clean started an agent"


def test_a_mistyped_cache_dir_is_named_and_costs_no_copy(g, tmp_path):
    src = dataset(tmp_path / "pfs" / "data")
    n = len(files_of(src))
    good = tmp_path / "cache"
    good.mkdir()
    want = direct([*DIGEST, src]).stdout
    cmd = [g.bin, "run", "--source", str(src), "--", *DIGEST, str(src)]
    proc = subprocess.run(cmd, capture_output=True, env={**g.env, "GRANARY_CACHE_DIR": str(good)},
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout == want, proc.stderr
    g.settle(src)
    tier = next(good.glob("granary-*"))
    assert_copies_are_the_source(tier, src, n)
    typo = tmp_path / "cahce"
    proc = subprocess.run(cmd, capture_output=True, env={**g.env, "GRANARY_CACHE_DIR": str(typo)},
                          timeout=600)
    err = proc.stderr.decode()
    # Refused before the program starts, naming the variable; nothing created, nothing removed.
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert f"GRANARY_CACHE_DIR={typo}" in err, err
    assert not typo.exists()
    assert_copies_are_the_source(tier, src, n)
    # The next run with the right value finds every copy.
    proc = subprocess.run([*cmd[:4], "--stats-json", str(tmp_path / "s.json"), *cmd[4:]],
                          capture_output=True, env={**g.env, "GRANARY_CACHE_DIR": str(good)},
                          timeout=600)
    assert proc.stdout == want, proc.stderr
    stats = json.loads((tmp_path / "s.json").read_text())
    assert tier_files(stats) == n and source_reads(stats) == 0, stats
    assert_copies_are_the_source(tier, src, n)
