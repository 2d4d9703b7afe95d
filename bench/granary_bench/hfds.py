"""The Hugging Face dataset: written by `datasets` itself (`bench/clients/hfds_make.py`:
`Dataset.from_generator` of random rows, `save_to_disk` in shards), checksummed per row as
generated (id -> label, sha256 of its bytes) and per file (the shards, as every dataset)."""

import hashlib
import json
import os
import subprocess

CLIENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients")


def generate(python, base, knobs, scratch):
    """Writes the dataset into `base`; returns (files, manifest extras)."""
    os.makedirs(scratch, exist_ok=True)
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=os.path.join(scratch, "hf-home"))
    r = subprocess.run([python, os.path.join(CLIENTS, "hfds_make.py"), base,
                        "--rows", str(knobs.hfds_rows), "--mean-kb", str(knobs.hfds_kb),
                        "--max-shard-size", knobs.hfds_shard, "--seed", str(knobs.seed),
                        "--cache", os.path.join(scratch, "cache")],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"datasets' save_to_disk failed (status {r.returncode}):\n"
                           + r.stderr[-3000:])
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    files = []
    for name in sorted(os.listdir(base)):
        with open(os.path.join(base, name), "rb") as f:
            data = f.read()
        files.append((name, len(data), hashlib.sha256(data).hexdigest()))
    return files, {"rows": rows}
