#!/usr/bin/env python3
"""What one placed open+read+close costs the program in instructions and cache misses, counted
(not timed): the C reader of `openread.py` (`clients/openread.c`, one reader) under valgrind's
cachegrind, directly and through `granary run` with every file placed, per file.

    python3 bench/openread_counts.py                          # 100,000 × 1 KiB files
    python3 bench/openread_counts.py --granary A --granary B  # two builds, one table each
    python3 bench/openread_counts.py --files 2000 --keep      # small tree; keep the agents

Counts are the reader's worker process's (the one that opens the files), from two runs that
differ by two timed passes (3 and 1, each followed by the checksum pass), divided by 2 × files:
whatever the process does once (start, the library's constructor, loading the list) cancels
out. Cachegrind simulates a 1 MiB last level (`--LL`), about one core's L2 here, so `LLd`
misses are the loads that leave the core's caches (the table's lines at 100,000 files); system
calls are not counted (the kernel is not simulated): the syscalls are the same with and without
granary (`strace -c`, docs/benchmarks.md). Deterministic: load on the machine changes nothing,
so no lock is needed and one run is enough. Needs valgrind.
"""
import argparse
import glob
import json
import os
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import openread  # noqa: E402  (the tree, the reader, the agent handle)

LL = "--LL=1048576,16,64"


def counts(prefix, env, exe, lst, passes, out: pathlib.Path):
    """Cachegrind's totals of the process that read the files (the one with most instructions)."""
    for f in glob.glob(f"{out}.*"):
        os.unlink(f)
    cmd = [*prefix, "valgrind", "--tool=cachegrind", "--cache-sim=yes", LL,
           f"--cachegrind-out-file={out}.%p", exe, lst, str(passes), "1"]
    p = subprocess.run(list(map(str, cmd)), capture_output=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"reader failed: {p.stderr.decode(errors='replace')[-2000:]}")
    best = None
    for f in glob.glob(f"{out}.*"):
        txt = pathlib.Path(f).read_text()
        events = re.search(r"^events: (.*)$", txt, re.M).group(1).split()
        totals = re.search(r"^summary: (.*)$", txt, re.M).group(1).split()
        c = dict(zip(events, map(int, totals)))
        if best is None or c["Ir"] > best["Ir"]:
            best = c
    return best


def per_file(prefix, env, exe, lst, files, out):
    one = counts(prefix, env, exe, lst, 1, out)
    three = counts(prefix, env, exe, lst, 3, out)
    return {k: (three[k] - one[k]) / (2 * files) for k in three}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000, help="1 KiB files")
    ap.add_argument("--granary", action="append",
                    help="a granary binary, or NAME=PATH (repeat for several builds); "
                         "default target/release/granary")
    ap.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/var/tmp/granary-openread-counts"))
    ap.add_argument("--keep", action="store_true", help="leave the agents and tiers for another run")
    args = ap.parse_args()
    specs = [g.split("=", 1) if "=" in g else [None, g] for g in args.granary or []]
    bins = [pathlib.Path(p) for _, p in specs] or [openread.REPO / "target/release/granary"]
    names = [n or f"build{i}" for i, (n, _) in enumerate(specs)] if len(bins) > 1 else ["granary"]
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    exe = openread.build_reader(work)
    src = work / f"ds-1k-{args.files}"
    openread.generate(src, args.files, 1024)
    lst = work / f"{src.name}.list"
    lst.write_text("".join(f"{src / d / f}\n" for d in sorted(os.listdir(src))
                           for f in sorted(os.listdir(src / d))))
    res = {"files": args.files, "ll": LL, "direct": per_file([], None, exe, lst, args.files, work / "direct")}
    for n, b in zip(names, bins):
        g = openread.Granary(b, work / n)
        try:
            g.reset()
            g.run(src, [exe, lst, 1, 2])  # job 1: walk, open every file
            g.settle()
            prefix = [g.bin, "run", "--source", src, "--tier", f"{g.tier}={g.tier_size}",
                      "--idle-timeout", "10m", "-q", "--"]
            res[n] = per_file(prefix, g.env, exe, lst, args.files, work / n)
            res[n]["placed"] = sum(s.get("files_placed_now", 0) for s in g.status().get("sources", []))
        finally:
            if not args.keep:
                g.reset()
    print(json.dumps(res, indent=1))
    keys = [("Ir", "instructions"), ("I1mr", "L1i misses"), ("D1mr", "L1d read misses"),
            ("DLmr", "LL read misses"), ("D1mw", "L1d write misses")]
    print(f"\nper file, {args.files:,} × 1 KiB placed files, one reader:")
    print("| | " + " | ".join(k for _, k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for n in ["direct", *names]:
        print(f"| {n} | " + " | ".join(f"{res[n][k]:.2f}" for k, _ in keys) + " |")


if __name__ == "__main__":
    main()
