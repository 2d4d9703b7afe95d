"""Programs in containers (issue 15), emulated with bubblewrap:

- Docker-shaped: private /dev (so its own /dev/shm), /tmp and /run, PID and network namespaces,
  only the source and the tier bound in;
- Apptainer-shaped: the host's /dev, a PID and a user namespace.

Each run reads the whole dataset (every byte hashed) and is compared with the same reader run
directly on the source; each asserts whether the tier served it and the report's warnings, which
must be present exactly when granary could not serve (and name the cause).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import CLIENTS, REPO, make_dataset, tier_files

READER = CLIENTS / "tree_digest.py"


def bwrap():
    path = shutil.which("bwrap")
    if not path:
        pytest.fail("bwrap not found: install bubblewrap (scripts/test.sh does)")
    return [path, "--die-with-parent"]


def visible_tools(granary):
    """Binds that keep the repository (reader, preload library) and the interpreter visible when
    /tmp is private (a clone may live under /tmp)."""
    dirs = {REPO, pathlib.Path(granary.bin).resolve().parent, pathlib.Path(sys.prefix).resolve()}
    out = []
    for d in sorted(dirs):
        out += ["--ro-bind", str(d), str(d)]
    return out


# pytest's base directory, where the tests keep the dataset, the tier and the agent's runtime: a
# container sees them only where they are bound. Under /tmp (pytest's default) the tmpfs hides
# them; `--basetemp` can put them anywhere, so that is hidden too.
BASETEMP: list = []


@pytest.fixture(scope="module", autouse=True)
def hidden_base(tmp_path_factory):
    BASETEMP[:] = [tmp_path_factory.getbasetemp().resolve()]


def docker_shaped(granary, binds, extra=()):
    hide = [a for d in BASETEMP if not d.is_relative_to("/tmp") for a in ("--tmpfs", str(d))]
    args = bwrap() + ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                      "--tmpfs", "/tmp", "--tmpfs", "/run", *hide] + visible_tools(granary)
    for src, dst in binds:
        args += ["--bind", str(src), str(dst)]
    return args + ["--unshare-pid", "--unshare-net", *extra]


def apptainer_shaped():
    return bwrap() + ["--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                      "--unshare-user", "--unshare-pid"]


def reader(root, *extra):
    return [sys.executable, str(READER), str(root), *extra]


@pytest.fixture(scope="module")
def warm(granary, tmp_path_factory):
    """A dataset and a tier holding all of it (a first job placed it)."""
    base = tmp_path_factory.mktemp("containers")
    data = make_dataset(base / "pfs" / "data", records=1, record_size=1 << 20)
    tier = base / "tier"
    want = subprocess.run(reader(data), capture_output=True, check=True, timeout=600).stdout
    proc, stats = granary.run(data, reader(data), tier=tier)
    assert proc.stdout == want
    granary.settle(data)
    return data, tier, json.loads(want)


def run(granary, warm, cmd, check=True):
    data, tier, _ = warm
    proc, stats = granary.run(data, cmd, tier=tier, check=check)
    return proc, stats


def test_a_plain_run_is_served_without_warnings(granary, warm):
    data, _, want = warm
    proc, stats = run(granary, warm, reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0
    assert stats["warnings"] == []


def test_docker_shaped_container_is_served(granary, warm):
    """The table's path (the runtime directory under /tmp) is hidden; the inherited fd is not."""
    data, tier, want = warm
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data), (tier, tier)])
                      + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_docker_shaped_workers_started_fresh_are_served(granary, warm, start):
    """spawn/forkserver workers are new interpreters started with every fd but the passed ones
    closed: the table fd must survive that, or they cannot reach the catalog in the container.
    The workers read every file; the parent only lists."""
    data, tier, want = warm
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data), (tier, tier)])
                      + reader(data, "--workers", "2", "--start", start))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]


def test_apptainer_shaped_container_is_served(granary, warm):
    data, _, want = warm
    proc, stats = run(granary, warm, apptainer_shaped() + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]


def test_cleared_environment_is_served(granary, warm):
    """`env -i` starts the reader without granary's variables: the library puts them back."""
    data, _, want = warm
    proc, stats = run(granary, warm, ["env", "-i", *reader(data)])
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]
    # GRANARY_DISABLE=1 in the child's environment keeps granary out of it, without a word.
    proc, stats = run(granary, warm, ["env", "-i", "GRANARY_DISABLE=1", *reader(data)])
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) == 0
    assert stats["warnings"] == [], stats["warnings"]


def test_cleared_environment_in_a_container_is_served(granary, warm):
    """bwrap's --clearenv: the variables are put back at its exec, the table reached by the fd."""
    data, tier, want = warm
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data), (tier, tier)],
                                                   ["--clearenv"]) + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]


def test_hidden_tier_is_named(granary, warm):
    data, tier, want = warm
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data)]) + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) == 0
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert f"tier 0 ({tier})" in w and "not visible" in w and f"--bind {tier}" in w, w


def test_source_bound_elsewhere_is_named(granary, warm):
    data, tier, want = warm
    elsewhere = pathlib.Path("/tmp/granary-elsewhere")
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, elsewhere), (tier, tier)])
                      + reader(elsewhere))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) == 0
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert "at another path" in w and f"-v {data}:{data}" in w, w


