#!/usr/bin/env python3
"""DLIO (argonne-lcf/dlio_benchmark 2.0.0) as a bench client: its PyTorch data loader and npz
reader, unchanged, on the bench's dataset, reporting the bench's JSON lines.

This script (standard library only) runs DLIO in the interpreter of the environment the bench
installed it in (`--python`), with DLIO's shipped `default` workload (PyTorch, npz, batch 4) and
overrides: the data folder, the number of files, one read thread (`--workers`), no evaluation,
no checkpoints, no emulated compute unless asked (`--computation-time`), and the bench's
verifying reader (`dlio_verify.VerifyingNPZReader`: DLIO's own NPZReader with every byte it reads
checked against the manifest). It translates DLIO's log into the bench's events:

  "Starting epoch N" -> tick (epoch begins), the reader's verified files -> ticks (timeline),
  "Ending epoch N"   -> epoch event, its time from DLIO's own two timestamps.

At the end every file of the manifest must have been verified once per epoch, or the run fails.
DLIO's tracer (dftracer, on by default in pydftracer 1.0.2) is turned off, as for any DLIO run
that is not being profiled.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time

from common import MISMATCH_EXIT, Reporter

HERE = os.path.dirname(os.path.abspath(__file__))
STARTING = re.compile(r"\] (\S+) Starting epoch (\d+)")
ENDING = re.compile(r"\] (\S+) Ending epoch (\d+) - (\d+) steps completed in (\S+) s")
STEP = re.compile(r"\] \S+ Rank \d+ step \d+ processed")


def _ts(text):
    """DLIO's timestamps (utcnow(): local time, microseconds) as seconds since the epoch."""
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def overrides(a, n_files, record_length):
    w = "++workload."
    return [
        "workload=default",
        f"{w}workflow.generate_data=False", f"{w}workflow.train=True",
        f"{w}workflow.evaluation=False", f"{w}workflow.checkpoint=False",
        f"{w}workflow.profiling=False",
        f"{w}dataset.data_folder={a.root}", f"{w}dataset.num_files_train={n_files}",
        f"{w}dataset.num_files_eval=0", f"{w}dataset.num_subfolders_train=0",
        f"{w}dataset.num_subfolders_eval=0", f"{w}dataset.record_length={record_length}",
        f"{w}dataset.keep_files=True",
        f"{w}reader.read_threads={a.workers}", f"{w}reader.batch_size={a.batch}",
        f"{w}reader.reader_classname=dlio_verify.VerifyingNPZReader",
        *([f"{w}reader.sample_shuffle=seed", f"{w}reader.file_shuffle=seed"] if a.shuffle else []),
        f"{w}train.epochs={a.epochs}", f"{w}train.computation_time={a.computation_time}",
        f"{w}train.seed={a.seed}",
        f"{w}output.folder={a.scratch}/output",
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", required=True, help="interpreter of DLIO's environment")
    p.add_argument("--root", required=True, help="DLIO's data folder (holds train/)")
    p.add_argument("--manifest", required=True)
    p.add_argument("--scratch", required=True, help="DLIO's working and output directory")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="DLIO's read_threads (1)")
    p.add_argument("--batch", type=int, default=4, help="DLIO's batch_size (4)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shuffle", action="store_true",
                   help="DLIO's sample_shuffle and file_shuffle = seed (default: DLIO's "
                        "default, files in name order)")
    p.add_argument("--computation-time", type=float, default=0.0,
                   help="DLIO's emulated compute per step, seconds (0)")
    p.add_argument("--tick", type=float, default=0.1)
    a, _ = p.parse_known_args()
    # DLIO runs in the scratch directory: paths must not be relative to ours.
    a.python, a.root, a.scratch, a.manifest = map(os.path.abspath, (a.python, a.root, a.scratch, a.manifest))

    with open(a.manifest) as f:
        m = json.load(f)
    files = {os.path.join(a.root, rel): size for rel, size, _ in m["files"]}
    os.makedirs(a.scratch, exist_ok=True)
    rep = Reporter(a.tick)
    rep.start(client="dlio", files=len(files), python=a.python)

    rd, wr = os.pipe()
    env = dict(os.environ, BENCH_ROOT=a.root, BENCH_MANIFEST=a.manifest,
               BENCH_VERIFY_FD=str(wr), DFTRACER_ENABLE="0", PYTHONUNBUFFERED="1",
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [a.python, "-m", "dlio_benchmark.main",
            *overrides(a, len(files), m["record_length"])]
    proc = subprocess.Popen(argv, cwd=a.scratch, env=env, pass_fds=(wr,),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.close(wr)

    verified = {}
    mismatches = []

    def read_verified():
        with os.fdopen(rd, "r") as f:
            for line in f:
                if line.startswith("{"):
                    bad = json.loads(line)
                    mismatches.append(bad)
                    rep.emit(ev="mismatch", path=bad.get("mismatch"), why=bad.get("why"))
                    continue
                n, path = line.rstrip("\n").split("\t", 1)
                verified[path] = verified.get(path, 0) + 1
                with rep.lock:
                    rep.verified_files += 1
                    rep.verified_bytes += int(n)
                rep.consumed(files.get(path, 0), 1)

    reader = threading.Thread(target=read_verified, daemon=True)
    reader.start()
    begin = None
    for line in proc.stdout:
        if STEP.search(line):
            continue
        sys.stderr.write(line)
        s = STARTING.search(line)
        if s:
            begin = rep.epoch_begin(int(s.group(2)))
            t0 = _ts(s.group(1))
            continue
        e = ENDING.search(line)
        if e and begin:
            epoch, t1 = int(e.group(2)), _ts(e.group(1))
            _, b0, s0 = begin
            rep.emit(ev="tick", t=time.time(), epoch=epoch, bytes=rep.bytes, samples=rep.samples)
            # The epoch as DLIO timed it (its own two timestamps), not as its lines arrived here.
            rep.emit(ev="epoch", epoch=epoch, t0=t0, t1=t1, seconds=t1 - t0,
                     bytes=rep.bytes - b0, samples=rep.samples - s0,
                     dlio_steps=int(e.group(3)), dlio_seconds=float(e.group(4)))
            begin = None
    rc = proc.wait()
    reader.join(timeout=30)
    if mismatches:
        sys.stderr.write(f"CHECKSUM MISMATCH: {mismatches[:3]}\n")
        os._exit(MISMATCH_EXIT)
    if rc != 0:
        sys.stderr.write(f"DLIO exited with status {rc}\n")
        sys.exit(rc if rc > 0 else 1)
    wrong = {p: n for p, n in verified.items() if n != a.epochs}
    missing = [p for p in files if p not in verified]
    if wrong or missing:
        rep.emit(ev="mismatch", path=(missing or list(wrong))[0],
                 why=f"{len(missing)} files never verified, {len(wrong)} verified a number of "
                     f"times other than {a.epochs}")
        os._exit(MISMATCH_EXIT)
    rep.done()


if __name__ == "__main__":
    main()
