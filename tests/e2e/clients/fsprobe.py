#!/usr/bin/env python3
"""Scenarios a careless or hostile program plays on a dataset, each printing what it observed as
one JSON document. Run once through `granary run` and once directly (on the same tree, or on a
twin made with `cp -a` when the scenario changes the tree): the documents must be identical.

Observations never contain absolute paths, and describe a file the way a comparison between two
twin trees allows: inode numbers become labels in order of appearance ("i0", "i1", ...), an mtime
or ctime set during the run becomes "new", earlier ones stay exact (mtime) or "old" (ctime).

    fsprobe.py SCENARIO ROOT [ARGS...]
"""
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time

# The program's own global symbol scope, as a C program's calls see it. (A handle to libc itself,
# `ctypes.CDLL("libc.so.6")`, would bypass LD_PRELOAD: a documented blind spot.)
LIBC = ctypes.CDLL(None, use_errno=True)


def err(e: OSError) -> dict:
    return {"errno": errno.errorcode.get(e.errno, str(e.errno))}


def content(data: bytes):
    if len(data) <= 64:
        return data.hex()
    return {"len": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class Probe:
    def __init__(self, root: str):
        self.root = root
        self.out = {}
        self.labels = {}
        self.next_label = 0
        # Coarse file system clocks lag the precise one by up to a tick: anything this run
        # changes is stamped well after `start`.
        self.start = time.time_ns()
        time.sleep(0.05)

    def p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def label(self, dev: int, ino: int) -> str:
        if (dev, ino) not in self.labels:
            self.labels[(dev, ino)] = f"i{self.next_label}"
            self.next_label += 1
        return self.labels[(dev, ino)]

    def forget(self, rel: str):
        """`rel` is about to be removed: its inode number may come back for a new file."""
        s = os.lstat(self.p(rel))
        self.labels.pop((s.st_dev, s.st_ino), None)

    def st(self, s: os.stat_result) -> dict:
        return {
            "type": stat.S_IFMT(s.st_mode), "mode": oct(stat.S_IMODE(s.st_mode)),
            "nlink": s.st_nlink, "uid": s.st_uid, "gid": s.st_gid,
            "size": s.st_size if not stat.S_ISDIR(s.st_mode) else "dir",
            "ino": self.label(s.st_dev, s.st_ino),
            "mtime": s.st_mtime_ns if s.st_mtime_ns < self.start else "new",
            "ctime": "old" if s.st_ctime_ns < self.start else "new",
        }

    def record(self, key: str, fn):
        try:
            self.out[key] = fn()
        except OSError as e:
            self.out[key] = err(e)

    def observe(self, key: str, rel: str):
        """Everything a program may ask about `rel`."""
        path = self.p(rel)
        seen = {}

        def get(name, fn):
            try:
                seen[name] = fn()
            except OSError as e:
                seen[name] = err(e)

        get("stat", lambda: self.st(os.stat(path)))
        get("lstat", lambda: self.st(os.lstat(path)))
        get("access_r", lambda: os.access(path, os.R_OK))
        get("exists", lambda: os.path.exists(path))
        if os.path.islink(path):
            get("readlink", lambda: os.readlink(path))
        if os.path.isdir(path):
            get("listdir", lambda: sorted(os.listdir(path)))
            get("scandir", lambda: sorted((e.name, e.is_dir(), e.is_file(), e.is_symlink())
                                          for e in os.scandir(path)))
        else:
            def read():
                with open(path, "rb") as f:
                    data = f.read()
                    return {"data": content(data), "fstat": self.st(os.fstat(f.fileno()))}
            get("read", read)
        parent = os.path.dirname(path)
        get("parent_listdir", lambda: sorted(os.listdir(parent)))
        self.out[key] = seen

    def dump(self):
        json.dump(self.out, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---- scenarios ----

def readall(root):
    """Reads every regular file under ROOT (the job that gets a tree placed)."""
    n = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                read_file(path)
                n += 1
    print(json.dumps({"files": n}))


def raw_stat(s: os.stat_result) -> dict:
    return {k: getattr(s, k) for k in ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid",
                                      "st_gid", "st_size", "st_mtime_ns", "st_ctime_ns")}


def identity(root, *rels):
    """Bytes and every stat field of unchanged-during-the-run files (compared on one tree)."""
    out = {}
    for rel in rels:
        path = os.path.join(root, rel)
        with open(path, "rb") as f:
            data = f.read()
            fst = raw_stat(os.fstat(f.fileno()))
        out[rel] = {"data": content(data), "stat": raw_stat(os.stat(path)), "fstat": fst}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


def own_changes(root):
    """Issue case 2: the program changes dataset paths and reads back what it changed."""
    pr = Probe(root)
    # Everything is read once first: from the cached copies, if any.
    for rel in ("f/trunc.bin", "f/target.bin", "f/replacement.bin", "f/gone.bin", "f/linked.bin",
                "f/timed.bin", "f/utimes.bin", "f/moded.bin", "f/rewritten.bin", "d/full/x.bin"):
        pr.observe("before " + rel, rel)
    pr.observe("before d", "d")
    pr.observe("before f", "f")

    os.truncate(pr.p("f/trunc.bin"), 5)
    pr.observe("truncate", "f/trunc.bin")

    pr.forget("f/target.bin")
    os.rename(pr.p("f/replacement.bin"), pr.p("f/target.bin"))
    pr.observe("rename over: target", "f/target.bin")
    pr.observe("rename over: old name", "f/replacement.bin")

    pr.forget("f/gone.bin")
    os.unlink(pr.p("f/gone.bin"))
    pr.observe("unlink", "f/gone.bin")

    pr.forget("d/empty")
    os.rmdir(pr.p("d/empty"))
    pr.observe("rmdir", "d/empty")
    pr.observe("rmdir: parent", "d")

    os.mkdir(pr.p("d/made"))
    pr.observe("mkdir", "d/made")
    pr.observe("mkdir: parent", "d")

    os.link(pr.p("f/linked.bin"), pr.p("f/hard.bin"))
    pr.observe("link: old", "f/linked.bin")
    pr.observe("link: new", "f/hard.bin")

    os.symlink("linked.bin", pr.p("f/sym"))
    pr.observe("symlink", "f/sym")

    os.utime(pr.p("f/timed.bin"), ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    pr.observe("utimensat", "f/timed.bin")
    # utimes(2) through libc, as C programs call it.
    tv = (ctypes.c_long * 4)(1_100_000_000, 250_000, 1_100_000_000, 250_000)
    pr.record("utimes rc", lambda: LIBC.utimes(pr.p("f/utimes.bin").encode(), tv))
    pr.observe("utimes", "f/utimes.bin")

    os.chmod(pr.p("f/moded.bin"), 0o600)
    pr.observe("chmod", "f/moded.bin")

    with open(pr.p("f/rewritten.bin"), "r+b") as f:
        f.write(b"NEW!")
    pr.observe("write in place", "f/rewritten.bin")

    os.rename(pr.p("d/full"), pr.p("d/moved"))
    pr.observe("rename dir: old child", "d/full/x.bin")
    pr.observe("rename dir: new child", "d/moved/x.bin")
    pr.observe("rename dir: parent", "d")
    pr.observe("after f", "f")

    # The same through coreutils (their own calls: ftruncate, renameat2, unlinkat, fchmodat,
    # linkat, utimensat; cp over an existing file), and through other paths into the source.
    def run(*cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        return [p.returncode, p.stderr.replace(root, "ROOT")]
    for rel in ("g/trunc.bin", "g/from.bin", "g/rm.bin", "g/chmod.bin", "g/touch.bin",
                "g/ln.bin", "g/over.bin", "g/dotdot.bin", "g/via-link.bin"):
        pr.observe("before " + rel, rel)
    pr.out["truncate(1)"] = run("truncate", "-s", "3", pr.p("g/trunc.bin"))
    pr.observe("truncate(1): file", "g/trunc.bin")
    pr.forget("g/to.bin")
    pr.out["mv(1)"] = run("mv", pr.p("g/from.bin"), pr.p("g/to.bin"))
    pr.observe("mv(1): old", "g/from.bin")
    pr.observe("mv(1): new", "g/to.bin")
    pr.forget("g/rm.bin")
    pr.out["rm(1)"] = run("rm", pr.p("g/rm.bin"))
    pr.observe("rm(1)", "g/rm.bin")
    pr.out["chmod(1)"] = run("chmod", "600", pr.p("g/chmod.bin"))
    pr.observe("chmod(1)", "g/chmod.bin")
    pr.out["touch(1)"] = run("touch", "-d", "@1200000000.5", pr.p("g/touch.bin"))
    pr.observe("touch(1)", "g/touch.bin")
    pr.out["ln(1)"] = run("ln", pr.p("g/ln.bin"), pr.p("g/ln2.bin"))
    pr.observe("ln(1)", "g/ln2.bin")
    pr.out["cp(1) over"] = run("cp", pr.p("g/to.bin"), pr.p("g/over.bin"))
    pr.observe("cp(1) over", "g/over.bin")
    os.truncate(pr.p("g/../g/./dotdot.bin"), 2)
    pr.observe("truncate through ..", "g/dotdot.bin")
    link = os.path.join(os.path.dirname(root), "outside-link")
    os.symlink(os.path.join(root, "g"), link)
    os.truncate(os.path.join(link, "via-link.bin"), 1)
    os.unlink(link)
    pr.observe("truncate through a link from outside", "g/via-link.bin")
    pr.observe("g after", "g")

    # Another process of the job sees the same.
    child = subprocess.run([sys.executable, __file__, "observe", root, "f/trunc.bin",
                            "f/target.bin", "f/gone.bin", "d/made", "f/hard.bin", "f/timed.bin",
                            "f/moded.bin", "d/moved/x.bin", "d", "f"],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "FSPROBE_START": str(pr.start)})
    pr.out["child"] = json.loads(child.stdout)
    pr.dump()


def open_fds_see_changes(root, tmp, *rels):
    """fds opened on a copy before the program changed the file (in place, through another fd)
    read the changed file by every call that reads: read, pread, readv, mmap, and the calls in
    which the kernel reads the fd (sendfile, copy_file_range, splice). One file per fd that
    stays unshared, one whose fd is dup'd."""
    import mmap
    pr = Probe(root)
    for rel, share in zip(rels, (False, True)):
        path = pr.p(rel)
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 10)
        other = os.dup(fd) if share else None
        with open(path, "r+b") as f:
            f.write(b"NEW CONTENT, LONGER THAN THE READS BELOW")
        res = {}
        r, w = os.pipe()
        n = os.sendfile(w, fd, None, 8)
        res["sendfile at the offset"] = [n, os.read(r, n).hex()]
        n = os.sendfile(w, fd, 2, 6)
        res["sendfile at 2"] = [n, os.read(r, n).hex()]
        n = os.splice(fd, w, 8)
        res["splice at the offset"] = [n, os.read(r, n).hex()]
        outp = os.path.join(tmp, "cfr.out")
        out = os.open(outp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        n = os.copy_file_range(fd, out, 8)
        os.close(out)
        res["copy_file_range at the offset"] = [n, read_file(outp).hex()]
        res["pread"] = os.pread(fd, 8, 1).hex()
        buf = bytearray(5)
        res["readv"] = [os.readv(fd, [buf]), bytes(buf).hex()]
        res["offset"] = os.lseek(fd, 0, os.SEEK_CUR)
        if other is not None:
            res["dup's offset"] = os.lseek(other, 0, os.SEEK_CUR)
        res["read"] = content(os.read(fd, 1 << 20))
        res["fstat"] = pr.st(os.fstat(fd))
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            res["mmap"] = content(m[:])
        pr.out[rel] = res
    pr.dump()


def observe(root, *rels):
    pr = Probe(root)
    pr.start = int(os.environ.get("FSPROBE_START", pr.start))
    for rel in rels:
        pr.observe(rel, rel)
    pr.dump()


# -- shared offsets (issue case 3): the file's 8-byte words hold their own offsets --

def decode(chunk: bytes):
    """(offset, length) of a chunk of a position-encoded file, or an error if it is not one
    contiguous piece of it."""
    if len(chunk) % 8 or not chunk:
        return ["odd chunk", len(chunk)]
    first = struct.unpack_from(">Q", chunk)[0]
    n = len(chunk) // 8
    words = struct.unpack(f">{n}Q", chunk)
    if words != tuple(range(first, first + 8 * n, 8)):
        return ["not contiguous", first, len(chunk)]
    return [first, len(chunk)]


def tiling(chunks, size):
    """How the readers' chunks cover the file: exactly once each byte, or what went wrong."""
    bad = [c for c in chunks if isinstance(c[0], str)]
    if bad:
        return {"bad chunks": bad[:5]}
    pos, dup, gaps = 0, [], []
    for off, n in sorted(chunks):
        if off < pos:
            dup.append([off, n])
        elif off > pos:
            gaps.append([pos, off])
        pos = max(pos, off + n)
    return {"total": sum(n for _, n in chunks), "size": size, "duplicated": dup[:5],
            "gaps": gaps[:5], "end": pos}


def copy_complete(tier: str, size: int) -> bool:
    for dirpath, _, names in os.walk(tier):
        if os.path.basename(dirpath) != "objects":
            continue
        for name in names:
            if len(name) == 16 and os.path.getsize(os.path.join(dirpath, name)) == size:
                return True
    return False


def wait_copied(tier: str, size: int, timeout=60.0) -> bool:
    """Polls the tier until a complete copy of a SIZE-byte file is there (directly: the caller
    passes a tier nobody writes to, and gets False after the bound)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if copy_complete(tier, size):
            return True
        time.sleep(0.02)
    return False


CHUNK = 64 << 10


def offsets(root, rel, tier, how):
    """Readers sharing one open file description, across the moment the agent's copy of the
    file completes: fd + dup(fd), parent + forked child, two threads."""
    path = os.path.join(root, rel)
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    chunks = []
    first = os.read(fd, CHUNK)
    chunks.append(decode(first))
    out = {"how": how}
    if how == "dup":
        other = os.dup(fd)
        out["copied midway"] = wait_copied(tier, size, 20)
        fds, eof = [fd, other], [False, False]
        i = 0
        while not all(eof):
            b = os.read(fds[i % 2], CHUNK)
            if b:
                chunks.append(decode(b))
            else:
                eof[i % 2] = True
            i += 1
    elif how == "fork":
        out["copied midway"] = wait_copied(tier, size, 20)
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:
            mine = []
            while True:
                if os.read(to_child, 1) != b"r":
                    break
                b = os.read(fd, CHUNK)
                if b:
                    mine.append(decode(b))
                os.write(from_child, b"1" if b else b"0")
            data = json.dumps(mine).encode()
            os.write(from_child, struct.pack(">Q", len(data)))
            while data:
                data = data[os.write(from_child, data):]
            os._exit(0)
        eof_parent = eof_child = False
        while not (eof_parent and eof_child):
            b = os.read(fd, CHUNK)
            if b:
                chunks.append(decode(b))
            eof_parent = not b
            os.write(from_parent, b"r")
            eof_child = os.read(to_parent, 1) == b"0"
        os.write(from_parent, b"q")
        n = struct.unpack(">Q", read_exact(to_parent, 8))[0]
        chunks += [tuple(c) for c in json.loads(read_exact(to_parent, n))]
        os.waitpid(pid, 0)
    elif how == "processes":
        # Parent and child read at once, each until EOF, while the copy completes.
        r, w = os.pipe()
        pid = os.fork()
        mine = []
        while True:
            b = os.read(fd, 4096)
            if not b:
                break
            mine.append(decode(b))
        if pid == 0:
            data = json.dumps(mine).encode()
            os.write(w, struct.pack(">Q", len(data)))
            while data:
                data = data[os.write(w, data):]
            os._exit(0)
        n = struct.unpack(">Q", read_exact(r, 8))[0]
        chunks += mine + [tuple(c) for c in json.loads(read_exact(r, n))]
        os.waitpid(pid, 0)
        out["copied by the end"] = wait_copied(tier, size, 20)
    elif how in ("threads", "threads on dups"):
        lock = threading.Lock()

        def reader(f):
            while True:
                b = os.read(f, 4096)
                if not b:
                    return
                with lock:
                    chunks.append(decode(b))
        fds = [fd, fd if how == "threads" else os.dup(fd)]
        threads = [threading.Thread(target=reader, args=(f,)) for f in fds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["copied by the end"] = wait_copied(tier, size, 20)
    chunks = [tuple(c) if not isinstance(c[0], str) else c for c in chunks]
    out["tiling"] = tiling(chunks, size)
    print(json.dumps(out, sort_keys=True))


def read_exact(fd, n):
    data = b""
    while len(data) < n:
        b = os.read(fd, n - len(data))
        if not b:
            break
        data += b
    return data


# -- bad pointers (issue case 5) --

class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vector_calls(fd):
    """readv/preadv with an unreadable iovec array and with an unwritable buffer: errno each."""
    out = {}
    good = ctypes.create_string_buffer(4096)
    bad_base = (Iovec * 2)(Iovec(ctypes.cast(good, ctypes.c_void_p), 16), Iovec(8, 4096))
    for name, call in (
        ("readv bad array", lambda: LIBC.readv(fd, ctypes.c_void_p(8), 1)),
        ("preadv bad array", lambda: LIBC.preadv(fd, ctypes.c_void_p(8), 1, ctypes.c_long(0))),
        ("readv bad buffer", lambda: LIBC.readv(fd, bad_base, 2)),
        ("preadv bad buffer", lambda: LIBC.preadv(fd, bad_base, 2, ctypes.c_long(16))),
        ("preadv2 bad array", lambda: LIBC.preadv2(fd, ctypes.c_void_p(8), 1, ctypes.c_long(0), 0)),
    ):
        ctypes.set_errno(0)
        r = call()
        out[name] = [r, errno.errorcode.get(ctypes.get_errno(), "0") if r < 0 else "ok"]
    out["offset after"] = os.lseek(fd, 0, os.SEEK_CUR)
    return out


def bad_iovec(root, placed_rel, fetched_rel):
    """Issue case 5, on a copy's fd, on a source fd of a file being fetched, and on a dup."""
    out = {}
    fd = os.open(os.path.join(root, placed_rel), os.O_RDONLY)
    out["copy"] = vector_calls(fd)
    dup = os.dup(fd)
    out["dup of copy"] = vector_calls(dup)
    src = os.open(os.path.join(root, fetched_rel), os.O_RDONLY)
    os.read(src, 4096)
    out["being fetched"] = vector_calls(src)
    out["being fetched: data after"] = content(os.read(src, 1 << 20))
    print(json.dumps(out, sort_keys=True))


# -- readers and writers in one job (issue case 6) --

def sqlite_commit(path, base, mode):
    """One writer's transaction: 5000 rows from id BASE, or (BASE < 0) a delete."""
    rw = sqlite3.connect(path)
    if int(base) < 0:
        rw.execute("delete from t where id % 3 = 0")
    else:
        rw.executemany("insert into t values (?, ?)", ((int(base) + k, k) for k in range(5_000)))
    rw.commit()
    done = ""
    if mode == "wal":
        # What auto-checkpointing does every 1000 pages: the database file itself changes.
        done = json.dumps(rw.execute("pragma wal_checkpoint(truncate)").fetchone())
    rw.close()
    return done


def sqlite_write(path, base, mode):
    print(sqlite_commit(path, base, mode))


def sqlite_rw(root, rel, mode, writer):
    """A read-only connection counts rows while another connection commits: of the same process
    (`writer` = "process") or of a child process ("child")."""
    path = os.path.join(root, rel)
    out = []
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def count(tag):
        try:
            out.append([tag, ro.execute("select count(*), sum(v) from t").fetchone()])
        except sqlite3.Error as e:
            out.append([tag, "error", str(e)])

    def write(base):
        if writer == "child":
            return subprocess.run([sys.executable, __file__, "sqlite_write", path, str(base), mode],
                                  capture_output=True, text=True, check=True).stdout.strip()
        return sqlite_commit(path, base, mode)
    count("start")
    for i in range(2):
        out.append(["checkpoint", write(25_000 + i * 5_000)])
        count(f"after commit {i}")
    write(-1)
    count("after delete")
    ro.close()
    with open(path, "rb") as f:
        out.append(["file", content(f.read())])
    print(json.dumps({"mode": mode, "counts": out}))


# -- holes (issue case 7) --

def holes(root, rel):
    path = os.path.join(root, rel)
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    out = {"size": size, "seeks": []}
    for off in sorted({0, 1, 4096, size // 3, size // 2, size - 4096, size - 1, size}):
        for whence, name in ((os.SEEK_DATA, "data"), (os.SEEK_HOLE, "hole")):
            try:
                out["seeks"].append([name, off, os.lseek(fd, off, whence)])
            except OSError as e:
                out["seeks"].append([name, off, err(e)])
    os.lseek(fd, 0, os.SEEK_SET)
    out["tail"] = content(os.pread(fd, 8, size - 8))
    out["blocks"] = [os.fstat(fd).st_blocks, os.stat(path).st_blocks]
    os.close(fd)
    print(json.dumps(out, sort_keys=True))


def tail(root, rel):
    """8 bytes at the end of a file."""
    path = os.path.join(root, rel)
    fd = os.open(path, os.O_RDONLY)
    print(json.dumps(content(os.pread(fd, 8, os.fstat(fd).st_size - 8))))


# -- exec with inherited fds (issue case 8) --

def inherit(root, rel, dirrel):
    fd = os.open(os.path.join(root, rel), os.O_RDONLY)
    os.read(fd, 3)
    dfd = os.open(os.path.join(root, dirrel), os.O_RDONLY | os.O_DIRECTORY)
    os.set_inheritable(fd, True)
    os.set_inheritable(dfd, True)
    code = ("import json,os,sys\nfd,dfd=int(sys.argv[1]),int(sys.argv[2])\n"
            "s=os.fstat(fd)\nd=os.fstat(dfd)\nkeys=('st_mode','st_ino','st_dev','st_nlink',"
            "'st_uid','st_gid','st_size','st_mtime_ns','st_ctime_ns')\nimport fcntl\n"
            "print(json.dumps({'fstat':{k:getattr(s,k) for k in keys},"
            "'F_GETFL':oct(fcntl.fcntl(fd,fcntl.F_GETFL)),"
            "'dir fstat':{k:getattr(d,k) for k in keys},"
            "'rest':os.read(fd,1<<20).hex(),'pread':os.pread(fd,5,0).hex(),"
            "'listdir':sorted(os.listdir(dfd)),"
            "'scandir':sorted(e.name for e in os.scandir(dfd))}))")
    child = subprocess.run([sys.executable, "-c", code, str(fd), str(dfd)], pass_fds=(fd, dfd),
                           capture_output=True, text=True)
    out = {"rc": child.returncode, "child": json.loads(child.stdout) if child.stdout else None,
           "stderr": child.stderr[-500:], "offset after": os.lseek(fd, 0, os.SEEK_CUR)}
    if os.getuid() == 0 and os.path.exists("/usr/bin/setpriv"):
        # A child with other credentials (here: other groups), which granary answers from
        # nothing but what the fds it inherited are.
        os.lseek(fd, 3, os.SEEK_SET)
        other = subprocess.run(["setpriv", "--regid=65534", "--clear-groups", sys.executable,
                                "-c", code, str(fd), str(dfd)], pass_fds=(fd, dfd),
                               capture_output=True, text=True)
        out["child with other groups"] = [other.returncode, other.stdout, other.stderr[-500:]]
    # A shell's `< file` redirection and exec: the program's stdin is the dataset file.
    sh = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" < "$2"', sys.executable,
                         "import os,json,fcntl;s=os.fstat(0);print(json.dumps([s.st_mode,s.st_ino,"
                         "s.st_size,s.st_mtime_ns,s.st_ctime_ns,os.read(0,1<<20).hex(),"
                         "oct(fcntl.fcntl(0,fcntl.F_GETFL))]))",
                         os.path.join(root, rel)], capture_output=True, text=True)
    out["stdin"] = [sh.returncode, sh.stdout, sh.stderr[-500:]]
    print(json.dumps(out, sort_keys=True))


def flags_across_switch(root, rel, tier):
    """Opens `rel` (not placed yet: the agent fetches it whole from this open) with each of the
    status flags a program may ask for itself, waits until its copy is complete, then reads: the
    fd moves to the copy, and `F_GETFL` must still show what the program asked for."""
    path = os.path.join(root, rel)
    asked = {"noatime": os.O_NOATIME, "nonblock": os.O_NONBLOCK, "none": 0}
    fds = {name: os.open(path, os.O_RDONLY | fl) for name, fl in asked.items()}
    out = {"before " + name: oct(fcntl.fcntl(fd, fcntl.F_GETFL)) for name, fd in fds.items()}
    if tier != "-":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                os.path.basename(d) == "objects" and any(len(f) == 16 for f in files)
                for d, _, files in os.walk(tier)):
            time.sleep(0.05)
        time.sleep(0.5)  # published after its rename
    for name, fd in fds.items():
        out["read " + name] = content(os.read(fd, 1 << 20))
        out["after " + name] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
        os.close(fd)
    print(json.dumps(out, sort_keys=True))


def noatime_open(root, rel):
    """Opens `rel` with O_NOATIME (only its owner, or CAP_FOWNER, may: EPERM otherwise), then
    without it and sets O_NOATIME with F_SETFL."""
    path = os.path.join(root, rel)
    out = {}
    for name, fl in (("noatime", os.O_RDONLY | os.O_NOATIME), ("plain", os.O_RDONLY)):
        try:
            fd = os.open(path, fl)
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
            continue
        out[name] = [oct(fcntl.fcntl(fd, fcntl.F_GETFL)), content(os.read(fd, 1 << 20))]
        if name == "plain":
            # The same rule for F_SETFL, unless the flag is set already.
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME)
                out["F_SETFL O_NOATIME"] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
            except OSError as e:
                out["F_SETFL O_NOATIME"] = errno.errorcode[e.errno]
        os.close(fd)
    print(json.dumps(out, sort_keys=True))


