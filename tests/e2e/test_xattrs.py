"""Extended attributes in a later job (issue 26): what tools ask every entry — `ls -l`'s ACL and
security-label queries, a listing of its attributes — is answered from the catalog where it is
provably the kernel's answer (the entry listed no attribute at the walk and its ctime, which
every attribute change moves, is unchanged; docs/preload-rules.md "Extended attributes"), and
everything else reaches the source: every answer is the one the program gets directly,
attributes changed between jobs included, and a copy's fd shows the source's attributes."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import direct

# Every path under the root (symlinks included, not followed): its attribute list and the value
# or errno of every attribute it lists and of the ones tools ask every entry about (`ls -l`,
# `ls --color`), by path (followed and not) and, for regular files, through an open fd (a copy's
# fd under granary).
DUMP = [sys.executable, "-c", """
import errno, os, sys
ASKED = ["system.posix_acl_access", "system.posix_acl_default", "security.selinux",
         "security.capability"]
def show(f, *a, **k):
    try:
        r = f(*a, **k)
        return sorted(r) if isinstance(r, list) else r.hex()
    except OSError as e:
        return errno.errorcode.get(e.errno, e.errno)
root = sys.argv[1]
paths = [root]
for d, dirs, files in os.walk(root):
    dirs.sort()
    paths += [os.path.join(d, n) for n in sorted(dirs + files)]
for p in paths:
    rel = os.path.relpath(p, root)
    for follow in (True, False):
        names = show(os.listxattr, p, follow_symlinks=follow)
        print(rel, follow, "list", names)
        for n in ASKED + (names if isinstance(names, list) else []):
            print(rel, follow, n, show(os.getxattr, p, n, follow_symlinks=follow))
    if os.path.isfile(p) and not os.path.islink(p):
        with open(p, "rb") as fh:
            fd = fh.fileno()
            names = show(os.listxattr, fd)
            print(rel, "fd list", names)
            for n in ASKED + (names if isinstance(names, list) else []):
                print(rel, "fd", n, show(os.getxattr, fd, n))
"""]

READ_ALL = [sys.executable, "-c", """
import os, sys
for d, dirs, files in os.walk(sys.argv[1]):
    for f in files:
        with open(os.path.join(d, f), 'rb') as fh:
            fh.read()
"""]


def tree(root: pathlib.Path):
    for d in range(3):
        (root / f"d{d}").mkdir(parents=True, exist_ok=True)
        for i in range(4):
            (root / f"d{d}" / f"f{i}").write_bytes(bytes([65 + i]) * (3000 + 100 * i + d))
    (root / "d0" / "link").symlink_to("f3")
    return root


def set_tag(path: pathlib.Path, value: bytes):
    try:
        os.setxattr(path, "user.tag", value)
    except OSError as e:
        pytest.skip(f"no user attributes on this file system: {e}")


def setfacl(*args) -> bool:
    if shutil.which("setfacl") is None:
        return False
    return subprocess.run(["setfacl", *map(str, args)], capture_output=True).returncode == 0


def own_agent(granary):
    """The next job starts an agent with its own configuration: the session's agent keeps the
    one of the job that started it (an earlier test's `immutable = true` would make every
    attribute change of a file invisible, as the declaration promises)."""
    granary.stop()


def config(tmp_path, threads):
    cfg = tmp_path / "granary.toml"
    cfg.write_text(f"[catalog]\nvalidate_threads = {threads}\n")
    return ["--config", str(cfg)]


def xattr_calls_on_source(log: pathlib.Path, src) -> list:
    return [line for line in log.read_text(errors="replace").splitlines()
            if str(src) in line and "xattr(" in line]


def test_ls_l_asks_the_source_no_extended_attribute_the_catalog_answers(granary, tmp_path):
    """`ls -l` asks for every entry's ACL and security label (`getxattr`, `lgetxattr`): on a
    validated entry that had no extended attribute at the walk, and whose ctime (which every
    attribute change moves) is unchanged, the catalog's answer is the source's, so nothing of
    it reaches the source — as its `stat` does not."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    log = tmp_path / "ls.strace"
    prog = ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(log), "ls", "-lR", str(src)]
    proc, _ = granary.run(src, prog, tier=tier)
    assert proc.stdout == direct(["ls", "-lR", src]).stdout
    calls = xattr_calls_on_source(log, src)
    assert calls == [], f"{len(calls)} extended-attribute calls reached the source: {calls[:3]}"


