#!/usr/bin/env bash
# The floor of a remote read on this machine (docs/cluster.md, "Measured"): what the kernel
# charges for a fresh staging copy's pages, an 8 MiB / 2 MiB MPI message between two ranks into
# fresh and into reused pages against a local read, and the latency of a control message between
# two ranks that poll with naps (as granary's communication threads do) or spin, and what a
# thread's wake-up costs in CPU: a nap that ends by itself against one another thread ends; and a
# same-host read's copy (process_vm_readv) into reused and fresh pages, in and out of cache, and
# against other ways of copying the same bytes (copy_paths).
#   bench/floor/run.sh            (needs mpicc/mpirun: openmpi-bin libopenmpi-dev)
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -o "$out/pages" pages.c
cc -O2 -pthread -o "$out/wakeups" wakeups.c
cc -O2 -o "$out/cma_copy" cma_copy.c
cc -O2 -o "$out/copy_paths" copy_paths.c
mpicc -O2 -o "$out/mpi_copy" mpi_copy.c
mpicc -O2 -o "$out/mpi_latency" mpi_latency.c
mpicc -O2 -o "$out/mpi_source_map" mpi_source_map.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
for n in 2097152 8388608; do "$out/pages" "$n" /dev/shm; done
for nap in 100 200; do "$out/wakeups" "$nap"; done
for n in 2097152 8388608; do "$out/cma_copy" "$n" 20; done
"$out/copy_paths" 2097152 64; "$out/copy_paths" 8388608 32
for n in 2097152 8388608; do mpirun -np 2 --oversubscribe "$out/mpi_copy" "$n" 20; done
for n in 2097152 8388608; do mpirun -np 2 --oversubscribe "$out/mpi_source_map" "$n" 30; done
mpirun -np 2 --oversubscribe "$out/mpi_latency" 0 1
for nap in 20 100; do for probes in 1 2; do
    mpirun -np 2 --oversubscribe "$out/mpi_latency" "$nap" "$probes"
done; done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
