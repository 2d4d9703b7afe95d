"""Shared plumbing for the benchmark clients (Python stdlib only).

A client is an ordinary training-data reader: it is given a data root and a
checksum manifest, reads every file once per epoch in a shuffled order, and
verifies every byte it reads against the manifest. It reports to stdout as JSON
lines, so the harness (or a person) can follow it:

  {"ev": "start", ...}                       once
  {"ev": "tick", "t": ..., "epoch": e, "bytes": cum, "samples": cum}   timeline
  {"ev": "epoch", "epoch": e, "t0": ..., "t1": ..., "seconds": ..., ...}
  {"ev": "done", "verified_files": n, "verified_bytes": b}

Any mismatch prints {"ev": "mismatch", ...} and the client exits with status 3.
"""

import argparse
import hashlib
import json
import os
import sys
import threading
import time

MISMATCH_EXIT = 3
CHUNK = 1 << 20

# Per-sample "model step" times, in milliseconds. The step is a sleep in the
# consuming process: it stands for accelerator time, which overlaps with the
# loader's I/O but does not take a CPU away from it (2-core machines included).
COMPUTE_PROFILES = {"lenet": 0.05, "alexnet": 1.5, "resnet": 6.0}


def compute_ms(text):
    """'lenet' | 'alexnet' | 'resnet' | a number of ms per sample."""
    if text in COMPUTE_PROFILES:
        return COMPUTE_PROFILES[text]
    return float(text)


def base_parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--root", required=True, help="directory the manifest paths are relative to")
    p.add_argument("--manifest", required=True, help="checksum manifest (JSON) written at generation")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1, help="shuffle seed (epoch e uses seed + e)")
    p.add_argument("--workers", type=int, default=2, help="parallel readers (processes or threads)")
    p.add_argument("--compute", type=compute_ms, default=compute_ms("lenet"),
                   help="model step per sample: lenet|alexnet|resnet or milliseconds (default lenet)")
    p.add_argument("--cache-dir", default=None,
                   help="framework-style cache: epoch 1 copies each file here as it is read, "
                        "later epochs read the copies")
    p.add_argument("--tick", type=float, default=0.1, help="timeline sampling period, seconds")
    return p


def load_manifest(path, subset=None):
    """Returns [(relpath, size, sha256hex)], optionally only paths under `subset`."""
    with open(path) as f:
        m = json.load(f)
    files = [tuple(e) for e in m["files"]]
    if subset:
        prefix = subset.rstrip("/") + "/"
        files = [e for e in files if e[0].startswith(prefix)]
    return files


class Reporter:
    """JSON-lines output plus a background timeline ticker.

    Counters are updated by the consuming thread; the ticker only reads them, so
    a torn read costs at most one sample of accuracy."""

    def __init__(self, tick):
        self.lock = threading.Lock()
        self.bytes = 0
        self.samples = 0
        self.epoch = 0
        self.verified_files = 0
        self.verified_bytes = 0
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def emit(self, **obj):
        line = json.dumps(obj)
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def start(self, **info):
        self.emit(ev="start", t=time.time(), pid=os.getpid(), **info)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self._tick):
            if self.epoch:
                self.emit(ev="tick", t=time.time(), epoch=self.epoch, bytes=self.bytes,
                          samples=self.samples)

    def consumed(self, nbytes, nsamples):
        self.bytes += nbytes
        self.samples += nsamples

    def epoch_begin(self, e):
        self.epoch = e
        self.emit(ev="tick", t=time.time(), epoch=e, bytes=self.bytes, samples=self.samples)
        return time.time(), self.bytes, self.samples

    def epoch_end(self, e, begin, **extra):
        t0, b0, s0 = begin
        t1 = time.time()
        self.emit(ev="tick", t=t1, epoch=e, bytes=self.bytes, samples=self.samples)
        self.emit(ev="epoch", epoch=e, t0=t0, t1=t1, seconds=t1 - t0, bytes=self.bytes - b0,
                  samples=self.samples - s0, **extra)

    def verified(self, nbytes):
        with self.lock:  # reader threads call this concurrently
            self.verified_files += 1
            self.verified_bytes += nbytes

    def done(self):
        self._stop.set()
        self.emit(ev="done", t=time.time(), verified_files=self.verified_files,
                  verified_bytes=self.verified_bytes)


def fail_mismatch(rel, why):
    """One wrong byte fails the whole run: say what and exit non-zero."""
    sys.stdout.write(json.dumps({"ev": "mismatch", "path": rel, "why": why}) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"CHECKSUM MISMATCH: {rel}: {why}\n")
    sys.stderr.flush()
    os._exit(MISMATCH_EXIT)


def check(rel, size, digest, got_size, got_digest):
    if got_size != size:
        fail_mismatch(rel, f"size {got_size} != manifest {size}")
    if got_digest != digest:
        fail_mismatch(rel, f"sha256 {got_digest} != manifest {digest}")


def compute_step(ms_per_sample, nsamples):
    if ms_per_sample > 0 and nsamples:
        time.sleep(ms_per_sample * nsamples / 1000.0)


def read_whole(path):
    """Reads a file the way image loaders do: open, read to EOF, close."""
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def read_whole_cached(root, rel, cache_dir):
    return read_cached(root, rel, cache_dir, read_whole)


def read_cached(root, rel, cache_dir, read):
    """Framework-style cache (tf.data.cache / copy-on-first-read): serve the local
    copy when it exists, otherwise read the source and leave a copy behind.
    `read(path)` returns a file's bytes. The copy is written to a temporary name
    and renamed, so a half-written copy is never served."""
    if cache_dir:
        cpath = os.path.join(cache_dir, rel)
        try:
            return read(cpath)
        except FileNotFoundError:
            pass
    data = read(os.path.join(root, rel))
    if cache_dir:
        os.makedirs(os.path.dirname(cpath), exist_ok=True)
        tmp = f"{cpath}.tmp{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, cpath)
    return data


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()
