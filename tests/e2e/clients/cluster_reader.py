#!/usr/bin/env python3
"""Reads a dataset the way one rank of a data-parallel job does: lists the tree, then reads every
file under it whole, in a shuffled order, with a few threads.

Prints {"progress": n} after every --every files (flushed: a test waits for these to act
mid-epoch), then {"listing": [[rel, kind], ...], "sha256": {rel: hex}} with every file's digest.
"""
import argparse
import hashlib
import json
import os
import queue
import random
import sys
import threading


def read_tree(root: str, seed: int = 0, threads: int = 4, every: int = 0):
    """The tree's listing ([rel, kind], sorted) and every file's sha256 by relative path, and
    the errors met."""
    listing, files = [], []
    for d, dirs, names in os.walk(root):
        for n in dirs:
            listing.append([os.path.relpath(os.path.join(d, n), root), "dir"])
        for n in names:
            p = os.path.join(d, n)
            kind = "link" if os.path.islink(p) else "file"
            listing.append([os.path.relpath(p, root), kind])
            if kind == "file":
                files.append(p)
    listing.sort()
    random.Random(seed).shuffle(files)

    todo: "queue.Queue[str]" = queue.Queue()
    for f in files:
        todo.put(f)
    sums, errors, lock = {}, [], threading.Lock()

    def worker() -> None:
        while True:
            try:
                p = todo.get_nowait()
            except queue.Empty:
                return
            try:
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
            except OSError as e:
                errors.append(f"{p}: {e}")
                continue
            with lock:
                sums[os.path.relpath(p, root)] = h
                if every and len(sums) % every == 0:
                    print(json.dumps({"progress": len(sums)}), flush=True)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return listing, sums, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--every", type=int, default=0)
    args = ap.parse_args()
    listing, sums, errors = read_tree(args.root, args.seed, args.threads, args.every)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"listing": listing, "sha256": sums}), flush=True)


if __name__ == "__main__":
    main()
