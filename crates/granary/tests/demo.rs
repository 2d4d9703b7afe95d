//! `granary demo` through the real binary, in both of its modes: on an emulated slow source
//! (as root, where cgroup v1 blkio and memory controllers and loop devices exist) and on a
//! local directory (`--no-emulation`, and not root). Each run must verify every byte it read
//! in both readers, say which mode ran and why, and leave nothing behind — no loop device, no
//! mount, no cgroup, no image — also when interrupted. No timing is asserted.

mod common;

use common::{ensure_preload, granary_cmd, BIN};

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use granary_core::size::format_size;

const FILES: u64 = 40;
const SIZE: u64 = 640 << 10;
const EPOCHS: u64 = 2;

/// The emulated runs one at a time: each compares the machine's cgroups before and after.
static EMULATED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn demo(dir: &Path, extra: &[&str]) -> Command {
    let mut c = granary_cmd(&dir.join("unused-runtime"));
    c.arg("demo")
        .arg("--dir")
        .arg(dir)
        .args(["--files", &FILES.to_string()])
        .args(["--size", &SIZE.to_string()])
        .args(["--epochs", &EPOCHS.to_string()])
        .args(extra);
    c
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Both readers read (and checked) every file in every epoch.
fn assert_verified(o: &Output) {
    let all = text(o);
    assert!(o.status.success(), "{all}");
    let want = format_size(FILES * SIZE * EPOCHS);
    let line = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with("bytes verified:"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no `bytes verified` line: {all}"));
    assert!(
        line.starts_with(&format!(
            "bytes verified: {want} direct, {want} under granary;"
        )),
        "expected {want} verified by each reader: {all}"
    );
}

/// What the emulation would create that could outlive the demo.
fn leftovers() -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    for ctl in ["blkio", "memory"] {
        for e in std::fs::read_dir(Path::new("/sys/fs/cgroup").join(ctl))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with("granary-demo-") {
                s.insert(format!("cgroup {ctl}/{n}"));
            }
        }
    }
    s
}

/// The demo's own traces under `dir`: its image attached, its dataset mounted, its image file.
fn traces_in(dir: &Path) -> Vec<String> {
    let mut t = Vec::new();
    let img = dir.join("source.img");
    let lo = Command::new("losetup")
        .arg("-j")
        .arg(&img)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !lo.is_empty() {
        t.push(format!("loop device: {lo}"));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounts.contains(&dir.display().to_string()) {
        t.push(format!("a mount under {}", dir.display()));
    }
    if img.exists() {
        t.push(format!("{} exists", img.display()));
    }
    t
}

/// True where this machine lets the demo emulate a slow source (its own probe, restated).
fn can_emulate() -> bool {
    granary_core::sys::uid() == 0
        && Path::new("/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device").exists()
        && Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
        && Path::new("/dev/loop-control").exists()
        && Command::new("mkfs.ext4")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// For a test of the emulated path: the machine's state before it (one such test at a time)
/// and a directory for the demo; `None` (the test skipped) where the demo cannot emulate.
fn emulated(
    test: &str,
) -> Option<(
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
    BTreeSet<String>,
)> {
    ensure_preload();
    if !can_emulate() {
        eprintln!("SKIPPED {test}: needs root, cgroup v1 blkio and memory, loop devices");
        return None;
    }
    let one = EMULATED.lock().unwrap_or_else(|e| e.into_inner());
    Some((one, tempfile::tempdir().unwrap(), leftovers()))
}

#[test]
fn demo_on_an_emulated_slow_source() {
    let Some((_one, d, before)) = emulated("demo_on_an_emulated_slow_source") else {
        return;
    };
    let o = demo(d.path(), &[]).output().unwrap();
    let all = text(&o);
    assert_verified(&o);
    assert!(
        all.contains("mode: emulated slow source; the source is an emulated parallel file system"),
        "{all}"
    );
    assert!(
        all.contains("source device, counted by the kernel:"),
        "{all}"
    );
    assert_eq!(leftovers(), before, "{all}");
    assert!(
        traces_in(d.path()).is_empty(),
        "{:?}\n{all}",
        traces_in(d.path())
    );
}

#[test]
fn demo_without_emulation_says_what_it_measured() {
    ensure_preload();
    let d = tempfile::tempdir().unwrap();
    let o = demo(d.path(), &["--no-emulation"]).output().unwrap();
    let all = text(&o);
    assert_verified(&o);
    assert!(
        all.contains("mode: local disk, no slow-source emulation (--no-emulation)"),
        "{all}"
    );
    assert!(
        all.contains("what this measured: granary's overhead"),
        "{all}"
    );
    assert!(traces_in(d.path()).is_empty(), "{all}");

    // Not root: the probe says so, the demo still runs (and still verifies every byte).
    if granary_core::sys::uid() != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        return;
    }
    let nobody = tempfile::tempdir().unwrap();
    let chown = Command::new("chown")
        .arg("65534:65534")
        .arg(nobody.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--reset-env",
        "--",
        BIN,
    ]);
    let inner = demo(nobody.path(), &[]);
    c.args(inner.get_args());
    let o = c.output().unwrap();
    let all = text(&o);
    assert_verified(&o);
    assert!(
        all.contains("mode: local disk, no slow-source emulation (not root)"),
        "{all}"
    );
}

#[test]
fn demo_cleans_up_when_interrupted() {
    let Some((_one, d, before)) = emulated("demo_cleans_up_when_interrupted") else {
        return;
    };
    let mut child = demo(d.path(), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt while the direct reader runs on the emulated source (its image is attached,
    // mounted and throttled by then).
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut log = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("reading the source directly") {
                let _ = tx.send(());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while rx.recv_timeout(Duration::from_millis(100)).is_err() {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the demo never reached its direct run"
        );
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    assert_eq!(leftovers(), before);
    assert!(traces_in(d.path()).is_empty(), "{:?}", traces_in(d.path()));
}
