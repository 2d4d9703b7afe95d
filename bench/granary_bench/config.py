"""Knobs: size presets and the command line.

Every knob has a preset value per --size and can be overridden one by one. The
presets are sized for a 2-core machine: quick finishes in about 5 minutes, full
in about 38 (see bench/README.md for how they were chosen).
"""

import argparse
import os
from dataclasses import dataclass, field, fields

MIB = 1 << 20


def workload_name(spec):
    """`small` of `small:resnet@local+granary-packed`."""
    return spec.split("@", 1)[0].split(":", 1)[0]


def spec_setups(spec):
    """The setups a workload spec names after `@` (`hfds:256M@pfs+granary-full`), or None:
    the workload runs under --setups (and its own --npz/dlio/hfds-setups)."""
    _, at, setups = spec.partition("@")
    return [s for s in setups.split("+") if s] if at else None

# Workloads: name -> (dataset, client script, extra client args, framework cache?)
WORKLOADS = {
    "small": ("smallfiles", "smallfiles.py", [], True),
    "records": ("records", "records.py", ["--io", "pread"], True),
    "mmap": ("records", "records.py", ["--io", "mmap"], False),
    "fanstore": ("fanstore", "fanstore.py", [], True),
    "npz": ("npz", "smallfiles.py", ["--reader", "npz"], True),
    # FanStore's sizes with low-entropy content (compresses ~3x), for the compressed pack.
    "fanstorez": ("fanstorez", "fanstore.py", [], True),
    # A real client: DLIO 2.0.0's PyTorch loader and npz reader (bench/clients/dlio_client.py),
    # on the npz files DLIO generates itself; installed by the bench (clientenv.py).
    "dlio": ("dlio", "dlio_client.py", [], False),
    # A real client: Hugging Face `datasets` (load_from_disk, shuffle, every row; the Arrow
    # shards are memory-mapped). NAME:CAP runs it under memory cap CAP (`hfds:768M`).
    "hfds": ("hfds", "hfds_client.py", [], False),
}
# Real clients, each in a Python environment the bench installs (clientenv.py): workload ->
# the requirements file's name in bench/clients/requirements/.
CLIENT_ENVS = {"dlio": "dlio", "hfds": "hfds"}
SETUPS = ["pfs", "local", "cache", "granary-full", "granary-half", "granary-packed",
          "granary-packed-zstd"]
# Not run unless asked for (--setups): the compressed pack only matters for `fanstorez`.
DEFAULT_SETUPS = ["pfs", "local", "cache", "granary-full", "granary-half", "granary-packed"]
# Workloads whose bar is epoch 1 against the source's bandwidth: PFS-direct runs one epoch
# (under the memory cap its later epochs re-read the source like the first), and PFS-direct
# and granary-full run `epoch1_pairs` times in all, alternating, for medians.
# Which setups repeat: npz pairs PFS-direct with granary-full; DLIO, whose bar is the physical
# limit alone, repeats granary-full (PFS-direct is its reference, run once).
EPOCH1_WORKLOADS = {"npz": ("pfs", "granary-full"), "dlio": ("granary-full",)}


