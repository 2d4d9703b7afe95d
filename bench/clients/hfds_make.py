#!/usr/bin/env python3
"""Writes the bench's Hugging Face dataset with `datasets` itself: rows of (id, label, data:
random bytes, log-normal sizes around --mean-kb), `save_to_disk` in shards of at most
--max-shard-size; prints the manifest's rows (id -> [label, sha256 of data]) as JSON."""

import argparse
import hashlib
import json
import math
import os
import random


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out")
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--mean-kb", type=int, default=100)
    p.add_argument("--max-shard-size", default="64MB")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cache", required=True, help="datasets' cache directory (scratch)")
    a = p.parse_args()
    import datasets

    rng = random.Random(a.seed)
    sigma = 0.5
    mu = math.log(a.mean_kb * 1024) - sigma * sigma / 2
    rows = {}

    def gen():
        for i in range(a.rows):
            size = int(min(1 << 20, max(4096, rng.lognormvariate(mu, sigma))))
            data = os.urandom(size)
            label = rng.randrange(1000)
            rows[i] = [label, hashlib.sha256(data).hexdigest()]
            yield {"id": i, "label": label, "data": data}

    features = datasets.Features({"id": datasets.Value("int64"), "label": datasets.Value("int64"),
                                  "data": datasets.Value("binary")})
    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=a.cache)
    ds.save_to_disk(a.out, max_shard_size=a.max_shard_size)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
