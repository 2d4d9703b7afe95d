"""Synthetic datasets shaped like the papers' (docs/background.md), and their checksum manifests.

Contents are random (incompressible) bytes; sizes are drawn from a seeded
generator so two runs with the same knobs have the same layout. The manifest
(relative path, size, sha256 of every file) is written outside the emulated
PFS, so that reading it costs the source nothing.
"""

import hashlib
import json
import math
import os
import random
import struct
import sys
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "clients"))
import npzload  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20

RECORD_HEADER = struct.Struct("<QI")


@dataclass
class Dataset:
    name: str          # directory under the source root
    files: list        # [(relpath, size, sha256)]
    manifest: str      # path of the manifest JSON
    stored_bytes: int = 0  # allocated on the source: files' and directories' blocks (du)

    @property
    def total_bytes(self):
        return sum(f[1] for f in self.files)


def _lognormal_sizes(rng, n, mean, lo, hi, sigma=0.5):
    """ImageNet JPEGs are roughly log-normal around ~110 KB."""
    mu = math.log(mean) - sigma * sigma / 2
    return [int(min(hi, max(lo, rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def _write(path, chunks):
    """Writes the chunks, returns (size, sha256)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
            h.update(c)
            size += len(c)
    return size, h.hexdigest()


def _random_chunks(n):
    while n > 0:
        k = min(n, 4 * MIB)
        yield os.urandom(k)
        n -= k


def _record_chunks(rng, shard_bytes, mean_record):
    """A shard of framed records (see bench/clients/records.py) of ~shard_bytes."""
    left = shard_bytes
    while left > 0:
        payload_len = _lognormal_sizes(rng, 1, mean_record, 4 * KIB, 1 * MIB)[0]
        payload_len = max(1, min(payload_len, left - RECORD_HEADER.size - 4))
        payload = os.urandom(payload_len)
        length = struct.pack("<Q", payload_len)
        yield RECORD_HEADER.pack(payload_len, zlib.crc32(length))
        yield payload
        yield struct.pack("<I", zlib.crc32(payload))
        left -= RECORD_HEADER.size + payload_len + 4


def gen_smallfiles(rng, base, n_files, n_classes, mean_kb):
    """ImageNet-like: class directories of ~mean_kb JPEG-sized files."""
    sizes = _lognormal_sizes(rng, n_files, mean_kb * KIB, 4 * KIB, 1 * MIB)
    out = []
    for i, size in enumerate(sizes):
        rel = f"train/c{i % n_classes:04d}/img_{i:07d}.jpg"
        os.makedirs(os.path.join(base, os.path.dirname(rel)), exist_ok=True)
        out.append((rel, *_write(os.path.join(base, rel), _random_chunks(size))))
    return out


def gen_records(rng, base, n_shards, min_mb, max_mb, mean_record_kb):
    """TFRecord-like shards of min_mb..max_mb MiB."""
    out = []
    os.makedirs(base, exist_ok=True)
    for i in range(n_shards):
        shard = int(rng.uniform(min_mb, max_mb) * MIB)
        rel = f"shard-{i:05d}-of-{n_shards:05d}.rec"
        out.append((rel, *_write(os.path.join(base, rel),
                                 _record_chunks(rng, shard, mean_record_kb * KIB))))
    return out


def gen_npz(rng, base, n_files, n_classes, kb):
    """npz samples (numpy.savez, uncompressed) of ~kb KiB: a fixed-shape array `x` of random
    bytes and an int64 label `y`, in class directories."""
    out = []
    for i in range(n_files):
        rel = f"train/c{i % n_classes:04d}/sample_{i:07d}.npz"
        os.makedirs(os.path.join(base, os.path.dirname(rel)), exist_ok=True)
        label = struct.pack("<q", rng.randrange(n_classes))
        data = npzload.npz_bytes({"x": npzload.npy_bytes(os.urandom(kb * KIB - 512)),
                                  "y": npzload.npy_bytes(label, "<i8")})
        out.append((rel, *_write(os.path.join(base, rel), [data])))
    return out


FANSTORE_SIZES = {"128K": 128 * KIB, "512K": 512 * KIB, "2M": 2 * MIB, "8M": 8 * MIB}


def gen_fanstore(rng, base, counts):
    """FanStore's benchmark: one directory per file size, counts per size."""
    out = []
    for d, size in FANSTORE_SIZES.items():
        os.makedirs(os.path.join(base, d), exist_ok=True)
        for i in range(counts[d]):
            rel = f"{d}/f{i:06d}"
            out.append((rel, *_write(os.path.join(base, rel), _random_chunks(size))))
    return out


def _low_entropy_chunks(n, rng):
    """npz-like arrays of small integers: random bytes mapped onto a skewed alphabet (mostly
    0..3), ~2.5 bits of entropy per byte, so zstd stores them ~3x smaller."""
    table = bytes((b & 3) if b < 224 else (b & 15) for b in range(256))
    while n > 0:
        k = min(n, 4 * MIB)
        yield os.urandom(k).translate(table)
        n -= k


def gen_fanstorez(rng, base, counts):
    """FanStore's sizes and counts, compressible contents (Zhang et al., section 6.6: 2.8x)."""
    out = []
    for d, size in FANSTORE_SIZES.items():
        os.makedirs(os.path.join(base, d), exist_ok=True)
        for i in range(counts[d]):
            rel = f"{d}/f{i:06d}"
            out.append((rel, *_write(os.path.join(base, rel), _low_entropy_chunks(size, rng))))
    return out


def gen_lmdb(rng, base, n_values, value_kb, shuffled=False):
    """An LMDB environment (subdir: data.mdb, lock.mdb) of n_values random values of value_kb
    KiB under keys 00000000..; written in key order (as dataset converters write them: leaf and
    overflow pages follow the key order in the file), or in a shuffled order (`shuffled`: a
    cursor scan then jumps around the file). The manifest holds one entry per key
    ("key", value size, sha256) besides the files."""
    import lmdb  # the python binding; deps.py installs it
    os.makedirs(base, exist_ok=True)
    size = value_kb * KIB
    order = list(range(n_values))
    if shuffled:
        rng.shuffle(order)
    env = lmdb.open(base, map_size=int(n_values * (size + 8 * KIB) * 1.2) + (64 << 20),
                    subdir=True, sync=False)
    values = []
    with env.begin(write=True) as txn:
        for i in order:
            v = os.urandom(size)
            txn.put(f"{i:08d}".encode(), v, append=not shuffled)
            values.append((f"{i:08d}", size, hashlib.sha256(v).hexdigest()))
    env.sync(True)
    env.close()
    values.sort()
    out = []
    for name in ("data.mdb", "lock.mdb"):
        p = os.path.join(base, name)
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for c in iter(lambda: f.read(4 * MIB), b""):
                h.update(c)
        out.append((name, os.path.getsize(p), h.hexdigest()))
    return out, values


def generate(knobs, source_root, manifest_dir, names, clients=None):
    """Generates the named datasets under source_root; returns {name: Dataset}. `clients`:
    the real clients' environments (run.py), for datasets a client generates itself."""
    os.makedirs(manifest_dir, exist_ok=True)
    made = {}
    for name in names:
        extra = {}
        rng = random.Random(f"{knobs.seed}:{name}")
        base = os.path.join(source_root, name)
        if name == "smallfiles":
            files = gen_smallfiles(rng, base, knobs.small_files, knobs.small_classes,
                                   knobs.small_mean_kb)
        elif name == "records":
            files = gen_records(rng, base, knobs.record_shards, knobs.record_min_mb,
                                knobs.record_max_mb, knobs.record_mean_kb)
        elif name == "fanstore":
            files = gen_fanstore(rng, base, knobs.fanstore_counts)
        elif name == "npz":
            files = gen_npz(rng, base, knobs.npz_files, knobs.small_classes, knobs.npz_kb)
        elif name == "fanstorez":
            files = gen_fanstorez(rng, base, knobs.fanstore_counts)
        elif name == "dlio":
            from . import dlio
            files, npz = dlio.generate(clients["dlio"]["python"], base, knobs.dlio_files,
                                       knobs.dlio_record_length,
                                       os.path.join(knobs.workdir, "dlio-generate"),
                                       lambda m: print(m, flush=True))
            extra = {"record_length": knobs.dlio_record_length, "npz": npz}
        elif name == "hfds":
            from . import hfds
            files, extra = hfds.generate(clients["hfds"]["python"], base, knobs,
                                         os.path.join(knobs.workdir, "hfds-generate"))
        else:
            raise ValueError(f"unknown dataset {name}")
        manifest = os.path.join(manifest_dir, f"{name}.json")
        with open(manifest, "w") as f:
            json.dump({"name": name, "files": files, **extra}, f)
        made[name] = Dataset(name, files, manifest, _allocated(base))
    return made


def _allocated(base):
    """What the dataset occupies on the source device (st_blocks of every file and
    directory, like du): no reader can fetch less, since a device reads whole blocks."""
    total = 0
    for d, _, names in os.walk(base):
        total += os.lstat(d).st_blocks * 512
        for n in names:
            total += os.lstat(os.path.join(d, n)).st_blocks * 512
    return total
