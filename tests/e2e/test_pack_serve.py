"""Serving a pack (issue 12, capabilities 3 and 4): `granary run --source DIR --pack PACK` and
`granary run --pack PACK --mount PATH`, through the real binary, compared with a direct read of
the tree: every byte and every stat field (atime aside: packing records mtime there), listings,
symlink targets; no metadata call on the source after the program starts (strace on the agent
and the program); what changed since packing served from the source; damaged partitions never
served, and named in the job's report (which pack, how many files, the command to run), a
damaged index too; the agent killed mid-partition, and a pack-only mount whose agent is gone,
still give the program every byte."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import Granary, direct, granary_bin, source_meta, source_opens, tier_files
from probes import wait_for
from test_pack import make_odd_tree
from test_source_device import drop_caches, loop_source  # noqa: F401 (fixture)
from test_waits import throttle  # noqa: F401 (fixture)

# Every entry below the root, sorted: its lstat fields (atime aside), a directory's names, a
# symlink's target, a file's sha256 — or the errno its read failed with.
READ_TREE = [sys.executable, "-c", r"""
import hashlib, json, os, stat, sys
root = os.fsencode(sys.argv[1])
out = []
def rec(p):
    st = os.lstat(p)
    r = {"path": os.path.relpath(p, root).decode("utf-8", "surrogateescape"),
         "mode": st.st_mode, "nlink": st.st_nlink, "uid": st.st_uid, "gid": st.st_gid,
         "size": st.st_size, "blocks": st.st_blocks, "ino": st.st_ino, "dev": st.st_dev,
         "mtime": st.st_mtime_ns, "ctime": st.st_ctime_ns}
    if stat.S_ISDIR(st.st_mode):
        r["names"] = sorted(n.decode("utf-8", "surrogateescape") for n in os.listdir(p))
    elif stat.S_ISLNK(st.st_mode):
        r["target"] = os.readlink(p).decode("utf-8", "surrogateescape")
    elif stat.S_ISREG(st.st_mode):
        try:
            with open(p, "rb") as f:
                data = f.read()
            r["sha256"] = hashlib.sha256(data).hexdigest()
        except OSError as e:
            r["errno"] = e.errno
    out.append(r)
for d, dirs, files in os.walk(root):
    dirs.sort()
    rec(d)
    for n in sorted(files):
        rec(os.path.join(d, n))
