#!/usr/bin/env python3
"""FanStore's read micro-benchmark (Zhang et al., section 6.2), on one node.

The dataset has one directory per file size (128K, 512K, 2M, 8M). For each size
in turn, `--workers` threads read every file of the directory whole, in a
shuffled order, and check it against the manifest. Each epoch reports, per
size, the time, the bandwidth (MB/s) and the throughput (files/s).
"""

import os
import queue
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def read_all(args, files, rep):
    todo = queue.Queue()
    for f in files:
        todo.put(f)
    errors = []

    def worker():
        try:
            while True:
                try:
                    rel, size, digest = todo.get_nowait()
                except queue.Empty:
                    return
                data = common.read_whole_cached(args.root, rel, args.cache_dir)
                common.check(rel, size, digest, len(data), common.sha256_hex(data))
                rep.verified(size)
                with rep.lock:
                    rep.bytes += size
                    rep.samples += 1
                common.compute_step(args.compute, 1)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, args.workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main():
    p = common.base_parser(__doc__)
    p.set_defaults(compute=0.0)
    args = p.parse_args()
    files = common.load_manifest(args.manifest)
    by_size = {}
    for f in files:
        by_size.setdefault(f[0].split("/")[0], []).append(f)
    # Smallest files first, as in the paper's figure.
    sizes = sorted(by_size, key=lambda d: by_size[d][0][1])
    rep = common.Reporter(args.tick)
    rep.start(client="fanstore", files=len(files), workers=args.workers, sizes=sizes)
    for e in range(1, args.epochs + 1):
        begin = rep.epoch_begin(e)
        per_size = {}
        for i, d in enumerate(sizes):
            group = list(by_size[d])
            random.Random(args.seed + e * 100 + i).shuffle(group)
            t0 = time.time()
            read_all(args, group, rep)
            secs = time.time() - t0
            nbytes = sum(f[1] for f in group)
            per_size[d] = {"seconds": secs, "files": len(group), "bytes": nbytes,
                           "MBps": nbytes / 1e6 / secs, "files_per_s": len(group) / secs}
        rep.epoch_end(e, begin, per_size=per_size)
    rep.done()


if __name__ == "__main__":
    main()
