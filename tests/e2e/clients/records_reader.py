#!/usr/bin/env python3
"""A tf.data-like reader of large record files: per epoch, shard order shuffled, `--interleave`
shards read at once in 256 KiB `pread`s round-robin; each shard's bytes checked against the
manifest. Exits 1 on any mismatch; one JSON line per epoch."""
import argparse
import hashlib
import json
import os
import random
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--interleave", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256 << 10)
    ap.add_argument("--prefix", default="records/")
    ap.add_argument("--sync-dir", help="after epoch k, create DIR/done-k and wait for DIR/go-k")
    args = ap.parse_args()
    with open(os.path.join(args.root, "MANIFEST.json")) as f:
        manifest = {k: v for k, v in json.load(f).items() if k.startswith(args.prefix)}
    names = sorted(manifest)
    rng = random.Random(5)
    bad = 0
    for epoch in range(args.epochs):
        rng.shuffle(names)
        t0 = time.monotonic()
        queue = list(names)
        active = []  # [name, fd, offset, hasher]
        total = 0
        while queue or active:
            while queue and len(active) < args.interleave:
                name = queue.pop()
                active.append([name, os.open(os.path.join(args.root, name), os.O_RDONLY), 0, hashlib.sha256()])
            for a in list(active):
                data = os.pread(a[1], args.chunk, a[2])
                if data:
                    a[3].update(data)
                    a[2] += len(data)
                    total += len(data)
                    continue
                os.close(a[1])
                active.remove(a)
                if a[3].hexdigest() != manifest[a[0]]:
                    bad += 1
                    print(f"MISMATCH {a[0]}", file=sys.stderr)
        print(json.dumps({"epoch": epoch, "files": len(names), "bytes": total,
                          "seconds": round(time.monotonic() - t0, 3)}), flush=True)
        if args.sync_dir and epoch + 1 < args.epochs:
            open(os.path.join(args.sync_dir, f"done-{epoch}"), "w").close()
            while not os.path.exists(os.path.join(args.sync_dir, f"go-{epoch}")):
                time.sleep(0.05)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