def test_attributes_read_as_directly_and_only_real_ones_reach_the_source(granary, tmp_path):
    """Files with attributes at the walk (a user attribute, an ACL) and without: every listing
    and value, by path and through a copy's fd, is the source's; only the files that have
    attributes are asked about them on the source (by path: the copy's own fd would answer
    for the copy)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    src = tree(tmp_path / "pfs" / "src")
    set_tag(src / "d0" / "f0", b"walked")
    with_acl = setfacl("-m", f"u:{os.getuid()}:r", src / "d0" / "f1")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    log = tmp_path / "dump.strace"
    prog = ["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-o", str(log), *DUMP, src]
    proc, stats = granary.run(src, prog, tier=tier)
    want = direct([*DUMP, src]).stdout
    assert b"user.tag 77616c6b6564" in want  # "walked", through the fd too
    assert proc.stdout == want
    assert stats["files_served_from_tiers"] >= 12, stats
    having = {str(src / "d0" / "f0")} | ({str(src / "d0" / "f1")} if with_acl else set())
    asked = {line.split('"')[1] for line in xattr_calls_on_source(log, src)}
    assert asked and asked <= having, asked - having


@pytest.mark.parametrize("restart", [False, True], ids=["agent-kept", "agent-restarted"])
@pytest.mark.parametrize("threads", [0, 4], ids=["no-background", "background"])
def test_attributes_changed_between_jobs_show_as_directly(granary, tmp_path, restart, threads):
    """Between two jobs: a user attribute added to a file that had none, one removed from a file
    that had one, one changed in value; an ACL added to a file, one removed, a default ACL given
    to a directory. The next job — its catalog kept or loaded, checked by the background
    validation or by the program itself — lists and reads every attribute, by path and by fd,
    and `ls -lR` shows every `+`, exactly as directly."""
    own_agent(granary)
    src = tree(tmp_path / "pfs" / "src")
    set_tag(src / "d0" / "f0", b"before")
    set_tag(src / "d0" / "f1", b"before")
    acl = setfacl("-m", f"u:{os.getuid()}:r", src / "d1" / "f1")
    tier = tmp_path / "tier"
    extra = config(tmp_path, threads)
    granary.run(src, [*READ_ALL, src], tier=tier, extra=extra)
    granary.settle(src)
    os.removexattr(src / "d0" / "f0", "user.tag")
    os.setxattr(src / "d0" / "f1", "user.tag", b"after")
    os.setxattr(src / "d0" / "f2", "user.tag", b"added")
    if acl:
        assert setfacl("-b", src / "d1" / "f1")
        assert setfacl("-m", f"u:{os.getuid()}:r", src / "d1" / "f2")
        assert setfacl("-d", "-m", f"u:{os.getuid()}:rx", src / "d2")
    if restart:
        granary.stop()
    proc, stats = granary.run(src, DUMP + [src], tier=tier, extra=extra)
    want = direct([*DUMP, src]).stdout
    assert b"d0/f2 fd user.tag 6164646564" in want  # "added", as the fd shows it
    assert proc.stdout == want
    ls = ["ls", "-lR", src]
    proc, _ = granary.run(src, ls, tier=tier, extra=extra)
    want = direct(ls).stdout
    assert proc.stdout == want
    if acl:
        assert want.count(b"+ ") == 2, want  # d1/f2's ACL and d2's default ACL


def test_ls_l_shows_an_acl_added_between_jobs(granary, tmp_path):
    """An ACL given to a file between two jobs (its ctime moves) shows in the next job's
    `ls -l` (the `+` after the mode) exactly as directly: whatever the catalog answers about
    extended attributes, it is the source's answer."""
    own_agent(granary)
    src = tree(tmp_path / "pfs" / "src")
    tier = tmp_path / "tier"
    granary.run(src, [*READ_ALL, src], tier=tier)
    granary.settle(src)
    if not setfacl("-m", f"u:{os.getuid()}:r", src / "d1" / "f2"):
        pytest.skip("no ACLs here (setfacl missing or refused)")
    ls = ["ls", "-lR", src]
    proc, _ = granary.run(src, ls, tier=tier)
    want = direct(ls).stdout
    assert b"+ " in want
    assert proc.stdout == want
