"""Real clients through `granary run` give exactly what they give on the source.

Each program runs directly on the source, then through granary twice: the first run reads from
the source while the agent places files; the second (after placement settled) is served from the
tier. Outputs and bytes must be identical in all three.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CLIENTS, direct, make_dataset, source_meta, source_opens, tier_files


def three_ways(granary, source, tier, cmd, cwd_rel_ok=True):
    """(direct output, first granary run, second granary run), stdout bytes each."""
    want = direct(cmd)
    assert want.returncode == 0, want.stderr.decode(errors="replace")
    first, s1 = granary.run(source, cmd, tier=tier)
    granary.settle(source)
    second, s2 = granary.run(source, cmd, tier=tier)
    return want.stdout, first.stdout, second.stdout, s1, s2


def test_cat_and_sha256sum(granary, dataset, tier):
    files = sorted(str(p) for p in dataset.rglob("*") if p.is_file() and not p.is_symlink())
    for cmd in (["cat", *files], ["sha256sum", *files]):
        want, first, second, _, s2 = three_ways(granary, dataset, tier, cmd)
        assert first == want
        assert second == want
        assert tier_files(s2) >= len(files), s2
        assert source_opens(s2) == 0, s2


def test_tar_ls_find_stat_listings(granary, dataset, tier):
    cmds = [
        ["tar", "-C", dataset, "--sort=name", "-cf", "-", "."],
        ["ls", "-laR", "--time-style=full-iso", dataset],
        ["find", dataset, "-printf", "%p %s %m %i %n %U %G %T@ %C@ %y %l\n"],
        ["stat", "--format=%n %s %b %B %f %i %h %u %g %x %y %z %W", *sorted(dataset.rglob("*"))],
    ]
    for cmd in cmds:
        want, first, second, _, _ = three_ways(granary, dataset, tier, cmd)
        assert first == want, cmd[0]
        assert second == want, cmd[0]


def test_cp_recursive(granary, dataset, tier, tmp_path):
    granary.run(dataset, ["cat", *[p for p in dataset.rglob("*.jpg")]], tier=tier)
    granary.settle(dataset)
    dst = tmp_path / "copy"
    granary.run(dataset, ["cp", "-a", dataset, dst], tier=tier)
    diff = subprocess.run(["diff", "-r", "--no-dereference", dataset, dst], capture_output=True)
    assert diff.returncode == 0, diff.stdout.decode(errors="replace")


def test_python_stdlib_apis(granary, dataset, tier):
    cmd = [sys.executable, CLIENTS / "stdlib_probe.py", dataset]
    want, first, second, _, s2 = three_ways(granary, dataset, tier, cmd)
    want_doc = json.loads(want)
    assert json.loads(first) == want_doc
    assert json.loads(second) == want_doc
    assert tier_files(s2) > 0


def test_forked_loader_three_epochs_then_zero_source_calls(granary, dataset, tier):
    cmd = [sys.executable, CLIENTS / "loader.py", dataset, "--epochs", "3", "--workers", "3"]
    _, s1 = granary.run(dataset, cmd, tier=tier)
    assert source_opens(s1) > 0
    granary.settle(dataset)
    proc, s2 = granary.run(dataset, cmd, tier=tier)
    epochs = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    manifest = json.loads((dataset / "MANIFEST.json").read_text())
    # Every file of every epoch came from the tier; the source saw no call at all.
    assert tier_files(s2) >= 3 * len(manifest), s2
    assert source_opens(s2) == 0, s2
    assert source_meta(s2) == 0, s2


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is installed by the test command")
@pytest.mark.parametrize("engine", ["psync", "mmap"])
def test_fio_verifies_its_pattern(granary, tmp_path, engine):
    source = tmp_path / "pfs"
    (source / "fio").mkdir(parents=True)
    job = ["--name=verify", f"--directory={source / 'fio'}", "--bs=64k", "--size=8M", "--nrfiles=4",
           "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"]
    write = direct(["fio", *job, "--rw=write", "--do_verify=0", "--ioengine=psync"])
    assert write.returncode == 0, write.stderr
    read = ["fio", *job, "--rw=read", "--verify_only", f"--ioengine={engine}", "--readonly"]
    tier = tmp_path / "tier"
    for _ in range(2):
        proc, stats = granary.run(source, read, tier=tier)
        assert b"verify" in proc.stdout
        granary.settle(source)
    assert tier_files(stats) >= 4, stats


@pytest.mark.parametrize("lock", ["nolock", "lock"])
def test_lmdb_read_only(granary, tmp_path, lock):
    pytest.importorskip("lmdb", reason="the test command installs the python lmdb binding")
    source = tmp_path / "pfs"
    source.mkdir()
    subprocess.run([sys.executable, CLIENTS / "lmdb_reader.py", "make", source / "db", "300"], check=True)
    tier = tmp_path / "tier"
    cmd = [sys.executable, CLIENTS / "lmdb_reader.py", "read", source / "db", lock]
    first, _ = granary.run(source, cmd, tier=tier)
    granary.settle(source)
    second, s2 = granary.run(source, cmd, tier=tier)
    for out in (first, second):
        assert json.loads(out.stdout)["bad"] == 0
    assert tier_files(s2) >= 1, s2  # data.mdb came from the tier


def test_large_dataset_of_many_directories(granary, tmp_path):
    source = make_dataset(tmp_path / "many", classes=60, per_class=40, mean_size=2000, records=0)
    tier = tmp_path / "tier"
    cmd = [sys.executable, CLIENTS / "loader.py", source, "--epochs", "1", "--workers", "4"]
    granary.run(source, cmd, tier=tier)
    granary.settle(source)
    _, s2 = granary.run(source, cmd, tier=tier)
    assert source_opens(s2) == 0, s2


@pytest.mark.skipif(shutil.which("cc") is None, reason="the test command installs gcc")
def test_calls_passed_through_fit_in_a_signal_handlers_small_stack(granary, dataset, tier,
                                                                  tmp_path):
    """A handler on a 16 KiB alternate stack (a guard page below it) maps, grows, moves and
    drops anonymous memory, sends a message and reads `/dev/zero`: granary passes each call
    through, and its hooks must leave the stack to the program — a release build's hook once
    reserved 17 KiB of it for a path (reading /proc/self/maps) it did not take."""
    exe = tmp_path / "small_stack"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(CLIENTS / "small_stack.c")], check=True)
    some = next(p for p in sorted(dataset.rglob("*")) if p.is_file() and not p.is_symlink())
    want = direct([exe, some])
    assert want.returncode == 0, want
    got, _ = granary.run(dataset, [exe, some], tier=tier, check=False)
    assert got.returncode == 0, got.stderr.decode(errors="replace")[-2000:]
    assert json.loads(got.stdout) == json.loads(want.stdout)
    assert json.loads(want.stdout) == {"mapped": 1, "grown": 1, "unmapped": 1, "sent": 5,
                                       "read": 16, "closed": 1}
