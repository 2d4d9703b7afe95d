#!/usr/bin/env python3
"""Writes a deterministic test dataset and its checksum manifest.

The tree mixes what real datasets contain and what trips interposition layers up: class
directories of small files, empty and odd-sized files, large record files, names with spaces and
UTF-8, nested directories, symlinks to files and to directories (inside the tree) and one
pointing outside it.
"""
import argparse
import hashlib
import json
import os
import random


def payload(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=12)
    ap.add_argument("--mean-size", type=int, default=110_000)
    ap.add_argument("--records", type=int, default=2, help="large record files")
    ap.add_argument("--record-size", type=int, default=3 << 20)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    manifest = {}

    def write(rel: str, data: bytes) -> None:
        path = os.path.join(args.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        manifest[rel] = hashlib.sha256(data).hexdigest()

    for c in range(args.classes):
        for i in range(args.per_class):
            size = max(0, int(rng.expovariate(1 / args.mean_size)))
            write(f"train/class{c:03d}/img{i:05d}.jpg", payload(rng, size))
    for r in range(args.records):
        write(f"records/shard-{r:05d}.tfrecord", payload(rng, args.record_size))
    write("edge/empty.bin", b"")
    write("edge/one.bin", b"x")
    write("edge/page-minus-one.bin", payload(rng, 4095))
    write("edge/exactly-128k.bin", payload(rng, 128 << 10))
    write("edge/with space é.bin", payload(rng, 1000))
    write("edge/deep/a/b/c/d/leaf.bin", payload(rng, 5000))
    os.symlink("one.bin", os.path.join(args.root, "edge/link-to-file"))
    os.symlink("deep/a", os.path.join(args.root, "edge/link-to-dir"))
    os.symlink("/etc/hostname", os.path.join(args.root, "edge/link-outside"))
    os.symlink("missing-target", os.path.join(args.root, "edge/dangling"))
    with open(os.path.join(args.root, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
