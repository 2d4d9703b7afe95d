"""Datasets named and laid out through symlinks (docs/reliability.md).

A source root is often a symlink (`/data/imagenet -> /lustre/proj/imagenet`), and two jobs may
name it differently: the table a job gets was made for the first job's spelling. Every spelling
that provably names the catalogued directory is served — the table's, the real path, the job's
own `--source` — whichever job made the table, by absolute paths or relative ones after a
`chdir`; a symlink retargeted between jobs never serves its old target's copies.

A dataset may itself be symlinks (the Hugging Face hub cache: `snapshots/<rev>/file ->
../../blobs/<sha>`): its files are served from the tier through their links, and no open tries
the link's own name on the tier (a copy is named by its target's path: such an open always
failed, one open in five).
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import source_opens, source_reads, tier_files
from probes import Holder, direct, make_tree, output, run_job

# Reads each file named by the arguments (`cd:DIR` changes directory first) and prints its
# length and SHA-256: two runs print the same exactly when they read the same bytes.
READER = """
import hashlib, os, sys
for p in sys.argv[1:]:
    if p.startswith("cd:"):
        os.chdir(p[3:])
        continue
    with open(p, "rb") as f:
        data = f.read()
    print(p, len(data), hashlib.sha256(data).hexdigest())
"""

FILES = {f"d/f{i}": os.urandom(1000 + 37 * i) for i in range(6)}
FILES["e/big.bin"] = os.urandom(3 << 20)


def spelled_tree(tmp_path):
    """The dataset at its real path, and a symlink to it where users name it (under a
    directory whose name starts with a dot, as `~/.cache` does)."""
    real = make_tree(tmp_path / "lustre" / "proj" / "ds", FILES)
    (tmp_path / "home" / ".cache").mkdir(parents=True)
    link = tmp_path / "home" / ".cache" / "ds"
    os.symlink(real, link)
    return real, link


def reads(real, link):
    """Every file by four spellings: through the link, by the real path, and relative after a
    `chdir` into each."""
    names = sorted(FILES)
    return {
        "link": [str(link / n) for n in names],
        "real": [str(real / n) for n in names],
        "cd-link": [f"cd:{link}", *names],
        "cd-real": [f"cd:{real}", *names],
    }


def place(granary, source, tier):
    proc, _ = run_job(granary, source, ["sh", "-c", f"cat {source}/d/* {source}/e/* > /dev/null"],
                      tier)
    output(proc)
    granary.settle(source)


@pytest.mark.parametrize("first", ["real", "link"])
@pytest.mark.parametrize("second", ["real", "link"])
def test_every_spelling_that_names_the_source_is_served(granary, tmp_path, first, second):
    """Job 1 names the source one way (and places every file), job 2 the same way or the
    other, on the same agent and tier; job 2's program reads every file through the link, by
    the real path and relative to each: the same bytes as directly, and each spelling granary
    can prove served from the tier. A job naming the source through the link was served
    nothing through it when job 1 had named the real path (the table's spelling was job 1's)."""
    real, link = spelled_tree(tmp_path)
    tier = tmp_path / "tier"
    spell = {"real": real, "link": link}
    place(granary, spell[first], tier)
    ways = reads(real, link)
    cmd = [sys.executable, "-c", READER, *[a for w in ways.values() for a in w]]
    got, stats = run_job(granary, spell[second], cmd, tier)
    assert output(got) == output(direct(cmd))
    # The link is provable when a job named it (its own `--source`, or the table's spelling):
    # only a program reading through a link no job ever named passes through.
    served = len(ways) if "link" in (first, second) else len(ways) - 1
    assert tier_files(stats) == served * len(FILES), stats
    assert source_opens(stats) == 0 and source_reads(stats) == 0, stats


def test_a_source_link_retargeted_between_jobs_never_serves_the_old_target(granary, tmp_path):
    """Job 1 names the source through a link and places every file; the link is retargeted
    (`ln -sfn`) to another directory with the same names and other bytes, the agent still
    running. Job 2 through the link reads the new directory's bytes (its state is set aside and
    the link served as the directory it names now); a job naming the old directory's real path
    reads through the link — the table's spelling, which no longer leads there — the new
    directory's bytes too; with the link back, the old directory is served from the tier
    again. The agent's kept state for the link served the old directory's copies under the new
    one's paths."""
    real, link = spelled_tree(tmp_path)
    other = make_tree(tmp_path / "lustre" / "proj" / "other",
                      {n: os.urandom(len(b)) for n, b in FILES.items()})
    tier = tmp_path / "tier"
    place(granary, link, tier)
    tmp = link.parent / "ds.new"
    os.symlink(other, tmp)
    os.rename(tmp, link)
    ways = reads(real, link)
    cmd = [sys.executable, "-c", READER, *ways["link"], *ways["cd-link"]]
    got, _ = run_job(granary, link, cmd, tier)
    assert output(got) == output(direct(cmd))
    # The old directory by its real path: the table (made for the link) is loaded with its
    # spelling, which leads elsewhere now.
    cmd = [sys.executable, "-c", READER, *ways["link"], *ways["real"]]
    got, stats = run_job(granary, real, cmd, tier)
    assert output(got) == output(direct(cmd))
    assert tier_files(stats) == len(FILES), stats
    # The link back: its old state, and its copies, serve it again.
    tmp = link.parent / "ds.back"
    os.symlink(real, tmp)
    os.rename(tmp, link)
    cmd = [sys.executable, "-c", READER, *ways["link"]]
    got, stats = run_job(granary, link, cmd, tier)
    assert output(got) == output(direct(cmd))
    assert tier_files(stats) == len(FILES), stats


