#!/usr/bin/env python3
"""The training program of tests/e2e/test_slurm.py: one per node, started by the job script's
`granary run --attach`. Reads the dataset as a rank of a data-parallel job does
(cluster_reader.read_tree), then waits, bounded, until SIGUSR1 has arrived (Slurm's
`--signal=B:USR1@T`, passed on by the job script, srun and `granary run`; not with --no-usr1)
and until the test has looked at the serving ranks (the file --hold names exists). Writes what
it saw to OUT/<host name>.read.json once read and OUT/<host name>.done.json at the end: its pid,
listing and digests, whether it ran under granary, when USR1 came.
"""
import argparse
import json
import os
import signal
import socket
import sys
import time

from cluster_reader import read_tree

usr1_at = []
signal.signal(signal.SIGUSR1, lambda *_: usr1_at.append(time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hold", required=True)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--wait", type=float, default=240, help="at most this long for USR1")
    ap.add_argument("--no-usr1", dest="usr1", action="store_false",
                    help="wait for the hold file only")
    args = ap.parse_args()
    host = socket.gethostname()
    started = time.monotonic()
    listing, sums, errors = read_tree(args.root, seed=sum(map(ord, host)), every=args.every)
    read_s = time.monotonic() - started
    result = {"host": host, "pid": os.getpid(), "listing": listing, "sha256": sums,
              "errors": errors,
              "read_s": read_s, "usr1_before_read_end": bool(usr1_at),
              "preload": "libgranary_preload" in os.environ.get("LD_PRELOAD", ""),
              "table": bool(os.environ.get("GRANARY_TABLE"))}
    tmp = os.path.join(args.out, f".{host}.json")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, os.path.join(args.out, f"{host}.read.json"))
    deadline = time.monotonic() + args.wait
    while ((args.usr1 and not usr1_at) or not os.path.exists(args.hold)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    result["usr1"] = bool(usr1_at)
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, os.path.join(args.out, f"{host}.done.json"))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
