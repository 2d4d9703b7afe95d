"""The job report counts what the program read from the source, whichever way it read it: `read`,
stdio (`fread`), fds opened O_RDWR, files created after the walk (docs/reliability.md)."""
import random
import sys

import pytest

from probes import make_tree, output, run_job

N = 300_000


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


READ = "import sys\nwith open(sys.argv[1], sys.argv[2]) as f: sys.stdout.write(str(len(f.read())))"


@pytest.mark.parametrize("how", ["cat", "python read", "fread", "O_RDWR", "created after the walk"])
def test_report_counts_source_bytes(granary, tmp_path, tier, how):
    src = make_tree(tmp_path / "src", {"data.bin": rand(N, 1)})
    path = src / "data.bin"
    cmd = {
        "cat": ["sh", "-c", 'cat "$0" | wc -c', path],
        "python read": [sys.executable, "-c", READ, path, "rb"],
        "fread": ["sha256sum", path],
        "O_RDWR": [sys.executable, "-c", READ, path, "r+b"],
        "created after the walk": ["sh", "-c", 'cp "$0" "$1" && cat "$1" | wc -c',
                                   tmp_path / "outside.bin", src / "new.bin"],
    }[how]
    if how == "created after the walk":
        (tmp_path / "outside.bin").write_bytes(rand(N, 2))
    got, stats = run_job(granary, src, cmd, tier)
    output(got)
    assert stats["source_io"]["bytes"] >= N, stats["source_io"]
