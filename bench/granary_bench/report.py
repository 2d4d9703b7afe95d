"""report.md: the results as a person reads them, plus the figures.

Times are the client's own epoch times (what a training job would log); the
Local setup's copy is reported apart. Ratios are granary's time divided by the
alternative's: below 1 means granary is faster.
"""

import os

GRANARY = ("granary-full", "granary-half", "granary-packed", "granary-packed-zstd")


def _job_time(r):
    if r.get("epochs"):
        return sum(e["seconds"] for e in r["epochs"])
    return r.get("wall")


def _ratio(a, b):
    if a is None or not b:
        return "–"
    return f"{a / b:.2f}"


def _s(x):
    return "–" if x is None else f"{x:.1f}"


def _mb(b):
    return f"{b / 1e6:.0f}"


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _by_workload(results):
    out = {}
    for r in results:
        out.setdefault(r["workload"], {})[r["setup"]] = r
    return out


def _later(r):
    """Mean time of epochs 2.. (steady state), or None."""
    eps = r.get("epochs") or []
    return sum(e["seconds"] for e in eps[1:]) / (len(eps) - 1) if len(eps) > 1 else None


def ratio_rows(data):
    rows = []
    for wl, by in _by_workload(data["results"]).items():
        pfs, local = by.get("pfs"), by.get("local")
        copy = data["copies"].get(local["dataset"], {}).get("seconds") if local else None
        for g in GRANARY:
            r = by.get(g)
            if not r or r["status"] != "ok":
                continue
            t = _job_time(r)
            ok = lambda x: x if x and x["status"] == "ok" else None  # noqa: E731
            pfs_ok, local_ok = ok(pfs), ok(local)
            # Whole-job ratios need as many PFS epochs (an epoch-1 workload runs PFS for one).
            pfs_job = pfs_ok if pfs_ok and len(pfs_ok.get("epochs") or []) == len(
                r.get("epochs") or []) else None
            rows.append([
                wl, g,
                _ratio(t, _job_time(pfs_job) if pfs_job else None),
                _ratio(t, _job_time(local_ok) if local_ok else None),
                _ratio(t, _job_time(local_ok) + copy if local_ok and copy else None),
                _ratio(r["epochs"][0]["seconds"] if r.get("epochs") else None,
                       pfs_ok["epochs"][0]["seconds"] if pfs_ok and pfs_ok.get("epochs") else None),
                _ratio(_later(r), _later(local_ok) if local_ok else None),
                _ratio(r["source_total"]["bytes"], pfs_job["source_total"]["bytes"] if pfs_job else None),
                _ratio(r.get("wall"), pfs_job.get("wall") if pfs_job else None),
            ])
    return rows


def _longest_stall(r):
    """Longest time in epoch 1 during which the model received nothing."""
    ticks = [t for t in r.get("ticks", []) if t["epoch"] == 1]
    if len(ticks) < 2:
        return 0.0
    longest, last = 0.0, ticks[0]
    for t in ticks[1:]:
        if t["bytes"] > last["bytes"]:
            longest = max(longest, t["t"] - last["t"])
            last = t
    return longest


def _probe_bandwidth(data):
    """Bytes/s the start-up probe got with large requests; None without a probe."""
    n = data.get("probe_numbers") or {}
    if n.get("source_bandwidth_Bps"):
        return n["source_bandwidth_Bps"]
    best = None  # results.json of an older run: parse the probe's text
    for k, v in (data.get("probe") or {}).items():
        if "sequential" in k and "throttled" in k and "unthrottled" not in k and "256 KiB" not in k:
            try:
                x = float(str(v).split(" MB/s")[0]) * 1e6
            except ValueError:
                continue
            best = max(best or 0, x)
    return best


def _source_bandwidth(data):
    """The physical limit of the emulated PFS: the blkio read cap (`knobs.read_bps`). The probe
    reads only 64 MiB, and blk-throttle lets a short burst through above its rate (the probe
    measured 75-77 MB/s against a 67.1 MB/s cap), so the probe overstates what a long read
    can sustain; it is used only for an unthrottled run, and shown beside the cap."""
    cap = (data.get("knobs") or {}).get("read_bps")
    throttled = "throttled" in str((data.get("emulation") or {}).get("mode", ""))
    if cap and throttled:
        return cap
    return _probe_bandwidth(data)


def _halves(r):
    """(first-half MB/s, second-half MB/s) of epoch 1, halves by bytes delivered:
    the time at which the client had delivered half of epoch 1's bytes splits it
    (linear between the 0.1 s ticks)."""
    eps = r.get("epochs") or []
    ticks = sorted((t["t"], t["bytes"]) for t in r.get("ticks", []) if t["epoch"] == 1)
    if not eps or len(ticks) < 2:
        return None
    e = eps[0]
    b0 = ticks[0][1]
    total = e.get("bytes") or (ticks[-1][1] - b0)
    if not total:
        return None
    half = total / 2
    t_half = None
    for (ta, ba), (tb, bb) in zip(ticks, ticks[1:]):
        if bb - b0 >= half:
            ta_b = ba - b0
            t_half = ta + (tb - ta) * ((half - ta_b) / (bb - ba) if bb > ba else 1.0)
            break
    if t_half is None:
        return None
    first, second = t_half - e["t0"], e["t1"] - t_half
    if first <= 0 or second <= 0:
        return None
    return half / first / 1e6, half / second / 1e6


