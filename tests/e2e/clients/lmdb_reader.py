#!/usr/bin/env python3
"""Creates (`make PATH N [shuffled]`) or reads back (`read PATH lock|nolock [PACE]`) an LMDB
database with the python `lmdb` binding. `make` writes N values of random sizes under keys
00000000.. in key order, or in a random order (`shuffled`: the values' pages are then scattered
over the file, away from the key order). `read` opens it read-only, iterates every record with a
cursor (sleeping PACE seconds after each) and checks each value against the digest stored at
creation; exits 1 on any mismatch.
"""
import hashlib
import json
import random
import sys
import time

import lmdb


def make(path: str, n: int, shuffled: bool) -> None:
    rng = random.Random(3)
    env = lmdb.open(path, map_size=1 << 30, subdir=True)
    digests = {}
    order = list(range(n))
    if shuffled:
        rng.shuffle(order)
    with env.begin(write=True) as txn:
        for i in order:
            key = f"{i:08d}".encode()
            val = rng.randbytes(rng.randint(1, 200_000))
            txn.put(key, val)
            digests[key.decode()] = hashlib.sha256(val).hexdigest()
    env.close()
    with open(path + ".digests.json", "w") as f:
        json.dump(digests, f)


def read(path: str, lock: bool, pace: float) -> None:
    with open(path + ".digests.json") as f:
        digests = json.load(f)
    env = lmdb.open(path, readonly=True, lock=lock, subdir=True)
    seen = 0
    bad = 0
    with env.begin() as txn:
        for key, val in txn.cursor():
            seen += 1
            if hashlib.sha256(val).hexdigest() != digests[key.decode()]:
                bad += 1
            if pace:
                time.sleep(pace)
    env.close()
    print(json.dumps({"records": seen, "bad": bad}))
    sys.exit(0 if bad == 0 and seen == len(digests) else 1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["shuffled"])
    else:
        read(sys.argv[2], sys.argv[3] == "lock", float(sys.argv[4]) if len(sys.argv) > 4 else 0)
