#!/bin/bash
# Which pages of one file enter the page cache more than once, and who read and evicted them:
# the kernel's filemap tracepoints, in a tracefs instance of our own (root; nothing global
# changed). Start it before a benchmark; it waits for FILE to exist, traces until it is gone
# (the benchmark's teardown), and writes OUT for bench/diag/pages.py.
#
#   bench/diag/trace_pages.sh /var/tmp/gb/pfs/lmdb/data.mdb /var/tmp/pages.txt &
#   python3 bench/mmap.py --size full --only three1 --workdir /var/tmp/gb
#   python3 bench/diag/pages.py /var/tmp/pages.txt
set -eu
f=$1 out=$2
I=/sys/kernel/tracing/instances/granary-pages-$$
mkdir -p "$I"
while [ ! -e "$f" ]; do sleep 0.2; done
sleep 3  # the dataset is written and flushed before the jobs
ino=$(stat -c %i "$f")
echo 20000 > "$I/buffer_size_kb"
for e in mm_filemap_add_to_page_cache mm_filemap_delete_from_page_cache; do
  echo "i_ino == $ino" > "$I/events/filemap/$e/filter"
  echo 1 > "$I/events/filemap/$e/enable"
done
echo 1 > "$I/tracing_on"
cat "$I/trace_pipe" > "$out" &
reader=$!
while [ -e "$f" ]; do sleep 0.5; done
sleep 1
kill $reader
echo 0 > "$I/tracing_on"
for e in mm_filemap_add_to_page_cache mm_filemap_delete_from_page_cache; do
  echo 0 > "$I/events/filemap/$e/enable"
done
rmdir "$I" 2>/dev/null || true
