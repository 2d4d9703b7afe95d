#!/usr/bin/env python3
"""A placed open as cheap as a direct one (issue "At the physical limit with real clients"): a C
reader (`clients/openread.c`, built here with `cc`) opens, reads to the end and closes every file
of a generated tree on the local disk, hot (every file in the page cache), with one process or a
fork pool of workers, directly and through `granary run` with every file placed. Then the same
reader on a fresh tier, while the agent is still placing what it reads (its first pass).

    python3 bench/openread.py                           # 100,000 × 1 KiB, 20,000 × 110 KiB files
    python3 bench/openread.py --granary A --granary B   # two builds, paired: rounds alternate
    python3 bench/openread.py --reader python           # the same passes from CPython (`open().read()`)
    python3 bench/openread.py --layout hf --only 1k --files 20000   # every file read through a symlink

Measured in one run, as ratios against direct reads of the same files, rounds interleaved
(direct, then each build): the fastest timed pass of each setup (other load only ever adds time,
so the minimum is the code's own cost), with medians beside it. The reader checks that every
setup read the same bytes (a digest of every file). A benchmark, not a test: nothing asserts on
timings; it exits 1 when a job fails or a digest differs. Writes `<out>/report.md` and
`results.json`.

The tiers go on a journaled ext4 (`mkfs.ext4` defaults) in a loop file the bench makes under
`--workdir` and removes afterwards: a node's local disk holds a journaled file system, and this
machine's root (ext4 without a journal, which skips inodes freed in the last 30 s at every
create) gives a figure no node would show (docs/benchmarks.md, "during placement").
`--tier-root DIR` puts them in DIR instead (e.g. /dev/shm for a RAM tier); without root
privileges the bench cannot mount and uses `--workdir`'s file system, and says so. The source
trees the direct passes read go on the tiers' file system too (direct "on the same disk"), unless
`--source-on workdir` (with `--tier-root`, they are removed after the run).

Before the hot rounds, every setup's files are put back in memory the same way (`even_out`: the
caches dropped, then direct's and every build's files read in one interleaved pass): otherwise the
tier placed first reads a few per cent slower than the next, whichever build it is.
"""
import argparse
import contextlib
import itertools
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import scale  # noqa: E402  (its Granary: the agent's status and stop)

REPO = pathlib.Path(__file__).resolve().parents[1]
CLIENT = REPO / "bench" / "clients" / "openread.c"

# The same passes as openread.c from Python: open(..., "rb").read() of every file.
PYREADER = r"""
import json, os, sys, time, hashlib
files = [l.strip() for l in open(sys.argv[1]) if l.strip()]
passes, workers = int(sys.argv[2]), int(sys.argv[3])
assert workers == 1, "the Python reader has no fork pool"
out = []
for p in range(passes):
    t = time.perf_counter()
    for f in files:
        with open(f, "rb") as fh:
            fh.read()
    out.append((time.perf_counter() - t) / len(files) * 1e6)
h = 0
for f in files:
    with open(f, "rb") as fh:
        h = (h + int.from_bytes(hashlib.blake2b(fh.read(), digest_size=8).digest(), "little")) % 2**64
print(json.dumps({"files": len(files), "workers": 1, "passes": out, "digest": "%016x" % h}))
"""

BARS = {"1k": 1.05, "110k": 1.02}
DURING_BAR = 1.3


@contextlib.contextmanager
def journaled_tier(work: pathlib.Path, need: int):
    """A journaled ext4 (`mkfs.ext4` defaults) on a loop file of at least `need` bytes,
    mounted for the run and removed after it; yields its mount point, or None when it cannot be
    made (not root, no mkfs.ext4, no loop device)."""
    img, mnt = work / "tier-ext4.img", work / "tier-ext4"
    # mkfs.ext4's default of one inode per 16 KiB: room for every copy's inode as well.
    size = max(need, 2 << 30)
    subprocess.run(["umount", str(mnt)], capture_output=True)
    img.unlink(missing_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    with open(img, "wb") as f:
        f.truncate(size)
    made = os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None and \
        subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], capture_output=True).returncode == 0 and \
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True).returncode == 0
    try:
        yield mnt if made else None
    finally:
        if made:
            for _ in range(10):  # an agent just stopped may still hold the tier for a moment
                if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                    break
                time.sleep(1)
            else:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        img.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def tier_fs(path: pathlib.Path) -> str:
    p = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(path)],
                       capture_output=True, text=True)
    return " ".join(p.stdout.split()) or "unknown"


