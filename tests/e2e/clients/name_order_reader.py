#!/usr/bin/env python3
"""One reader opening a directory's files in name order (DLIO's default loader), or in a
shuffled order (`--shuffle SEED`), each read whole through a buffered file object and checked
against a manifest of sha256s (`name<TAB>sha256` lines). Exits 1 on a mismatch; prints one JSON
line per epoch."""
import argparse
import hashlib
import json
import os
import random


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir")
    ap.add_argument("manifest")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--shuffle", type=int, help="read in a random order of this seed")
    a = ap.parse_args()
    want = dict(line.split("\t") for line in open(a.manifest).read().splitlines())
    names = sorted(os.listdir(a.dir))
    assert sorted(want) == names, "the directory holds other files than the manifest"
    for e in range(a.epochs):
        order = list(names)
        if a.shuffle is not None:
            random.Random(a.shuffle + e).shuffle(order)
        n = 0
        for name in order:
            with open(os.path.join(a.dir, name), "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() != want[name]:
                raise SystemExit(f"MISMATCH: {name}")
            n += len(data)
        print(json.dumps({"epoch": e, "files": len(order), "bytes": n}), flush=True)


if __name__ == "__main__":
    main()
