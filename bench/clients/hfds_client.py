#!/usr/bin/env python3
"""Hugging Face `datasets` as a bench client: `load_from_disk` of a dataset `save_to_disk` wrote
in shards, `.shuffle(seed)` every epoch, every row iterated (the Arrow shards are memory-mapped:
the reads are page faults, in the shuffled order). Runs in the environment the bench installed
`datasets` in; `common.py` (standard library) beside it reports the bench's JSON lines.

Every row is checked: sha256 of its `data` bytes and its `label` against the manifest
(`rows`: id -> [label, sha256]), and every id must come exactly once per epoch.
"""

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MISMATCH_EXIT, Reporter, fail_mismatch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--root", required=True, help="the directory save_to_disk wrote")
    p.add_argument("--manifest", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tick", type=float, default=0.1)
    a, _ = p.parse_known_args()
    # Local files only: never ask the Hub for anything.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets  # the client's environment

    with open(a.manifest) as f:
        rows = {int(k): v for k, v in json.load(f)["rows"].items()}
    rep = Reporter(a.tick)
    t = time.time()
    ds = datasets.load_from_disk(a.root)
    rep.start(client="hf-datasets", version=datasets.__version__, rows=len(ds),
              load_seconds=time.time() - t)
    if len(ds) != len(rows):
        fail_mismatch(a.root, f"{len(ds)} rows, manifest {len(rows)}")
    for e in range(1, a.epochs + 1):
        begin = rep.epoch_begin(e)
        seen = set()
        # In memory: the default writes the shuffled indices beside the shards, and a shared
        # dataset directory is read-only.
        for row in ds.shuffle(seed=a.seed + e, keep_in_memory=True):
            i, data = row["id"], row["data"]
            label, digest = rows.get(i, (None, None))
            if i in seen or label != row["label"] or hashlib.sha256(data).hexdigest() != digest:
                fail_mismatch(f"row {i}", "duplicate" if i in seen else "label or data differ")
            seen.add(i)
            rep.consumed(len(data), 1)
            rep.verified(len(data))
        if len(seen) != len(rows):
            fail_mismatch(a.root, f"epoch {e}: {len(seen)} of {len(rows)} rows")
        rep.epoch_end(e, begin)
    rep.done()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException as e:  # a failed read is a failed job, said once
        sys.stderr.write(f"{type(e).__name__}: {e}\n")
        sys.exit(MISMATCH_EXIT if isinstance(e, ValueError) else 1)
