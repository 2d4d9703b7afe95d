"""Directory fds handed to the program are real fds of the real directory: `rm -rf`,
`shutil.rmtree`, every `*at()` call, `fsync`, `fchdir`, `flock` behave exactly as without granary
(docs/reliability.md, "Failed or hung jobs")."""
import json
import random

from probes import fsprobe, make_tree, prime, run_job, same_run, twin


def test_directory_fds_are_the_real_directories(granary, tmp_path, tier):
    rng = random.Random(3)
    files = {}
    for top in ("a", "b"):
        for sub in ("s1", "s2/deeper"):
            for i in range(3):
                files[f"{top}/{sub}/f{i}.bin"] = rng.randbytes(2000 + i)
    files["c/x.bin"] = rng.randbytes(100)
    files["c/y.bin"] = rng.randbytes(200)
    files["c/keep/z.bin"] = rng.randbytes(300)
    files["e1/one.bin"] = b"1"
    files["e2/two.bin"] = b"2"
    src = make_tree(tmp_path / "a" / "src", files)
    other = twin(src, tmp_path / "b")
    prime(granary, src, tier)
    got, want, stats = same_run(granary, src, tier, fsprobe("dirfds", src),
                                fsprobe("dirfds", other))
    got, want = json.loads(got), json.loads(want)
    for key in want:
        assert got.get(key) == want[key], key
    assert got == want
    # What is left on disk is what the direct run left.
    left = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    assert left == sorted(str(p.relative_to(other)) for p in other.rglob("*"))


def test_rm_rf_of_the_whole_tree(granary, tmp_path, tier):
    src = make_tree(tmp_path / "scratch" / "src",
                    {f"d{i}/e{j}/f.bin": b"x" * (i * 10 + j) for i in range(3) for j in range(3)})
    prime(granary, src, tier)
    for cmd in (["rm", "-rf", src / "d0"], ["find", src, "-mindepth", "1", "-delete"]):
        got, stats = run_job(granary, src, cmd, tier)
        assert (got.returncode, got.stderr) == (0, b""), cmd
    assert list(src.iterdir()) == []
