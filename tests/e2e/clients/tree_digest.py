#!/usr/bin/env python3
"""Reads a whole tree and prints one JSON object: every entry's relative path with its type
and, for regular files, the SHA-256 of all its bytes (symlinks: their target). Files are read
by worker processes when asked, started the way DataLoader workers are (`fork`, or `spawn` and
`forkserver`, which start a fresh interpreter with every inherited fd but the ones it passes
closed).

Two runs print the same JSON exactly when they saw the same tree and the same bytes.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os


def digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--start", choices=["fork", "spawn", "forkserver"], default="fork")
    args = ap.parse_args()
    out, files = {}, []
    for d, dirs, names in os.walk(args.root):
        dirs.sort()
        for n in sorted(dirs + names):
            p = os.path.join(d, n)
            rel = os.path.relpath(p, args.root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                files.append(p)
    if args.workers:
        with mp.get_context(args.start).Pool(args.workers) as pool:
            sums = pool.map(digest, files, chunksize=4)
    else:
        sums = [digest(p) for p in files]
    for p, s in zip(files, sums):
        out[os.path.relpath(p, args.root)] = s
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
