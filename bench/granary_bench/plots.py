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
    """Per-epoch time stacked per setup, like the seeds' figures 13, 18 and 22."""
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def epoch1_throughput(data, path):
    """What the model receives (MB/s) during epoch 1, and what the source
    delivers (dashed), per setup."""
    wl = _by_workload(data)
    fig, axes = _grid(len(wl))
    for ax, (name, rs) in zip(axes, wl.items()):
        for r in _ok(rs):
            e1 = r["epochs"][0]
            ticks = [t for t in r["ticks"] if t["epoch"] == 1]
            xs, ys = [], []
            for a, b in zip(ticks, ticks[1:]):
                dt = b["t"] - a["t"]
                if dt > 0:
                    xs.append(b["t"] - e1["t0"])
                    ys.append((b["bytes"] - a["bytes"]) / dt / 1e6)
            c = COLORS.get(r["setup"], "grey")
            ax.plot(xs, ys, color=c, label=r["setup"], linewidth=1.4)
            src = [(t + r["t_start"] - e1["t0"], v) for t, v in r.get("source_rate", [])
                   if e1["t0"] <= t + r["t_start"] <= e1["t1"]]
            if src and r["setup"] != "local":
                ax.plot([s[0] for s in src], [s[1] for s in src], color=c, linestyle=":",
                        linewidth=1.0)
        ax.set_title(name)
        ax.set_xlabel("seconds into epoch 1")
        ax.set_ylabel("MB/s delivered to the model")
        ax.legend(fontsize=7)
    fig.suptitle("Epoch 1 throughput (solid: data delivered to the model; dotted: read from the PFS)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    fig.savefig(path, dpi=110)
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