def setfl_on_a_dup(root, rel):
    """The program sets O_NOATIME and O_NONBLOCK on one fd of an open file description:
    `F_GETFL` on its dup (which shares the status flags) shows them too."""
    fd = os.open(os.path.join(root, rel), os.O_RDONLY)
    dup = os.dup(fd)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME | os.O_NONBLOCK)
    print(json.dumps({"fd": oct(fcntl.fcntl(fd, fcntl.F_GETFL)),
                      "dup": oct(fcntl.fcntl(dup, fcntl.F_GETFL))}, sort_keys=True))



def setfl_on_a_dup_under_seccomp(root, rel, action):
    """`setfl_on_a_dup` in a process under a seccomp filter that answers `kcmp(2)` (which the
    program never calls) with `action`: `eperm`, or `kill` (the process), as a filter written
    for the program (systemd's `SystemCallFilter=`) does with calls it does not list."""
    import ctypes
    import struct
    ret = {"eperm": 0x00050000 | 1, "kill": 0x80000000}[action]
    nr = {"x86_64": 312, "aarch64": 272}[os.uname().machine]
    # BPF: load the syscall number; kcmp -> ret; anything else -> allow.
    insns = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, ret), (0x06, 0, 0, 0x7fff0000)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in insns))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(len(insns), ctypes.addressof(code))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    assert libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    assert libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0
    setfl_on_a_dup(root, rel)


