"""`granary pack` on odd trees, driven through the real binary: every file read back with
`granary pack cat` equals the source byte for byte (names with spaces, newlines and non-UTF-8
bytes, a 3,800-byte path, empty files, hard links, symlinks inside and pointing out, a sparse
file), `ls -R` lists every entry, `verify --source` and `diff` agree the pack matches. The
tools on damaged packs and on paths that are no pack: each damaged file named once, exit 1 for
damage and 2 for usage errors, PACK first; an interrupted pack leaves nothing behind."""
import os
import signal
import subprocess

import pytest

from conftest import granary_bin
from probes import wait_for


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
    diff = run("pack", "diff", out, src)
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
    diff = run("pack", "diff", out, src, check=False)
    assert diff.returncode == 1
    assert diff.stdout.startswith(b"M plain/words.txt (size, mtime, ctime")
    # verify --source notices the source differs; the pack itself is intact.
    assert run("pack", "verify", out, "--source", src, check=False).returncode == 1
    assert run("pack", "verify", out).returncode == 0


def simple_tree(src: str, dirs=3, files=20):
    """dirs × files small files of random bytes; returns {relative path: bytes}."""
    out = {}
    for d in range(dirs):
        os.makedirs(os.path.join(src, f"d{d}"))
        for i in range(files):
            rel = f"d{d}/f{i:02d}"
            data = os.urandom(1000 + 37 * i)
            with open(os.path.join(src, rel), "wb") as f:
                f.write(data)
            out[rel] = data
    return out


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def readable_and_named(out, files, verify):
    """Every file either reads back exactly with `pack cat` or is named once by verify (and
    `pack cat` refuses it with status 1, nothing on stdout). Returns the names."""
    lines = verify.stdout.decode().splitlines()
    named = [l.split(": ", 1)[0] for l in lines]
    damaged = {n for n in named if n in files}
    assert len([n for n in named if n in files]) == len(damaged), f"a file named twice: {lines}"
    for rel, data in files.items():
        got = run("pack", "cat", out, rel, check=False)
        if rel in damaged:
            assert got.returncode == 1 and got.stdout == b"", (rel, got.stderr)
            assert f"granary pack verify {out}".encode() in got.stderr, got.stderr
        else:
            assert got.returncode == 0 and got.stdout == data, rel
    return damaged