def _cached_bytes(r):
    """Bytes granary holds in its tiers at the end of the job: placement.bytes_placed
    (whole files) + placement.chunk_bytes_placed (chunks of PARTIAL files), capped at
    the sum of the tiers' `used` (placed bytes also count copies that known-order
    placement dropped again to make room)."""
    st = r.get("granary_stats") or {}
    pl = st.get("placement") or {}
    placed = pl.get("bytes_placed", st.get("bytes_placed"))
    if placed is not None:
        placed += pl.get("chunk_bytes_placed", 0)
    used = sum(t.get("used", 0) for t in st.get("tiers") or []) if st.get("tiers") else None
    if placed is None:
        return used, "tiers' used"
    if used is not None and used < placed:
        return used, "tiers' used (< bytes placed)"
    return placed, "bytes_placed + chunk_bytes_placed"


def measured_bar(data):
    """The issue's bar, computed from this run: rows of
    [criterion, workload, setup, measured, bar, verdict, how]."""
    rows = []
    bw = _source_bandwidth(data)

    def verdict(x, limit):
        if x is None or limit is None:
            return "n/a"
        return "**pass**" if x <= limit else "**FAIL**"

    def ok(r):
        return r if r and r.get("status") == "ok" else None

    for wl, by in _by_workload(data["results"]).items():
        if not any(s in by for s in ("pfs", "local", "granary-full", "granary-half")):
            continue  # only packed setups ran (`NAME@granary-packed`): their rows are packed's
        pfs, local = ok(by.get("pfs")), ok(by.get("local"))
        full, half = ok(by.get("granary-full")), ok(by.get("granary-half"))
        ds = data["datasets"].get((full or half or pfs or {}).get("dataset", ""), {})
        size = ds.get("bytes")
        # Source bytes are compared with what the dataset occupies on the source device:
        # a device reads whole blocks, so even one cold pass costs more than the file bytes.
        stored = ds.get("stored_bytes") or size
        e1 = lambda r: r["epochs"][0]["seconds"] if r and r.get("epochs") else None  # noqa: E731
        g1, p1 = e1(full), e1(pfs)
        if wl.startswith("records"):
            if g1 is not None and bw and size:
                limit_s = size / bw
                x = g1 / limit_s
                probe = _probe_bandwidth(data)
                rows.append(["epoch 1 / (dataset / source bandwidth)", wl, "granary-full",
                             f"{x:.2f}", "≤ 1.10", verdict(x, 1.10),
                             f"{g1:.1f} s; {size / 1e6:.0f} MB / {bw / 1e6:.1f} MB/s = "
                             f"{limit_s:.1f} s" + (f" (the 64 MiB probe: {probe / 1e6:.1f} MB/s, "
                                                   f"ratio {g1 / (size / probe):.2f})"
                                                   if probe and probe != bw else "")])
            else:
                rows.append(["epoch 1 / (dataset / source bandwidth)", wl, "granary-full", "–",
                             "≤ 1.10", "n/a", "no granary-full result or no probe"])
            x = g1 / p1 if g1 is not None and p1 else None
            rows.append(["epoch 1 / PFS epoch 1", wl, "granary-full", _f2(x), "≤ 0.85",
                         verdict(x, 0.85), f"{_s(g1)} s vs {_s(p1)} s"])
        if wl.startswith("npz"):
            rows += _epoch1_rows(data, wl, {"granary-full": full, "pfs": pfs}, size, bw,
                                 (("granary-full", 1.20), ("pfs", None)))
        if wl == "dlio":
            rows += _epoch1_rows(data, wl, {"granary-full": full, "local": local, "pfs": pfs},
                                 size, bw, (("granary-full", 1.05), ("local", None),
                                            ("pfs", None)))
        if wl.startswith("hfds-"):
            rows += _hfds_rows(wl, full, local, pfs, size, bw, e1)
        if wl.startswith("small"):
            x = g1 / p1 if g1 is not None and p1 else None
            rows.append(["epoch 1 / PFS epoch 1", wl, "granary-full", _f2(x), "≤ 1.00",
                         verdict(x, 1.00), f"{_s(g1)} s vs {_s(p1)} s"])
        x, how = _steady_state(data, wl, full, local)
        # DLIO's and HF datasets' jobs run one epoch by default: their bars are epoch 1.
        if x is not None or not (wl == "dlio" or wl.startswith("hfds")):
            rows.append(["mean of epochs ≥ 2 / Local's", wl, "granary-full", _f2(x), "≤ 1.05",
                         verdict(x, 1.05), how])
        for name, r in (("granary-full", full), ("granary-half", half)):
            if not r or not size:
                continue
            src = r["source_total"]["bytes"]
            x = src / stored
            if name == "granary-full":
                limit, how = 1.01, ""
            else:
                cached, which = _cached_bytes(r)
                if cached is None:
                    rows.append(["source bytes / dataset", wl, name, f"{x:.2f}", "–", "n/a",
                                 "no stats JSON: cached bytes unknown"])
                    continue
                unc = max(0.0, 1 - min(cached, size) / size)
                limit = 1.01 * (1 + 2 * unc)
                how = f"; uncached {unc:.2f} (cached {cached / 1e6:.0f} MB = {which})"
            ref = ""
            if pfs and pfs.get("source"):
                p_e1 = {str(b): v for b, v in pfs["source"].items()}.get("1", {}).get("bytes")
                if p_e1:
                    ref = f"; PFS-direct epoch 1 alone: {p_e1 / stored:.3f}"
            rows.append(["source bytes / dataset as stored", wl, name, f"{x:.3f}",
                         f"≤ {limit:.3f}", verdict(x, limit),
                         f"{src / 1e6:.1f} MB / {stored / 1e6:.1f} MB allocated "
                         f"({size / 1e6:.1f} MB of file bytes: {src / size:.3f}){how}{ref}"])
        h = _halves(full) if full else None
        if h:
            x = h[1] / h[0]
            rows.append(["epoch 1: 2nd-half / 1st-half throughput", wl, "granary-full",
                         f"{x:.2f}", "≥ 0.90", "**pass**" if x >= 0.9 else "**FAIL**",
                         f"{h[0]:.1f} → {h[1]:.1f} MB/s"])
        else:
            rows.append(["epoch 1: 2nd-half / 1st-half throughput", wl, "granary-full", "–",
                         "≥ 0.90", "n/a", "no timeline"])
    return rows


