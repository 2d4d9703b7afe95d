#!/usr/bin/env python3
"""Pages read more than once, from bench/diag/trace_pages.sh's output: per job (runs of page
insertions split at pauses), the bytes added, distinct, read twice, and for each MiB read twice
who read it first, who evicted it and who read it again (the thread names: `mappings` is the
agent's follower, `place-N` its fetch workers, the program's own name for its faults)."""
import collections
import re
import sys

PAT = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (mm_filemap_\w+): dev \S+ "
                 r"ino \w+ pfn=\w+ ofs=(\d+) order=(\d+)")


def main(path, gap=0.35):
    ev = []
    for line in open(path):
        m = PAT.match(line)
        if m:
            comm, _, t, kind, ofs, order = m.groups()
            ev.append((float(t), comm, kind.endswith("add_to_page_cache"), int(ofs) // 4096,
                       1 << int(order)))
    jobs, cur, last = [], [], None
    for e in ev:
        if e[2] and last is not None and e[0] - last > gap:
            jobs.append(cur)
            cur = []
        cur.append(e)
        if e[2]:
            last = e[0]
    jobs.append(cur)
    for s in jobs:
        adds = [e for e in s if e[2]]
        if not adds:
            continue
        t0 = adds[0][0]
        seen, gone, twice = {}, {}, []
        total = 0
        for t, comm, add, pg, n in s:
            for p in range(pg, pg + n):
                if add:
                    total += 1
                    if p in seen:
                        twice.append((p, comm, seen[p], gone.get(p, ("?", t0)), t))
                    seen[p] = (comm, t)
                else:
                    gone[p] = (comm, t)
        print(f"job at {t0:.1f}: {total * 4096 / 1e6:.1f} MB added, {len(seen) * 4096 / 1e6:.1f} "
              f"MB distinct, {len(twice) * 4096 / 1e6:.1f} MB read twice")
        by = collections.defaultdict(list)
        for r in twice:
            by[r[0] * 4096 >> 20].append(r)
        for mib in sorted(by):
            p, again, (first, t1), (evictor, t2), t3 = by[mib][0]
            print(f"  MiB {mib}: {len(by[mib])} pages; first by {first} at {t1 - t0:.2f} s, "
                  f"evicted by {evictor} at {t2 - t0:.2f} s, again by {again} at {t3 - t0:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1])