def test_source_not_bound_passes_through(granary, warm, tmp_path):
    """The container has a directory of its own at the source's path: the program must see it,
    never the catalog's listing of the host's."""
    data, tier, _ = warm
    own = tmp_path / "own"
    (own / "x").mkdir(parents=True)
    (own / "x" / "mine.bin").write_bytes(b"the container's own file")
    want = json.loads(subprocess.run(reader(own), capture_output=True, check=True).stdout)
    proc, stats = run(granary, warm, docker_shaped(granary, [(own, data), (tier, tier)])
                      + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) == 0 and stats["catalog_metadata_calls"] == 0
    assert any("did not see the source" in w for w in stats["warnings"]), stats["warnings"]


def test_hidden_catalog_is_named_and_binding_the_runtime_dir_fixes_it(granary, warm):
    """Without the fd (a launcher that drops it) and with its own /dev/shm and /tmp, the
    container cannot reach the table; the warning says to bind the runtime directory, and
    doing so serves it."""
    data, tier, want = warm
    hide = ["--unsetenv", "GRANARY_TABLE_FD"]
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data), (tier, tier)], hide)
                      + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) == 0
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert "did not attach" in w and f"--bind {granary.runtime}" in w, w

    rt = granary.runtime
    proc, stats = run(granary, warm, docker_shaped(granary, [(data, data), (tier, tier), (rt, rt)],
                                                   hide) + reader(data))
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0
    assert stats["warnings"] == [], stats["warnings"]


STATIC_CAT = r"""
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[65536];
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0) return 1;
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) write(1, buf, n);
        close(fd);
    }
    return 3;
}
"""


def test_static_program_is_named_and_its_status_kept(granary, warm, tmp_path):
    data, _, _ = warm
    src = tmp_path / "cat.c"
    src.write_text(STATIC_CAT)
    exe = tmp_path / "static-cat"
    subprocess.run(["cc", "-static", "-O1", "-o", str(exe), str(src)], check=True)
    files = sorted(p for p in data.rglob("*.jpg"))[:5]
    want = b"".join(p.read_bytes() for p in files)
    proc, stats = run(granary, warm, [exe, *files], check=False)
    assert proc.returncode == 3 and stats["exit_status"] == 3
    assert proc.stdout == want
    assert tier_files(stats) == 0
    assert len(stats["warnings"]) == 1, stats["warnings"]
    w = stats["warnings"][0]
    assert "no process of the program loaded" in w and "statically linked" in w, w


def flags(granary, data, tier, runtime):
    proc = subprocess.run([granary.bin, "container-flags", "--runtime", runtime, "--source",
                           str(data), "--tier", f"{tier}=1G"], capture_output=True, env=granary.env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode().strip()


def test_container_flags_name_every_bind_and_variable(granary, warm):
    data, tier, _ = warm
    lib = pathlib.Path(granary.bin).resolve().parent
    rt = granary.runtime
    groups = "".join(f" --group-add={g}" for g in sorted(set(os.getgroups())))
    user = f"--user={os.getuid()}:{os.getegid()}{groups}" if os.getuid() == 0 else \
        "--userns=keep-id --group-add=keep-groups"
    assert flags(granary, data, tier, "docker") == (
        f"--user={os.getuid()}:{os.getegid()}{groups} "
        f"--volume={data}:{data} --volume={tier}:{tier} --volume={rt}:{rt} --volume={lib}:{lib}:ro "
        "--env=LD_PRELOAD --env=GRANARY_TABLE --env=GRANARY_TABLE_ID --env=GRANARY_JOB_SLOT "
        "--env=GRANARY_SOURCE")
    assert flags(granary, data, tier, "podman") == (
        f"{user} "
        f"--volume={data}:{data} --volume={tier}:{tier} --volume={rt}:{rt} --volume={lib}:{lib}:ro "
        "--env=LD_PRELOAD --env=GRANARY_TABLE --env=GRANARY_TABLE_ID --env=GRANARY_JOB_SLOT "
        "--env=GRANARY_SOURCE")
    assert flags(granary, data, tier, "apptainer") == (
        f"--bind={data}:{data},{tier}:{tier},{rt}:{rt},{lib}:{lib}:ro")


def test_container_flags_suffice_for_a_daemon_started_container(granary, warm):
    """`docker run` gets neither fds nor environment from `granary run`: emulated by a container
    with a cleared environment that gets only what the printed flags give (binds, and each
    `--env=NAME` with the value it has in the job, as the docker client passes it)."""
    data, tier, want = warm
    inner = docker_shaped(granary, [], ["--clearenv"])
    for f in flags(granary, data, tier, "docker").split():
        name, _, value = f.partition("=")
        if name == "--volume":
            src, dst, *ro = value.split(":")
            inner += ["--ro-bind" if ro else "--bind", src, dst]
        elif name == "--env":
            inner += ["--setenv", value, f"${{{value}}}"]
        else:
            assert name in ("--user", "--group-add"), f  # the same user here
    script = " ".join(f'"{a}"' if a.startswith("${") else f"'{a}'" for a in inner + reader(data))
    proc, stats = run(granary, warm, ["sh", "-c", "exec " + script])
    assert json.loads(proc.stdout) == want
    assert tier_files(stats) > 0, stats
    assert stats["warnings"] == [], stats["warnings"]
