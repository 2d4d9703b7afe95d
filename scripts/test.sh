#!/usr/bin/env bash
# The test command of the README and of CI: installs what the tests need, builds everything,
# runs every test (the docs check, Rust unit, property and integration tests, then end-to-end
# tests that drive real programs — cat, tar, python, fio, lmdb — through `granary run`).
#
#   scripts/test.sh            everything
#   scripts/test.sh -k lmdb    extra arguments go to pytest (end-to-end tests only)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in fio:fio strace:strace mkfs.ext4:e2fsprogs losetup:mount setpriv:util-linux \
            pgrep:procps diff:diffutils cc:gcc setfacl:acl sqlite3:sqlite3 bwrap:bubblewrap \
            objdump:binutils mpirun:openmpi-bin mpicc:libopenmpi-dev \
            java:default-jdk-headless \
            slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge \
            nsenter:util-linux unshare:util-linux; do
    command -v "${pair%%:*}" >/dev/null || need_apt+=("${pair#*:}")
done
[ -e /usr/include/lmdb.h ] || need_apt+=(liblmdb-dev)
# Cluster mode (`granary serve`) links MPI through rsmpi, whose build runs bindgen, which loads
# libclang.so itself (libclang-cpp.so, which other LLVM packages bring, does not count).
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || need_apt+=(libclang-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: installing ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "test.sh: missing ${need_apt[*]} (not root: tests that need them are skipped)" >&2
    fi
fi
py_missing=()
python3 -c "import pytest" 2>/dev/null || py_missing+=(pytest)
python3 -c "import lmdb" 2>/dev/null || py_missing+=(lmdb)
# The metrics file's test parses it as a collector would.
python3 -c "import prometheus_client" 2>/dev/null || py_missing+=(prometheus_client)
# The wheel test (tests/e2e/test_wheel.py) builds a manylinux_2_28 wheel with zig.
command -v maturin >/dev/null || py_missing+=(maturin)
python3 -c "import ziglang" 2>/dev/null || py_missing+=(ziglang)
if [ ${#py_missing[@]} -gt 0 ]; then
    echo "test.sh: pip install ${py_missing[*]}"
    python3 -m pip install -q "${py_missing[@]}" 2>/dev/null \
        || python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi

# The docs name only what exists: paths into the code, files, links (scripts/check-docs.py --help).
python3 scripts/check-docs.py --self-test
python3 scripts/check-docs.py
cargo fmt --all --check
# The default build needs no MPI; the `mpi` feature adds `granary serve` (cluster mode).
cargo clippy --workspace --all-targets -q -- -D warnings
cargo clippy --workspace --all-targets -q --features granary/mpi -- -D warnings
cargo build --workspace
cargo test --workspace
cargo test -p granary-core --features shuttle --test shuttle
# The end-to-end tests drive target/debug/granary: built with MPI, so tests/e2e/test_cluster.py
# runs its 3-rank jobs (it is skipped only when the binary lacks the feature).
cargo build --workspace --features granary/mpi
# tests/e2e/test_slurm.py starts a Slurm cluster of its own (Debian's slurmctld, slurmd, munge)
# and runs docs/cluster.md's job script on it with that binary.
# Only failed tests keep their temporary directories: a passing run would leave ~11 GB (loop
# images, datasets, tiers) in /tmp for each of the last three runs.
python3 -m pytest tests/e2e -v -p no:cacheprovider -o tmp_path_retention_policy=failed "$@"
