//! A slow source on one machine, built as the benchmark builds its parallel file system
//! (bench/README.md): an ext4 image on a loop device (direct I/O on its backing file), a
//! cgroup-v1 blkio group capping reads of that device at 64 MiB/s and 150 requests/s, a 128 KiB
//! readahead, and a memory cgroup capping the page cache below the dataset, as on a node whose
//! RAM is smaller than its dataset. Caches are dropped before each run by remounting the image
//! (its pages only: nothing else on the machine loses its cache).
//!
//! Every step is undone on drop, in reverse order, whether the demo succeeded, failed or was
//! interrupted: processes left in the groups (only ours: the wrapper put them there) are ended,
//! the image unmounted and detached, the groups and the image removed.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::size::format_size;

pub const READ_BPS: u64 = 64 << 20;
pub const READ_IOPS: u64 = 150;
pub const READAHEAD_KB: u64 = 128;
const CGROUP: &str = "/sys/fs/cgroup";

/// Why a slow source cannot be emulated here, or `None` when it can.
pub fn unavailable() -> Option<String> {
    if granary_core::sys::uid() != 0 {
        return Some("not root".into());
    }
    for (ctl, file) in [
        ("blkio", "blkio.throttle.read_iops_device"),
        ("memory", "memory.limit_in_bytes"),
    ] {
        if !Path::new(CGROUP).join(ctl).join(file).exists() {
            return Some(format!("no cgroup v1 {ctl} controller at {CGROUP}/{ctl}"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control)".into());
    }
    for cmd in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if !on_path(cmd) {
            return Some(format!("no `{cmd}` command"));
        }
    }
    None
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// Runs a command; its stderr in the error when it fails.
fn run(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !o.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

pub struct SlowSource {
    /// Where the image is mounted: the dataset's directory.
    pub mnt: PathBuf,
    image: PathBuf,
    /// `/dev/loopN`, once attached.
    dev: Option<String>,
    mounted: bool,
    /// The blkio and memory groups, once created.
    groups: Vec<PathBuf>,
    pub mem_cap: u64,
}

impl SlowSource {
    /// An image of `image_bytes` (sparse) at `image`, mounted at `mnt`; the page cache capped
    /// at `mem_cap`. On error, what was set up is undone (drop).
    pub fn create(image: &Path, mnt: &Path, image_bytes: u64, mem_cap: u64) -> Result<SlowSource> {
        let mut s = SlowSource {
            mnt: mnt.to_path_buf(),
            image: image.to_path_buf(),
            dev: None,
            mounted: false,
            groups: Vec::new(),
            mem_cap,
        };
        std::fs::File::create(image)
            .and_then(|f| f.set_len(image_bytes))
            .with_context(|| format!("creating {}", image.display()))?;
        // Inode tables and journal now: lazy initialisation would write while we measure.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(image))?;
        let dev = run(Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(image))?;
        s.dev = Some(dev);
        let name = s.name();
        std::fs::write(
            format!("/sys/block/{name}/queue/read_ahead_kb"),
            READAHEAD_KB.to_string(),
        )
        .context("setting the loop device's readahead")?;
        std::fs::create_dir_all(mnt)?;
        s.mount()?;
        let majmin = std::fs::read_to_string(format!("/sys/block/{name}/dev"))?
            .trim()
            .to_string();
        let tag = format!("granary-demo-{}", std::process::id());
        for (ctl, settings) in [
            (
                "blkio",
                vec![
                    (
                        "blkio.throttle.read_bps_device",
                        format!("{majmin} {READ_BPS}"),
                    ),
                    (
                        "blkio.throttle.read_iops_device",
                        format!("{majmin} {READ_IOPS}"),
                    ),
                ],
            ),
            (
                "memory",
                vec![("memory.limit_in_bytes", mem_cap.to_string())],
            ),
        ] {
            let g = Path::new(CGROUP).join(ctl).join(&tag);
            std::fs::create_dir(&g).with_context(|| format!("creating {}", g.display()))?;
            s.groups.push(g.clone());
            for (k, v) in settings {
                std::fs::write(g.join(k), v).with_context(|| format!("writing {k}"))?;
            }
        }
        Ok(s)
    }

    fn name(&self) -> String {
        self.dev
            .as_deref()
            .and_then(|d| Path::new(d).file_name())
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    }

    fn mount(&mut self) -> Result<()> {
        let dev = self.dev.clone().unwrap_or_default();
        run(Command::new("mount")
            .args(["-o", "noatime"])
            .arg(&dev)
            .arg(&self.mnt))?;
        self.mounted = true;
        Ok(())
    }

    fn umount(&mut self) -> bool {
        if !self.mounted {
            return true;
        }
        // An agent that just stopped may take a moment to close its last file.
        for _ in 0..50 {
            if run(Command::new("umount").arg(&self.mnt)).is_ok() {
                self.mounted = false;
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// `program`, started inside the blkio and memory groups: a shell writes its own pid into
    /// each group, then execs it, so everything it starts (the agent too) is inside.
    pub fn command(&self, program: &OsStr) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@""#)
            .arg("granary-demo");
        for g in &self.groups {
            c.arg(g.join("cgroup.procs"));
        }
        c.arg("--").arg(program);
        c
    }

    /// Cold start: the source's pages (data and metadata) leave the page cache. Unmounting
    /// writes the image back and evicts its files; the device's own cache goes with its last
    /// close.
    pub fn drop_caches(&mut self) -> Result<()> {
        if !self.umount() {
            bail!("cannot unmount {}", self.mnt.display());
        }
        if let Some(dev) = &self.dev {
            let _ = run(Command::new("blockdev").arg("--flushbufs").arg(dev));
        }
        self.mount()
    }

    /// (read requests, bytes read) on the loop device since it was attached, counted by the
    /// kernel.
    pub fn device_reads(&self) -> (u64, u64) {
        let s =
            std::fs::read_to_string(format!("/sys/block/{}/stat", self.name())).unwrap_or_default();
        let f: Vec<u64> = s
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        (
            f.first().copied().unwrap_or(0),
            f.get(2).copied().unwrap_or(0) * 512,
        )
    }

    pub fn describe(&self) -> String {
        format!(
            "an emulated parallel file system: an ext4 image on {} (direct I/O), reads capped at \
             {} MiB/s and {READ_IOPS} requests/s (cgroup v1 blkio), {READAHEAD_KB} KiB readahead, \
             page cache capped at {} (memory cgroup); caches dropped before each run",
            self.dev.as_deref().unwrap_or("?"),
            READ_BPS >> 20,
            format_size(self.mem_cap)
        )
    }

    fn pids(&self) -> Vec<i32> {
        self.groups
            .iter()
            .filter_map(|g| std::fs::read_to_string(g.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    /// Ends what is left in the groups: only processes the wrapper put there.
    fn end_leftovers(&self) {
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                let _ = Command::new("kill")
                    .arg(format!("-{sig}"))
                    .arg(p.to_string())
                    .output();
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.pids().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// True if everything was undone (the image is gone and nothing is mounted).
    pub fn teardown(&mut self) -> bool {
        self.end_leftovers();
        let unmounted = self.umount()
            || run(Command::new("umount").arg("-l").arg(&self.mnt)).is_ok_and(|_| {
                self.mounted = false;
                true
            });
        if let Some(dev) = self.dev.take() {
            if let Err(e) = run(Command::new("losetup").arg("-d").arg(&dev)) {
                eprintln!("granary demo: detaching {dev}: {e:#}");
            }
        }
        for g in self.groups.drain(..).rev() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&g).is_err() && g.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if g.exists() {
                eprintln!("granary demo: could not remove {}", g.display());
            }
        }
        if unmounted {
            let _ = std::fs::remove_file(&self.image);
        } else {
            eprintln!(
                "granary demo: {} is still mounted; left {} in place",
                self.mnt.display(),
                self.image.display()
            );
        }
        unmounted
    }
}

impl Drop for SlowSource {
    fn drop(&mut self) {
        self.teardown();
    }
}
