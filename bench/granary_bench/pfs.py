"""The emulated PFS: a loop-mounted ext4 image behind a blkio throttle.

What makes it behave like a slow shared file system on one machine:
- the loop device runs with direct I/O on its backing file, so a read of the
  image really goes to the disk instead of the host's page cache;
- a cgroup-v1 blkio group caps the bandwidth and IOPS of reads submitted to the
  loop device, so every request costs something and large requests pay off;
- the loop device gets a fixed readahead (128 KiB, the kernel's classic default);
- a memory cgroup caps what the run can keep in page cache below the dataset
  size, and caches are dropped before every cold run.

Without root none of this is possible: the source is a plain directory, reads
are unthrottled, and "dropping caches" is a best-effort POSIX_FADV_DONTNEED
over the files involved. The report says so.

Everything set up here is registered on an ExitStack, so it is torn down in
reverse order on success, failure, or a signal (see run.py).
"""

import os
import subprocess
import time

from . import cgroup

SECTOR = 512


def _sh(*argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout.strip()


class EmulatedPFS:
    def __init__(self, knobs, log):
        self.k = knobs
        self.log = log
        self.root_mode = os.geteuid() == 0 and cgroup.available("blkio") and cgroup.available("memory")
        self.workdir = knobs.workdir
        self.mount = os.path.join(self.workdir, "pfs")
        self.image = os.path.join(self.workdir, "pfs.img")
        self.loop = None
        self.blkio = None
        self.memory = None
        self.params = {}      # every emulation parameter, for the report
        self.measured = {}    # probe measurements, for the report
        self.numbers = {}     # the same, as numbers (bytes/s, reads/s)

    # ---- setup -------------------------------------------------------------

    def setup(self, stack, image_bytes):
        os.makedirs(self.mount, exist_ok=True)
        if not self.root_mode:
            self.log("WARNING: not root (or no cgroup-v1 blkio/memory): the source is a plain "
                     "directory, reads are NOT throttled, page cache is NOT capped; caches are "
                     "evicted per file with POSIX_FADV_DONTNEED. Numbers are not PFS-like.")
            self.params = {"mode": "unthrottled (no root)", "source": self.mount}
            return
        size = max(image_bytes, 256 << 20)
        with open(self.image, "wb") as f:
            f.truncate(size)
        stack.callback(self._remove_image)
        # Initialise inode tables and journal now: lazy init would write to the
        # image in the background while we measure.
        _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.image)
        self.loop = _sh("losetup", "-f", "--show", "--direct-io=on", self.image)
        stack.callback(self._detach_loop)
        name = os.path.basename(self.loop)
        dio = open(f"/sys/block/{name}/loop/dio").read().strip()
        if dio != "1":
            raise RuntimeError(f"{self.loop}: direct I/O refused (dio={dio}); reads would come "
                               "from the host page cache")
        default_ra = open(f"/sys/block/{name}/queue/read_ahead_kb").read().strip()
        with open(f"/sys/block/{name}/queue/read_ahead_kb", "w") as f:
            f.write(str(self.k.readahead_kb))
        _sh("mount", "-o", "noatime", self.loop, self.mount)
        stack.callback(self._umount)
        majmin = open(f"/sys/block/{name}/dev").read().strip()

        tag = f"granary-bench-{os.getpid()}"
        self.blkio = cgroup.Group("blkio", tag)
        self.blkio.create()
        stack.callback(self.blkio.remove)
        if self.k.read_bps:
            self.blkio.write("blkio.throttle.read_bps_device", f"{majmin} {self.k.read_bps}")
        if self.k.read_iops:
            self.blkio.write("blkio.throttle.read_iops_device", f"{majmin} {self.k.read_iops}")
        self.memory = cgroup.Group("memory", tag)
        self.memory.create()
        stack.callback(self.memory.remove)
        self.memory.write("memory.limit_in_bytes", self.k.mem_cap)
        self.params = {
            "mode": "throttled loop device (root)",
            "image": f"{self.image} ({size >> 20} MiB, ext4, mounted noatime, read-only while measuring)",
            "loop device": f"{self.loop} ({majmin}), direct I/O on the backing file (dio=1)",
            "readahead": f"{self.k.readahead_kb} KiB (kernel default on this loop device: {default_ra} KiB)",
            "max request": f"{open(f'/sys/block/{name}/queue/max_sectors_kb').read().strip()} KiB "
                           "(queue/max_sectors_kb)",
            "read bandwidth cap": _fmt_bps(self.k.read_bps),
            "read IOPS cap": f"{self.k.read_iops}/s" if self.k.read_iops else "none",
            "memory cap (page cache + process memory)": f"{self.k.mem_cap >> 20} MiB",
            "blkio cgroup": self.blkio.path,
            "memory cgroup": self.memory.path,
            "cache drop": "sync; echo 3 > /proc/sys/vm/drop_caches before every run",
        }

    def seal(self):
        """After generation: the source becomes read-only, like a shared PFS."""
        if self.root_mode:
            _sh("mount", "-o", "remount,ro", self.mount)

    # ---- teardown (registered on the ExitStack) -----------------------------

    def _umount(self):
        for attempt in range(20):
            r = subprocess.run(["umount", self.mount], capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        subprocess.run(["umount", "-l", self.mount])

    def _detach_loop(self):
        subprocess.run(["losetup", "-d", self.loop])

    def _remove_image(self):
        if os.path.exists(self.image):
            os.unlink(self.image)

    # ---- during runs -------------------------------------------------------

    def groups(self):
        return [g for g in (self.blkio, self.memory) if g]

    def wrap(self, argv):
        return cgroup.wrap(self.groups(), argv)

    def drop_caches(self, paths=()):
        """Cold start: nothing of the source or the local copies in RAM."""
        if self.root_mode:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            return
        for top in paths:
            for d, _, names in os.walk(top):
                for n in names:
                    try:
                        fd = os.open(os.path.join(d, n), os.O_RDONLY)
                    except OSError:
                        continue
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)

    def stat(self):
        """(reads completed, bytes read) on the loop device since it was attached."""
        if not self.loop:
            return (0, 0)
        f = open(f"/sys/block/{os.path.basename(self.loop)}/stat").read().split()
        return (int(f[0]), int(f[2]) * SECTOR)

    def memory_stats(self):
        if not self.memory:
            return {}
        out = {"max_usage": int(self.memory.read("memory.max_usage_in_bytes")),
               "failcnt": int(self.memory.read("memory.failcnt"))}
        for line in self.memory.read("memory.oom_control").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                out["oom_kill"] = int(v)
        return out

    def reset_memory_stats(self):
        if self.memory:
            self.memory.write("memory.max_usage_in_bytes", 0)
            self.memory.write("memory.failcnt", 0)

    # ---- probes: does the throttle bite? -----------------------------------

    def probe(self, probe_path, python):
        """Times cold reads of the probe file, inside and outside the throttle, and
        fails if the throttle does not hold (numbers would be meaningless):
        - sequential 1 MiB reads (the bandwidth, as `cp` sees it);
        - sequential 256 KiB reads (an untuned client: tf.data's pread size; the
          kernel sends 256 KiB requests) -- should be bound by the IOPS cap;
        - sequential 8 MiB reads (granary's agent; the kernel splits them at
          max_sectors_kb) -- should reach the bandwidth cap: the source bandwidth
          the measured bar divides by;
        - random 4 KiB reads (the request rate)."""
        if not self.root_mode:
            return
        seq = ("import os,sys,time;f=open(sys.argv[1],'rb',buffering=0);bs=int(sys.argv[2])\n"
               "t=time.time();n=0\nwhile True:\n b=f.read(bs)\n if not b: break\n n+=len(b)\n"
               "print(n/(time.time()-t))")
        rnd = ("import os,sys,time,random;fd=os.open(sys.argv[1],os.O_RDONLY);"
               "os.posix_fadvise(fd,0,0,os.POSIX_FADV_RANDOM);sz=os.fstat(fd).st_size;"
               "r=random.Random(7);n=int(sys.argv[2]);t=time.time()\n"
               "for i in range(n): os.pread(fd,4096,r.randrange(sz//4096)*4096)\n"
               "print(n/(time.time()-t))")

        def timed(code, *args, throttled):
            self.drop_caches()
            argv = [python, "-c", code, probe_path, *args]
            if throttled:
                argv = self.wrap(argv)
            s0 = self.stat()
            out = _sh(*argv)
            s1 = self.stat()
            return float(out), s1[0] - s0[0], s1[1] - s0[1]

        def per_read(reads, nbytes):
            return f"{reads} device reads, {nbytes / max(reads, 1) / 1024:.0f} KiB per read"

        bw_raw, _, _ = timed(seq, str(1 << 20), throttled=False)
        bw, reads, nbytes = timed(seq, str(1 << 20), throttled=True)
        bw256, r256, b256 = timed(seq, str(256 << 10), throttled=True)
        bw8m, r8m, b8m = timed(seq, str(8 << 20), throttled=True)
        iops_raw, _, _ = timed(rnd, "2000", throttled=False)
        iops, _, _ = timed(rnd, str(max(200, self.k.read_iops * 2)), throttled=True)
        size_mib = os.path.getsize(probe_path) >> 20
        self.measured = {
            f"cold sequential read of {size_mib} MiB, unthrottled": f"{bw_raw / 1e6:.0f} MB/s",
            f"cold sequential 1 MiB reads of {size_mib} MiB, throttled": f"{bw / 1e6:.1f} MB/s "
            f"({per_read(reads, nbytes)})",
            "cold sequential 256 KiB reads (untuned client), throttled": f"{bw256 / 1e6:.1f} MB/s "
            f"({per_read(r256, b256)})",
            "cold sequential 8 MiB reads (granary's agent), throttled": f"{bw8m / 1e6:.1f} MB/s "
            f"({per_read(r8m, b8m)})",
            "cold random 4 KiB reads, unthrottled": f"{iops_raw:.0f} reads/s",
            "cold random 4 KiB reads, throttled": f"{iops:.0f} reads/s",
        }
        # Numbers for the measured bar: the source bandwidth is what large requests
        # get through the throttle (the physical limit of the emulated PFS).
        self.numbers = {"seq_1m_Bps": bw, "seq_256k_Bps": bw256, "seq_8m_Bps": bw8m,
                        "source_bandwidth_Bps": max(bw, bw8m), "random_4k_iops": iops,
                        "unthrottled_Bps": bw_raw, "unthrottled_iops": iops_raw}
        self.log("probe: " + "; ".join(f"{k}: {v}" for k, v in self.measured.items()))
        if self.k.read_bps and bw > 1.5 * self.k.read_bps:
            raise RuntimeError(f"throttle does not bite: {bw / 1e6:.1f} MB/s measured, "
                               f"{self.k.read_bps / 1e6:.1f} MB/s configured")
        if self.k.read_iops and iops > 1.5 * self.k.read_iops:
            raise RuntimeError(f"IOPS throttle does not bite: {iops:.0f}/s measured, "
                               f"{self.k.read_iops}/s configured")
        if self.k.read_bps and self.k.read_iops and bw256 > 0.9 * bw8m:
            self.log(f"WARNING: 256 KiB reads get {bw256 / 1e6:.1f} MB/s, as much as 8 MiB reads "
                     f"({bw8m / 1e6:.1f} MB/s): the emulation does not charge per request for an "
                     "untuned client (raise --read-bps or lower --read-iops)")


def _fmt_bps(bps):
    return f"{bps / (1 << 20):.0f} MiB/s ({bps} B/s)" if bps else "none"
