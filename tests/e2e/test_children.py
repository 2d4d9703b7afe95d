"""Programs the job's program starts (docs/reliability.md, "Programs the program starts"): one
started with an environment cleared of granary's variables gets them back from the library and
is served; one granary cannot serve (static, setgid) is named in the report only when it was
given a path of the dataset — `ldconfig -p`, `uname` and `true` read nothing of it and get no
warning. Every byte a child reads is compared with the source."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CLIENTS, make_dataset, tier_files
from test_containers import STATIC_CAT

READER = CLIENTS / "tree_digest.py"


@pytest.fixture(scope="module")
def warm(granary, tmp_path_factory):
    """A dataset and a tier holding all of it (a first job placed it), and its digest."""
    base = tmp_path_factory.mktemp("children")
    data = make_dataset(base / "pfs" / "data", records=1, record_size=1 << 20)
    tier = base / "tier"
    want = subprocess.run([sys.executable, str(READER), str(data)], capture_output=True,
                          check=True, timeout=600).stdout
    proc, _ = granary.run(data, [sys.executable, str(READER), str(data)], tier=tier)
    assert proc.stdout == want
    granary.settle(data)
    return data, tier, json.loads(want)


def python(code):
    return [sys.executable, "-c", code]


def test_helpers_with_a_cleared_environment_give_no_warning(granary, warm):
    """The issue's repro, and what `import torch` does: `ctypes.util.find_library` runs
    `/sbin/ldconfig -p` (static) with only LC_ALL and LANG; `uname` with nothing at all."""
    data, tier, _ = warm
    code = ("import subprocess, ctypes.util\n"
            "subprocess.run(['true'], env={'LC_ALL': 'C'}, check=True)\n"
            "assert ctypes.util.find_library('c'), 'ldconfig -p found no libc'\n"
            "subprocess.run(['uname', '-a'], env={}, check=True, stdout=subprocess.DEVNULL)\n")
    for quiet in ([], ["-q"]):
        proc, stats = granary.run(data, python(code), tier=tier, extra=quiet)
        assert stats["warnings"] == [], stats["warnings"]
        assert b"warning" not in proc.stderr, proc.stderr.decode()


SPAWN = {
    # CPython's subprocess: fork (or vfork) and execve with the given environment.
    "subprocess": "import subprocess, sys\n"
                  "r = subprocess.run([sys.executable, READER, DATA], env={'LC_ALL': 'C'},\n"
                  "                   capture_output=True, check=True)\n"
                  "sys.stdout.buffer.write(r.stdout)\n",
    # posix_spawn with an environment of its own.
    "posix_spawn": "import os, sys\n"
                   "r, w = os.pipe()\n"
                   "pid = os.posix_spawn(sys.executable, [sys.executable, READER, DATA],\n"
                   "                     {'LC_ALL': 'C'}, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])\n"
                   "os.close(w)\n"
                   "out = b''.join(iter(lambda: os.read(r, 65536), b''))\n"
                   "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n"
                   "sys.stdout.buffer.write(out)\n",
    # The program empties its own environment, then execv passes that on.
    "execv": "import os, sys\n"
             "os.environ.clear()\n"
             "os.execv(sys.executable, [sys.executable, READER, DATA])\n",
}


@pytest.mark.parametrize("how", SPAWN)
def test_a_python_child_with_a_cleared_environment_is_served(granary, warm, how):
    data, tier, want = warm
    code = f"READER, DATA = {str(READER)!r}, {str(data)!r}\n" + SPAWN[how]
    proc, stats = granary.run(data, python(code), tier=tier)
    assert json.loads(proc.stdout) == want
    # Only the child reads the dataset: what the tiers served, it read.
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]


def test_a_static_child_is_named_only_when_given_a_dataset_path(granary, warm, tmp_path):
    data, tier, _ = warm
    src = tmp_path / "cat.c"
    src.write_text(STATIC_CAT)
    exe = tmp_path / "static-cat"
    subprocess.run(["cc", "-static", "-O1", "-o", str(exe), str(src)], check=True)
    files = sorted(str(p) for p in data.rglob("*.jpg"))[:3]
    want = b"".join(open(f, "rb").read() for f in files)
    outside = tmp_path / "notes.txt"
    outside.write_bytes(b"not the dataset\n")
    # A path outside the dataset: nothing to say.
    code = ("import subprocess, sys\n"
            f"r = subprocess.run([{str(exe)!r}, {str(outside)!r}], capture_output=True)\n"
            "assert r.returncode == 3 and r.stdout == b'not the dataset\\n', r\n")
    proc, stats = granary.run(data, python(code), tier=tier)
    assert stats["warnings"] == [], stats["warnings"]
    # The dataset's files: correct bytes from the source, and the warning names the program
    # and the path.
    code = ("import subprocess, sys\n"
            f"r = subprocess.run([{str(exe)!r}, *{files!r}], capture_output=True, env={{}})\n"
            "assert r.returncode == 3, r\n"
            "sys.stdout.buffer.write(r.stdout)\n")
    proc, stats = granary.run(data, python(code), tier=tier)
    assert proc.stdout == want
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert str(exe) in w and files[0] in w and "statically linked" in w, w
    assert f"warning: {w}" in proc.stderr.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a program setgid to another group")
def test_a_setgid_child_given_a_dataset_path_is_named(granary, warm, tmp_path):
    data, tier, _ = warm
    exe = tmp_path / "sgid-cat"
    shutil.copy("/bin/cat", exe)
    os.chown(exe, 0, 65534)
    os.chmod(exe, 0o2755)
    f = sorted(str(p) for p in data.rglob("*.jpg"))[0]
    code = ("import subprocess, sys\n"
            f"sys.stdout.buffer.write(subprocess.run([{str(exe)!r}, {f!r}], check=True,\n"
            "                                        capture_output=True).stdout)\n")
    proc, stats = granary.run(data, python(code), tier=tier)
    assert proc.stdout == open(f, "rb").read()
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert str(exe) in w and f in w and "setgid" in w, w


def test_children_made_every_way_answer_in_their_own_process(granary, warm, tmp_path):
    """The library caches its pid (docs/reliability.md, "Children and the pid"): a child made by
    `fork`, by a raw fork system call (no atfork handler runs), by `clone` with and without
    `CLONE_VM`, or by `vfork` stats a placed file into its own buffer — never its parent's — and
    its close of an inherited fd leaves the parent's fd described as the file."""
    data, tier, _ = warm
    exe = tmp_path / "children_pid"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(CLIENTS / "children_pid.c")], check=True)
    placed = next(p for p in sorted(data.rglob("*")) if p.is_file())
    want = subprocess.run([exe, placed], capture_output=True, check=True, timeout=60).stdout
    assert want.count(b" 1") == 19 and b" 0" not in want, want.decode()
    proc, stats = granary.run(data, [exe, placed], tier=tier)
    assert proc.stdout.decode() == want.decode()
    assert tier_files(stats) >= 1