def setfl_in_a_forked_child(root, rel):
    """A forked child sets O_NOATIME and O_NONBLOCK on the open file description it shares with
    its parent: `F_GETFL` in the parent, after the child exited, shows them."""
    fd = os.open(os.path.join(root, rel), os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME | os.O_NONBLOCK)
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"parent": oct(fcntl.fcntl(fd, fcntl.F_GETFL))}, sort_keys=True))

# -- directory fds (issue case 9) --

def dirfds(root):
    pr = Probe(root)

    def rc(cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        return [p.returncode, p.stderr.replace(root, "ROOT")]
    pr.out["rm -rf"] = rc(["rm", "-rf", pr.p("a")])
    pr.observe("after rm -rf", "a")
    pr.observe("after rm -rf: root", ".")
    import shutil
    pr.record("rmtree", lambda: shutil.rmtree(pr.p("b")))
    pr.observe("after rmtree", "b")
    dfd = os.open(pr.p("c"), os.O_RDONLY | os.O_DIRECTORY)
    pr.record("fstat dfd", lambda: pr.st(os.fstat(dfd)))
    pr.record("listdir dfd", lambda: sorted(os.listdir(dfd)))
    pr.record("mkdirat", lambda: os.mkdir("made", dir_fd=dfd))
    pr.record("openat created", lambda: os.close(os.open("made/new.bin", os.O_WRONLY | os.O_CREAT,
                                                            0o644, dir_fd=dfd)))
    pr.record("unlinkat", lambda: os.unlink("x.bin", dir_fd=dfd))
    pr.record("unlinkat missing", lambda: os.unlink("nothing", dir_fd=dfd))
    pr.record("statat", lambda: pr.st(os.stat("y.bin", dir_fd=dfd)))
    pr.record("renameat", lambda: os.rename("y.bin", "z.bin", src_dir_fd=dfd, dst_dir_fd=dfd))
    pr.record("openat read", lambda: content(read_at(dfd, "z.bin")))
    pr.record("fsync dfd", lambda: os.fsync(dfd))
    pr.record("listdir dfd after", lambda: sorted(os.listdir(dfd)))
    pr.observe("after *at", "c")
    pr.observe("after *at: made", "c/made")
    pr.record("fchdir", lambda: os.fchdir(dfd))
    pr.record("relative after fchdir", lambda: sorted(os.listdir(".")))
    os.chdir("/")
    d1 = os.open(pr.p("e1"), os.O_RDONLY | os.O_DIRECTORY)
    d2 = os.open(pr.p("e2"), os.O_RDONLY | os.O_DIRECTORY)
    pr.record("flock e1", lambda: fcntl.flock(d1, fcntl.LOCK_EX | fcntl.LOCK_NB))
    pr.record("flock e2", lambda: fcntl.flock(d2, fcntl.LOCK_EX | fcntl.LOCK_NB))
    d1b = os.open(pr.p("e1"), os.O_RDONLY | os.O_DIRECTORY)
    pr.record("flock e1 again", lambda: fcntl.flock(d1b, fcntl.LOCK_EX | fcntl.LOCK_NB))
    other = subprocess.run(["flock", "-n", pr.p("e2"), "true"], capture_output=True)
    pr.out["flock(1) e2 while held"] = other.returncode
    pr.dump()


def read_at(dfd, name):
    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


# -- interruptible waits (issue case 11) --

def interrupted(root, rel, marker, how):
    """Reads REL from its end (`pread`), or maps it (`mmap`), until interrupted."""
    import mmap
    path = os.path.join(root, rel)
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    got = 0
    try:
        os.pread(fd, 4096, 0)
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(marker + ".tmp", marker)
        if how == "mmap":
            # A mapping never waits (its tail comes from the source); the reads below do.
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                got = len(m[size - 4096:])
        # Far ahead of the agent's copy: the read waits for it.
        off = size - 4096
        while off >= 0:
            got += len(os.pread(fd, 4096, off))
            off -= 4096
        print(json.dumps({"interrupted": False, "read": got}))
    except KeyboardInterrupt:
        print(json.dumps({"interrupted": True}))


# -- fd calls that act on the file (small items) --

def fd_calls(root, rel):
    path = os.path.join(root, rel)
    out = {}
    flags = {"rdonly": os.O_RDONLY, "nonblock": os.O_RDONLY | os.O_NONBLOCK,
             "noatime": os.O_RDONLY | os.O_NOATIME, "nofollow": os.O_RDONLY | os.O_NOFOLLOW,
             "nocloexec": os.O_RDONLY}
    for name, fl in flags.items():
        fd = os.open(path, fl)
        if name == "nocloexec":
            os.set_inheritable(fd, True)
        out["F_GETFL " + name] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
        out["F_GETFD " + name] = fcntl.fcntl(fd, fcntl.F_GETFD)
        out["read " + name] = content(os.read(fd, 1 << 20))
        # The program sets its status flags from what F_GETFL showed it: the flags granary
        # added to a copy's fd (O_NONBLOCK, O_NOATIME) are gone or the program's own after it.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        out["F_GETFL after F_SETFL " + name] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
        fcntl.fcntl(fd, fcntl.F_SETFL, (fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND) | os.O_NOATIME)
        out["F_GETFL after F_SETFL O_NOATIME " + name] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.read(fd, 10)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # The lock moved a copy's fd to the source: the status flags granary added stay hidden.
    out["F_GETFL after flock"] = oct(fcntl.fcntl(fd, fcntl.F_GETFL))
    out["flock -n on the source while held"] = subprocess.run(
        ["flock", "-n", path, "true"]).returncode
    fcntl.flock(fd, fcntl.LOCK_UN)
    out["flock -n after unlock"] = subprocess.run(["flock", "-n", path, "true"]).returncode
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    out["lockf: flock(1) unaffected"] = subprocess.run(["flock", "-n", path, "true"]).returncode
    out["offset after locks"] = os.lseek(fd, 0, os.SEEK_CUR)
    out["read after locks"] = content(os.read(fd, 1 << 20))
    os.fchmod(fd, 0o640)
    out["stat after fchmod"] = raw_stat(os.stat(path))["st_mode"]
    out["fstat after fchmod"] = raw_stat(os.fstat(fd))["st_mode"]
    out["child stat after fchmod"] = subprocess.run(
        ["stat", "-c", "%a", path], capture_output=True, text=True).stdout
    os.close(fd)
    print(json.dumps(out, sort_keys=True))


def resident_pages(path: str) -> int:
    out = subprocess.run(["fincore", "--noheadings", "--raw", "--bytes", "-o", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def releases(root, tier, *rels):
    """Every way an fd goes away (close, fclose, close_range, dup2 and dup3 over it, freopen)
    on copies the agent keeps out of the page cache (transient): each must drop the pages the
    program read, and then the fd number, reused for a file granary never opened, must be
    described as that file. A vfork child closing an inherited fd must not drop its parent's
    pages. RELS: one file per way, all of different sizes."""
    out = {}
    LIBC.fopen.restype = ctypes.c_void_p
    LIBC.freopen.restype = ctypes.c_void_p
    LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    LIBC.freopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
    LIBC.fileno.argtypes = [ctypes.c_void_p]
    LIBC.fclose.argtypes = [ctypes.c_void_p]
    LIBC.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    LIBC.fread.restype = ctypes.c_size_t

    def copy_path(rel):
        size = os.path.getsize(os.path.join(root, rel))
        found = [os.path.join(d, n) for d, _, names in os.walk(tier) for n in names
                 if os.path.basename(d) == "objects" and len(n) == 16
                 and os.path.getsize(os.path.join(d, n)) == size]
        return found[0] if len(found) == 1 else None

    def opened(rel):
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        while os.read(fd, 1 << 20):
            pass
        return fd

    def kind(fd):
        return "fifo" if stat.S_ISFIFO(os.fstat(fd).st_mode) else "not a fifo"

    ways = iter(rels)
    copies = {rel: copy_path(rel) for rel in rels}
    out["every file has one copy"] = all(copies.values())

    def done(way, rel, extra=None):
        out[way] = {"pages left": resident_pages(copies[rel]) if copies[rel] else None,
                    **(extra or {})}

    rel = next(ways)
    os.close(opened(rel))
    done("close", rel)

    rel = next(ways)
    fp = LIBC.fopen(os.path.join(root, rel).encode(), b"r")
    buf = ctypes.create_string_buffer(1 << 20)
    while LIBC.fread(buf, 1, len(buf), fp):
        pass
    fd = LIBC.fileno(fp)
    LIBC.fclose(fp)
    r, w = os.pipe()
    done("fclose", rel, {"number reused": kind(fd) if r == fd else "not reused"})
    os.close(r)
    os.close(w)

    rel = next(ways)
    fd = opened(rel)
    LIBC.close_range(fd, fd, 0)
    r, w = os.pipe()
    done("close_range", rel, {"number reused": kind(fd) if r == fd else "not reused"})
    os.close(r)
    os.close(w)

    for way, inheritable in (("dup2 over it", True), ("dup3 over it", False)):
        rel = next(ways)
        fd = opened(rel)
        r, w = os.pipe()
        os.dup2(r, fd, inheritable=inheritable)
        done(way, rel, {"now": kind(fd)})
        for x in (fd, r, w):
            os.close(x)

    rel = next(ways)
    fp = LIBC.fopen(os.path.join(root, rel).encode(), b"r")
    while LIBC.fread(buf, 1, len(buf), fp):
        pass
    fd = LIBC.fileno(fp)
    other = os.path.join(tier, "..", "elsewhere.txt")
    with open(other, "w") as f:
        f.write("not in the dataset\n")
    fp = LIBC.freopen(other.encode(), b"r", fp)
    done("freopen", rel, {"same number": LIBC.fileno(fp) == fd,
                          "now": raw_stat(os.fstat(fd)) == raw_stat(os.stat(other))})
    LIBC.fclose(fp)

    rel = next(ways)
    fd = opened(rel)
    os.set_inheritable(fd, True)
    subprocess.run(["true"], close_fds=True)
    pid = os.posix_spawn("/bin/true", ["true"], os.environ,
                         file_actions=[(os.POSIX_SPAWN_CLOSE, fd)])
    os.waitpid(pid, 0)
    out["vfork children closed it"] = {
        "parent's pages kept": resident_pages(copies[rel]) > 0 if copies[rel] else None,
        "fstat is the source's": raw_stat(os.fstat(fd)) == raw_stat(
            os.stat(os.path.join(root, rel)))}
    os.close(fd)
    done("close after vfork", rel)
    print(json.dumps(out, sort_keys=True))


def main():
    scenario, *args = sys.argv[1:]
    globals()[scenario](*args)


if __name__ == "__main__":
    main()
