#!/usr/bin/env python3
"""Reads files through `mmap` the ways programs do, and prints what it saw as one JSON object
(digests, return codes), so a run through granary can be compared with a direct one.

    mapper.py scan PATH [--start OFF] [--epochs N] [--drop] [--marker F] [--pace S] [--step B]
    mapper.py syscalls PATH     pages never touched before handed to write(2), sendfile, pwrite
    mapper.py fork PATH         children forked with the mapping live read it all
    mapper.py threads PATH      threads fault on one mapping at once
    mapper.py memcalls PATH     mmap/mprotect/mremap/munmap through libc (ctypes)
    mapper.py segv PATH         reads, then dereferences NULL (dies of SIGSEGV)
"""
import ctypes
import hashlib
import json
import mmap
import os
import sys
import tempfile
import threading
import time

MIB = 1 << 20


def sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def open_map(path, flags=mmap.MAP_SHARED):
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
    return fd, m


def scan(path, args):
    start = int(args.get("--start", 0))
    epochs = int(args.get("--epochs", 1))
    step = int(args.get("--step", MIB))
    pace = float(args.get("--pace", 0))
    fd, m = open_map(path)
    if "--marker" in args:
        with open(args["--marker"] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(args["--marker"] + ".tmp", args["--marker"])
    view = memoryview(m)
    out = {"size": len(m), "epochs": []}
    for e in range(epochs):
        h = hashlib.sha256()
        for off in range(start, len(m), step):
            h.update(view[off:off + step])
            if pace:
                time.sleep(pace)
        out["epochs"].append(h.hexdigest())
        if "--drop" in args and e + 1 < epochs:
            # The next pass finds nothing in memory: its pages leave this process and the cache.
            m.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    view.release()
    m.close()
    os.close(fd)
    return out


def syscalls(path, args):
    fd, m = open_map(path)
    size = len(m)
    out = {}
    # Ranges nobody touched yet: across the middle, at the end, at the start.
    ranges = [(size // 2 - 3 * MIB // 2, 3 * MIB), (size - MIB - 123, MIB + 123), (0, 2 * MIB)]
    view = memoryview(m)
    with tempfile.TemporaryFile() as t:
        for a, n in ranges:
            r, w = os.pipe()
            got = bytearray()
            pos = a

            def drain():
                while True:
                    b = os.read(r, 1 << 16)
                    if not b:
                        return
                    got.extend(b)
            th = threading.Thread(target=drain)
            th.start()
            while pos < a + n:
                # write(2) given a pointer straight into the mapping: the kernel reads the pages.
                pos += os.write(w, view[pos:a + n])
            os.close(w)
            th.join()
            os.close(r)
            out[f"write {a}+{n}"] = sha(got)
            t.seek(0)
            t.truncate()
            done = 0
            while done < n:
                done += os.pwrite(t.fileno(), view[a + done:a + n], done)
            t.seek(0)
            out[f"pwrite {a}+{n}"] = sha(t.read())
    view.release()
    m.close()
    os.close(fd)
    return out


def fork(path, args):
    fd, m = open_map(path)
    first = sha(m[:MIB])
    kids = []
    for k in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            half = len(m) // 2
            part = m[k * half:(k + 1) * half] if k == 0 else m[half:]
            os.write(w, sha(part).encode())
            os._exit(0)
        os.close(w)
        kids.append((pid, r))
    out = {"first": first}
    for k, (pid, r) in enumerate(kids):
        got = b""
        while True:
            b = os.read(r, 256)
            if not b:
                break
            got += b
        os.close(r)
        _, status = os.waitpid(pid, 0)
        out[f"child {k}"] = [got.decode(), os.waitstatus_to_exitcode(status)]
    out["parent"] = sha(m[:])
    m.close()
    os.close(fd)
    return out


def threads(path, args):
    fd, m = open_map(path)
    view = memoryview(m)
    n = 4
    res = [None] * n

    def work(k):
        h = hashlib.sha256()
        for off in range(k * MIB, len(m), n * MIB):
            h.update(view[off:off + MIB])  # hashlib releases the GIL: faults race
        res[k] = h.hexdigest()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    view.release()
    m.close()
    os.close(fd)
    return {"threads": res}


def memcalls(path, args):
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: what C code calls
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    out = {}
    for name, flags in (("shared", mmap.MAP_SHARED), ("private", mmap.MAP_PRIVATE)):
        a = libc.mmap(None, size, mmap.PROT_READ, flags, fd, 0)
        if a in (None, ctypes.c_void_p(-1).value):
            out[name] = ["mmap failed", ctypes.get_errno()]
            continue
        res = {"whole": sha(ctypes.string_at(a, size))}
        res["mprotect"] = libc.mprotect(a, size, mmap.PROT_READ)
        # Grow it (it may move): the same bytes, and more room past the end.
        b = libc.mremap(a, size, size + 16 * 4096, 1)  # MREMAP_MAYMOVE
        if b in (None, ctypes.c_void_p(-1).value):
            res["mremap"] = ["failed", os.strerror(ctypes.get_errno())]
            libc.munmap(a, size)
        else:
            res["mremap"] = ["ok", sha(ctypes.string_at(b, size))]
            # A hole in the middle, then what is left on both sides.
            mid = (size // 2) // 4096 * 4096
            res["munmap"] = libc.munmap(b + mid, 2 * MIB)
            res["left"] = sha(ctypes.string_at(b, mid))
            res["right"] = sha(ctypes.string_at(b + mid + 2 * MIB, size - mid - 2 * MIB))
            # Shrink what is left of the head in place.
            c = libc.mremap(b, mid, mid // 2, 0)
            res["shrunk"] = sha(ctypes.string_at(c, mid // 2)) if c not in (
                None, ctypes.c_void_p(-1).value) else "failed"
            libc.munmap(c, mid // 2)
            libc.munmap(b + mid + 2 * MIB, size + 16 * 4096 - mid - 2 * MIB)
        out[name] = res
    os.close(fd)
    return out


def segv(path, args):
    fd, m = open_map(path)
    sys.stdout.write(json.dumps({"read": sha(m[:])}) + "\n")
    sys.stdout.flush()
    ctypes.string_at(0)  # a real NULL dereference
    return {"survived": True}


def main():
    mode, path = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    args = {}
    i = 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            args[rest[i]] = rest[i + 1]
            i += 2
        else:
            args[rest[i]] = True
            i += 1
    out = {"scan": scan, "syscalls": syscalls, "fork": fork, "threads": threads,
           "memcalls": memcalls, "segv": segv}[mode](path, args)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