@dataclass
class Knobs:
    size: str = "quick"
    out: str = "results/quick"
    workdir: str = "/var/tmp/granary-bench"
    seed: int = 1
    # datasets
    small_files: int = 600
    small_classes: int = 10
    small_mean_kb: int = 110
    record_shards: int = 3
    record_min_mb: int = 32
    record_max_mb: int = 40
    record_mean_kb: int = 110
    fanstore_counts: dict = field(default_factory=lambda: {"128K": 128, "512K": 32, "2M": 8, "8M": 2})
    npz_files: int = 240
    npz_kb: int = 700
    # setups the npz workload runs under (its PFS-direct epochs take minutes)
    npz_setups: list = field(default_factory=lambda: ["pfs", "local", "granary-full"])
    # DLIO (a real client): files its generator makes, its record_length (846 x 846 bytes, a
    # 716,214-byte file), its read threads and batch, its emulated compute per step, shuffling
    # (DLIO's default: none, files in name order), the setups it runs under, epochs per job,
    # and the memory cap of its jobs (DLIO with torch and tensorflow imported holds ~540 MB)
    dlio_files: int = 240
    dlio_record_length: int = 716800
    dlio_read_threads: int = 1
    dlio_batch: int = 4
    dlio_computation_time: float = 0.0
    dlio_shuffle: bool = False
    dlio_setups: list = field(default_factory=lambda: ["pfs", "local", "granary-full"])
    dlio_epochs: int = 1
    dlio_mem_cap: int = 1024 * MIB
    clients_dir: str = "/var/tmp/granary-bench-clients"
    # Hugging Face datasets (a real client): rows of log-normal random bytes around hfds_kb,
    # written by save_to_disk in shards of at most hfds_shard, the setups it runs under
    hfds_rows: int = 600
    hfds_kb: int = 100
    hfds_shard: str = "64MB"
    hfds_setups: list = field(default_factory=lambda: ["pfs", "local", "granary-full"])
    # emulated PFS
    read_bps: int = 64 * MIB
    read_iops: int = 150
    readahead_kb: int = 128
    mem_cap: int = 64 * MIB
    # the job
    epochs: int = 3
    workers: int = 2
    batch: int = 32
    workloads: list = field(default_factory=lambda: ["small:lenet", "records:lenet", "mmap:lenet",
                                                     "fanstore", "npz:lenet"])
    setups: list = field(default_factory=lambda: list(DEFAULT_SETUPS))
    client_cmd: str = None
    # granary
    granary: str = None
    granary_half: float = 0.5
    granary_extra: list = field(default_factory=list)
    strace: bool = False
    keep: bool = False
    # steady state: Local and granary-full run this many times in all (paired) when
    # Local's epochs are shorter than repeat_below seconds
    repeat: int = 3
    repeat_epochs: int = 8
    repeat_below: float = 5.0
    local_hog_mb: int = 0
    # epoch-1 bar (EPOCH1_WORKLOADS): PFS-direct and granary-full cold epochs 1, paired
    epoch1_pairs: int = 3


PRESETS = {
    "quick": {},
    "full": dict(
        out="results/full",
        # ~38 minutes on 2 cores at the default 150 IOPS (npz ~12 of them); every
        # dataset stays above the 256 MiB memory cap (~340 / ~540 / ~540 MB).
        small_files=3000, small_classes=30,
        record_shards=8, record_min_mb=32, record_max_mb=96,
        fanstore_counts={"128K": 1024, "512K": 256, "2M": 64, "8M": 16},
        npz_files=2400,
        dlio_files=1200,
        hfds_rows=3200,
        mem_cap=256 * MIB,
        workloads=["small:lenet", "small:resnet", "records:lenet", "mmap:lenet", "fanstore",
                   "npz:lenet", "dlio"],
    ),
}


def parse_size(text):
    """512M, 8G, 64K or plain bytes."""
    text = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def _counts(text):
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        out[k.strip()] = int(v)
    return out


