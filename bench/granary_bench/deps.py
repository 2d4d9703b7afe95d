"""What the harness needs on a fresh machine, installed only when missing.

Python stdlib for everything but the plots (matplotlib); util-linux (losetup,
mount), e2fsprogs (mkfs.ext4) and, with --strace, strace.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

TOOLS = {"losetup": "util-linux", "mount": "mount", "mkfs.ext4": "e2fsprogs", "cp": "coreutils"}


def _apt(pkgs, log):
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    log(f"installing {' '.join(pkgs)} with apt-get")
    subprocess.run(["apt-get", "update", "-qq"], check=False)
    return subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs]).returncode == 0


def ensure(log, want_strace=False):
    missing = sorted({pkg for tool, pkg in TOOLS.items() if not shutil.which(tool)})
    if want_strace and not shutil.which("strace"):
        missing.append("strace")
    if missing:
        _apt(missing, log)
    if importlib.util.find_spec("matplotlib") is None:
        log(f"installing matplotlib for {sys.executable}")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"])
        if r.returncode != 0:
            # Debian's system Python refuses pip (PEP 668): take the distro package.
            if not (sys.executable.startswith("/usr/bin/") and _apt(["python3-matplotlib"], log)):
                log("WARNING: matplotlib unavailable: the report will have tables but no plots")
        importlib.invalidate_caches()
