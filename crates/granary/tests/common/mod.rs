//! Helpers shared by the integration tests that drive the real `granary` binary.

#![allow(dead_code)] // each test crate uses a subset

use std::path::Path;
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// The preload library next to the binary; built on demand since `cargo test -p granary` does
/// not build the cdylib.
pub fn ensure_preload() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let lib = Path::new(BIN).with_file_name("libgranary_preload.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut c = Command::new(cargo);
            c.args(["build", "-p", "granary-preload"]);
            if Path::new(BIN)
                .parent()
                .is_some_and(|p| p.ends_with("release"))
            {
                c.arg("--release");
            }
            let st = c.status().expect("running cargo build -p granary-preload");
            assert!(st.success(), "cargo build -p granary-preload failed");
        }
    });
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The `granary` binary with a private runtime directory (so its own agent) and none of the
/// caller's granary environment.
pub fn granary_cmd(rt: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env("GRANARY_RUNTIME_DIR", rt)
        .env_remove("GRANARY_CONFIG")
        .env_remove("GRANARY_DISABLE")
        .env_remove("LD_PRELOAD");
    c
}

/// sha256 of `b` as hex, computed by Python's hashlib: the test and the Python readers it
/// checks agree by construction.
pub fn sha256_hex(b: &[u8]) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Fails the test with the command's exit status and output unless it succeeded.
pub fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Waits (at most a minute) until the agent on runtime directory `rt` has no placement work
/// left for its first source (`pending == 0`, not busy); returns that source's status.
pub fn settle(rt: &Path) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let o = granary_cmd(rt).args(["status", "--json"]).output().unwrap();
        let s: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
        let src = &s["sources"][0];
        if src["pending"].as_u64() == Some(0) && !src["busy"].as_bool().unwrap_or(true) {
            return src.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "placement never settled: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An ext4 image on a loop device with direct I/O on its backing file (reads reach the disk,
/// not the host's page cache), mounted `noatime`; unmounted and detached on drop. `None`
/// when this cannot be done here (not root, no loop devices).
pub struct LoopFs {
    pub mnt: std::path::PathBuf,
    pub dev: String,
}

impl LoopFs {
    pub fn new(dir: &Path, mib: u64) -> Option<LoopFs> {
        if granary_core::sys::uid() != 0 {
            return None;
        }
        let (img, mnt) = (dir.join("fs.img"), dir.join("mnt"));
        std::fs::create_dir_all(&mnt).ok()?;
        let out = Command::new("sh")
            .arg("-ec")
            .arg(format!(
                "truncate -s {mib}M {i}; mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 \
                 {i}; l=$(losetup -f --show --direct-io=on {i}); \
                 mount -o noatime $l {m} || {{ losetup -d $l; exit 1; }}; echo $l",
                i = img.display(),
                m = mnt.display()
            ))
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Some(LoopFs { mnt, dev })
    }

    /// `loopN`, its name under /sys/block.
    pub fn name(&self) -> String {
        Path::new(&self.dev)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string()
    }

    /// Empties the page cache of this file system alone (unmount writes it back and drops
    /// it; the mount comes back at the same place): its next reads come from the device.
    pub fn drop_cache(&self) {
        let ok = Command::new("sh")
            .arg("-ec")
            .arg(format!(
                "umount {m}; mount -o noatime {d} {m}",
                m = self.mnt.display(),
                d = self.dev
            ))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remounting {} failed", self.mnt.display());
    }

    pub fn set_readahead_kb(&self, kb: u64) {
        let p = format!("/sys/block/{}/queue/read_ahead_kb", self.name());
        std::fs::write(&p, kb.to_string()).unwrap_or_else(|e| panic!("writing {p}: {e}"));
    }

    /// (read requests completed, bytes read) on the device so far, as the kernel counts them.
    pub fn reads(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/sys/block/{}/stat", self.name())).unwrap();
        let f: Vec<u64> = s
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        (f[0], f[2] * 512)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Writes `path`'s dirty pages back and drops them from the page cache: its next reads come
/// from the device. This file only: a global `drop_caches` empties the cache under the tests
/// running beside this one (it made a chunk test that counts page-cache hits fail in CI, where
/// the `sync` before it took long enough to land mid-run).
pub fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.sync_all().unwrap();
    granary_core::sys::fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
}
