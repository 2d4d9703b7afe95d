#!/usr/bin/env python3
"""A PyTorch-DataLoader-like reader: forked worker processes read shuffled files whole, for
several epochs, and every byte is checked against the manifest. One worker also spawns a
subprocess that reads a file, as data pipelines calling external decoders do.

Exits 1 on any mismatch; prints one JSON line per epoch.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time


def check(args):
    root, rel, want, delay = args
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    if delay:
        time.sleep(delay)
    return rel, hashlib.sha256(data).hexdigest() == want, len(data)


def subprocess_read(root, rel, want):
    got = subprocess.run(["sha256sum", os.path.join(root, rel)], capture_output=True, check=True)
    return got.stdout.split()[0].decode() == want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds of 'compute' per sample")
    ap.add_argument("--marker", help="file to create once the first epoch is half done")
    ap.add_argument("--sync-dir", help="after epoch k (the last one too), create DIR/done-k and "
                    "wait for DIR/go-k (lets a test observe the system between epochs, and "
                    "after the last while the job still runs)")
    args = ap.parse_args()

    with open(os.path.join(args.root, "MANIFEST.json")) as f:
        manifest = json.load(f)
    names = sorted(manifest)
    rng = random.Random(args.seed)
    ctx = mp.get_context("fork")
    bad = 0
    with ctx.Pool(args.workers) as pool:
        for epoch in range(args.epochs):
            rng.shuffle(names)
            t0 = time.monotonic()
            nbytes = 0
            work = [(args.root, n, manifest[n], args.delay) for n in names]
            for i, (rel, ok, size) in enumerate(pool.imap_unordered(check, work, chunksize=2)):
                nbytes += size
                if not ok:
                    bad += 1
                    print(f"MISMATCH {rel}", file=sys.stderr)
                if args.marker and epoch == 0 and i == len(names) // 2:
                    open(args.marker, "w").close()
            sub_ok = pool.apply(subprocess_read, (args.root, names[0], manifest[names[0]]))
            if not sub_ok:
                bad += 1
                print(f"MISMATCH (subprocess) {names[0]}", file=sys.stderr)
            print(json.dumps({"epoch": epoch, "files": len(names), "bytes": nbytes,
                              "seconds": round(time.monotonic() - t0, 3)}), flush=True)
            if args.sync_dir:
                open(os.path.join(args.sync_dir, f"done-{epoch}"), "w").close()
                while not os.path.exists(os.path.join(args.sync_dir, f"go-{epoch}")):
                    time.sleep(0.05)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