HELP = __doc__ + """
Setups (all in one run, on the same data):
  pfs           the client reads the emulated PFS directly, page cache cold
  local         the dataset is copied to local disk first (copy time reported apart)
  cache         framework cache: epoch 1 copies each file locally as it is read,
                later epochs read the copies (not for mmap readers: DALI/LMDB have none)
  granary-full  granary run with a local tier that holds the whole dataset
  granary-half  granary run with a local tier that holds --granary-half of it
  granary-packed       the dataset packed once (`granary pack`, onto the PFS, time reported
                       apart), served with `granary run --pack` and a tier that holds it all
  granary-packed-zstd  the same with a zstd:1 pack (not by default; for `fanstorez`)

Workloads (NAME[:COMPUTE][@SETUP+SETUP...], COMPUTE = lenet|alexnet|resnet|ms per sample;
@ runs that workload under those setups only, whatever --setups and --*-setups say, so one
invocation can pick rows: --workloads dlio@granary-full,hfds:256M@pfs+granary-full):
  small         ImageNet-like small files in class dirs, shuffled, DataLoader-like
                forked workers reading whole files
  records       TFRecord-like 32-96 MiB shards (full), shuffled, 256 KiB preads,
                several shards interleaved (tf.data)
  mmap          the same shards through mmap (DALI, LMDB)
  fanstore      FanStore's micro-benchmark: 128K/512K/2M/8M files, MB/s and files/s
  npz           npz samples of ~700 KiB (numpy.savez) read as numpy.load reads them
                (small reads at both ends, 256 KiB reads between), DataLoader-like:
                files between the source's readahead and a MiB, request-bound when the
                program reads them itself; runs under --npz-setups only, PFS-direct one
                epoch, and --epoch1-pairs cold epoch-1 pairs of PFS-direct and granary-full
  fanstorez     the same sizes with low-entropy (npz-like) content that compresses ~3x
                (not by default; e.g. --workloads fanstorez --setups
                pfs,local,granary-packed,granary-packed-zstd)
  dlio          a real client: DLIO 2.0.0 (argonne-lcf/dlio_benchmark), its PyTorch data
                loader and npz reader, on the npz files DLIO's generator makes (716 KB each);
                installed by the bench into --clients-dir (pip, pinned: ~6.7 GB with torch,
                once); every byte its reader reads checked; one epoch under --dlio-setups,
                granary-full --epoch1-pairs times (its bar: epoch 1 / (dataset / bandwidth))
  hfds:CAP      a real client: Hugging Face datasets 4.4.1, load_from_disk of shards
                save_to_disk wrote (--hfds-rows, --hfds-shard), .shuffle(seed), every row
                iterated through the memory-mapped Arrow files and checked; one epoch under
                --hfds-setups with memory cap CAP (e.g. hfds:768M, the mapped set fits, and
                hfds:256M, it does not); not by default
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bench/run.py", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Knobs()
    p.add_argument("--size", choices=sorted(PRESETS), default="quick",
                   help="preset for every knob below (quick ~5 min, full ~38 min on 2 cores)")
    p.add_argument("--out", help="report directory (default results/<size>)")
    p.add_argument("--workdir", help=f"scratch space for the image, local copies and tiers "
                                     f"(default {d.workdir}); never inside the repository")
    p.add_argument("--seed", type=int, help="dataset layout and shuffle seed")
    g = p.add_argument_group("datasets")
    g.add_argument("--small-files", type=int, help=f"small files (quick {d.small_files})")
    g.add_argument("--small-classes", type=int, help="class directories")
    g.add_argument("--small-mean-kb", type=int, help="mean small-file size, KiB (110)")
    g.add_argument("--record-shards", type=int, help=f"record shards (quick {d.record_shards})")
    g.add_argument("--record-min-mb", type=int, help="smallest shard, MiB")
    g.add_argument("--record-max-mb", type=int, help="largest shard, MiB")
    g.add_argument("--record-mean-kb", type=int, help="mean record size, KiB (110)")
    g.add_argument("--fanstore-counts", type=_counts,
                   help="files per size, e.g. 128K=128,512K=32,2M=8,8M=2 (FanStore/1024)")
    g.add_argument("--npz-files", type=int, help=f"npz samples (quick {d.npz_files}, full 2400)")
    g.add_argument("--npz-kb", type=int, help="npz sample size, KiB (700)")
    g.add_argument("--dlio-files", type=int,
                   help=f"files DLIO generates (quick {d.dlio_files}, full 1200)")
    g.add_argument("--dlio-record-length", type=int,
                   help="DLIO's record_length: its arrays are sqrt(this)^2 bytes (716800)")
    g.add_argument("--hfds-rows", type=int,
                   help=f"rows of the Hugging Face dataset (quick {d.hfds_rows}, full 3200: "
                        "~320 MB)")
    g.add_argument("--hfds-shard", help="save_to_disk's max_shard_size (64MB)")
    g.add_argument("--clients-dir", help="where the real clients' Python environments are "
                                         f"installed and kept ({d.clients_dir})")
    g = p.add_argument_group("emulated PFS")
    g.add_argument("--read-bps", type=parse_size, help="blkio read bandwidth cap, e.g. 32M "
                                                       "(0 = none; default 64M)")
    g.add_argument("--read-iops", type=int,
                   help="blkio read IOPS cap (0 = none; default 150: 150 x 256 KiB = 37.5 MiB/s, "
                        "well below the bandwidth cap, so an untuned client's 128-256 KiB "
                        "requests are request-bound while 1 MiB+ requests reach the bandwidth)")
    g.add_argument("--readahead-kb", type=int, help="loop device readahead, KiB (128)")
    g.add_argument("--mem-cap", type=parse_size,
                   help="memory cgroup limit for the run's processes and page cache, e.g. 64M "
                        "(quick 64M, full 256M; keep it below the dataset size)")
    g = p.add_argument_group("job")
    g.add_argument("--epochs", type=int, help="epochs per job (3, as in the seeds)")
    g.add_argument("--workers", type=int, help="loader processes/threads (2)")
    g.add_argument("--batch", type=int, help="samples per batch (small files, 32)")
    g.add_argument("--workloads", type=lambda s: s.split(","),
                   help="comma list of NAME[:COMPUTE] (see above)")
    g.add_argument("--setups", type=lambda s: s.split(","), help="comma list of setups (see above)")
    g.add_argument("--npz-setups", type=lambda s: s.split(","),
                   help="setups the npz workload runs under, among --setups "
                        f"(default {','.join(d.npz_setups)})")
    g.add_argument("--client-cmd",
                   help="plug in your own reader instead of the shipped clients: a shell command "
                        "with {root} {manifest} {epochs} {workers} {cache_dir} placeholders "
                        "(also exported as BENCH_ROOT, BENCH_MANIFEST, ...); it replaces the "
                        "client of every workload. If it prints the clients' JSON lines the "
                        "report has per-epoch data, otherwise just the total time.")
    g.add_argument("--dlio-setups", type=lambda s: s.split(","),
                   help=f"setups the dlio workload runs under ({','.join(d.dlio_setups)})")
    g.add_argument("--hfds-setups", type=lambda s: s.split(","),
                   help=f"setups the hfds workload runs under ({','.join(d.hfds_setups)})")
    g.add_argument("--dlio-read-threads", type=int, help="DLIO's read_threads (1)")
    g.add_argument("--dlio-batch", type=int, help="DLIO's batch_size (4)")
    g.add_argument("--dlio-computation-time", type=float,
                   help="DLIO's emulated compute per step, seconds (0: I/O-bound)")
    g.add_argument("--dlio-shuffle", action="store_true",
                   help="DLIO's sample_shuffle and file_shuffle = seed (default: DLIO's default, "
                        "no shuffle: files in name order)")
    g.add_argument("--dlio-epochs", type=int, help="epochs of each DLIO job (1)")
    g.add_argument("--dlio-mem-cap", type=parse_size,
                   help="memory cap of DLIO's jobs instead of --mem-cap (1G: DLIO with torch "
                        "and tensorflow imported holds ~540 MB)")
    g = p.add_argument_group("granary")
    g.add_argument("--granary", help="granary binary (default $GRANARY_BIN or "
                                     "target/release/granary, built with cargo if missing)")
    g.add_argument("--granary-half", type=float, help="tier size of granary-half, as a fraction "
                                                      "of the dataset (0.5)")
    g.add_argument("--granary-extra", action="append",
                   help="extra argument for `granary run` (repeatable)")
    g = p.add_argument_group("other")
    g.add_argument("--strace", action="store_true",
                   help="also count file/descriptor syscalls on source paths with strace -f "
                        "(slows every run; timings are marked)")
    g.add_argument("--keep", action="store_true", help="keep the workdir (image, copies, tiers)")
    g.add_argument("--repeat", type=int,
                   help="run Local and granary-full this many times in all, alternating, for "
                        "the 'epochs >= 2 vs Local' criterion (its median of paired ratios): "
                        "sub-second epochs on a shared machine vary by 10%% run to run (3; "
                        "1 = no repetition)")
    g.add_argument("--repeat-epochs", type=int,
                   help="epochs of each repetition: every epoch after the first is one more "
                        "steady-state sample at almost no cost, since epoch 1 dominates (8)")
    g.add_argument("--local-hog-mb", type=int,
                   help="diagnostic: run Local with a process holding this many MiB beside its "
                        "client, inside the same memory cgroup, to see whether a placed-epoch gap "
                        "is granary's resident memory (13 on the full small-file set); 0 = off")
    g.add_argument("--repeat-below", type=float,
                   help="repeat only workloads whose Local epochs 2.. take less than this many "
                        "seconds; longer epochs average the noise out themselves (5)")
    g.add_argument("--epoch1-pairs", type=int,
                   help="for the npz workload: cold epoch-1 runs of PFS-direct and granary-full "
                        "in all (the main run's included), alternating; the bar takes medians (3)")
    g.add_argument("--report-only", metavar="DIR",
                   help="re-render DIR/report.md and plots from DIR/results.json; runs nothing")
    a = p.parse_args(argv)

    values = {f.name: getattr(d, f.name) for f in fields(Knobs)}
    values.update(PRESETS[a.size])
    values["size"] = a.size
    values.setdefault("out", f"results/{a.size}")
    for f in fields(Knobs):
        v = getattr(a, f.name, None)
        if v is not None and v is not False:
            values[f.name] = v
    k = Knobs(**values)
    k.report_only = a.report_only
    if a.out is None:
        # Default reports land in the repository's results/, wherever we run from.
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        k.out = os.path.join(repo, PRESETS[a.size].get("out", f"results/{a.size}"))
    k.out = os.path.abspath(k.out)
    k.workdir = os.path.abspath(k.workdir)
    for w in k.workloads:
        if workload_name(w) not in WORKLOADS:
            p.error(f"unknown workload {w}")
    picked = [s for w in k.workloads for s in spec_setups(w) or []]
    for s in k.setups + k.npz_setups + k.dlio_setups + k.hfds_setups + picked:
        if s not in SETUPS:
            p.error(f"unknown setup {s}")
    return k
