#!/usr/bin/env python3
"""Reads a dataset the way one rank of a data-parallel job does: lists the tree, then reads every
file under it whole, in a shuffled order, with a few threads. `--step S --barrier DIR --group N
--member K`: the ranks of a group that read the same files (a model-parallel group: the same
--seed) in the same order, step by step: after every S files a rank waits (bounded) until all N
of the group have read theirs.

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
import time

# A group's barrier waits at most this long for the slowest member.
BARRIER_WAIT = 600


def barrier(directory: str, step: int, group: int, member: int) -> bool:
    """Marks step `step` done by `member` and waits until the whole group has; False if the
    wait expired."""
    open(os.path.join(directory, f"{step}.{member}"), "w").close()
    deadline = time.monotonic() + BARRIER_WAIT
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(directory, f"{step}.{m}")) for m in range(group)):
            return True
        time.sleep(0.005)
    return False


def read_tree(root: str, seed: int = 0, threads: int = 4, every: int = 0, step: int = 0,
              group=None):
    """The tree's listing ([rel, kind], sorted) and every file's sha256 by relative path, and
    the errors met. `step` and `group` (barrier directory, size, member): read in steps of
    `step` files, the group waiting for each other after each."""
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
    files.sort()
    random.Random(seed).shuffle(files)
    sums, errors, lock = {}, [], threading.Lock()
    steps = [files[i:i + step] for i in range(0, len(files), step)] if step else [files]
    for number, batch in enumerate(steps):
        read_files(root, batch, threads, every, sums, errors, lock)
        if group and not barrier(group[0], number, group[1], group[2]):
            errors.append(f"step {number}: the group did not arrive within {BARRIER_WAIT} s")
    return listing, sums, errors


def read_files(root, files, threads, every, sums, errors, lock):
    todo: "queue.Queue[str]" = queue.Queue()
    for f in files:
        todo.put(f)

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--barrier", help="the group's barrier directory (with --step)")
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--member", type=int, default=0)
    args = ap.parse_args()
    group = (args.barrier, args.group, args.member) if args.barrier else None
    listing, sums, errors = read_tree(args.root, args.seed, args.threads, args.every,
                                      args.step, group)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"listing": listing, "sha256": sums}), flush=True)


if __name__ == "__main__":
    main()
