"""The DLIO dataset: made by DLIO's own npz generator, checksummed by the bench.

DLIO 2.0.0 generates `train/img_<i>_of_<n>.npz` (numpy.savez of a random uint8 array `x` of
sqrt(record_length)² bytes and a label `y`, seeded by DLIO) in its data folder. Right after
generation, before the source is sealed, the bench reads every file once and writes the
manifest: each file's size and sha256 (like every dataset's), and for DLIO's verifying reader
(`bench/clients/dlio_verify.py`) where the `x.npy` member's bytes lie, their CRC-32 computed here
from the bytes (and required to equal the one the zip directory records), the array's shape and
dtype, and the file's other bytes (zip headers, npy header, `y`, central directory: ~0.5 KB).
"""

import ast
import base64
import hashlib
import os
import struct
import subprocess
import zipfile
import zlib

LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # zip local file header, 30 bytes


def generate(python, base, n_files, record_length, scratch, log):
    """Runs DLIO's generator into `base`; returns (files, npz entries) for the manifest."""
    os.makedirs(scratch, exist_ok=True)
    w = "++workload."
    argv = [python, "-m", "dlio_benchmark.main", "workload=default",
            f"{w}workflow.generate_data=True", f"{w}workflow.train=False",
            f"{w}workflow.evaluation=False", f"{w}workflow.checkpoint=False",
            f"{w}workflow.profiling=False",
            f"{w}dataset.data_folder={base}", f"{w}dataset.num_files_train={n_files}",
            f"{w}dataset.num_files_eval=0", f"{w}dataset.num_subfolders_train=0",
            f"{w}dataset.num_subfolders_eval=0", f"{w}dataset.record_length={record_length}",
            f"{w}output.folder={scratch}/output"]
    env = dict(os.environ, DFTRACER_ENABLE="0")
    r = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"DLIO's generator failed (status {r.returncode}):\n"
                           + (r.stdout + r.stderr)[-3000:])
    # DLIO lists valid/ before training even with no evaluation files.
    os.makedirs(os.path.join(base, "valid"), exist_ok=True)
    files, entries = [], []
    train = os.path.join(base, "train")
    names = sorted(os.listdir(train))
    if len(names) != n_files:
        raise RuntimeError(f"DLIO generated {len(names)} files in {train}, {n_files} asked for")
    for name in names:
        rel = f"train/{name}"
        with open(os.path.join(base, rel), "rb") as f:
            data = f.read()
        files.append((rel, len(data), hashlib.sha256(data).hexdigest()))
        entries.append(npz_entry(rel, data))
    log(f"  DLIO generated {len(files)} files of {files[0][1]} bytes")
    return files, entries


def npz_entry(rel, data):
    """What the verifying reader checks a file's reads against (see the module's docstring)."""
    import io
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo("x.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise RuntimeError(f"{rel}: x.npy is compressed; the verifying reader expects savez")
    h = LOCAL_HEADER.unpack_from(data, info.header_offset)
    if h[0] != b"PK\x03\x04":
        raise RuntimeError(f"{rel}: no local header at {info.header_offset}")
    name_len, extra_len = h[9], h[10]
    a = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
    z = a + info.compress_size
    crc = zlib.crc32(data[a:z])
    if crc != info.CRC:
        raise RuntimeError(f"{rel}: x.npy CRC-32 {crc:#x} != its zip directory's {info.CRC:#x}")
    shape, descr = _npy_header(data[a:z])
    return {"path": rel, "x_data": [a, z], "x_crc32": crc, "x_shape": list(shape),
            "x_dtype": descr, "head": base64.b64encode(data[:a]).decode(),
            "tail": base64.b64encode(data[z:]).decode()}


def _npy_header(member):
    """(shape, descr) of an .npy member (format versions 1-3)."""
    if member[:6] != b"\x93NUMPY":
        raise RuntimeError("x.npy has no npy magic")
    major = member[6]
    if major == 1:
        n, = struct.unpack_from("<H", member, 8)
        start = 10
    else:
        n, = struct.unpack_from("<I", member, 8)
        start = 12
    d = ast.literal_eval(member[start:start + n].decode("latin1"))
    return tuple(d["shape"]), d["descr"]
