"""DLIO's own npz reader with every byte it reads checked against the bench's manifest.

Loaded by DLIO 2.0.0 as a custom reader (`++workload.reader.reader_classname=
dlio_verify.VerifyingNPZReader`, this directory on PYTHONPATH). It is DLIO's `NPZReader` with one
change: `open` hands `numpy.load` the file opened as `open(path, "rb")` would open it (a
`FileIO` under a `BufferedReader` of the file's block size), with the `FileIO` recording what it
reads. The system calls are the same as DLIO's `np.load(filename)` (same reads at the same
offsets, same seeks, same close), so the source sees DLIO's I/O unchanged. Then:

- the bytes of the `x.npy` member's data are checked by `zipfile` itself as numpy reads them
  (CRC-32 at the end of the member, `BadZipFile` otherwise: what DLIO's reader does anyway,
  at no extra cost), and the CRC-32 it checked against is compared with the manifest's, which
  the bench computed from the bytes at generation;
- every other byte the reader read (zip headers, the npy header, the central directory, the
  end records) is compared with the manifest's copy of those bytes.

A full sha256 per file in the reader would cost it as much CPU as `numpy.load` itself (1.4–1.7
ms for 716 KB on the 2-core bench machine) and so slow the very loop being measured.

Each verified file is reported on the pipe `BENCH_VERIFY_FD` as one line (path, bytes read);
a mismatch is reported there and the process exits with status 3, which ends the DLIO run.
"""

import base64
import io
import json
import os
import zipfile

import numpy as np
from dlio_benchmark.reader.npz_reader import NPZReader

MISMATCH_EXIT = 3

_manifest = None


def _load_manifest():
    """{absolute path: entry}: read once per process (after DLIO's workers fork, each its own)."""
    global _manifest
    if _manifest is None:
        root = os.environ["BENCH_ROOT"]
        with open(os.environ["BENCH_MANIFEST"]) as f:
            m = json.load(f)
        _manifest = {os.path.join(root, e["path"]): e for e in m["npz"]}
    return _manifest


def _report(line):
    fd = int(os.environ.get("BENCH_VERIFY_FD", "-1"))
    if fd >= 0:
        # One write below PIPE_BUF: whole even with several writers on the pipe.
        os.write(fd, (line + "\n").encode()[:4000])


def _fail(path, why):
    _report(json.dumps({"mismatch": path, "why": why}))
    os._exit(MISMATCH_EXIT)


class _RecordingFile(io.FileIO):
    """A `FileIO` that keeps (offset, bytes) of every read outside [skip_from, skip_to)."""

    def __init__(self, path, skip):
        super().__init__(path, "r")
        self.skip = skip
        self.pieces = []
        self.nbytes = 0

    def readinto(self, b):
        off = self.tell()
        n = super().readinto(b)
        if n:
            self.nbytes += n
            a, z = self.skip
            with memoryview(b) as m:
                if off < a:
                    self.pieces.append((off, bytes(m[: min(n, a - off)])))
                if off + n > z:
                    s = max(off, z)
                    self.pieces.append((s, bytes(m[s - off : n])))
        return n


class VerifyingNPZReader(NPZReader):
    """DLIO's NPZReader; `open` verifies what it read (see the module's docstring)."""

    def open(self, filename):
        entry = _load_manifest().get(os.path.abspath(filename))
        if entry is None:
            _fail(filename, "not in the manifest")
        a, z = entry["x_data"]
        raw = _RecordingFile(filename, (a, z))
        # What `open(filename, "rb")` builds, so numpy reads exactly as from a path.
        f = io.BufferedReader(raw, raw._blksize)
        try:
            with f:
                npz = np.load(f, allow_pickle=True)
                try:
                    x = npz["x"]
                    crc = npz.zip.getinfo("x.npy").CRC
                finally:
                    npz.close()
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            _fail(filename, f"{type(e).__name__}: {e}")
        if crc != entry["x_crc32"]:
            _fail(filename, f"x.npy CRC-32 {crc:#x} != manifest {entry['x_crc32']:#x}")
        if list(x.shape) != entry["x_shape"] or x.dtype.str != entry["x_dtype"]:
            _fail(filename, f"x {x.shape} {x.dtype.str} != manifest {entry['x_shape']} "
                            f"{entry['x_dtype']}")
        head = base64.b64decode(entry["head"])
        tail = base64.b64decode(entry["tail"])
        for off, got in raw.pieces:
            if off < a:
                want = head[off : off + len(got)]
            else:
                want = tail[off - z : off - z + len(got)]
            if got != want:
                _fail(filename, f"bytes at {off}..{off + len(got)} differ from the manifest")
        _report(f"{raw.nbytes}\t{filename}")
        return x
