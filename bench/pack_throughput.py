#!/usr/bin/env python3
"""Pack throughput: `tar cf` against `granary pack` (none, zstd:1) on the same tree, same disk.

Generates a tree like the small-file workload (~3,000 files of ~110 KB of random bytes in class
directories) plus a compressible set (low-entropy arrays, ~2.5x with zstd), then runs every
setup several times in rotated order (paired runs). Before each run: the previous output is
removed, `sync`, and the page cache is dropped (root only; otherwise the source is read from
cache and the figures are not cold). Each timing includes a final `sync`, so every setup pays
for getting its bytes to the disk (granary pack fsyncs anyway; tar does not).

    cargo build --release -p granary
    sudo python3 bench/pack_throughput.py                 # 5 paired runs, medians
    python3 bench/pack_throughput.py --runs 3 --json out.json

Nothing is asserted: this is a measurement. The machine may be shared; say so with the figures.
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def generate(root: pathlib.Path, files: int, size: int, compressible: int, csize: int, seed: int) -> int:
    """Writes the tree once (kept between invocations); returns its total bytes."""
    stamp = root / ".generated"
    want = f"{files} {size} {compressible} {csize} {seed}"
    if stamp.exists() and stamp.read_text() == want:
        return int((root / ".bytes").read_text())
    if root.exists():
        shutil.rmtree(root)
    rng = random.Random(seed)
    total = 0
    small = root / "src" / "train"
    for i in range(files):
        d = small / f"class{i % 30:02d}"
        d.mkdir(parents=True, exist_ok=True)
        n = max(1024, int(rng.lognormvariate(0, 0.35) * size))
        (d / f"img{i:05d}.bin").write_bytes(os.urandom(n))
        total += n
    low = bytes.maketrans(bytes(range(256)), bytes(b & 7 for b in range(256)))
    comp = root / "src" / "arrays"
    comp.mkdir(parents=True, exist_ok=True)
    for i in range(compressible):
        data = os.urandom(csize).translate(low)
        (comp / f"arr{i:04d}.npy").write_bytes(data)
        total += len(data)
    (root / ".bytes").write_text(str(total))
    stamp.write_text(want)
    return total


def drop_caches() -> bool:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def remove(p: pathlib.Path):
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/var/tmp/granary-pack-bench", type=pathlib.Path)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--size", type=int, default=110_000, help="median file size (bytes)")
    ap.add_argument("--compressible", type=int, default=100, help="files in the compressible set")
    ap.add_argument("--compressible-size", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--granary", default=os.environ.get("GRANARY_BIN") or str(REPO / "target/release/granary"))
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    if not os.access(a.granary, os.X_OK):
        sys.exit(f"{a.granary} not found: cargo build --release -p granary (or --granary PATH)")
    a.workdir.mkdir(parents=True, exist_ok=True)
    total = generate(a.workdir / "tree", a.files, a.size, a.compressible, a.compressible_size, 1)
    src = a.workdir / "tree" / "src"
    tar_out = a.workdir / "out.tar"
    pack_out = a.workdir / "out.granary"
    setups = {
        "tar cf": ["tar", "cf", str(tar_out), "-C", str(src), "."],
        "granary pack none": [a.granary, "pack", str(src), str(pack_out), "-q"],
        "granary pack zstd:1": [a.granary, "pack", str(src), str(pack_out), "--compress", "zstd:1", "-q"],
    }
    times = {k: [] for k in setups}
    sizes = {}
    cold = True
    for run in range(a.runs):
        order = list(setups)
        order = order[run % len(order):] + order[:run % len(order)]
        for name in order:
            remove(tar_out)
            remove(pack_out)
            cold = drop_caches() and cold
            t0 = time.monotonic()
            subprocess.run(setups[name], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["sync"], check=True)
            times[name].append(time.monotonic() - t0)
            out = tar_out if name.startswith("tar") else pack_out
            sizes[name] = out.stat().st_size if out.is_file() else sum(f.stat().st_size for f in out.iterdir())
        print(f"run {run + 1}/{a.runs}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" for k in setups), flush=True)
    remove(tar_out)
    remove(pack_out)
    med = {k: statistics.median(v) for k, v in times.items()}
    mbs = {k: total / med[k] / 1e6 for k in setups}
    tar = mbs["tar cf"]
    print(f"\ntree: {a.files} files of ~{a.size // 1000} KB + {a.compressible} compressible of "
          f"{a.compressible_size >> 10} KiB = {total / 1e6:.0f} MB; {os.cpu_count()} cores; "
          f"caches {'dropped before each run' if cold else 'NOT dropped (not root)'}")
    print(f"{'setup':<22}{'median s':>10}{'MB/s':>9}{'x tar':>8}{'output MB':>11}   runs")
    for k in setups:
        print(f"{k:<22}{med[k]:>10.2f}{mbs[k]:>9.0f}{mbs[k] / tar:>8.2f}{sizes[k] / 1e6:>11.0f}   "
              + " ".join(f"{t:.2f}" for t in times[k]))
    if a.json:
        a.json.write_text(json.dumps({"total_bytes": total, "times": times, "median_s": med,
                                      "mb_per_s": mbs, "output_bytes": sizes, "cold": cold}, indent=1))


if __name__ == "__main__":
    main()
