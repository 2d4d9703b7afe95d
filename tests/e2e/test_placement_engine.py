"""Issue "placement engine", checked where it matters: the source device. Bytes read from the
loop device are counted by the kernel (/sys/block/loopN/stat), with the page cache dropped first,
so nothing granary reports about itself is taken on trust."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import CLIENTS, make_dataset, source_opens
from test_source_device import device_reads, drop_caches, loop_source, two_epochs  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="loop devices and drop_caches need root")


def dataset_bytes(root: pathlib.Path, prefix="") -> int:
    manifest = json.loads((root / "MANIFEST.json").read_text())
    return sum((root / k).stat().st_size for k in manifest if k.startswith(prefix))


def run_epochs(granary, source, tier, client, epochs, dev, **kw):
    """Runs `client` for `epochs` epochs in one job; returns (sectors read per epoch, stats)."""
    drop_caches()
    start = device_reads(dev)[1]
    proc, stats = granary.run(source, [sys.executable, CLIENTS / client, source, "--epochs", epochs,
                                       *sum(([f"--{k.replace('_', '-')}", v] for k, v in kw.items()), [])],
                              tier=tier)
    granary.settle(source)  # background copies count too
    lines = [json.loads(l) for l in proc.stdout.decode().splitlines()]
    assert [l["epoch"] for l in lines] == list(range(epochs))
    return (device_reads(dev)[1] - start) * 512, stats


def test_small_files_are_read_from_the_source_once(granary, loop_source, tmp_path):
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=6, per_class=60, mean_size=110_000, records=0)
    size = dataset_bytes(source)
    read, stats = run_epochs(granary, source, tmp_path / "tier", "loader.py", 3, dev, workers=3)
    # The page cache is dropped before the job; the memory of the job is not capped here, so
    # anything above 1.0 is the agent reading what the program had already read.
    assert read <= 1.01 * size + (2 << 20), f"source device read {read} bytes for a {size}-byte dataset"
    # The agent copies from the page cache; a page evicted (or still under I/O) before it gets
    # there is read again — rare, and bounded like the device bytes above.
    assert stats["placement"].get("duplicate_bytes", 0) <= 0.01 * size, stats["placement"]


def test_large_records_are_read_from_the_source_once(granary, loop_source, tmp_path):
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=1, per_class=1, records=3, record_size=24 << 20)
    size = dataset_bytes(source, "records/")
    read, stats = run_epochs(granary, source, tmp_path / "tier", "records_reader.py", 2, dev,
                             interleave=2)
    assert read <= 1.01 * size + (2 << 20), f"source device read {read} bytes for {size} bytes of records"
    # The program's own reads of the shards were served by the agent's fetch, not the source.
    assert stats["source_io"]["bytes"] < size / 4, stats["source_io"]


def test_small_files_closed_by_exiting_fork_workers_are_placed(
        granary, loop_source, tmp_path):
    """Only files below the whole-fetch size, so nothing is read ahead and the agent leaves each
    close request to its idle-class workers (docs/placement.md, "Small files' close requests"):
    a fork pool whose workers end with `os._exit` (multiprocessing's), one of them starting a
    subprocess that reads a file, reads every file once; the next epoch, its page cache dropped,
    reads nothing from the source device: every file was placed. (Epoch 1's own device reads
    are not bounded here: on a loaded node main's agent too read 20–40 % of such a dataset
    again, 23.9 MB for 17.0 MB, when its copies came after the pages had gone.)"""
    dev, mnt = loop_source
    source = make_dataset(mnt / "data", classes=8, per_class=250, mean_size=8000, records=0)
    out, before, after = two_epochs(granary, dev, source, tmp_path)
    assert [json.loads(l)["epoch"] for l in out.decode().splitlines()] == [0, 1]
    assert after == before, f"epoch 2 read the source device: {before} -> {after}"


def mid_size_files(root: pathlib.Path, n: int, size: int) -> pathlib.Path:
    """`n` files of `size` random bytes in `root/train`, created in a scrambled order, and a
    manifest of their sha256s beside `root`."""
    train = root / "train"
    train.mkdir(parents=True)
    lines = []
    for k in range(n):
        i = (k * 7919 + 13) % n
        data = os.urandom(size)
        (train / f"img_{i:04}.npz").write_bytes(data)
        lines.append(f"img_{i:04}.npz\t{hashlib.sha256(data).hexdigest()}")
    (root.parent / "manifest.tsv").write_text("\n".join(sorted(lines)) + "\n")
    return train


@pytest.mark.parametrize("shuffle", [None, 7])
def test_a_reader_in_name_order_is_read_ahead(granary, loop_source, tmp_path, shuffle):
    """One reader of mid-size files in name order (DLIO's default): the agent fetches the next
    files before the program opens them (`placement.read_ahead`), every byte once from the
    source, none by the program itself. The same files in a shuffled order are never read
    ahead (their opens look nothing like a run)."""
    dev, mnt = loop_source
    # The emulated PFS's readahead, so 140 KB files are fetched whole (in one request).
    pathlib.Path(f"/sys/block/{os.path.basename(dev)}/queue/read_ahead_kb").write_text("128")
    n, size = 240, 140_000
    train = mid_size_files(mnt / "data", n, size)
    drop_caches()
    start = device_reads(dev)[1]
    cmd = [sys.executable, CLIENTS / "name_order_reader.py", train, mnt / "manifest.tsv"]
    if shuffle is not None:
        cmd += ["--shuffle", shuffle]
    proc, stats = granary.run(mnt / "data", cmd, tier=tmp_path / "tier")
    granary.settle(mnt / "data")
    read = (device_reads(dev)[1] - start) * 512
    assert json.loads(proc.stdout.decode().splitlines()[-1])["files"] == n
    assert read <= 1.01 * n * size + (2 << 20), f"source device read {read} bytes for {n * size}"
    pl = stats["placement"]
    assert stats["source_io"]["bytes"] == 0, "the program read the source itself"
    assert pl["duplicate_bytes"] == 0, pl
    if shuffle is None:
        # Read ahead from the sixth open on; a loaded machine may leave a few to the program's
        # own opens (the agent lagging behind), never most of them.
        assert pl["read_ahead"] >= n // 2, pl
    else:
        assert pl["read_ahead"] == 0, pl
