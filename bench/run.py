#!/usr/bin/env python3
"""granary's evaluation harness: one command, one report.

    sudo python3 bench/run.py --size quick            # ~5 minutes, results/quick/
    sudo python3 bench/run.py --size full             # ~38 minutes, results/full/

Builds an emulated PFS, generates the papers' datasets (docs/background.md) on it, runs every
workload under every setup (PFS, Local, Cache, granary), and writes
report.md, plots and results.json. See bench/README.md and --help.
"""

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from granary_bench import (clientenv, compact, config, dataset, deps, granary, pfs, report,  # noqa: E402
                           runner)

PROBE_BYTES = 64 << 20


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _raise_on_term(signum, frame):
    # SIGTERM/SIGHUP take the same path as Ctrl-C: unwind, tear everything down.
    raise KeyboardInterrupt(f"signal {signum}")


def machine_info():
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    return {"cpus": os.cpu_count(), "memory_gib": round(mem / (1 << 30), 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "git": rev.stdout.strip() or "?", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def main(argv=None):
    k = config.parse_args(argv)
    if k.report_only:
        report.write(compact.read(k.report_only), k.report_only, log)
        return 0
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_term)
    deps.ensure(log, want_strace=k.strace)
    t_start = time.time()
    if k.workdir.startswith(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep):
        sys.exit("--workdir must not be inside the repository (datasets are never committed)")
    os.makedirs(k.out, exist_ok=True)
    clients = _client_envs(k)
    names = sorted({config.WORKLOADS[config.workload_name(w)][0] for w in k.workloads})
    failed = True
    with contextlib.ExitStack() as stack:
        os.makedirs(k.workdir, exist_ok=True)
        if not k.keep:
            stack.callback(shutil.rmtree, k.workdir, True)
        emu = pfs.EmulatedPFS(k, log)
        estimate = _estimate_bytes(k)
        log(f"emulated PFS: {'root mode' if emu.root_mode else 'NO ROOT: unthrottled'}, "
            f"datasets ~{estimate >> 20} MiB")
        emu.setup(stack, int(estimate * 1.2) + PROBE_BYTES + (128 << 20))
        log(f"generating datasets {', '.join(names)} on {emu.mount}")
        t0 = time.time()
        datasets = dataset.generate(k, emu.mount, os.path.join(k.workdir, "manifests"), names,
                                    clients)
        probe = os.path.join(emu.mount, ".probe")
        with open(probe, "wb") as f:
            f.write(os.urandom(PROBE_BYTES))
        emu.seal()
        gen_secs = time.time() - t0
        for d in datasets.values():
            log(f"  {d.name}: {len(d.files)} files, {d.total_bytes / 1e6:.0f} MB "
                f"({d.stored_bytes / 1e6:.0f} MB allocated on the source)")
        emu.probe(probe, sys.executable)

        g, reason = granary.Granary.locate(k.granary, log)
        if g is None:
            log(f"granary setups will be skipped: {reason.splitlines()[0]}")
        else:
            log(f"granary: {g.path} ({g.version})")
            stack.callback(g.cleanup, emu.groups())
        bench = runner.Bench(k, emu, datasets, g, reason, log, clients)
        results, repeats = bench.run_all()
        data = {"knobs": {f: getattr(k, f) for f in k.__dataclass_fields__},
                "machine": machine_info(), "emulation": emu.params, "probe": emu.measured,
                "probe_numbers": emu.numbers,
                "datasets": {n: {"files": len(d.files), "bytes": d.total_bytes,
                                 "stored_bytes": d.stored_bytes}
                             for n, d in datasets.items()},
                "generation_seconds": gen_secs, "copies": bench.copies,
                "packs": getattr(bench, "packs", {}),
                "granary": {"path": g.path if g else None, "version": g.version if g else None,
                            "skipped_reason": reason},
                "clients": clients,
                "results": results, "repeats": repeats, "wall_seconds": time.time() - t_start,
                "command": " ".join(["python3", "bench/run.py", *(argv or sys.argv[1:])])}
        compact.write(data, k.out)
        report.write(data, k.out, log)
        failed = any(r["status"] in ("failed", "MISMATCH") for r in results + repeats)
    log(f"done in {time.time() - t_start:.0f}s: {os.path.join(k.out, 'report.md')}")
    return 1 if failed else 0


def _client_envs(k):
    """The real clients' environments, installed when missing (before anything is set up: a
    first install takes minutes). {workload: {"python": path} or {"skipped": reason}}; a
    client that cannot be installed is dropped from the run with the reason."""
    out = {}
    for w in list(k.workloads):
        name = config.workload_name(w)
        env = config.CLIENT_ENVS.get(name)
        if env is None or name in out:
            continue
        try:
            out[name] = {"python": clientenv.ensure(env, k.clients_dir, log)}
        except clientenv.Unavailable as e:
            log(f"workload {name} skipped: {e}")
            out[name] = {"skipped": str(e)}
            k.workloads = [x for x in k.workloads if config.workload_name(x) != name]
    return out


def _estimate_bytes(k):
    small = k.small_files * k.small_mean_kb * 1024 * 1.15
    names = {config.workload_name(w) for w in k.workloads}
    if "npz" in names:
        small += k.npz_files * (k.npz_kb + 4) * 1024
    if "dlio" in names:
        small += k.dlio_files * (k.dlio_record_length + 8192)
    if "hfds" in names:
        small += k.hfds_rows * (k.hfds_kb + 8) * 1024 * 1.2
    records = k.record_shards * k.record_max_mb * (1 << 20)
    fan = sum(n * s for n, s in ((k.fanstore_counts.get(d, 0), b)
                                 for d, b in dataset.FANSTORE_SIZES.items()))
    total = small + records + fan + (fan if "fanstorez" in names else 0)
    # Packs are written beside the datasets on the PFS: one more copy per packed setup.
    picked = {s for w in k.workloads for s in config.spec_setups(w) or []}
    packs = sum(1 for s in set(k.setups) | picked if s.startswith("granary-packed"))
    return int(total * (1 + packs))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); everything set up was torn down")
        sys.exit(130)
