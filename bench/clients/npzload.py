"""Reading an .npz sample the way `numpy.load` does, with the standard library only.

`np.load(path)` opens the file buffered, reads the 6-byte magic and seeks back, hands the
file to `zipfile.ZipFile` (which reads the end-of-central-directory record at the end, then
the central directory), and `npz[key]` opens the member twice: once to read its magic, once
for `format.read_array`, which reads the array data from the zip member in 256 KiB pieces
(`BUFFER_SIZE`). The source therefore sees a few small reads at both ends of the file and
sequential 256 KiB reads in between: under a 128 KiB readahead, several device requests per
700 KB sample.

Every byte the reader takes from the file is recorded by offset, so the caller can check the
whole file against the manifest's sha256 (and that the reads covered all of it).
"""

import hashlib
import io
import struct
import zipfile

MAGIC = b"\x93NUMPY"
BUFFER_SIZE = 1 << 18  # numpy.lib.format.BUFFER_SIZE


class Recorder(io.RawIOBase):
    """A file object that passes reads through and keeps what they returned."""

    def __init__(self, f, size):
        super().__init__()
        self.f = f
        self.buf = bytearray(size)
        self.spans = []

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, off, whence=0):
        return self.f.seek(off, whence)

    def tell(self):
        return self.f.tell()

    def read(self, n=-1):
        pos = self.f.tell()
        data = self.f.read(n)
        end = min(pos + len(data), len(self.buf))
        if end > pos:
            self.buf[pos:end] = data[:end - pos]
            self.spans.append((pos, end))
        return data

    def covered(self):
        """True if the reads covered every byte of the file."""
        reach = 0
        for a, b in sorted(self.spans):
            if a > reach:
                return False
            reach = max(reach, b)
        return reach >= len(self.buf)


def _npy_header(member):
    """numpy.lib.format.read_magic + read_array_header_1_0: (data length in bytes)."""
    magic = member.read(8)
    if magic[:6] != MAGIC:
        raise ValueError("not an .npy member")
    major = magic[6]
    hlen_fmt = "<H" if major == 1 else "<I"
    (hlen,) = struct.unpack(hlen_fmt, member.read(struct.calcsize(hlen_fmt)))
    header = member.read(hlen).decode("latin1")
    shape = header.split("'shape': (", 1)[1].split(")", 1)[0]
    count = 1
    for d in shape.split(","):
        if d.strip():
            count *= int(d)
    descr = header.split("'descr': '", 1)[1].split("'", 1)[0]
    return count * int(descr[2:] or 1)


def load(path, size):
    """Reads every array of the .npz at `path` as numpy.load does; returns (file bytes as
    read, True if the reads covered the whole file)."""
    with open(path, "rb") as fid:
        rec = Recorder(fid, size)
        # np.load: sniff the magic, seek back, then zipfile.
        magic = rec.read(len(MAGIC))
        rec.seek(-len(magic), 1)
        with zipfile.ZipFile(rec) as zf:
            for name in zf.namelist():
                # NpzFile.__getitem__: one open to read the magic, a second for read_array.
                with zf.open(name) as m:
                    m.read(len(MAGIC))
                with zf.open(name) as m:
                    left = _npy_header(m)
                    while left > 0:
                        chunk = m.read(min(BUFFER_SIZE, left))
                        if not chunk:
                            raise ValueError(f"{name}: truncated array data")
                        left -= len(chunk)
        return bytes(rec.buf), rec.covered()


def npy_bytes(payload, descr="|u1"):
    """An .npy file (format 1.0) holding `payload` as a 1-D array of `descr`."""
    itemsize = int(descr[2:] or 1)
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({len(payload) // itemsize},), }}"
    # numpy pads the header with spaces so the data starts at a multiple of 64 bytes.
    pad = 64 - (len(MAGIC) + 4 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    return MAGIC + b"\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + payload


def npz_bytes(arrays):
    """An uncompressed .npz (numpy.savez) of {name: npy bytes}."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name, data in arrays.items():
            zf.writestr(zipfile.ZipInfo(name + ".npy", (1980, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()