def build_reader(work: pathlib.Path) -> str:
    exe = work / "openread"
    if not exe.exists() or exe.stat().st_mtime < CLIENT.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-o", str(exe), str(CLIENT)], check=True)
    return str(exe)


def generate(root: pathlib.Path, files: int, size: int, per_dir: int = 1000):
    marker = root.parent / f".{root.name}.complete"
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    blob = os.urandom(size + 4096)
    for i in range(files):
        d = root / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir(parents=True)
        k = (i * 61) % 4096
        (d / f"f{i:07d}.bin").write_bytes(blob[k:k + size])
    marker.write_text("")


def generate_hf(root: pathlib.Path, files: int, size: int, per_dir: int = 1000):
    """A Hugging Face hub cache's shape: the bytes in `blobs/<sha>`, the dataset's names in
    `snapshots/<rev>/` as relative symlinks to them (`d0000/f0000000.bin -> ../../../blobs/<sha>`).
    Returns the snapshot directory (the paths a reader opens)."""
    snap = root / "snapshots" / ("0" * 40)
    marker = root.parent / f".{root.name}.complete"
    if marker.exists():
        return snap
    shutil.rmtree(root, ignore_errors=True)
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    blob = os.urandom(size + 4096)
    for i in range(files):
        d = snap / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir(parents=True)
        sha = f"{(i * 0x9E3779B97F4A7C15) % (1 << 64):016x}{i:048x}"
        k = (i * 61) % 4096
        (blobs / sha).write_bytes(blob[k:k + size])
        os.symlink(f"../../../blobs/{sha}", d / f"f{i:07d}.bin")
    marker.write_text("")
    return snap


