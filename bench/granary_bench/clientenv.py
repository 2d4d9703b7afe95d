"""Python environments for the real clients (DLIO, Hugging Face `datasets`), made by the bench.

Each client gets a virtual environment of its own, installed with pip from a requirements file
in `bench/clients/requirements/` that pins every package (the client and all it imports, with
their dependencies) and installed with `--no-deps`, so two machines get the same versions and
pip never resolves anything new. The environment lives outside the repository and outside the
workdir (`--clients-dir`, default /var/tmp/granary-bench-clients), named after the file's hash:
it is made once and reused by later runs until the file changes. Only the package registry is
needed (no other download).
"""

import hashlib
import os
import shutil
import subprocess
import sys

REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "clients", "requirements")


class Unavailable(Exception):
    """The environment could not be made; the message says why."""


def ensure(name, clients_dir, log):
    """The interpreter of client `name`'s environment, made if missing."""
    req = os.path.join(REQUIREMENTS, f"{name}.txt")
    with open(req, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    env = os.path.join(clients_dir, f"{name}-{digest}")
    python = os.path.join(env, "bin", "python")
    stamp = os.path.join(env, ".installed")
    if os.path.exists(stamp) and os.access(python, os.X_OK):
        return python
    shutil.rmtree(env, ignore_errors=True)
    os.makedirs(clients_dir, exist_ok=True)
    log(f"installing the {name} client into {env} (pip, pinned; once per requirements file)")
    r = subprocess.run([sys.executable, "-m", "venv", env], capture_output=True, text=True)
    if r.returncode != 0 and _apt_venv(log):
        r = subprocess.run([sys.executable, "-m", "venv", env], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        raise Unavailable(f"python3 -m venv failed: {r.stderr.strip()[-500:]}")
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-r", req],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        raise Unavailable(f"pip install -r {os.path.relpath(req)} failed: "
                          f"{(r.stderr or r.stdout).strip()[-800:]}")
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    log(f"  {name} client installed ({_du(env) / 1e9:.1f} GB)")
    return python


def _apt_venv(log):
    """Debian's python3 needs its venv module as a package."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    v = f"python3.{sys.version_info.minor}-venv"
    log(f"installing {v} with apt-get (python3 -m venv failed)")
    subprocess.run(["apt-get", "update", "-qq"], check=False)
    return subprocess.run(["apt-get", "install", "-y", "-qq", v]).returncode == 0


def _du(path):
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(d, n)).st_blocks * 512
            except OSError:
                pass
    return total