def test_a_source_link_retargeted_while_a_job_reads_its_old_target(granary, tmp_path):
    """The link retargeted while a job that named it still runs: a second job naming the link
    runs without granary (its state is the first job's directory's, which that job still
    reads), and reads the new directory's bytes; the first job's state is untouched."""
    real, link = spelled_tree(tmp_path)
    other = make_tree(tmp_path / "lustre" / "proj" / "other",
                      {n: os.urandom(len(b)) for n, b in FILES.items()})
    tier = tmp_path / "tier"
    place(granary, link, tier)
    holder = Holder(granary, link, tier)
    try:
        tmp = link.parent / "ds.new"
        os.symlink(other, tmp)
        os.rename(tmp, link)
        cmd = [sys.executable, "-c", READER, *reads(real, link)["link"]]
        got, stats = run_job(granary, link, cmd, tier)
        assert output(got) == output(direct(cmd))
        assert stats["disabled"] and "leads to" in stats["fallback"], stats
    finally:
        holder.close()


def hf_cache(root, blobs=300):
    """A Hugging Face hub cache's shape: the bytes in `blobs/<sha>`, the names in
    `snapshots/<rev>/` as relative symlinks to them, one directory level down too."""
    files = {}
    for i in range(blobs):
        data = os.urandom(700 + (i * 131) % 5000)
        sha = f"{i:04x}" + "%060x" % int.from_bytes(os.urandom(30), "big")
        files[f"blobs/{sha}"] = data
    make_tree(root, files)
    snap = root / "snapshots" / ("ab" * 20)
    links = []
    for i, blob in enumerate(sorted(files)):
        rel = f"data/train-{i:05d}.parquet" if i % 2 else f"shard-{i:05d}.json"
        p = snap / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        up = "../" * rel.count("/") + "../../"
        os.symlink(up + blob, p)
        links.append(p)
    return links


def test_a_hugging_face_cache_is_served_through_its_links(granary, tmp_path):
    """Job 1 reads every file of an HF-cache-shaped tree through its snapshot links (the agent
    places the blobs); job 2 reads them again through the links, traced: every byte as
    directly, every file from the tier, no data read from the source, and no open of a tier
    object that does not exist — the library opened the link's own name there first (its copy
    is its target's), which failed for one open in five."""
    src = tmp_path / "hub" / "datasets--org--name"
    links = hf_cache(src)
    tier = tmp_path / "tier"
    cmd = [sys.executable, "-c", READER, *map(str, links)]
    proc, _ = run_job(granary, src, cmd, tier)
    output(proc)
    granary.settle(src)
    trace = tmp_path / "trace"
    traced = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace), *cmd]
    got, stats = run_job(granary, src, traced, tier)
    assert output(got) == output(direct(cmd))
    assert tier_files(stats) == len(links), stats
    assert source_reads(stats) == 0, stats
    # The tier's copies are opened relative to its object directory's fd by their 16-hex-digit
    # names: each of those opens found its copy.
    opens = [line for line in trace.read_text().splitlines()
             if re.search(r'openat\(\d+, "[0-9a-f]{16}"', line)]
    assert len(opens) >= len(links), len(opens)
    failed = [line for line in opens if "ENOENT" in line]
    assert not failed, failed[:5]