def test_verify_names_each_damaged_file_once_and_exits_1(tmp_path):
    src = str(tmp_path / "src")
    files = simple_tree(src)
    out = str(tmp_path / "pack")
    run("pack", src, out, "--partitions", "2", "-q")
    part1 = os.path.join(out, "part-00001")
    orig = open(part1, "rb").read()

    # A cut partition: one line for it, then each of its files once, by name.
    with open(part1, "r+b") as f:
        f.truncate(len(orig) - 1)
    v = run("pack", "verify", out, check=False)
    assert v.returncode == 1, v.stderr
    lines = v.stdout.decode().splitlines()
    assert "part-00001" in lines[0] and "truncated" in lines[0], lines[0]
    damaged = readable_and_named(out, files, v)
    assert len(lines) == 1 + len(damaged) and 0 < len(damaged) < len(files), lines
    assert f"{len(damaged)} files cannot be read from the pack".encode() in v.stderr, v.stderr

    # A damaged header: the same, as one partition problem.
    with open(part1, "wb") as f:
        f.write(orig)
    flip(part1, 40)
    v = run("pack", "verify", out, check=False)
    assert v.returncode == 1
    assert readable_and_named(out, files, v) == damaged
    assert "header" in v.stdout.decode().splitlines()[0]

    # One flipped byte in one file's data: that file, once.
    with open(part1, "wb") as f:
        f.write(orig)
    victim = next(iter(sorted(damaged)))
    flip(part1, orig.index(files[victim]) + 10)
    v = run("pack", "verify", out, check=False)
    assert v.returncode == 1
    assert readable_and_named(out, files, v) == {victim}
    assert v.stdout.decode().splitlines() == [
        f"{victim}: checksum mismatch: the stored bytes are damaged ({part1})"]

    # With the source, a file that changed there differs; the damaged one is still damaged.
    with open(part1, "wb") as f:
        f.write(orig)
    with open(os.path.join(src, "d0/f00"), "ab") as f:
        f.write(b"x")
    v = run("pack", "verify", out, src, check=False)
    assert v.returncode == 1 and v.stdout.decode() == "d0/f00: differs from the source\n"
    # The older spelling still works.
    assert run("pack", "verify", out, "--source", src, check=False).stdout == v.stdout
    assert run("pack", "verify", out).returncode == 0

    # A damaged index: exit 1, said once.
    index = os.path.join(out, "index")
    flip(index, os.path.getsize(index) // 2)
    v = run("pack", "verify", out, check=False)
    assert v.returncode == 1, v.stderr
    assert len(v.stdout.splitlines()) == 1 and b"corrupt pack" in v.stdout
    assert b"the index is damaged" in v.stderr


def test_not_a_pack_is_a_usage_error_said_once(tmp_path):
    src = str(tmp_path / "src")
    simple_tree(src, dirs=1, files=3)
    out = str(tmp_path / "pack")
    run("pack", src, out, "-q")
    cases = {
        src: "not a granary pack (no index file)",
        os.path.join(src, "d0/f00"): "not a granary pack",
        os.path.join(out, "index"): f"not a granary pack (a file of one: name its directory, {out})",
        str(tmp_path / "nothing"): "No such file or directory",
    }
    for path, said in cases.items():
        for tool in (["verify"], ["ls"], ["cat", "d0/f00"], ["diff", path, src]):
            args = ["pack", tool[0], *( [path] if tool[0] != "diff" else []), *tool[1:]]
            r = run(*args, check=False)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            err = r.stderr.decode()
            assert said in err and err.count("No such file") <= 1, (args, err)
            assert r.stdout == b"", args
    # Usage errors of the command line itself: 2, from clap.
    assert run("pack", "verify", check=False).returncode == 2
    # A path not in the pack: 2, the pack named.
    r = run("pack", "cat", out, "nope", check=False)
    assert r.returncode == 2 and f"{out}: nope: not in the pack".encode() in r.stderr


def test_tools_take_the_pack_first_and_describe_their_arguments(tmp_path):
    src = str(tmp_path / "src")
    simple_tree(src, dirs=2, files=3)
    out = str(tmp_path / "pack")
    run("pack", src, out, "-q")
    os.remove(os.path.join(src, "d1/f02"))
    new = run("pack", "diff", out, src, check=False)
    old = run("pack", "diff", src, out, check=False)
    assert new.returncode == old.returncode == 1
    assert new.stdout == old.stdout == b"D d1/f02\n"
    for tool, args in {"verify": ["PACK", "SRC"], "ls": ["PACK", "PATH"], "cat": ["PACK", "PATH"],
                       "diff": ["PACK", "SRC"]}.items():
        h = run("pack", tool, "--help").stdout.decode()
        usage = h.splitlines()[0] if h.startswith("Usage") else next(
            l for l in h.splitlines() if l.startswith("Usage:"))
        # PACK first, then the rest, each described under "Arguments:".
        assert usage.index("<PACK>") < usage.index(args[1]), usage
        described = h.split("Arguments:")[1].split("Options:")[0]
        for a in args:
            line = next(l for l in described.splitlines() if f"<{a}>" in l or f"[{a}]" in l)
            assert len(line.split(maxsplit=1)) == 2, f"{tool}: {a} is not described: {h}"
        assert "Exit status:" in h, h


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["INT", "TERM", "HUP"])
def test_an_interrupted_pack_removes_its_temporary_files(tmp_path, sig):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(16):
        # Compressible but not trivially: zstd at a high level on one thread takes seconds.
        (src / f"f{i}").write_bytes(bytes(b & 0x0F for b in os.urandom(1 << 20)))
    out = tmp_path / "out.granary"
    proc = subprocess.Popen([granary_bin(), "pack", str(src), str(out), "--compress", "zstd:19",
                             "--threads", "1", "-q"], stderr=subprocess.PIPE)
    tmp = tmp_path / f".out.granary.tmp-{proc.pid}"
    try:
        wait_for(lambda: (tmp / "part-00000").exists() or proc.poll() is not None,
                 "the pack to start its first partition")
        assert proc.poll() is None, "the pack finished before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ended by the signal (as without a handler), after removing what it wrote.
    assert proc.returncode == -sig, (proc.returncode, err)
    assert b"interrupted; the partial pack was removed" in err
    assert sorted(os.listdir(tmp_path)) == ["src"], os.listdir(tmp_path)
    # The next pack finds no leftover to report.
    nxt = run("pack", str(src), str(out), "--compress", "lz4")
    assert b"left by an interrupted pack" not in nxt.stderr
