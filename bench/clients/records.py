#!/usr/bin/env python3
"""Large record-file reader, shaped like tf.data (pread) or DALI/LMDB (mmap).

Shards hold TFRecord-like framed records:
    uint64 length (LE) | uint32 crc32(length) | payload | uint32 crc32(payload)
(zlib CRC-32, not TFRecord's masked CRC-32C: the stdlib has no CRC-32C.)

Every epoch the shard order is reshuffled and `--workers` reader threads each
take the next shard (tf.data's parallel interleave with cycle_length=workers),
so several files are read interleaved. Readers hand records to a bounded buffer
(tf.data's prefetch); the main thread runs the model step per record.

--io pread  reads each shard front to back in `--chunk` (256 KiB) pread calls.
--io mmap   maps each shard and walks the records in the mapping; the page
            faults are the I/O (DALI's and LMDB's default).

Each record's CRC and each shard's sha256 are checked against the manifest.
"""

import mmap
import os
import queue
import random
import struct
import sys
import threading
import time
import hashlib
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HEADER = struct.Struct("<QI")
DONE = object()


def parse_records(rel, view, pos, end):
    """Yields (start, stop) of each complete record in view[pos:end], checking
    both CRCs; stops at the first incomplete record (the caller keeps the tail)."""
    while end - pos >= HEADER.size:
        length, lcrc = HEADER.unpack_from(view, pos)
        if zlib.crc32(view[pos:pos + 8]) != lcrc:
            common.fail_mismatch(rel, f"bad length crc at offset {pos}")
        stop = pos + HEADER.size + length + 4
        if stop > end:
            return
        payload = view[pos + HEADER.size:stop - 4]
        (pcrc,) = struct.unpack_from("<I", view, stop - 4)
        if zlib.crc32(payload) != pcrc:
            common.fail_mismatch(rel, f"bad record crc at offset {pos}")
        yield pos, stop
        pos = stop


def read_pread(args, rel, size, digest, out):
    """Front-to-back pread in fixed chunks; with a cache dir, copy-on-first-read."""
    src = os.path.join(args.root, rel)
    cpath = os.path.join(args.cache_dir, rel) if args.cache_dir else None
    tmp = None
    if cpath and os.path.exists(cpath):
        src, cpath = cpath, None
    fd = os.open(src, os.O_RDONLY)
    if cpath:
        os.makedirs(os.path.dirname(cpath), exist_ok=True)
        tmp = open(f"{cpath}.tmp{threading.get_ident()}", "wb")
    h = hashlib.sha256()
    buf = bytearray()
    off = 0
    try:
        while True:
            data = os.pread(fd, args.chunk, off)
            if not data:
                break
            off += len(data)
            h.update(data)
            if tmp:
                tmp.write(data)
            buf += data
            consumed = 0
            view = memoryview(buf)
            for start, stop in parse_records(rel, view, 0, len(buf)):
                out.put((stop - start, 1))
                consumed = stop
            view.release()
            del buf[:consumed]
    finally:
        os.close(fd)
    if buf:
        common.fail_mismatch(rel, f"{len(buf)} trailing bytes after the last record")
    common.check(rel, size, digest, off, h.hexdigest())
    if tmp:
        tmp.close()
        os.rename(tmp.name, cpath)


def read_mmap(args, rel, size, digest, out):
    """Map the shard and walk it; every touched page is a fault on the source. Reports how long
    after the mmap the first record was in hand (`first_record`)."""
    fd = os.open(os.path.join(args.root, rel), os.O_RDONLY)
    try:
        t_map = time.monotonic()
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    h = hashlib.sha256()
    view = memoryview(mm)
    end = 0
    try:
        for start, stop in parse_records(rel, view, 0, len(view)):
            h.update(view[start:stop])
            if end == 0:
                args.rep.emit(ev="first_record", epoch=args.rep.epoch, path=rel,
                              after_mmap_s=time.monotonic() - t_map)
            out.put((stop - start, 1))
            end = stop
    finally:
        view.release()
        total = len(mm)
        mm.close()
    if end != total:
        common.fail_mismatch(rel, f"{total - end} trailing bytes after the last record")
    common.check(rel, size, digest, total, h.hexdigest())


def reader(args, todo, out, read_file, rep):
    try:
        while True:
            try:
                rel, size, digest = todo.get_nowait()
            except queue.Empty:
                return
            read_file(args, rel, size, digest, out)
            rep.verified(size)
    except OSError as e:
        out.put(e)
    finally:
        out.put(DONE)


def run_epoch(args, files, rep):
    todo = queue.Queue()
    for f in files:
        todo.put(f)
    out = queue.Queue(maxsize=args.buffer)
    read_file = read_pread if args.io == "pread" else read_mmap
    threads = [threading.Thread(target=reader, args=(args, todo, out, read_file, rep), daemon=True)
               for _ in range(max(1, args.workers))]
    for t in threads:
        t.start()
    running = len(threads)
    while running:
        item = out.get()
        if item is DONE:
            running -= 1
            continue
        if isinstance(item, Exception):
            raise item
        nbytes, nrec = item
        rep.consumed(nbytes, nrec)
        common.compute_step(args.compute, nrec)
    for t in threads:
        t.join()


def main():
    p = common.base_parser(__doc__)
    p.add_argument("--io", choices=["pread", "mmap"], default="pread")
    p.add_argument("--chunk", type=int, default=256 << 10, help="pread size in bytes (256 KiB)")
    p.add_argument("--buffer", type=int, default=64, help="records buffered ahead of the model")
    p.add_argument("--subset", default=None, help="only manifest paths under this prefix")
    args = p.parse_args()
    if args.io == "mmap" and args.cache_dir:
        p.error("mmap readers (DALI, LMDB) have no framework cache: no --cache-dir with --io mmap")
    files = common.load_manifest(args.manifest, args.subset)
    rep = common.Reporter(args.tick)
    args.rep = rep
    rep.start(client=f"records-{args.io}", files=len(files), workers=args.workers,
              chunk=args.chunk, compute_ms=args.compute)
    for e in range(1, args.epochs + 1):
        order = list(files)
        random.Random(args.seed + e).shuffle(order)
        begin = rep.epoch_begin(e)
        run_epoch(args, order, rep)
        rep.epoch_end(e, begin)
    rep.done()


if __name__ == "__main__":
    main()