print(json.dumps(out, sort_keys=True, indent=0))
"""]


def read_tree(out: bytes):
    return {r["path"]: r for r in json.loads(out)}


def pack(src, out, *args):
    proc = subprocess.run([granary_bin(), "pack", str(src), str(out), "-q", *map(str, args)],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")


def serve(granary, args, cmd, tier, tier_size="1G", extra=(), timeout=300, quiet=True):
    """`granary run --pack … ` (args: --source DIR or --mount PATH, and --pack PACK)."""
    stats_path = granary.tmp / f"stats-{time.monotonic_ns()}.json"
    argv = [granary.bin, "run", *map(str, args), "--tier", f"{tier}={tier_size}",
            "--stats-json", str(stats_path), *(["-q"] if quiet else []), *extra, "--",
            *map(str, cmd)]
    proc = subprocess.run(argv, capture_output=True, env=granary.env, timeout=timeout)
    assert proc.returncode == 0, (argv, proc.stderr.decode(errors="replace")[-3000:])
    return proc, json.loads(stats_path.read_text())


def pack_args(mode, src: pathlib.Path, packed: pathlib.Path):
    """`granary run` arguments to serve `packed` with the tree (`source`) or, the tree moved
    away, with the pack alone where the tree used to be (`mount`)."""
    if mode == "source":
        return ["--source", src, "--pack", packed]
    os.rename(src, src.parent / "gone")
    return ["--pack", packed, "--mount", src]


def regular_files(tree):
    return [p for p, r in tree.items() if (r["mode"] & 0o170000) == 0o100000]


@pytest.mark.parametrize("codec", ["none", "zstd:1"])
@pytest.mark.parametrize("mode", ["source", "mount"])
def test_every_byte_and_stat_field_of_a_packed_tree(granary, tmp_path, codec, mode):
    src = tmp_path / "pfs" / "data"
    os.makedirs(src)
    make_odd_tree(os.fsencode(src))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed, "--compress", codec, "--partitions", "2")
    want = direct([*READ_TREE, src])
    assert want.returncode == 0, want.stderr
    expected = read_tree(want.stdout)
    args = pack_args(mode, src, packed)
    proc, stats = serve(granary, args, [*READ_TREE, src], tmp_path / "tier")
    got = read_tree(proc.stdout)
    assert got.keys() == expected.keys()
    for p in expected:
        assert got[p] == expected[p], p
    files = regular_files(expected)
    # Every file from its copy, every stat and listing from the index: nothing from the source.
    assert tier_files(stats) == len(files), stats
    assert source_opens(stats) == 0, stats
    # One: os.walk's stat through "pointing out", a symlink leaving the tree (the kernel's).
    assert source_meta(stats) == 1, stats
    assert stats["catalog"]["pack_files"] == len(files), stats["catalog"]


def test_no_source_metadata_call_after_the_program_starts(granary, tmp_path):
    """Counted outside granary: strace -f on `granary run`, the agent it starts and the program.
    The tree is checked per directory before the start; afterwards nothing names it but the
    program's own opens of the directories it lists."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    src = tmp_path / "pfs" / "data"
    for d in range(4):
        for i in range(25):
            p = src / f"class{d}" / f"img{i:03d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(20_000 + 997 * i))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed, "--partitions", "2")
    granary.stop()  # the agent of this job is started under strace
    log = tmp_path / "strace.log"
    stats_path = tmp_path / "stats.json"
    argv = ["strace", "-f", "-qq", "-s", "4096", "-e", "trace=%file,%desc", "-o", str(log),
            granary.bin, "run",
            "--source", str(src), "--pack", str(packed), "--tier", f"{tmp_path / 'tier'}=1G",
            "--idle-timeout", "1s", "--stats-json", str(stats_path), "-q", "--", *READ_TREE,
            str(src)]
    proc = subprocess.run(argv, capture_output=True, env=granary.env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    assert read_tree(proc.stdout) == read_tree(direct([*READ_TREE, src]).stdout)
    lines = log.read_text(errors="replace").splitlines()
    start = next(i for i, l in enumerate(lines) if f'execve("{sys.executable}"' in l)
    program = lines[start].split()[0]
    names_source = [l for l in lines if f'"{src}"' in l or f'"{src}/' in l]
    # Once the last job detached the agent holds the tree's directories for the next job
    # (`O_PATH` references, crates/granary-agent/src/source/pins.rs): not calls of this job.
    held = [l for l in lines[start + 1:] if not l.startswith(f"{program} ")
            and "openat(" in l and "O_PATH" in l and "O_DIRECTORY" not in l]
    after = [l for l in lines[start + 1:]
             if (f'"{src}"' in l or f'"{src}/' in l) and l not in held]
    assert names_source, "strace saw nothing of the source: the check is broken"
    # The program's directory fds are real fds of the real directories (docs/preload-rules.md,
    # rule 16): one open per directory it lists, nothing else — no stat, no listing, no file.
    dir_opens = [l for l in after if "openat(" in l and "O_DIRECTORY" in l]
    assert [l for l in after if l not in dir_opens] == [], after[:20]
    # READ_TREE lists each of the 5 directories twice (os.walk, then os.listdir).
    assert len(dir_opens) <= 2 * 5, dir_opens
    # The pack: the index once, each partition at most once.
    opened = [l for l in lines if "open" in l and str(packed) in l and "= -1" not in l]
    parts = [l for l in opened if "/part-" in l]
    assert len([l for l in opened if l.count("/index") == 1]) == 1, opened
    assert 1 <= len(parts) <= 2, parts
    stats = json.loads(stats_path.read_text())
    assert source_opens(stats) == 0 and source_meta(stats) == 0, stats


def change_since_packing(src: pathlib.Path):
    """Changes a per-directory check sees: a file replaced by rename, one added, one removed,
    a new directory with a file, a directory removed."""
    tmp = src.parent / "replacement"
    tmp.write_bytes(b"R" * 5000)
    os.rename(tmp, src / "a" / "f1")
    (src / "a" / "new").write_bytes(b"new file")
    (src / "b" / "f2").unlink()
    (src / "c" / "fresh").mkdir()
    (src / "c" / "fresh" / "x").write_bytes(b"x" * 3)
    shutil.rmtree(src / "d")


def small_tree(src: pathlib.Path):
    for d in "abcd":
        for i in range(6):
            p = src / d / f"f{i}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(bytes([65 + i]) * (3000 + 100 * i))
    return src


def test_what_changed_since_packing_comes_from_the_source(granary, tmp_path):
    src = small_tree(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    change_since_packing(src)
    proc, stats = serve(granary, ["--source", src, "--pack", packed], [*READ_TREE, src],
                        tmp_path / "tier")
    assert read_tree(proc.stdout) == read_tree(direct([*READ_TREE, src]).stdout)
    cat = stats["catalog"]
    assert cat["pack_dirs_changed"] >= 3, cat
    # a/f1 (replaced), a/new, c/fresh/x: from the source; the rest from the pack.
    assert cat["pack_source_files"] == 3, cat
    assert cat["pack_files"] == 24 - 1 - 6 - 1, cat


def test_a_joining_job_sees_changes_made_while_another_holds_the_pack(granary, tmp_path):
    src = small_tree(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    tier = tmp_path / "tier"
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [granary.bin, "run", "--source", str(src), "--pack", str(packed), "--tier", f"{tier}=1G",
         "-q", "--", sys.executable, "-c",
         f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"],
        env=granary.env, start_new_session=True, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: any(s.get("jobs") for s in granary.status().get("sources", [])),
                 "the first job to attach")
        granary.settle(src)
        change_since_packing(src)
        proc, _ = serve(granary, ["--source", src, "--pack", packed], [*READ_TREE, src], tier)
        assert read_tree(proc.stdout) == read_tree(direct([*READ_TREE, src]).stdout)
    finally:
        go.touch()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    assert holder.returncode == 0, holder.stderr.read()


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def table_opens(report: str) -> dict:
    """The report table's opens column by row: tiers, the source (or pack), refused opens."""
    rows, lines = {}, report.splitlines()
    start = next(i for i, l in enumerate(lines) if l.split()[:3] == ["served", "from", "opens"])
    for l in lines[start + 1:]:
        w = l.split()
        if w[0] == "tier":
            rows[" ".join(w[:2])] = int(w[-3])
        elif w[0] == "the":
            rows["source"] = int(w[-8])
        elif w[0] == "refused":
            rows["refused"] = int(w[1])
        else:
            return rows
    return rows


@pytest.mark.parametrize("damage", ["data", "header", "cut"])
@pytest.mark.parametrize("mode", ["source", "mount"])
def test_a_damaged_partition_is_never_served(granary, tmp_path, damage, mode):
    src = tmp_path / "pfs" / "data"
    victim = os.urandom(200_000)
    (src / "a").mkdir(parents=True)
    (src / "a" / "victim").write_bytes(victim)
    for i in range(8):
        (src / "a" / f"other{i}").write_bytes(os.urandom(10_000 + i))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    part = packed / "part-00000"
    blob = part.read_bytes()
    if damage == "data":
        flip(part, blob.index(victim) + 12345)
    elif damage == "header":
        flip(part, 40)  # the pack id
    else:
        with open(part, "r+b") as f:
            f.truncate(len(blob) - 1)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    args = pack_args(mode, src, packed)
    proc, stats = serve(granary, args, [*READ_TREE, src], tmp_path / "tier", quiet=False)
    got = read_tree(proc.stdout)
    assert got.keys() == expected.keys()
    refused = {"a/victim"} if damage == "data" else set(regular_files(expected))
    for p, r in expected.items():
        if mode == "mount" and p in refused:
            # Nothing else to read from: the open fails cleanly, never wrong bytes.
            assert got[p]["errno"] == 5 and "sha256" not in got[p], got[p]
            continue
        assert got[p] == r, p
    if mode == "source":
        assert source_opens(stats) == len(refused), stats
    # The report names the pack, how many of its files it could not serve, and what to run.
    d = stats["pack_damage"]
    real = os.path.realpath(packed)
    verify = f"granary pack verify {real}"
    assert d["pack"] == real and d["verify"] == verify and not d["index"], d
    assert d["files"] == len(refused), d
    assert d["refused_opens"] == (len(refused) if mode == "mount" else 0), d
    what = {"data": "checksum mismatch", "header": "header", "cut": "truncated"}[damage]
    assert what in d["problems"][0], d
    [warning] = [w for w in stats["warnings"] if "is damaged" in w]
    assert verify in warning and f"{len(refused)} file" in warning, warning
    assert ("EIO" in warning) == (mode == "mount"), warning
    report = proc.stderr.decode()
    assert f"DAMAGED: {len(refused)} of its files cannot be read from it" in report, report
    assert f"warning: pack {real} is damaged" in report, report
    # The table's opens add up to the job's, the refused ones in a row of their own.
    assert sum(table_opens(report).values()) == int(report.split(" opens of dataset files")[0]
                                                    .rsplit("; ", 1)[1]), report
    assert ("refused" in table_opens(report)) == (mode == "mount"), report
    # What the user runs next says the same.
    v = subprocess.run([granary_bin(), "pack", "verify", str(packed)], capture_output=True)
    assert v.returncode == 1
    named = [l.split(": ", 1)[0] for l in v.stdout.decode().splitlines()]
    assert set(named) & set(expected) == refused, named


@pytest.mark.parametrize("mode", ["source", "mount"])
def test_a_damaged_index_is_named_and_the_job_runs_from_the_source(granary, tmp_path, mode):
    """The index is the catalog: damaged, nothing can be served from the pack. With the tree
    the job runs from it and its report says why and what to run; with the pack alone the
    program is not run at all (it would find nothing), with the same message."""
    src = small_tree(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    index = packed / "index"
    flip(index, index.stat().st_size // 2)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    args = pack_args(mode, src, packed)
    stats_path = tmp_path / "stats.json"
    ran = tmp_path / "ran"
    cmd = [sys.executable, "-c",
           "import pathlib, subprocess, sys\n"
           "pathlib.Path(sys.argv[1]).touch()\n"
           "sys.exit(subprocess.run(sys.argv[2:]).returncode)", ran, *READ_TREE, src]
    proc = subprocess.run([granary.bin, "run", *map(str, args), "--tier", f"{tmp_path / 'tier'}=1G",
                           "--stats-json", str(stats_path), "--", *map(str, cmd)],
                          capture_output=True, env=granary.env, timeout=300)
    verify = f"granary pack verify {os.path.realpath(packed)}"
    err = proc.stderr.decode()
    assert verify in err and "is damaged" in err and "corrupt pack" in err, err
    if mode == "mount":
        assert proc.returncode == 2 and not ran.exists(), err
        return
    assert proc.returncode == 0, err
    assert read_tree(proc.stdout) == expected
    stats = json.loads(stats_path.read_text())
    assert stats["disabled"] and verify in stats["fallback"], stats
    d = stats["pack_damage"]
    assert d["index"] and d["files"] == 24 and d["verify"] == verify, d


def test_the_pack_alone_damaged_and_the_agent_gone(granary, tmp_path):
    """The preload library extracts files itself once the agent is gone; a file whose bytes
    fail their checksum gets EIO, and the report still names the pack and the command."""
    src = tmp_path / "pfs" / "data"
    victim = os.urandom(50_000)
    (src / "a").mkdir(parents=True)
    (src / "a" / "victim").write_bytes(victim)
    for i in range(5):
        (src / "a" / f"other{i}").write_bytes(os.urandom(7_000 + i))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    part = packed / "part-00000"
    flip(part, part.read_bytes().index(victim) + 999)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    os.rename(src, tmp_path / "pfs" / "gone")
    g = Granary(tmp_path / "own")  # its agent gets killed: nobody else's
    (tmp_path / "own").mkdir()
    script = [sys.executable, "-c", r"""
import json, os, signal, subprocess, sys
st = json.loads(subprocess.run([sys.argv[1], "status", "--json"], capture_output=True).stdout)
os.kill(st["pid"], signal.SIGKILL)
os.execv(sys.argv[2], sys.argv[2:])
""", g.bin, *READ_TREE, src]
    proc, stats = serve(g, ["--pack", packed, "--mount", src], script, tmp_path / "tier",
                        tier_size="4K")
    got = read_tree(proc.stdout)
    assert got.keys() == expected.keys()
    for p, r in expected.items():
        if p == "a/victim":
            assert got[p]["errno"] == 5 and "sha256" not in got[p], got[p]
        else:
            assert got[p] == r, p
    d = stats["pack_damage"]
    assert d["pack"] == os.path.realpath(packed) and d["refused_opens"] == 1, d
    [warning] = [w for w in stats["warnings"] if "is damaged" in w]
    assert d["verify"] in warning and "EIO (1 open failed)" in warning, warning
    assert d["verify"].encode() in proc.stderr  # -q: the warning is still printed
    assert not g.agent_pids()


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("codec", ["lz4", "zstd:1"])
def test_pack_only_with_the_agent_gone_extracts_every_file(granary, tmp_path, codec):
    """No room for any copy, and the agent killed before the program reads: every file comes
    out of its partition in the program itself (frames decoded, checksum checked)."""
    src = tmp_path / "pfs" / "data"
    os.makedirs(src)
    make_odd_tree(os.fsencode(src))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed, "--compress", codec)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    os.rename(src, tmp_path / "pfs" / "gone")
    g = Granary(tmp_path / "own")  # its agent gets killed: nobody else's
    (tmp_path / "own").mkdir()
    script = [sys.executable, "-c", r"""
import json, os, signal, subprocess, sys
st = json.loads(subprocess.run([sys.argv[1], "status", "--json"], capture_output=True).stdout)
os.kill(st["pid"], signal.SIGKILL)
os.execv(sys.argv[2], sys.argv[2:])
""", g.bin, *READ_TREE, src]
    proc, stats = serve(g, ["--pack", packed, "--mount", src], script, tmp_path / "tier",
                        tier_size="4K")
    got = read_tree(proc.stdout)
    assert got == expected
    # A tier of one block (the smallest granary takes) holds an empty file (no block) and one
    # small file at most; every other one was extracted.
    files = regular_files(expected)
    assert tier_files(stats) <= 2, stats
    assert source_opens(stats) == len(files) - tier_files(stats), stats
    # Each open counted once: the pack's extracted files in the row of the source or the pack.
    assert stats["opens"] == tier_files(stats) + source_opens(stats), stats
    assert not g.agent_pids()


BLKIO = pathlib.Path("/sys/fs/cgroup/blkio")


@pytest.mark.skipif(os.getuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists(),
                    reason="needs root and the cgroup-v1 blkio controller")
@pytest.mark.parametrize("mode", ["source", "mount"])
def test_agent_killed_mid_partition(tmp_path, loop_source, throttle, mode):
    """The pack on a block device the agent alone reads slowly (a blkio cgroup): the program
    starts, some files are placed, the agent is killed (SIGKILL) in the middle of the partition,
    and the program then reads every file — from copies, the source, or (pack only) the
    partition itself — byte for byte."""
    dev, mnt = loop_source
    src = mnt / "data"
    for i in range(60):
        p = src / f"c{i % 3}" / f"f{i:03d}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(256 << 10))
    packed = mnt / "data.granary"
    pack(src, packed)
    os.sync()
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    # The agent reads the pack through the page cache: only what is not cached meets the throttle.
    drop_caches()
    (tmp_path / "own").mkdir()
    g = Granary(tmp_path / "own")  # this agent gets throttled and killed: nobody else's
    tier = tmp_path / "tier"
    try:
        # An agent reading in 256 KiB blocks, moved into the throttle before it sees the pack.
        started = subprocess.run([g.bin, "run", "--source", str(src), "--tier", f"{tier}=1G",
                                  "--block-size", "256K", "-q", "--", "true"],
                                 capture_output=True, env=g.env, timeout=120)
        assert started.returncode == 0, started.stderr
        [agent] = g.agent_pids()
        throttle(agent, dev, 1 << 20)
        args = pack_args(mode, src, packed)
        go = tmp_path / "go"
        stats_path = tmp_path / "stats.json"
        wait_go = [sys.executable, "-c",
                   "import os, sys, time\n"
                   "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
                   "os.execv(sys.argv[2], sys.argv[2:])", go, *READ_TREE, src]
        argv = [g.bin, "run", *map(str, args), "--tier", f"{tier}=1G", "--stats-json",
                str(stats_path), "-q", "--", *map(str, wait_go)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=g.env,
                                start_new_session=True)
        try:
            def placed():
                mine = [s for s in g.status().get("sources", []) if s.get("pack")]
                return mine and mine[0].get("files_placed_now", 0) >= 3
            wait_for(lambda: placed() or proc.poll() is not None, "some copies from the pack")
            assert proc.poll() is None, proc.communicate()
            kill(agent)
            go.touch()
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == 0, err.decode(errors="replace")
        assert read_tree(out) == expected
        stats = json.loads(stats_path.read_text())
        served = tier_files(stats)
        assert 3 <= served < 60, stats
        if mode == "source":
            assert source_opens(stats) == 60 - served, stats
    finally:
        throttle(None, dev, 0)
        g.stop()


@pytest.mark.parametrize("restart", [False, True], ids=["agent-kept", "agent-restarted"])
@pytest.mark.parametrize("mode", ["source", "mount"])
def test_a_later_job_reuses_the_copies_and_never_a_damaged_one(granary, tmp_path, restart, mode):
    src = small_tree(tmp_path / "pfs" / "data")
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    args = pack_args(mode, src, packed)
    tier = tmp_path / "tier"
    serve(granary, args, [*READ_TREE, src], tier)
    granary.settle(src)
    if restart:
        granary.stop()
    objects = sorted(p for p in tier.rglob("*") if p.parent.name == "objects" and p.is_file())
    assert len(objects) == 24
    # One copy damaged behind granary's back (same size, a byte flipped: its ctime tells).
    flip(objects[0], 100)
    proc, stats = serve(granary, args, [*READ_TREE, src], tier)
    assert read_tree(proc.stdout) == expected
    assert tier_files(stats) == 23, stats
    assert stats["placement"]["agent_source_bytes"] < 20_000, stats["placement"]


@pytest.mark.parametrize("mode", ["source", "mount"])
def test_what_does_not_fit_the_tier_is_served_from_the_source_or_the_pack(granary, tmp_path, mode):
    src = tmp_path / "pfs" / "data"
    for i in range(40):
        p = src / f"d{i % 4}" / f"f{i:02d}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(100 << 10))
    packed = tmp_path / "pfs" / "data.granary"
    pack(src, packed)
    expected = read_tree(direct([*READ_TREE, src]).stdout)
    args = pack_args(mode, src, packed)
    tier = tmp_path / "tier"
    proc, stats = serve(granary, args, [*READ_TREE, src], tier, tier_size="2M")
    assert read_tree(proc.stdout) == expected
    served = tier_files(stats)
    # 2 MiB hold 20 of the 40 files of 100 KiB (whole 4 KiB blocks each); none beyond it.
    assert 0 < served <= 20, stats
    assert source_opens(stats) == 40 - served, stats
    used = sum(p.stat().st_blocks * 512 for p in tier.rglob("*") if p.is_file()
               and p.parent.name == "objects")
    assert used <= 2 << 20, used
