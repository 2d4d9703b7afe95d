"""What a suite keeps in the repository: results.json with its time series thinned.

A run records a tick every 0.1 s and the source device's counters every 0.05 s: the report's
figures are computed from all of them when the run ends (raw/results.json keeps them, and
`--report-only` prefers it), but the plots need no more than ~60 points for epoch 1.
`compact` keeps ~60 points of epoch 1 and ~12 of each later epoch, always the first and
last of each, so the committed results stay small (results/ ≤ 2 MB) and still draw the plots."""
import json
import os

SERIES = ("ticks", "source_series")


def _even(series, points):
    if len(series) <= points:
        return series
    step = (len(series) - 1) / (points - 1)
    return [series[round(i * step)] for i in range(points)]


def _thin(series, points):
    """Epoch 1 (the throughput plot's) keeps `points`, every later epoch a fifth of that; a
    series without epochs keeps `points`. First and last of each epoch always."""
    if not series or not isinstance(series[0], dict) or "epoch" not in series[0]:
        return _even(series, points)
    out, run = [], []
    for x in series + [None]:
        if run and (x is None or x.get("epoch") != run[0].get("epoch")):
            out += _even(run, points if run[0].get("epoch") == 1 else max(2, points // 5))
            run = []
        if x is not None:
            run.append(x)
    return out


def compact(obj, points=60):
    """A copy of `obj` with every list under a key in SERIES thinned (`_thin`)."""
    if isinstance(obj, dict):
        return {k: compact(_thin(v, points) if k in SERIES and isinstance(v, list) else v,
                           points) for k, v in obj.items()}
    if isinstance(obj, list):
        return [compact(v, points) for v in obj]
    if isinstance(obj, float):
        # Milliseconds for timestamps, six digits for the rest: far below the runs' noise.
        return round(obj, 3) if abs(obj) >= 1e5 else float(f"{obj:.6g}")
    return obj


def write(data, out):
    """out/raw/results.json (everything, not committed) and out/results.json (thinned)."""
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    with open(os.path.join(out, "raw", "results.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(compact(json.loads(json.dumps(data, default=str))), f, separators=(",", ":"))


def read(out):
    """The fullest results.json of a suite's directory: raw/ if it is there."""
    for p in (os.path.join(out, "raw", "results.json"), os.path.join(out, "results.json")):
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)
    raise FileNotFoundError(os.path.join(out, "results.json"))
