#!/usr/bin/env python3
"""Small-file loader, shaped like PyTorch's DataLoader over an ImageFolder.

Every epoch the sample order is reshuffled; the main process hands batches of
indices to worker processes forked for that epoch (DataLoader's default,
persistent_workers=False), keeps at most `prefetch` batches per worker in
flight, and takes results back in order. Workers open, read and close each file
and check it against the manifest; the main process runs the model step.

`--reader whole` reads each file to EOF in one call (an image loader);
`--reader npz` reads it as `numpy.load` reads an .npz sample (npzload.py).
"""

import multiprocessing as mp
import os
import queue
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npzload  # noqa: E402


def read_npz(path, size):
    data, covered = npzload.load(path, size)
    if not covered:
        common.fail_mismatch(path, "the npz reads did not cover the whole file")
    return data


READERS = {"whole": lambda path, size: common.read_whole(path), "npz": read_npz}


def load_batch(root, cache_dir, batch, reader="whole"):
    """Worker side: read and verify every file of one batch."""
    nbytes = 0
    for rel, size, digest in batch:
        data = common.read_cached(root, rel, cache_dir, lambda p: READERS[reader](p, size))
        common.check(rel, size, digest, len(data), common.sha256_hex(data))
        nbytes += len(data)
    return nbytes


def worker_loop(root, cache_dir, index_q, result_q, reader):
    while True:
        item = index_q.get()
        if item is None:
            return
        bid, batch = item
        try:
            result_q.put((bid, load_batch(root, cache_dir, batch, reader), len(batch)))
        except OSError as e:
            result_q.put((bid, e, 0))


def consume(args, rep, nbytes, nsamples):
    """Main side: the batch reaches the model."""
    rep.consumed(nbytes, nsamples)
    rep.verified_files += nsamples
    rep.verified_bytes += nbytes
    common.compute_step(args.compute, nsamples)


def run_epoch(args, files, order, rep):
    batches = [[files[i] for i in order[k:k + args.batch]]
               for k in range(0, len(order), args.batch)]
    if args.workers == 0:
        for b in batches:
            n = load_batch(args.root, args.cache_dir, b, args.reader)
            consume(args, rep, n, len(b))
        return
    ctx = mp.get_context("fork")
    result_q = ctx.Queue()
    index_qs = [ctx.Queue() for _ in range(args.workers)]
    procs = [ctx.Process(target=worker_loop, args=(args.root, args.cache_dir, q, result_q, args.reader),
                         daemon=True) for q in index_qs]
    for p in procs:
        p.start()
    sent = 0
    ready = {}
    limit = args.prefetch * args.workers

    def send():
        nonlocal sent
        index_qs[sent % args.workers].put((sent, batches[sent]))
        sent += 1

    while sent < min(limit, len(batches)):
        send()
    for want in range(len(batches)):
        # Results come back in any order; hand them to the model in order.
        while want not in ready:
            try:
                bid, n, cnt = result_q.get(timeout=0.5)
            except queue.Empty:
                # A worker that found a mismatch exits non-zero: so do we.
                for p in procs:
                    if p.exitcode not in (None, 0):
                        sys.exit(p.exitcode)
                continue
            if isinstance(n, Exception):
                raise n
            ready[bid] = (n, cnt)
        n, cnt = ready.pop(want)
        if sent < len(batches):
            send()
        consume(args, rep, n, cnt)
    for q in index_qs:
        q.put(None)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(p.exitcode)


def main():
    p = common.base_parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prefetch", type=int, default=2, help="batches in flight per worker")
    p.add_argument("--subset", default=None, help="only manifest paths under this prefix")
    p.add_argument("--reader", choices=sorted(READERS), default="whole",
                   help="whole: read each file to EOF at once; npz: as numpy.load reads an .npz")
    args = p.parse_args()
    files = common.load_manifest(args.manifest, args.subset)
    rep = common.Reporter(args.tick)
    rep.start(client="smallfiles", reader=args.reader, files=len(files), workers=args.workers,
              batch=args.batch,
              compute_ms=args.compute)
    for e in range(1, args.epochs + 1):
        order = list(range(len(files)))
        random.Random(args.seed + e).shuffle(order)
        begin = rep.epoch_begin(e)
        run_epoch(args, files, order, rep)
        rep.epoch_end(e, begin)
    rep.done()


if __name__ == "__main__":
    main()
