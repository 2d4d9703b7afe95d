"""How a finished copy gets its object name: renamed from its temporary name, replacing an old
file a killed agent left under that name, which is never served. Every byte any program reads is
checked against the source, and every copy left in the tier against its file."""
import hashlib
import json
import pathlib
import sys


from conftest import CLIENTS, tier_files

LOADER = [sys.executable, str(CLIENTS / "loader.py")]


def sha(p: pathlib.Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def objects(tier: pathlib.Path):
    return [p for p in tier.rglob("*") if p.is_file() and p.parent.name == "objects"]


def manifest(dataset: pathlib.Path):
    return json.loads((dataset / "MANIFEST.json").read_text())


def assert_every_copy_is_its_files(tier: pathlib.Path, dataset: pathlib.Path, names=None):
    """Every file in the tier's object directories is a complete copy of a dataset file (of the
    one it was placed for, where `names` maps object names to files)."""
    want = {sha(p) for p in dataset.rglob("*") if p.is_file()}
    copies = objects(tier)
    assert copies, "nothing was placed"
    for p in copies:
        assert not p.name.startswith(".tmp-") and not p.name.endswith(".part"), p
        if names and p.name in names:
            assert sha(p) == sha(dataset / names[p.name]), f"{p} is not {names[p.name]}"
        else:
            assert sha(p) in want, f"{p} is no dataset file's copy"
    return copies


def test_an_old_file_under_an_object_name_is_replaced_never_served(granary, dataset, tier, tmp_path):
    """A killed agent can leave a complete copy under its object name that no saved catalog or
    copies record names. Here the first job places every file; then its catalog and record go (as
    if the agent had been killed before saving them), and once the next agent's sweep is done the
    program plants files of the wrong bytes under the object names of files not placed yet: each
    placement must replace the planted file, and no program may read one."""
    cmd = [*LOADER, dataset, "--epochs", "1", "--workers", "2"]
    granary.stop()
    granary.run(dataset, cmd, tier=tier)
    granary.settle(dataset)
    granary.stop()
    by_sum = {}
    for f in sorted(dataset.rglob("*")):
        if f.is_file():
            by_sum.setdefault(sha(f), str(f.relative_to(dataset)))
    names = {p.name: by_sum[sha(p)] for p in objects(tier)}
    assert len(names) > 10
    (objdir,) = {p.parent for p in objects(tier)}
    for p in objdir.parent.iterdir():
        if p.name != "objects":
            p.unlink()

    log = tmp_path / "agent.log"
    plant = tmp_path / "plant.py"
    plant.write_text(f"""
import os, sys, time
log, objdir, names = {str(log)!r}, {str(objdir)!r}, {sorted(names)!r}
# After the new agent's sweep (which deletes what no catalog names), so the plants stay.
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if os.path.exists(log) and "sweep removed" in open(log, errors="replace").read():
        break
    time.sleep(0.05)
for n in names:
    p = os.path.join(objdir, n)
    if not os.path.exists(p):
        with open(p, "wb") as f:
            f.write(b"planted, not the file's bytes " + n.encode())
os.execv(sys.argv[1], sys.argv[1:])
""")
    env = {"GRANARY_LOG": f"info:{log}"}
    granary.run(dataset, [sys.executable, plant, *cmd], tier=tier, env=env)
    granary.settle(dataset)
    _, stats = granary.run(dataset, cmd, tier=tier, env=env)
    assert tier_files(stats) > 0
    granary.stop()
    copies = assert_every_copy_is_its_files(tier, dataset, names)
    assert len(copies) == len(names)