def _hfds_rows(wl, full, local, pfs, size, bw, e1):
    """Hugging Face datasets under memory cap CAP (`hfds-CAP`): where the mapped shards fit
    (CAP above the dataset), epoch 1 ≤ 1.2 × max(dataset ÷ bandwidth, Local's epoch 1); where
    they do not, epoch 1 ≤ PFS-direct's."""
    from .config import parse_size
    cap = parse_size(wl.split("-", 1)[1])
    g1, l1, p1 = e1(full), e1(local), e1(pfs)
    crit = "epoch 1 / max(dataset / bandwidth, Local epoch 1)"
    if not (size and bw):
        return [[crit, wl, "granary-full", "–", "≤ 1.20", "n/a", "no source bandwidth"]]
    if cap > size:
        if g1 is None or l1 is None:
            return [[crit, wl, "granary-full", "–", "≤ 1.20", "n/a", "no granary or Local run"]]
        ref = max(size / bw, l1)
        x = g1 / ref
        return [[crit, wl, "granary-full", f"{x:.2f}", "≤ 1.20",
                 "**pass**" if x <= 1.2 else "**FAIL**",
                 f"{g1:.1f} s; dataset / bandwidth {size / bw:.1f} s, Local {l1:.1f} s, "
                 f"PFS-direct {_s(p1)} s; cap {cap >> 20} MiB holds the {size / 1e6:.0f} MB"]]
    if g1 is None or p1 is None:
        return [["epoch 1 / PFS epoch 1", wl, "granary-full", "–", "≤ 1.00", "n/a",
                 "no granary or PFS-direct run"]]
    x = g1 / p1
    return [["epoch 1 / PFS epoch 1", wl, "granary-full", f"{x:.2f}", "≤ 1.00",
             "**pass**" if x <= 1.0 else "**FAIL**",
             f"{g1:.1f} s vs {p1:.1f} s; Local {_s(l1)} s; cap {cap >> 20} MiB < the "
             f"{size / 1e6:.0f} MB mapped"]]


def _median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _epoch1_rows(data, wl, main, size, bw, bars):
    """Epoch 1 over (dataset / source bandwidth) for each (setup, bar) of `bars` (bar None: a
    reference row), each the median of the main run (`main`: setup -> result) and its epoch-1
    repetitions (`--epoch1-pairs`)."""
    runs = {1: dict(main)}
    for r in data.get("repeats") or []:
        if r["workload"] == wl and r.get("kind") == "epoch1" and r["status"] == "ok":
            runs.setdefault(r["rep"], {})[r["setup"]] = r
    e1 = {s: [runs[k][s]["epochs"][0]["seconds"] for k in sorted(runs)
              if runs[k].get(s) and runs[k][s].get("epochs")] for s, _ in bars}
    if not (bw and size):
        return [["epoch 1 / (dataset / source bandwidth)", wl, "granary-full", "–",
                 f"≤ {bars[0][1]:.2f}", "n/a", "no source bandwidth"]]
    limit_s = size / bw
    rows = []
    for setup, bar in bars:
        t = e1[setup]
        if not t:
            rows.append(["epoch 1 / (dataset / source bandwidth)", wl, setup, "–",
                         "≤ 1.20" if bar else "(reference)", "n/a" if bar else "–",
                         f"no {setup} result"])
            continue
        x = _median(t) / limit_s
        how = (f"median of {len(t)} cold runs: " if len(t) > 1 else "") + ", ".join(
            f"{v:.1f}" for v in t) + f" s; {size / 1e6:.0f} MB / {bw / 1e6:.1f} MB/s = {limit_s:.1f} s"
        if setup != "granary-full" and e1["granary-full"]:
            how += (f"; granary-full / {setup} "
                    f"{_median(e1['granary-full']) / _median(t):.2f}")
        verdict = ("**pass**" if x <= bar else "**FAIL**") if bar else "–"
        rows.append(["epoch 1 / (dataset / source bandwidth)", wl, setup, f"{x:.2f}",
                     f"≤ {bar:.2f}" if bar else "(reference)", verdict, how])
    return rows


