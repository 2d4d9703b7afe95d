"""The report's figures (matplotlib, PNG). Each function takes results.json's
data and writes one file; setups keep the same colour in every figure."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"pfs": "#c44e52", "local": "#4c72b0", "cache": "#dd8452",
          "granary-full": "#55a868", "granary-half": "#8fc99b"}
EPOCH_ALPHA = [1.0, 0.6, 0.35, 0.2, 0.12]


def _by_workload(data):
    out = {}
    for r in data["results"]:
        out.setdefault(r["workload"], []).append(r)
    return out


def _ok(rs):
    return [r for r in rs if r["status"] == "ok" and r.get("epochs")]


def _grid(n, w=4.2, h=3.6):
    fig, axes = plt.subplots(1, n, figsize=(w * n, h), squeeze=False)
    return fig, axes[0]


def epochs_stacked(data, path):
    """Per-epoch time stacked per setup, like the papers' per-epoch figures."""
    wl = _by_workload(data)
    fig, axes = _grid(len(wl))
    copies = data.get("copies", {})
    for ax, (name, rs) in zip(axes, wl.items()):
        rs = _ok(rs)
        labels = []
        for x, r in enumerate(rs):
            bottom = 0.0
            if r["setup"] == "local":
                c = copies.get(r.get("dataset"), {}).get("seconds")
                if c:
                    ax.bar(x, c, color="white", edgecolor=COLORS["local"], hatch="//")
                    bottom = c
            for i, e in enumerate(r["epochs"]):
                ax.bar(x, e["seconds"], bottom=bottom, color=COLORS.get(r["setup"], "grey"),
                       alpha=EPOCH_ALPHA[min(i, len(EPOCH_ALPHA) - 1)], edgecolor="black",
                       linewidth=0.4)
                bottom += e["seconds"]
            ax.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=8)
            labels.append(r["setup"])
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(name)
        ax.set_ylabel("seconds (epoch 1 darkest)")
    fig.suptitle("Job time per setup, stacked by epoch (hatched: copy before the Local job)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _rates(points, t_end, window):
    """Cumulative (t, bytes) -> [(t, MB/s)] over fixed windows ending at t:
    the raw counters move in throttle-slice steps, windows make a readable line."""
    if len(points) < 2:
        return [], []
    xs, ys = [], []
    t = window
    i = 0
    prev = _interp(points, 0.0)
    while t <= t_end + 1e-9:
        cur = _interp(points, t)
        xs.append(t)
        ys.append((cur - prev) / window / 1e6)
        prev = cur
        t += window
    return xs, ys


def _interp(points, t):
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return points[-1][1]


def epoch1_throughput(data, path):
    """Epoch 1, per setup: MB/s delivered to the model and read from the source
    (top), and MB delivered so far (bottom: the slope is the throughput)."""
    wl = _by_workload(data)
    fig, axes = plt.subplots(2, len(wl), figsize=(4.2 * len(wl), 6.4), squeeze=False)
    for col, (name, rs) in enumerate(wl.items()):
        top, bottom = axes[0][col], axes[1][col]
        rs = _ok(rs)
        longest = max((r["epochs"][0]["seconds"] for r in rs), default=1.0)
        window = max(0.2, longest / 15)
        for r in rs:
            e1 = r["epochs"][0]
            dur = e1["seconds"]
            pts = [(t["t"] - e1["t0"], t["bytes"] - r["ticks"][0]["bytes"]) for t in r["ticks"]
                   if t["epoch"] == 1]
            c = COLORS.get(r["setup"], "grey")
            xs, ys = _rates(pts, dur, min(window, max(dur / 4, 0.02)))
            top.plot(xs, ys, color=c, label=r["setup"], linewidth=1.4)
            bottom.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], color=c,
                        label=r["setup"], linewidth=1.4)
            off = r["t_start"] - e1["t0"]
            src = [(t + off, b) for t, b in r.get("source_series", [])]
            base = _interp(src, 0.0) if src else 0
            src = [(t, b - base) for t, b in src if t >= 0]
            if src and r["setup"] != "local":
                xs, ys = _rates(src, dur, window)
                top.plot(xs, ys, color=c, linestyle=":", linewidth=1.2)
        top.set_title(name)
        top.set_ylabel("MB/s")
        top.legend(fontsize=7)
        bottom.set_xlabel("seconds into epoch 1")
        bottom.set_ylabel("MB delivered to the model")
    fig.suptitle("Epoch 1: throughput over time (solid: delivered to the model, dotted: read from the PFS) and progress")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def source_traffic(data, path):
    """Source (loop device) MB and reads per epoch, per setup."""
    wl = _by_workload(data)
    fig, axes = plt.subplots(2, len(wl), figsize=(4.2 * len(wl), 6.2), squeeze=False)
    for col, (name, rs) in enumerate(wl.items()):
        rs = _ok(rs)
        n_ep = max((len(r["epochs"]) for r in rs), default=0)
        buckets = [str(e) for e in range(1, n_ep + 1)] + ["after"]
        width = 0.8 / max(len(buckets), 1)
        for row, (key, scale, unit) in enumerate([("bytes", 1e6, "MB"), ("reads", 1, "reads")]):
            ax = axes[row][col]
            for x, r in enumerate(rs):
                src = {str(k): v for k, v in r["source"].items()}
                for i, b in enumerate(buckets):
                    v = src.get(b, {}).get(key, 0)
                    if b == "1":
                        v += src.get("startup", {}).get(key, 0)
                    ax.bar(x - 0.4 + width * (i + 0.5), v / scale, width,
                           color=COLORS.get(r["setup"], "grey"),
                           alpha=EPOCH_ALPHA[min(i, len(EPOCH_ALPHA) - 1)], edgecolor="black",
                           linewidth=0.3)
            ax.set_xticks(range(len(rs)))
            ax.set_xticklabels([r["setup"] for r in rs], rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(f"source {unit} per epoch")
            if row == 0:
                ax.set_title(name)
    fig.suptitle("Source traffic per epoch from /sys/block/loopN/stat "
                 "(bars per setup: epoch 1, 2, ..., after the job)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def fanstore(data, path):
    """FanStore's figure 3 on one node: MB/s and files/s per file size."""
    rs = [r for r in _ok(data["results"]) if r["workload"] == "fanstore"
          and r["epochs"][0].get("per_size")]
    if not rs:
        return False
    sizes = list(rs[0]["epochs"][0]["per_size"])
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    width = 0.8 / len(rs)
    for row, (which, title) in enumerate([(0, "epoch 1 (cold)"), (-1, "last epoch")]):
        for col, (key, unit) in enumerate([("MBps", "MB/s"), ("files_per_s", "files/s")]):
            ax = axes[row][col]
            for i, r in enumerate(rs):
                per = r["epochs"][which]["per_size"]
                ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(sizes))],
                       [per[s][key] for s in sizes], width, label=r["setup"],
                       color=COLORS.get(r["setup"], "grey"))
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels(sizes)
            ax.set_yscale("log")
            ax.set_ylabel(unit)
            ax.set_title(f"{unit}, {title}")
            ax.legend(fontsize=7)
    fig.suptitle("FanStore micro-benchmark: every file of each size read whole")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
