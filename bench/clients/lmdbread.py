#!/usr/bin/env python3
"""LMDB reader (the python `lmdb` binding), shaped like Caffe's and many PyTorch datasets':
the environment is opened read-only (`--lock`: with LMDB's reader lock file, else
`lock=False`) and mapped whole; every value read is checked against the manifest.

--access seq     a cursor scan in key order (Caffe's data layer)
--access random  `get`s of the keys in a shuffled order (a map-style Dataset with shuffle)
--procs N        N reader processes, each opening the environment itself; with
                 --split contiguous each reads its contiguous share of the keys (MPI-Caffe's
                 contiguous pattern of Stanovnik et al.), with --split none each reads everything
--epochs E       passes, in one open environment (later passes find what the first cached)

Output: the clients' JSON lines (see common.py); epoch times are the slowest process's.
"""

import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def share(keys, rank, procs, split):
    if split == "none" or procs == 1:
        return keys
    n = len(keys)
    return keys[rank * n // procs:(rank + 1) * n // procs]


def worker(args, rank, values, start_evt, q):
    import lmdb
    env = lmdb.open(args.root, readonly=True, lock=args.lock, subdir=True)
    keys = sorted(values)
    mine = share(keys, rank, args.procs, args.split)
    lo, hi = (mine[0], mine[-1]) if mine else ("", "")
    q.put(("ready", rank))
    start_evt.wait()
    for e in range(1, args.epochs + 1):
        t0 = time.time()
        n = nbytes = 0
        with env.begin(buffers=False) as txn:
            if args.access == "seq":
                cur = txn.cursor()
                ok = cur.set_range(lo.encode())
                while ok:
                    k = cur.key().decode()
                    if k > hi:
                        break
                    v = cur.value()
                    check(values, k, v)
                    n += 1
                    nbytes += len(v)
                    ok = cur.next()
            else:
                order = list(mine)
                random.Random(args.seed * 1000 + e * 10 + rank).shuffle(order)
                for k in order:
                    v = txn.get(k.encode())
                    check(values, k, v)
                    n += 1
                    nbytes += len(v)
        if n != len(mine):
            common.fail_mismatch(args.root, f"process {rank} read {n} values of {len(mine)}")
        q.put(("epoch", rank, e, t0, time.time(), n, nbytes))
        # Every process starts the next pass together (a training step's barrier).
        start_evt.wait()
    env.close()
    q.put(("done", rank))


def check(values, k, v):
    want = values.get(k)
    if v is None or want is None or len(v) != want[0] or hashlib.sha256(v).hexdigest() != want[1]:
        common.fail_mismatch(k, "value differs from the manifest")


def main():
    p = common.base_parser(__doc__)
    p.add_argument("--access", choices=["seq", "random"], default="seq")
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--split", choices=["contiguous", "none"], default="contiguous")
    p.add_argument("--lock", action="store_true", help="open with lock=True (the reader table)")
    args = p.parse_args()
    with open(args.manifest) as f:
        m = json.load(f)
    values = {k: (size, digest) for k, size, digest in m["values"]}
    rep = common.Reporter(args.tick)
    rep.start(client=f"lmdb-{args.access}", procs=args.procs, split=args.split, lock=args.lock,
              values=len(values))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    barrier = [ctx.Event() for _ in range(args.epochs + 1)]
    procs = [ctx.Process(target=worker_shim, args=(args, r, values, barrier, q))
             for r in range(args.procs)]
    for pr in procs:
        pr.start()
    for _ in procs:
        msg = q.get()
        if msg[0] != "ready":
            raise SystemExit(f"unexpected {msg}")
    for e in range(1, args.epochs + 1):
        begin = rep.epoch_begin(e)
        barrier[e - 1].set()
        got = [q.get() for _ in procs]
        for g in got:
            rep.consumed(g[6], g[5])
        rep.epoch_end(e, begin, slowest=max(g[4] for g in got) - begin[0])
    barrier[args.epochs].set()
    for _ in procs:
        q.get()
    for pr in procs:
        pr.join()
        if pr.exitcode != 0:
            sys.exit(pr.exitcode or 1)
    rep.done()


def worker_shim(args, rank, values, barrier, q):
    class Step:
        def __init__(self):
            self.k = 0

        def wait(self):
            barrier[self.k].wait()
            self.k += 1
    worker(args, rank, values, Step(), q)


if __name__ == "__main__":
    main()
