"""The wheel (issue 15): `maturin build --release --zig --compatibility manylinux_2_28` makes a
wheel that installs with pip into a fresh virtual environment and runs with no Rust and no build
tree: its `granary` carries the preload library and writes it out on first use. Every ELF it
holds or writes out needs glibc 2.28 at most.

The build takes minutes (a release build for another target), so this module builds once and
every test uses that wheel. It needs `maturin` and `ziglang` from PyPI (scripts/test.sh installs
them); without them it fails rather than skipping.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import CLIENTS, REPO, Granary, make_dataset

GLIBC_FLOOR = (2, 28)


def glibc_needed(elf: pathlib.Path):
    """The newest GLIBC_x.y version `elf` requires (`objdump -T`), as a tuple."""
    out = subprocess.run(["objdump", "-T", str(elf)], capture_output=True, text=True, check=True)
    versions = [tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out.stdout)]
    assert versions, f"{elf}: no glibc symbols found by objdump -T"
    return max(versions)


def is_elf(path: pathlib.Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if shutil.which("maturin") is None:
        pytest.fail("maturin not found: `pip install maturin ziglang` (scripts/test.sh does)")
    out = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run(
        ["maturin", "build", "--release", "--zig", "--compatibility", "manylinux_2_28",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheels = list(out.glob("granary-*manylinux_2_28_x86_64.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh venv with the wheel, and an environment without cargo, the build tree or any
    GRANARY_* variable; HOME is new, so the library is written out by this install."""
    base = tmp_path_factory.mktemp("venv")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", "-q", str(wheel)],
                   check=True, timeout=600)
    home = base / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRANARY_", "CARGO", "RUSTUP", "LD_"))}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}:/usr/bin:/bin",
               GRANARY_RUNTIME_DIR=str(base / "runtime"))
    work = base / "elsewhere"  # outside the clone
    work.mkdir()
    yield venv / "bin" / "granary", env, work, home
    subprocess.run([str(venv / "bin" / "granary"), "stop"], env=env, capture_output=True, timeout=120)


def settle(granary, env, data):
    """Waits (bounded) until the installed agent has placed what the first job asked for."""
    g = Granary(pathlib.Path(env["GRANARY_RUNTIME_DIR"]).parent)
    g.bin, g.env, g.runtime = str(granary), env, pathlib.Path(env["GRANARY_RUNTIME_DIR"])
    g.settle(data)


def test_every_elf_in_the_wheel_needs_glibc_2_28_at_most(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path)
    elves = [p for p in tmp_path.rglob("*") if p.is_file() and is_elf(p)]
    assert [p.name for p in elves] == ["granary"], elves
    for p in elves:
        assert glibc_needed(p) <= GLIBC_FLOOR, p


def test_the_installed_demo_is_served_by_its_own_library(installed):
    granary, env, work, home = installed
    assert shutil.which("cargo", path=env["PATH"]) is None
    proc = subprocess.run([str(granary), "demo", "--files", "300", "--epochs", "2"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(rows) == 2, proc.stdout
    # the reader's second epoch was served from the tier
    assert int(rows[1][-1]) > 0, proc.stdout
    libs = list((home / ".cache" / "granary").glob("*/libgranary_preload.so"))
    assert len(libs) == 1, libs
    assert glibc_needed(libs[0]) <= GLIBC_FLOOR


def test_an_installed_job_is_served_byte_for_byte(installed, tmp_path):
    granary, env, work, home = installed
    data = make_dataset(tmp_path / "data", records=1, record_size=1 << 20)
    reader = [sys.executable, str(CLIENTS / "tree_digest.py"), str(data)]
    want = json.loads(subprocess.run(reader, capture_output=True, check=True).stdout)
    for run in range(2):
        stats = tmp_path / f"stats{run}.json"
        proc = subprocess.run([str(granary), "run", "--source", str(data), "--tier",
                               f"{tmp_path / 'tier'}=1G", "--stats-json", str(stats), "--", *reader],
                              cwd=work, env=env, capture_output=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == want
        report = json.loads(stats.read_text())
        assert report["fallback"] is None and report["warnings"] == [], report
        if run == 0:
            settle(granary, env, data)
    assert report["files_served_from_tiers"] > 0, report
