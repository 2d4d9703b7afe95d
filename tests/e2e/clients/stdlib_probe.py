#!/usr/bin/env python3
"""Exercises the Python stdlib's file APIs on a tree and prints one JSON document describing
everything it saw: listings, stat fields, contents' digests. Run it with and without granary and
compare the output: it must be identical.
"""
import glob
import hashlib
import json
import mmap
import os
import pathlib
import sys

STAT_FIELDS = ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size",
               "st_mtime_ns", "st_ctime_ns", "st_blocks", "st_blksize")


def st(s):
    return {k: getattr(s, k) for k in STAT_FIELDS}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(root: str) -> None:
    out = {}
    # os.walk (scandir underneath), sorted because directory order is the file system's.
    walk = []
    for dirpath, dirnames, filenames in os.walk(root):
        walk.append([os.path.relpath(dirpath, root), sorted(dirnames), sorted(filenames)])
    out["walk"] = sorted(walk)
    out["walk_follow"] = sorted(
        [os.path.relpath(d, root), sorted(f)] for d, _, f in os.walk(root, followlinks=True))
    out["listdir_root"] = sorted(os.listdir(root))
    out["scandir"] = {}
    for dirpath, _, _ in os.walk(root):
        with os.scandir(dirpath) as it:
            out["scandir"][os.path.relpath(dirpath, root)] = sorted(
                (e.name, e.is_dir(), e.is_file(), e.is_symlink(), e.inode()) for e in it)
    out["glob"] = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "train", "*", "*.jpg")))
    out["rglob"] = sorted(str(p.relative_to(root)) for p in pathlib.Path(root).rglob("*.bin"))

    files = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            rec = {"lstat": st(os.lstat(path))}
            if os.path.exists(path):
                rec["stat"] = st(os.stat(path))
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        data = f.read()
                        rec["fstat_matches_stat"] = st(os.fstat(f.fileno())) == rec["stat"]
                    rec["read"] = digest(data)
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        half = len(data) // 2
                        rec["pread_tail"] = digest(os.pread(fd, len(data), half))
                        if data:
                            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                                rec["mmap"] = digest(m[:])
                    finally:
                        os.close(fd)
                    rec["pathlib"] = digest(pathlib.Path(path).read_bytes())
            else:
                rec["exists"] = False
            if os.path.islink(path):
                rec["readlink"] = os.readlink(path)
                rec["realpath"] = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
            rec["access_r"] = os.access(path, os.R_OK)
            files[rel] = rec
    out["files"] = files
    out["stat_dirs"] = {os.path.relpath(d, root): st(os.stat(d)) for d, _, _ in os.walk(root)}

    # Relative paths, chdir and dir_fd.
    os.chdir(os.path.join(root, "train"))
    out["relative"] = digest(open("class000/img00000.jpg", "rb").read())
    os.chdir("class001")
    out["relative_dotdot"] = digest(open("../class002/img00001.jpg", "rb").read())
    dfd = os.open(os.path.join(root, "edge"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open("exactly-128k.bin", os.O_RDONLY, dir_fd=dfd)
        out["dir_fd_read"] = digest(os.read(fd, 1 << 20))
        os.close(fd)
        out["dir_fd_stat"] = st(os.stat("one.bin", dir_fd=dfd))
        out["dir_fd_listdir"] = sorted(os.listdir(dfd))
        os.fchdir(dfd)
        out["fchdir_cwd"] = os.path.relpath(os.getcwd(), os.path.realpath(root))
        out["fchdir_read"] = digest(open("one.bin", "rb").read())
    finally:
        os.close(dfd)

    # Errors must carry the same errno.
    errors = {}
    for rel in ("train/no-such-file", "no-such-dir/x", "edge/one.bin/not-a-dir", "edge/dangling"):
        try:
            open(os.path.join(root, rel), "rb")
            errors[rel] = "opened"
        except OSError as e:
            errors[rel] = e.errno
        try:
            os.stat(os.path.join(root, rel))
            errors[rel + ":stat"] = "ok"
        except OSError as e:
            errors[rel + ":stat"] = e.errno
    out["errors"] = errors
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