def _steady_state(data, wl, full, local):
    """Mean of epochs 2.. under granary-full over Local's: the median of the paired
    ratios of the main run and its repetitions (run k of Local with run k of granary)."""
    runs = {1: {"local": local, "granary-full": full}}
    for r in data.get("repeats") or []:
        if r["workload"] == wl and r["status"] == "ok" and r.get("kind", "steady") == "steady":
            runs.setdefault(r["rep"], {})[r["setup"]] = r
    pairs = []
    for rep in sorted(runs):
        g, l = runs[rep].get("granary-full"), runs[rep].get("local")
        gl, ll = (_later(g) if g else None), (_later(l) if l else None)
        if gl is not None and ll:
            pairs.append((gl / ll, gl, ll))
    if not pairs:
        return None, "no pair of granary-full and Local results"
    med = _median(p[0] for p in pairs)
    if len(pairs) == 1:
        return med, f"{_s3(pairs[0][1])} s vs {_s3(pairs[0][2])} s"
    return med, (f"median of {len(pairs)} paired runs: "
                 + ", ".join(f"{gl:.2f}/{ll:.2f} s = {x:.2f}" for x, gl, ll in pairs))


def _f2(x):
    return "–" if x is None else f"{x:.2f}"


def _s3(x):
    return "–" if x is None else f"{x:.2f}"


def anomalies(data):
    """Heuristic flags on granary's behaviour, for the people working on it."""
    out = []
    for wl, by in _by_workload(data["results"]).items():
        pfs = by.get("pfs")
        for g in GRANARY:
            r = by.get(g)
            if not r or r["status"] != "ok" or not r.get("epochs"):
                continue
            size = data["datasets"][r["dataset"]]["bytes"]
            src = {str(b): v for b, v in r["source"].items()}
            later = sum(v["bytes"] for b, v in src.items() if b.isdigit() and b != "1")
            if g == "granary-full" and later > 0.01 * size:
                out.append(f"{wl} / {g}: {later / 1e6:.1f} MB read from the PFS after epoch 1 "
                           "although the tier holds everything (placement lagging behind the job?)")
            e1 = src.get("1", {}).get("bytes", 0) + src.get("startup", {}).get("bytes", 0)
            if e1 > 1.05 * size:
                out.append(f"{wl} / {g}: epoch 1 read {e1 / 1e6:.0f} MB from the PFS for a "
                           f"{size / 1e6:.0f} MB dataset (+{(e1 / size - 1) * 100:.0f}% duplicate reads)")
            if pfs and pfs["status"] == "ok" and pfs.get("epochs"):
                a, b = r["epochs"][0]["seconds"], pfs["epochs"][0]["seconds"]
                if a > 1.1 * b:
                    out.append(f"{wl} / {g}: epoch 1 took {a:.1f} s, {a / b:.2f}x the PFS "
                               f"setup's {b:.1f} s")
                stall, base = _longest_stall(r), _longest_stall(pfs)
                if stall > 0.5 and stall > 2 * base:
                    out.append(f"{wl} / {g}: the model received nothing for {stall:.1f} s in "
                               f"epoch 1 (longest gap under PFS: {base:.1f} s)")
    for r in data["results"]:
        if r.get("memory", {}).get("oom_kill"):
            out.append(f"{r['workload']} / {r['setup']}: {r['memory']['oom_kill']} OOM kill(s) in "
                       "the memory cgroup")
    return out


def write(data, out, log):
    figs = {}
    try:
        from . import plots
        plots.epochs_stacked(data, os.path.join(out, "epochs.png"))
        figs["epochs"] = "epochs.png"
        plots.epoch1_throughput(data, os.path.join(out, "epoch1_throughput.png"))
        figs["throughput"] = "epoch1_throughput.png"
        plots.source_traffic(data, os.path.join(out, "source_traffic.png"))
        figs["source"] = "source_traffic.png"
        if plots.fanstore(data, os.path.join(out, "fanstore.png")):
            figs["fanstore"] = "fanstore.png"
    except ImportError as e:
        log(f"no plots: {e}")
    md = render(data, figs)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)