class Granary(scale.Granary):
    """scale.py's agent handle, with a tier of its own per build."""

    def __init__(self, binary: pathlib.Path, work: pathlib.Path, tier_root: pathlib.Path | None = None,
                 tier_size: str = "40G"):
        super().__init__(binary, work)
        self.work = work
        self.tier_size = tier_size
        # The runtime directory's parent (with the tiers elsewhere, nothing else makes it).
        work.mkdir(parents=True, exist_ok=True)
        self.tier = (tier_root / work.name if tier_root else work) / "tier"

    def reset(self):
        """No agent, no catalog, no copies: the next job walks and places from scratch."""
        self.stop()
        shutil.rmtree(self.tier, ignore_errors=True)
        shutil.rmtree(self.rt, ignore_errors=True)

    def settle(self, timeout=1800):
        """Until the agent places nothing more and its validation is done."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            srcs = self.status().get("sources", [])
            if srcs and all((s.get("validation") or {}).get("done") for s in srcs) \
                    and all(s.get("pending", 1) == 0 and not s.get("busy") for s in srcs):
                return
            time.sleep(0.2)
        raise SystemExit("the agent did not settle")

    def run(self, source, prog):
        # An agent that idles out while it still places (its copies run at idle priority: slow
        # when other jobs hold the cores) would leave `settle` waiting on no agent at all.
        cmd = [self.bin, "run", "--source", str(source), "--tier", f"{self.tier}={self.tier_size}",
               "--idle-timeout", "10m", "-q", "--", *prog]
        p = subprocess.run(list(map(str, cmd)), capture_output=True, env=self.env)
        if p.returncode != 0:
            raise SystemExit(f"job failed: {p.stderr.decode(errors='replace')[-2000:]}")
        # `granary run` that cannot serve runs the program anyway: a figure of direct reads.
        if b"without granary" in p.stderr:
            raise SystemExit(f"the job ran without granary: {p.stderr.decode(errors='replace')[-2000:]}")
        return p


def even_out(builds, lst, exe, work):
    """Every setup's files put back in memory the same way: the caches dropped (`drop_caches`),
    then the direct tree's file i, each build's copy i, file i + 1, ... read once. Without it the
    tier placed first reads 2–7 % slower than the one placed after it, whichever build it is;
    dropping the page cache and reading the files back takes that away (docs/benchmarks.md, "The
    order effect"). Not neutral for 110 KiB files: read-back pages read at other speeds than
    written ones, direct's ~6 % faster (docs/benchmarks.md, "How the pages came into the cache
    moves the figure"). Returns what was done (for the report)."""
    if os.geteuid() != 0:
        return "not done (needs root for drop_caches): placement order may move the figures"
    files = [l for l in lst.read_text().splitlines() if l]
    # A copy is `<tier>/<source id>/objects/<16 hex digits>` (docs/architecture.md).
    copies = [sorted(map(str, g.tier.glob("*/objects/*"))) for g in builds]
    mixed = work / "even.list"
    mixed.write_text("".join(f"{p}\n" for row in itertools.zip_longest(files, *copies)
                             for p in row if p))
    subprocess.run(["sync"], check=True)
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    direct([exe, mixed, 1, 1])
    return (f"caches dropped, then {len(files)} files and {', '.join(str(len(c)) for c in copies)} "
            f"copies read in one interleaved pass")


def reader_cmd(kind, exe, lst, passes, workers):
    if kind == "python":
        return [sys.executable, "-c", PYREADER, str(lst), str(passes), str(workers)]
    return [exe, str(lst), str(passes), str(workers)]


def direct(cmd):
    p = subprocess.run(list(map(str, cmd)), capture_output=True)
    if p.returncode != 0:
        raise SystemExit(f"direct reader failed: {p.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(p.stdout)


def summary(passes):
    return {"fastest_us": min(passes), "median_us": statistics.median(passes), "passes_us": passes}


def hot(builds, names, src, lst, kind, exe, workers, passes, rounds):
    """Rounds of: direct, then each build (every file placed, page cache hot). The builds take
    turns at going first, so that no build always runs in the same place of a round (right
    after the direct passes, or after another build's agent stopped)."""
    runs = {"direct": [], **{n: [] for n in names}}
    per_round = []
    digests = set()
    for r in range(rounds):
        out = direct(reader_cmd(kind, exe, lst, passes, workers))
        runs["direct"] += out["passes"]
        digests.add(out["digest"])
        fastest = {"direct": min(out["passes"])}
        turn = r % len(builds)
        for n, g in list(zip(names, builds))[turn:] + list(zip(names, builds))[:turn]:
            out = json.loads(g.run(src, reader_cmd(kind, exe, lst, passes, workers)).stdout)
            runs[n] += out["passes"]
            digests.add(out["digest"])
            fastest[n] = min(out["passes"])
        per_round.append(fastest)
    if len(digests) != 1:
        raise SystemExit(f"digests differ: {digests}")
    res = {k: summary(v) for k, v in runs.items()}
    for n in names:
        res[n]["ratio"] = res[n]["fastest_us"] / res["direct"]["fastest_us"]
        res[n]["median_ratio"] = res[n]["median_us"] / res["direct"]["median_us"]
        # Paired: each round's fastest pass against the same round's direct one (and, with
        # several builds, against the first build's), the median over rounds.
        res[n]["round_ratio"] = statistics.median(r[n] / r["direct"] for r in per_round)
        res[n]["vs_first_build"] = statistics.median(r[n] / r[names[0]] for r in per_round)
    res["per_round"] = per_round
    return res


def during(builds, names, src, lst, exe, workers, passes, rounds):
    """The reader's first passes on a fresh tier (the agent walks at attach, then places what the
    reader opens while it reads), against direct passes of the same round. Files hot in the page
    cache: what is measured is what placement takes from the program, not the source's speed."""
    res = {n: [] for n in names}
    for _ in range(rounds):
        d = direct(reader_cmd("c", exe, lst, passes, workers))
        for n, g in zip(names, builds):
            g.reset()
            # The last build's copies dropped the source's pages (a copied small file's go):
            # read them back first, so every setup starts from a hot page cache.
            direct(reader_cmd("c", exe, lst, 1, workers))
            out = json.loads(g.run(src, reader_cmd("c", exe, lst, passes, workers)).stdout)
            if out["digest"] != d["digest"]:
                raise SystemExit("digest differs during placement")
            # Its copies still running would compete with the next setup's passes.
            g.stop()
            res[n].append({"direct_us": min(d["passes"]), "passes_us": out["passes"],
                           "ratio_first": out["passes"][0] / min(d["passes"])})
    return {n: {"rounds": r, "ratio_first": statistics.median(x["ratio_first"] for x in r)}
            for n, r in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000, help="1 KiB files")
    ap.add_argument("--mid-files", type=int, default=20_000,
                    help="110 KiB files (page cache must hold them twice per build)")
    ap.add_argument("--workers", default="1,2", help="reader processes: 1 = one reader, N = a fork pool")
    ap.add_argument("--passes", type=int, default=5, help="timed passes per job")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds (direct, each build) of the hot passes; 0 skips them")
    ap.add_argument("--during-rounds", type=int, default=3, help="rounds on a fresh tier; 0 skips")
    ap.add_argument("--no-even", dest="even", action="store_false",
                    help="skip `even_out` before the hot rounds (the tier placed first then reads "
                         "slower)")
    ap.add_argument("--reader", choices=("c", "python"), default="c")
    ap.add_argument("--only", choices=("1k", "110k"), help="one file size only")
    ap.add_argument("--layout", choices=("plain", "hf"), default="plain",
                    help="hf: a Hugging Face hub cache (`generate_hf`): the reader opens every file "
                         "through a symlink to its blob")
    ap.add_argument("--granary", action="append",
                    help="a granary binary, or NAME=PATH (repeat to pair builds: rounds alternate); "
                         "default target/release/granary")
    ap.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/var/tmp/granary-openread"))
    ap.add_argument("--tier-root", type=pathlib.Path,
                    help="where the tiers go (default: a journaled ext4 on a loop file the bench "
                         "makes under --workdir and removes); e.g. /dev/shm for a RAM tier")
    ap.add_argument("--source-on", choices=("tier", "workdir"), default="tier",
                    help="where the source (direct) trees go: tier = on the tiers' file system (the "
                         "same disk), workdir = under --workdir (the layout before; each run then "
                         "reuses them)")
    ap.add_argument("--tier-size", default="40G",
                    help="each job's tier size; a tiny one (64K) copies nothing, so the first-pass "
                         "rows measure the library's path for files not placed yet, without copies")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "results/openread")
    args = ap.parse_args()
    specs = [g.split("=", 1) if "=" in g else [None, g] for g in args.granary or []]
    bins = [pathlib.Path(p) for _, p in specs] or [REPO / "target/release/granary"]
    if not bins[0].exists():
        subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=REPO, check=True)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    exe = build_reader(work)
    workers = [int(w) for w in args.workers.split(",")]
    if args.reader == "python":
        workers = [1]
    names = [n or f"build{i}" for i, (n, _) in enumerate(specs)] if len(bins) > 1 else ["granary"]
    sizes = [("1k", 1024, args.files), ("110k", 110 * 1024, args.mid_files)]
    sizes = [s for s in sizes if not args.only or s[0] == args.only]
    if args.tier_root:
        run(args, work, exe, workers, names, bins, sizes, args.tier_root)
        return
    # The source trees and every build's copies of the largest set at once (the hot rounds),
    # 4 KiB blocks, an inode (16 KiB of the file system at mkfs.ext4's default ratio) each, slack.
    per_file = [n * (-(-sz // 4096) * 4096 + 16384) for _, sz, n in sizes]
    need = (len(bins) * max(per_file) + sum(per_file)) * 5 // 4
    with journaled_tier(work, need) as mnt:
        if mnt is None:
            print(f"cannot make a journaled ext4 tier (needs root, mkfs.ext4, a loop device): "
                  f"the tiers go under {work}", flush=True)
        run(args, work, exe, workers, names, bins, sizes, mnt)


def run(args, work, exe, workers, names, bins, sizes, tier_root):
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    res = {"reader": args.reader, "layout": args.layout, "tier_size": args.tier_size, "builds": {n: str(b) for n, b in zip(names, bins)},
           "commit": commit, "load_before": os.getloadavg()[0], "sizes": {},
           "tier": tier_fs(tier_root or work) + ("" if tier_root else f" ({work})")}
    # The direct reads' tree on the same file system as the tiers (the issue's "on the same
    # disk"), unless asked for under the workdir.
    src_root = tier_root if tier_root and args.source_on == "tier" else work
    res["source"] = tier_fs(src_root) + f" ({src_root})"
    live = []  # every agent is stopped before the tier is unmounted, also on a failure
    try:
        for key, size, files in sizes:
            print(f"generating {files} files of {size} B ({args.layout})", flush=True)
            if args.layout == "hf":
                src = src_root / f"hf-{key}-{files}"
                tree = generate_hf(src, files, size)
            else:
                src = tree = src_root / f"ds-{key}-{files}"
                generate(src, files, size)
            lst = work / f"{src.name}.list"
            lst.write_text("".join(f"{tree / d / f}\n" for d in sorted(os.listdir(tree))
                                   for f in sorted(os.listdir(tree / d))))
            builds = [Granary(b, work / f"{n}-{key}", tier_root, args.tier_size)
                      for n, b in zip(names, bins)]
            live += builds
            r = res["sizes"][key] = {"files": files, "size": size, "hot": {}}
            for g in builds if args.rounds else []:
                g.reset()
                g.run(src, reader_cmd("c", exe, lst, 1, 2))  # job 1: walk, open every file
                g.settle()
                r["placed"] = sum(s.get("placed", 0) for s in g.status().get("sources", []))
            if args.rounds:
                r["even"] = even_out(builds, lst, exe, work) if args.even else "not asked"
            for w in workers if args.rounds else []:
                print(f"{key}: hot, {w} worker(s)", flush=True)
                r["hot"][str(w)] = hot(builds, names, src, lst, args.reader, exe, w, args.passes, args.rounds)
            if args.during_rounds and args.reader == "c":
                w = max(workers)
                print(f"{key}: during placement, {w} worker(s)", flush=True)
                r["during"] = during(builds, names, src, lst, exe, w, args.passes, args.during_rounds)
                r["during_workers"] = w
            for g in builds:
                g.reset()
            if args.tier_root and src_root == args.tier_root:
                # Not left in a directory of the user's (a RAM tier's would hold its memory).
                shutil.rmtree(src, ignore_errors=True)
                (src.parent / f".{src.name}.complete").unlink(missing_ok=True)
    finally:
        for g in live:
            g.stop()
    res["load_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "report.md").write_text(report(res, " ".join(sys.argv[1:])))
    print((args.out / "report.md").read_text())


def report(res, argv):
    rows = []
    names = list(res["builds"])
    # A tier too small for any copy: the "placed" rows read files not placed, and the first pass
    # runs with no copy made beside it.
    size = res.get("tier_size", "40G")
    placed, during = ("placed", "during placement") if size == "40G" else \
        (f"through a {size} tier (nothing placed)", f"through a {size} tier (no copies)")
    for key, r in res["sizes"].items():
        what = f"{r['files']:,} × {r['size'] // 1024} KiB"
        for w, h in r["hot"].items():
            pool = "one reader" if w == "1" else f"{w} fork workers"
            for n in names:
                x = h[n]
                label = f" ({n})" if len(names) > 1 else ""
                ok = x["ratio"] <= BARS[key]
                rows.append(f"| {placed} ÷ direct{label}, {what}, {pool} | {x['ratio']:.3f} "
                            f"({x['fastest_us']:.2f} vs {h['direct']['fastest_us']:.2f} µs; per round "
                            f"{x['round_ratio']:.3f}) | ≤ {BARS[key]} | {'pass' if ok else '**fail**'} |")
            for n in names[1:]:
                rows.append(f"| {n} ÷ {names[0]}, {what}, {pool} (median of rounds) | "
                            f"{h[n]['vs_first_build']:.3f} | — | |")
        for n, d in r.get("during", {}).items():
            firsts = ", ".join(f"{x['ratio_first']:.2f}" for x in d["rounds"])
            ok = d["ratio_first"] <= DURING_BAR
            label = f" ({n})" if len(names) > 1 else ""
            rows.append(f"| first pass {during} ÷ direct{label}, {what}, "
                        f"{r['during_workers']} fork workers (median of rounds) | {d['ratio_first']:.2f} "
                        f"(rounds {firsts}) | ≤ {DURING_BAR} | {'pass' if ok else '**fail**'} |")
    builds = "; ".join(f"{n} = `{b}`" for n, b in res["builds"].items())
    evens = "".join(f"Before the hot rounds of {k}: {r['even']}.\n\n"
                    for k, r in res["sizes"].items() if "even" in r)
    layout = ", every file through a symlink (hf)" if res.get("layout") == "hf" else ""
    return (f"# Placed open+read+close ({res['reader']} reader{layout})\n\n"
            f"`python3 bench/openread.py {argv}` at {res['commit']}; {builds}; "
            f"load average {res['load_before']:.2f} before, {res['load_after']:.2f} after, "
            f"{os.cpu_count()} cores; tiers on {res.get('tier', '?')}, the source (direct) "
            f"trees on {res.get('source', '?')}.\n\n"
            f"{evens}"
            "| what | measured | bar | |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
