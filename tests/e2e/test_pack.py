"""`granary pack` on odd trees, driven through the real binary: every file read back with
`granary pack cat` equals the source byte for byte (names with spaces, newlines and non-UTF-8
bytes, a 3,800-byte path, empty files, hard links, symlinks inside and pointing out, a sparse
file), `ls -R` lists every entry, `verify --source` and `diff` agree the pack matches."""
import os
import subprocess

import pytest

from conftest import granary_bin


def make_odd_tree(src: bytes):
    def put(rel: bytes, data: bytes):
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    put(b"plain/random.bin", os.urandom(300_000))
    put(b"plain/words.txt", b"pack me " * 50_000)
    put(b"with space/a file.txt", b"spaces")
    put(b"new\nline/x\ny", b"newlines")
    put(b"\xff\xfebytes/\xe9t\xe9", os.urandom(777))
    put(b"empty/zero", b"")
    os.makedirs(os.path.join(src, b"empty/dir"))
    long = b"/".join(bytes([ord("a") + i]) * 200 for i in range(19))
    assert len(long) >= 3800
    put(long, os.urandom(1234))
    os.link(os.path.join(src, b"plain/random.bin"), os.path.join(src, b"plain/hard link"))
    os.symlink(b"random.bin", os.path.join(src, b"plain/inside"))
    os.symlink(b"/etc/hostname", os.path.join(src, b"pointing out"))
    with open(os.path.join(src, b"sparse"), "wb") as f:
        f.truncate(16 << 20)
        f.seek(9 << 20)
        f.write(os.urandom(4096))


def tree_entries(src: bytes):
    """Relative paths of every entry below src, and the regular files' bytes."""
    entries, files = [], {}
    for root, dirs, names in os.walk(src):
        for n in dirs + names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, src)
            entries.append(rel)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    files[rel] = f.read()
    return entries, files


def run(*args, check=True):
    proc = subprocess.run([granary_bin(), *args], capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"granary {args!r} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return proc


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd:1"])
def test_odd_tree_round_trips(tmp_path, codec):
    src = os.fsencode(tmp_path / "src")
    os.makedirs(src)
    make_odd_tree(src)
    out = os.fsencode(tmp_path / "pack")
    run("pack", src, out, "--compress", codec, "--partitions", "2", "-q")

    entries, files = tree_entries(src)
    for rel, data in files.items():
        got = run("pack", "cat", out, rel).stdout
        assert got == data, f"{rel!r}: {len(got)} bytes, source has {len(data)}"
    # Symlinks: inside the pack followed; pointing out refused, nothing on stdout.
    assert run("pack", "cat", out, b"plain/inside").stdout == files[b"plain/random.bin"]
    bad = run("pack", "cat", out, b"pointing out", check=False)
    assert bad.returncode != 0 and bad.stdout == b"" and b"outside the pack" in bad.stderr

    listing = run("pack", "ls", "-R", out).stdout.splitlines()
    assert len(listing) == len(entries), (len(listing), len(entries))
    assert any(line.endswith(b"pointing out -> /etc/hostname") for line in listing)
    assert any(b"new\\nline" in line for line in listing)

    verify = run("pack", "verify", out, "--source", src)
    assert b"OK" in verify.stderr
    diff = run("pack", "diff", src, out)
    assert diff.stdout == b""

    # The hole of the sparse file is not stored: the pack is far smaller than the tree.
    stored = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    assert stored < sum(len(d) for d in files.values()) - (15 << 20)


def test_diff_sees_a_change_verify_sees_damage(tmp_path):
    src = os.fsencode(tmp_path / "src")
    os.makedirs(src)
    make_odd_tree(src)
    out = os.fsencode(tmp_path / "pack")
    run("pack", src, out, "-q")
    with open(os.path.join(src, b"plain/words.txt"), "ab") as f:
        f.write(b"more")
    diff = run("pack", "diff", src, out, check=False)
    assert diff.returncode == 1
    assert diff.stdout.startswith(b"M plain/words.txt (size, mtime, ctime")
    # verify --source notices the source differs; the pack itself is intact.
    assert run("pack", "verify", out, "--source", src, check=False).returncode == 1
    assert run("pack", "verify", out).returncode == 0