def render(data, figs):
    k, m = data["knobs"], data["machine"]
    res = data["results"]
    L = []
    L.append(f"# granary evaluation — `{k['size']}` run\n")
    L.append(f"{m['date']} · {m['cpus']} CPUs, {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
             f"Python {m['python']} · git `{m['git']}` · granary: "
             f"{data['granary']['version'] or 'not run'} · whole run {data['wall_seconds']:.0f} s\n")
    L.append(f"Command: `{data['command']}`\n")
    if not str(data["emulation"].get("mode", "")).startswith("throttled"):
        L.append("> **Not PFS-like**: this run had no root (or no cgroup-v1 blkio/memory), so the "
                 "source was a plain directory, unthrottled, with no page-cache cap and no device "
                 "counters (source traffic reads 0). Only correctness and relative overheads mean "
                 "anything here.\n")
    bad = [r for r in res if r["status"] not in ("ok", "skipped")]
    if bad:
        L.append("> **FAILED RUNS** — the numbers of these jobs are not valid:\n>")
        for r in bad:
            L.append(f"> - {r['workload']} / {r['setup']}: **{r['status']}** — "
                     f"{r.get('reason', '').splitlines()[0] if r.get('reason') else ''}")
        L.append("")
    skipped = sorted({(r["setup"], r.get("reason", "")) for r in res if r["status"] == "skipped"})
    if skipped:
        L.append("Skipped: " + "; ".join(f"{s} ({why.splitlines()[0]})" for s, why in skipped) + "\n")

    L.append("## Headline: granary against the alternatives\n")
    L.append("Each cell is granary's time divided by the alternative's (below 1: granary is "
             "faster). *Job* = sum of the epoch times as the client logs them; *Local+copy* "
             "adds the up-front copy; *later epochs* compares the mean of epochs 2.. with "
             "Local's; *source bytes* is the ratio of bytes read from the emulated PFS over the "
             "whole job; *process wall* is the time of the whole command, including granary's agent "
             "start and catalog walk. Whole-job PFS ratios are left out (–) where PFS-direct ran "
             "fewer epochs (npz: one, its bar compares epoch 1).\n")
    rows = ratio_rows(data)
    if rows:
        L.append(_table(["workload", "setup", "job / PFS", "job / Local", "job / (Local+copy)",
                         "epoch 1 / PFS epoch 1", "later epochs / Local", "source bytes / PFS",
                         "process wall / PFS"],
                        rows))
    else:
        L.append("_No granary results in this run" +
                 (f": {data['granary']['skipped_reason'].splitlines()[0]}"
                  if data["granary"].get("skipped_reason") else "") + "._\n")

    bar = measured_bar(data)
    from . import packed
    pbar = packed.bar_rows(data, _source_bandwidth(data))
    if bar or pbar:
        L.append("## Measured bar\n")
        L.append("The issue's criteria, computed from this run. *Source bandwidth* is the "
                 "emulated PFS's physical limit, the blkio read cap (the start-up probe, a short "
                 "64 MiB read that the throttle's burst allowance flatters, is shown beside it); "
                 "*source bytes* are the loop device's bytes over the "
                 "whole job (start-up, the epochs, and the agent's copies until `granary stop`), "
                 "divided by the dataset *as stored*: the blocks its files and directories occupy "
                 "on the source file system (`du`), the least any reader can fetch — one cold "
                 "PFS-direct pass is shown beside it; "
                 "*epochs ≥ 2 / Local's* is the median of the paired ratios of the main run and "
                 "its repetitions (`--repeat`, for workloads whose epochs are short enough for "
                 "timer and neighbour noise to matter); "
                 "granary-half's allowance is 1.01 × (1 + 2 × uncached fraction), the uncached "
                 "fraction = 1 − cached bytes / dataset bytes, cached bytes = the job's stats JSON "
                 "`placement.bytes_placed` + `placement.chunk_bytes_placed` (chunks of partially "
                 "placed files), capped at the sum of the tiers' `used`; epoch-1 "
                 "halves are split by bytes delivered (the moment the client had delivered half "
                 "of epoch 1's bytes, from its 0.1 s timeline).\n")
        if k.get("size") == "quick":
            L.append("In a quick run epochs 2.. take 0.1–0.3 s: the *epochs ≥ 2 / Local* rows are "
                     "within timer noise here; read them on a full run.\n")
        if bar:
            L.append(_table(["criterion", "workload", "setup", "measured", "bar", "", "numbers"],
                            bar))
        if pbar:
            L.append("\n### Serving a pack (`granary run --pack`)\n")
            L.append("The dataset packed once with `granary pack` onto the emulated PFS (time "
                     "and traffic below, like Local's copy), then served from the pack: "
                     "*packed size* = the index and partitions as stored; *source opens* = the "
                     "program's opens of source paths + the agent's partition opens (its "
                     "counters) + 1 for the index; the compressed pack's *ratio* = the raw "
                     "dataset over the pack's bytes.\n")
            L.append(_table(["pack", "codec", "seconds", "source MB read", "partitions", "MB"],
                            packed.pack_rows(data)))
            L.append(_table(["criterion", "workload", "setup", "measured", "bar", "", "numbers"],
                            pbar))
            bar = bar + pbar
        fails = sum(1 for r in bar if "FAIL" in r[5])
        L.append(f"{sum(1 for r in bar if 'pass' in r[5])} pass, {fails} fail"
                 + (f", {sum(1 for r in bar if r[5] == 'n/a')} n/a" if any(r[5] == 'n/a' for r in bar)
                    else "") + ".\n")

    notes = anomalies(data)
    if notes:
        L.append("### Things to look at (automatic checks)\n")
        L.extend(f"- {n}" for n in notes)
        L.append("")

    L.append("## Job time per epoch\n")
    if "epochs" in figs:
        L.append(f"![job time per setup, stacked by epoch]({figs['epochs']})\n")
    for wl, by in _by_workload(res).items():
        n_ep = max((len(r.get("epochs") or []) for r in by.values()), default=0)
        rows = []
        for s, r in by.items():
            if r["status"] == "skipped":
                rows.append([r["label"]] + ["–"] * (n_ep + 3) + [f"skipped: {r['reason']}"])
                continue
            eps = [_s(e["seconds"]) for e in r.get("epochs") or []]
            eps += ["–"] * (n_ep - len(eps))
            copy = data["copies"].get(r["dataset"], {}).get("seconds") if s == "local" else None
            note = r["status"] if r["status"] != "ok" else ""
            if r.get("memory", {}).get("oom_kill"):
                note += f" OOM kills: {r['memory']['oom_kill']}"
            rows.append([r["label"], *eps, _s(_job_time(r)), _s(copy), _s(r.get("wall")), note])
        L.append(f"### {wl}\n")
        L.append(_table(["setup", *[f"epoch {i}" for i in range(1, n_ep + 1)], "job (s)",
                         "copy (s)", "process wall (s)", "note"], rows))

    reps = data.get("repeats") or []
    if reps:
        L.append("### Repetitions\n")
        L.append("Run again after the main run, alternating, same cold start each time; "
                 "run 1 is the main run above. *steady*: Local and granary-full, for epochs ≥ 2; "
                 "*epoch 1*: PFS-direct and granary-full, one epoch each, for the epoch-1 bar.\n")
        rows = []
        for wl, by in _by_workload(res).items():
            for kind, names in (("steady", ("local", "granary-full")),
                                ("epoch1", ("pfs", "granary-full"))):
                if not any(x["workload"] == wl and x.get("kind", "steady") == kind for x in reps):
                    continue
                tag = " (epoch 1)" if kind == "epoch1" else ""
                for r in [by.get(n) for n in names]:
                    if r and r["status"] == "ok":
                        rows.append([wl, r["label"] + tag, 1,
                                     *[_s3(e["seconds"]) for e in r["epochs"]], _s3(_later(r)), ""])
            for r in reps:
                if r["workload"] == wl:
                    label = by.get(r["setup"], {}).get("label", r["setup"])
                    if r.get("kind") == "epoch1":
                        label += " (epoch 1)"
                    rows.append([wl, label, r["rep"], *[_s3(e["seconds"]) for e in r["epochs"]],
                                 _s3(_later(r)), "" if r["status"] == "ok" else r["status"]])
        n_ep = max(len(r) for r in rows) - 5
        rows = [r[:3 + len(r) - 5] + ["–"] * (n_ep - (len(r) - 5)) + r[-2:] for r in rows]
        L.append(_table(["workload", "setup", "run", *[f"epoch {i}" for i in range(1, n_ep + 1)],
                         "mean of epochs ≥ 2", "note"], rows))

    L.append("## Throughput during epoch 1\n")
    if "throughput" in figs:
        L.append(f"![epoch 1 throughput]({figs['throughput']})\n")
    L.append("Solid lines: MB/s delivered to the model (the client's own counter, sampled every "
             "0.1 s). Dotted: MB/s read from the emulated PFS (loop device counters, every 50 ms) "
             "— for granary this includes the agent's background copying.\n")

    L.append("## Source traffic per epoch\n")
    if "source" in figs:
        L.append(f"![source traffic]({figs['source']})\n")
    L.append("Counted outside granary, from `/sys/block/<loop>/stat` (reads completed, sectors "
             "read), cut when the harness receives each epoch's first and last line. *startup* is "
             "before epoch 1 (process start, agent start), *after* is after the last epoch until "
             "the agent was stopped. Cells: MB / device reads.\n")
    for wl, by in _by_workload(res).items():
        rows = []
        n_ep = 0
        for r in by.values():
            if r["status"] == "skipped":
                continue
            src = {str(b): v for b, v in r.get("source", {}).items()}
            eps = sorted(int(b) for b in src if b.isdigit())
            n_ep = max(n_ep, len(eps))
            cells = [f"{_mb(src[b]['bytes'])} / {src[b]['reads']}" if b in src else "–"
                     for b in ["startup", *map(str, eps), "after"]]
            rows.append([r["label"], *cells,
                         f"{_mb(r['source_total']['bytes'])} / {r['source_total']['reads']}"])
        if rows:
            L.append(f"### {wl}\n")
            L.append(_table(["setup", "startup", *[f"epoch {i}" for i in range(1, n_ep + 1)],
                             "after", "total"], rows))
    disk_rows = []
    reps = data.get("repeats") or []
    for wl, by in _by_workload(res).items():
        runs = [(1, by.get(s)) for s in ("local", "granary-full", "granary-half")]
        runs += [(r["rep"], r) for r in reps if r["workload"] == wl]
        for run, r in runs:
            if not r or r["status"] != "ok" or not r.get("local_disk"):
                continue
            d = {str(b): v for b, v in r["local_disk"].items()}
            eps = sorted(int(b) for b in d if b.isdigit())
            label = by.get(r["setup"], {}).get("label", r["setup"])
            disk_rows.append([wl, label, run, *[f"{d[str(e)]['bytes'] / 1e6:.0f}" for e in eps]])
    if disk_rows:
        n_ep = max(len(r) for r in disk_rows) - 3
        disk_rows = [r + ["–"] * (n_ep + 3 - len(r)) for r in disk_rows]
        L.append("### Local disk reads per epoch\n")
        L.append("MB read from the block device that holds the Local copy and granary's tiers "
                 "(`/sys/dev/block/<dev>/stat`, same epoch cuts): in epochs ≥ 2 these are the "
                 "page-cache misses, where a placed epoch and Local's can differ under the "
                 "memory cap. The device is shared with everything else on the machine, including the "
                 "emulated PFS's image file: epoch 1 counts the source reads a second time.\n")
        L.append(_table(["workload", "setup", "run", *[f"epoch {i}" for i in range(1, n_ep + 1)]],
                        disk_rows))
    gst = [r for r in res if r.get("granary_stats")]
    if gst:
        L.append("granary's placement counters per job (from its `--stats-json`, kept as "
                 "`raw/logs/<workload>-<setup>.stats.json`, not committed): *page cache* = bytes of small-file "
                 "copies taken from pages the program had just read (no source traffic), "
                 "*duplicate* = bytes the agent read from the source that the program had read "
                 "already (in the device bytes above), *agent source* = all the agent's source "
                 "bytes, *no room* = files no tier had room for, *reuse rejected* = catalog "
                 "entries of an earlier run not reused.\n")
        rows = []
        for r in gst:
            st = r["granary_stats"]
            pl, cat = st.get("placement", {}), st.get("catalog", {})
            rows.append([r["workload"], r["setup"], _mb(pl.get("page_cache_bytes", 0)),
                         _mb(pl.get("duplicate_bytes", 0)), _mb(pl.get("agent_source_bytes", 0)),
                         _mb(pl.get("bytes_placed", 0)), pl.get("no_room", "–"),
                         pl.get("evictions", "–"), cat.get("reuse_rejected", "–"),
                         r.get("granary_stats_file", "–")])
        L.append(_table(["workload", "setup", "page cache MB", "duplicate MB", "agent source MB",
                         "placed MB", "no room", "evictions", "reuse rejected", "stats JSON"],
                        rows))
    traced = [r for r in res if r.get("strace") is not None]
    if traced:
        L.append("System calls of the job (strace -f, not the agent) that name a path under the "
                 "source, per epoch — metadata and open calls that reach the PFS:\n")
        buckets = sorted({str(b) for r in traced for b in r["strace"]},
                         key=lambda b: (not b.isdigit(), int(b) if b.isdigit() else 0, b))
        L.append(_table(["workload", "setup", *buckets], [
            [r["workload"], r["setup"]] + [
                ", ".join(f"{n} {c}" for n, c in sorted(r["strace"].get(b, {}).items())) or "0"
                for b in buckets]
            for r in traced]))
    copies = data.get("copies") or {}
    if copies:
        L.append("Local setup copies (`cp -a` from the emulated PFS, before the job, page cache "
                 "cold):\n")
        L.append(_table(["dataset", "seconds", "source MB", "source reads"],
                        [[d, _s(c["seconds"]), _mb(c["source_bytes"]), c["source_reads"]]
                         for d, c in copies.items()]))

    fan = [r for r in res if r["workload"] == "fanstore" and r["status"] == "ok"
           and r.get("epochs") and r["epochs"][0].get("per_size")]
    if fan:
        L.append("## FanStore micro-benchmark\n")
        if "fanstore" in figs:
            L.append(f"![fanstore]({figs['fanstore']})\n")
        sizes = list(fan[0]["epochs"][0]["per_size"])
        rows = []
        for r in fan:
            for label, ep in (("epoch 1", r["epochs"][0]), ("last epoch", r["epochs"][-1])):
                rows.append([r["label"], label] + [
                    f"{ep['per_size'][s]['MBps']:.0f} MB/s, {ep['per_size'][s]['files_per_s']:.0f} f/s"
                    for s in sizes])
        L.append(_table(["setup", "epoch", *sizes], rows))

    gstats = [r for r in res if r.get("granary_stats") or r.get("granary_stats_error")]
    if gstats:
        L.append("## granary's own counters (`--stats-json`)\n")
        L.append("As granary reports them, next to the device counters above. *program* = what "
                 "the job itself read from the source through the library (mmap page faults are "
                 "invisible to it), *agent* = the agent's copies, *served* = files and MB the job "
                 "got from the tier, *placed* = files and MB copied into the tier, *not placed* = "
                 "placement failures (a full tier counts here), *walk* = catalog walk time.\n")
        rows = []
        for r in gstats:
            st = r.get("granary_stats")
            if not st:
                rows.append([r["workload"], r["setup"], f"no stats: {r['granary_stats_error']}"]
                            + [""] * 7)
                continue
            src, pl = st.get("source_io", {}), st.get("placement", {})
            rows.append([
                r["workload"], r["setup"],
                f"{src.get('opens', '?')} opens, {_mb(src.get('bytes', 0))} MB",
                f"{_mb(pl.get('agent_source_bytes', 0))} MB",
                f"{st.get('files_served_from_tiers', '?')} / {_mb(st.get('bytes_served_from_tiers', 0))} MB",
                f"{pl.get('files_placed', '?')} / {_mb(pl.get('bytes_placed', 0))} MB",
                pl.get("failures", "?"),
                f"{r['tier']['bytes'] >> 20} MiB ({r['tier']['used_bytes'] >> 20} used)",
                f"{st.get('catalog', {}).get('walk_s', 0):.2f} s",
                f"{st.get('wall_time_s', 0):.1f} s",
            ])
        L.append(_table(["workload", "setup", "program source reads", "agent source reads",
                         "served from tier", "placed", "not placed", "tier", "walk", "wall"],
                        rows))

    L.append("## Emulated PFS and run parameters\n")
    L.append(_table(["parameter", "value"], [[a, f"`{b}`" if "/" in str(b) else b]
                                              for a, b in data["emulation"].items()]))
    iops, bps = k.get("read_iops"), k.get("read_bps")
    if iops and bps:
        L.append(
            "Why these numbers: a real PFS charges per request (RPC, lock, OST seek) as well as "
            "per byte, and an untuned client sends small requests — the 128 KiB readahead, or a "
            "256 KiB `pread` that the kernel issues as 256 KiB requests — while granary's agent "
            "reads large files in 8 MiB reads, issued as requests of up to `max_sectors_kb`. The "
            "IOPS cap is chosen so that IOPS × 256 KiB lies well below the bandwidth cap "
            f"({iops} × 256 KiB = {iops / 4:.1f} MiB/s against {bps / (1 << 20):.0f} MiB/s; "
            f"128 KiB requests get {iops / 8:.1f} MiB/s): the untuned client is request-bound, "
            "large requests reach the bandwidth. The probe below checks both in this run "
            "(256 KiB reads vs 8 MiB reads, cold, through the throttle).\n")
    if data.get("probe"):
        L.append("Probe (measured at the start of this run; the run aborts if the throttle does "
                 "not hold):\n")
        L.append(_table(["measurement", "result"], list(data["probe"].items())))
    L.append(_table(["knob", "value"], [
        ["epochs", k["epochs"]], ["loader workers", k["workers"]], ["batch (small files)", k["batch"]],
        ["workloads", ", ".join(k["workloads"])], ["setups", ", ".join(k["setups"])],
        ["granary-half tier", f"{k['granary_half']:.0%} of the dataset"],
        ["client command", k["client_cmd"] or "shipped clients (bench/clients)"],
        ["strace", "on (timings include its overhead)" if k["strace"] else "off"],
    ]))
    L.append(_table(["dataset", "files", "MB", "mean file"], [
        [n, d["files"], _mb(d["bytes"]), f"{d['bytes'] / max(d['files'], 1) / 1024:.0f} KiB"]
        for n, d in data["datasets"].items()]))
    L.append("Compute per sample (a sleep in the consuming process, standing for accelerator "
             "time): lenet 0.05 ms, alexnet 1.5 ms, resnet 6 ms.\n")
    clients = data.get("clients") or {}
    if clients:
        rows = []
        for name, c in clients.items():
            if name == "dlio" and "python" in c:
                how = (f"DLIO 2.0.0, PyTorch loader, npz reader, {k.get('dlio_read_threads')} read "
                       f"thread(s), batch {k.get('dlio_batch')}, computation_time "
                       f"{k.get('dlio_computation_time')} s, "
                       f"{'shuffled (seed)' if k.get('dlio_shuffle') else 'files in name order'}, "
                       f"memory cap {(k.get('dlio_mem_cap') or 0) >> 20} MiB")
            else:
                how = ""
            rows.append([name, c.get("python") or f"skipped: {c.get('skipped')}", how])
        L.append("Real clients (installed by the bench, `bench/clients/requirements/`):\n")
        L.append(_table(["client", "interpreter", "configuration"], rows))

    L.append("## How to read this\n")
    L.append(
        "- **PFS** reads the emulated PFS directly; **Local** copies the dataset to local disk "
        "first and reads the copy; **Cache** copies each file to local disk as epoch 1 reads it "
        "(framework cache; only when the dataset fits, and not for mmap readers); **granary** "
        "runs the same client under `granary run` with a local tier that holds everything, or "
        "part of it.\n"
        "- Every run starts cold: caches dropped, fresh tier and cache directories, no agent alive.\n"
        "- Every client checks every byte it reads against the sha256 manifest written at "
        "generation; a mismatch fails the job and the run.\n"
        "- The page cache is capped by the memory cgroup, so PFS epochs 2.. are partly served "
        "from RAM, as on a real node whose RAM is smaller than the dataset.\n")
    return "\n".join(L)


