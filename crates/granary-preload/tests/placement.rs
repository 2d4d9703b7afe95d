//! The client side of the placement engine (docs/placement.md, "Preload side"), with the test
//! playing the agent: it writes the partial copy and publishes progress, beats the heartbeat,
//! renames the copy into place, keeps chunk files. Real Python programs read; every byte they
//! read is written out and compared with the source.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, Fixture, PY};
use granary_shm::{chunk_data_offset, job, request, State};

const MIB: usize = 1 << 20;
const LARGE: &str = "large/a.bin";
const SIZE: usize = 8 * MIB;

fn fixture() -> Fixture {
    Fixture::with_large(&[(LARGE, SIZE, 42)], MIB as u64, MIB as u64)
}

/// Beats the fixture's heartbeat every 20 ms until dropped.
struct Heart {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heart {
    fn start(table: &std::path::Path) -> Heart {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let table = table.to_path_buf();
        let thread = std::thread::spawn(move || {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&table)
                .unwrap();
            let len = file.metadata().unwrap().len() as usize;
            let (_m, t) =
                granary_shm::Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&file), len).unwrap();
            while !s.load(Ordering::Relaxed) {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: clock_gettime fills the timespec.
                unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
                t.beat(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Heart {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heart {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads the large file while the "agent" fetches it. Phase 1 (file PLACING): a thread preads
/// it whole in 256 KiB steps (waiting on progress); `fd2` reads its first MiB with `read`;
/// `fd3`/`fd4` stay open. Phase 2 (after "go", file PLACED): `fd2` reads on from where it was,
/// `fd3` is mapped, `fd4` is sought; where each fd points is printed.
const FETCHING: &str = r#"
import sys, os, mmap, threading
root, out = sys.argv[1], sys.argv[2]
p = os.path.join(root, "large/a.bin")
size = os.path.getsize(p)
fd1 = os.open(p, os.O_RDONLY)
fd2 = os.open(p, os.O_RDONLY)
fd3 = os.open(p, os.O_RDONLY)
fd4 = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
chunks = []
def reader():
    off = 0
    while off < size:
        b = os.pread(fd1, 262144, off)
        if not b:
            break
        chunks.append(b)
        off += len(b)
t = threading.Thread(target=reader)
t.start()
t.join()
open(os.path.join(out, "pread.bin"), "wb").write(b"".join(chunks))
first = os.read(fd2, 1 << 20)
print("phase1", os.readlink(f"/proc/self/fd/{fd2}"), os.lseek(fd2, 0, os.SEEK_CUR), flush=True)
sys.stdin.readline()
rest = b""
while True:
    b = os.read(fd2, 1 << 20)
    if not b:
        break
    rest += b
open(os.path.join(out, "read.bin"), "wb").write(first + rest)
print("fd2", os.readlink(f"/proc/self/fd/{fd2}"), os.lseek(fd2, 0, os.SEEK_CUR), flush=True)
m = mmap.mmap(fd3, 0, prot=mmap.PROT_READ)
open(os.path.join(out, "mmap.bin"), "wb").write(m[:])
maps = [l.split()[-1] for l in open("/proc/self/maps")
        if len(l.split()) >= 6 and ("a.bin" in l or l.split()[-1].startswith(sys.argv[3]))]
print("maps", " ".join(maps), flush=True)
print("fd3", os.readlink(f"/proc/self/fd/{fd3}"), flush=True)
os.lseek(fd4, 12345, os.SEEK_SET)
print("fd4", os.readlink(f"/proc/self/fd/{fd4}"), os.lseek(fd4, 0, os.SEEK_CUR),
      os.get_inheritable(fd4), os.get_inheritable(fd2), flush=True)
print("fd1", os.pread(fd1, 10, 100) == open(p, "rb").read()[100:110], os.readlink(f"/proc/self/fd/{fd1}"), flush=True)
"#;

#[test]
fn reads_wait_on_the_partial_copy_and_fds_switch_to_the_complete_one() {
    let f = fixture();
    let data = pattern(SIZE, 42);
    let idx = f.idx(LARGE);
    f.drive(idx, State::Placing);
    let half = SIZE / 2;
    f.agent_write(LARGE, &f.part(LARGE), &data[..half]);
    granary_shm::lifecycle::progress(f.t(), idx, half as u64);
    let _heart = Heart::start(&f.table);
    let out = tempfile::tempdir().unwrap();
    let tier = f.tier.display().to_string();
    let mut child = f
        .cmd(
            PY,
            &[
                "-c",
                FETCHING,
                &f.p(""),
                out.path().to_str().unwrap(),
                &tier,
            ],
            true,
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The agent fetches the second half in 512 KiB blocks while the program reads.
    {
        let mut part = fs::OpenOptions::new()
            .append(true)
            .open(f.part(LARGE))
            .unwrap();
        let mut off = half;
        while off < SIZE {
            std::thread::sleep(Duration::from_millis(15));
            let end = (off + MIB / 2).min(SIZE);
            part.write_all(&data[off..end]).unwrap();
            granary_shm::lifecycle::progress(f.t(), idx, end as u64);
            off = end;
        }
    }
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let phase1: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(phase1.first(), Some(&"phase1"), "{line}");
    // Before completion the fd is still the source fd, moved past what was read.
    assert_eq!(phase1[1], f.real_src().join(LARGE).to_str().unwrap());
    assert_eq!(phase1[2], MIB.to_string());
    // Complete: renamed into place, then PLACED.
    fs::rename(f.part(LARGE), f.object(LARGE)).unwrap();
    f.record_identity(LARGE);
    f.drive(idx, State::Placed);
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}\n{rest}");

    for name in ["pread.bin", "read.bin", "mmap.bin"] {
        let got = fs::read(out.path().join(name)).unwrap();
        assert!(
            got == data,
            "{name}: {} bytes differ from the source",
            got.len()
        );
    }
    let obj = f.object(LARGE).display().to_string();
    let lines: Vec<Vec<&str>> = rest
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let get = |k: &str| {
        lines
            .iter()
            .find(|l| l.first() == Some(&k))
            .unwrap_or_else(|| panic!("no {k} in {rest}"))
            .clone()
    };
    // fd2: switched on its next read, offset carried over, read to the end.
    assert_eq!(get("fd2")[1..], [obj.as_str(), &SIZE.to_string()]);
    // fd3: mmap after completion maps the copy. CPython's mmap dups the fd first, so its OFD
    // is shared and stays on the source; the mapping is the copy's, through an fd of its own.
    assert_eq!(get("fd3")[1], f.real_src().join(LARGE).to_str().unwrap());
    assert!(get("maps")[1..].contains(&obj.as_str()), "{rest}");
    // fd4: switched by lseek; FD_CLOEXEC kept as it was (fd4 O_CLOEXEC, fd2 not).
    assert_eq!(get("fd4")[1..], [obj.as_str(), "12345", "False", "False"]);
    assert_eq!(get("fd1")[1..], ["True", obj.as_str()]);

    let source = f.counter(job::SOURCE_BYTES);
    assert!(
        source <= MIB as u64,
        "program read {source} bytes from the source"
    );
    let tier = f.counter(job::TIER_BYTES);
    assert!(tier >= 2 * SIZE as u64, "tier bytes {tier}");
    assert_eq!(f.counter(job::FALLBACKS), 0);
    assert!(f.counter(job::TIER_FILES) >= 4);
}

const READ_ALL: &str = r#"
import sys, os
root, out = sys.argv[1], sys.argv[2]
p = os.path.join(root, "large/a.bin")
size = os.path.getsize(p)
fd = os.open(p, os.O_RDONLY)
parts, off = [], 0
while off < size:
    b = os.pread(fd, 262144, off)
    if not b:
        break
    parts.append(b)
    off += len(b)
open(os.path.join(out, "pread.bin"), "wb").write(b"".join(parts))
with open(p, "rb", buffering=0) as f:
    parts = []
    while True:
        b = f.read(100000)
        if not b:
            break
        parts.append(b)
open(os.path.join(out, "read.bin"), "wb").write(b"".join(parts))
fd = os.open(p, os.O_RDONLY)
v = [bytearray(300000), bytearray(77), bytearray(1 << 20)]
n = os.preadv(fd, v, 4 * 1024 * 1024 - 1000)
open(os.path.join(out, "preadv.bin"), "wb").write(b"".join(v)[:n])
os.lseek(fd, 3 * 1024 * 1024 + 5, os.SEEK_SET)
v = [bytearray(1 << 20), bytearray(1 << 20)]
n = os.readv(fd, v)
open(os.path.join(out, "readv.bin"), "wb").write(b"".join(v)[:n])
print(os.lseek(fd, 0, os.SEEK_CUR))
"#;

fn read_all(f: &Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let o = f.run(PY, &["-c", READ_ALL, &f.p(""), out.to_str().unwrap()], true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (3 * MIB + 5 + 2 * MIB).to_string()
    );
    let data = pattern(SIZE, 42);
    let check = |name: &str, range: std::ops::Range<usize>| {
        let got = fs::read(out.join(name)).unwrap();
        assert!(
            got == data[range.clone()],
            "{name}: differs ({} bytes)",
            got.len()
        );
    };
    check("pread.bin", 0..SIZE);
    check("read.bin", 0..SIZE);
    check(
        "preadv.bin",
        4 * MIB - 1000..4 * MIB - 1000 + 300000 + 77 + MIB,
    );
    check("readv.bin", 3 * MIB + 5..5 * MIB + 5);
}

#[test]
fn a_silent_agent_sends_reads_beyond_progress_to_the_source() {
    let f = fixture();
    let data = pattern(SIZE, 42);
    let idx = f.idx(LARGE);
    f.drive(idx, State::Placing);
    f.agent_write(LARGE, &f.part(LARGE), &data[..SIZE / 2]);
    granary_shm::lifecycle::progress(f.t(), idx, (SIZE / 2) as u64);
    // Never beaten: the agent is gone.
    read_all(&f);
    let source = f.counter(job::SOURCE_BYTES);
    let tier = f.counter(job::TIER_BYTES);
    // What progress covered came from the partial copy (a read straddling it: the source),
    // the rest from the source.
    assert!(source >= SIZE as u64, "source bytes {source}");
    assert!(tier >= (SIZE - MIB) as u64, "tier bytes {tier}");
    assert_eq!(f.state_of(LARGE), State::Placing);
}

#[test]
fn a_placing_file_that_is_complete_is_read_from_the_partial_copy() {
    let f = fixture();
    let idx = f.idx(LARGE);
    f.drive(idx, State::Placing);
    f.agent_write(LARGE, &f.part(LARGE), &pattern(SIZE, 42));
    granary_shm::lifecycle::progress(f.t(), idx, SIZE as u64);
    read_all(&f);
    assert_eq!(f.counter(job::SOURCE_BYTES), 0);
    // Every byte read, by every call of the family (pread, read, preadv, readv), came from it.
    assert_eq!(
        f.counter(job::TIER_BYTES),
        (2 * SIZE + 300000 + 77 + MIB + 2 * MIB) as u64
    );
}

#[test]
fn partial_files_read_present_chunks_from_the_chunk_file_and_ask_for_the_rest() {
    let f = fixture();
    let data = pattern(SIZE, 42);
    let idx = f.idx(LARGE);
    let cs = MIB as u64;
    assert_eq!(f.t().chunk_count(idx), (SIZE / MIB) as u64);
    let base = chunk_data_offset(SIZE as u64, cs) as usize;
    let mut file = vec![0u8; base + SIZE];
    for k in (0..SIZE / MIB).step_by(2) {
        file[base + k * MIB..base + (k + 1) * MIB].copy_from_slice(&data[k * MIB..(k + 1) * MIB]);
        granary_shm::lifecycle::chunk(f.t(), idx, k as u64, true);
    }
    // Absent chunks hold garbage: reading them from the chunk file would be caught.
    for k in (1..SIZE / MIB).step_by(2) {
        file[base + k * MIB..base + (k + 1) * MIB].fill(0xee);
    }
    f.agent_write(LARGE, &f.chunks(LARGE), &file);
    f.drive(idx, State::Partial);
    read_all(&f);
    let source = f.counter(job::SOURCE_BYTES);
    let tier = f.counter(job::TIER_BYTES);
    assert!(source >= SIZE as u64 / 2, "source bytes {source}");
    assert!(tier >= SIZE as u64 / 2, "tier bytes {tier}");
    let reqs = f.requests_arg();
    let asked: std::collections::BTreeSet<u32> = reqs
        .iter()
        .filter(|(k, p, _)| *k == request::CHUNK && p == LARGE)
        .map(|r| r.2)
        .collect();
    assert_eq!(asked, [1, 3, 5, 7].into_iter().collect(), "{reqs:?}");
    assert!(!reqs.iter().any(|(k, _, _)| *k == request::CLOSED));
}

#[test]
fn mapping_a_partial_file_maps_its_present_chunks_over_the_source() {
    let f = fixture();
    let data = pattern(SIZE, 42);
    let idx = f.idx(LARGE);
    let base = chunk_data_offset(SIZE as u64, MIB as u64) as usize;
    let mut file = vec![0xeeu8; base + SIZE]; // absent chunks: garbage, mapping them is caught
    for k in (0..SIZE / MIB).step_by(2) {
        file[base + k * MIB..base + (k + 1) * MIB].copy_from_slice(&data[k * MIB..(k + 1) * MIB]);
        granary_shm::lifecycle::chunk(f.t(), idx, k as u64, true);
    }
    f.agent_write(LARGE, &f.chunks(LARGE), &file);
    f.drive(idx, State::Partial);
    // A read-only shared mapping (LMDB's), one at an offset, and a private writable one.
    let script = r#"
import hashlib, mmap, os, sys
p = os.path.join(sys.argv[1], "large/a.bin")
fd = os.open(p, os.O_RDONLY)
whole = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
tail = mmap.mmap(fd, 3 << 20, offset=5 << 20, prot=mmap.PROT_READ)
priv = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
maps = open("/proc/self/maps").read()
print(hashlib.sha256(whole[:]).hexdigest(), hashlib.sha256(tail[:]).hexdigest(),
      hashlib.sha256(priv[:]).hexdigest())
print("chunk-file-mapped" if ".chunks" in maps else "source-only", file=sys.stderr)
"#;
    let with = f.run(PY, &["-c", script, &f.p("")], true);
    let without = f.run(PY, &["-c", script, &f.p("")], false);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert_eq!(
        with.stdout, without.stdout,
        "mapped bytes differ from the source's"
    );
    assert!(
        String::from_utf8_lossy(&with.stderr).contains("chunk-file-mapped"),
        "present chunks were not mapped from the chunk file: {}",
        String::from_utf8_lossy(&with.stderr)
    );
}

#[test]
fn closing_a_small_unplaced_file_asks_for_a_copy_from_the_page_cache() {
    let f = fixture();
    let small = "train/cls1/img3.jpg";
    f.drive(f.idx("train/cls1/img4.jpg"), State::Queued);
    let script = r#"
import sys, os
root = sys.argv[1]
for rel in ["train/cls1/img3.jpg", "a.txt", "large/a.bin", "train/cls1/img4.jpg"]:
    with open(os.path.join(root, rel), "rb") as f:
        f.read()
"#;
    f.same_py(script);
    f.same("cat", &[&f.p("train/cls0/img2.jpg")]);
    let reqs = f.requests();
    let closed: Vec<&str> = reqs
        .iter()
        .filter(|(k, _)| *k == request::CLOSED)
        .map(|(_, p)| p.as_str())
        .collect();
    // Placed (a.txt) and large files are not the page cache's to copy. One process's requests
    // come in its order; two processes' (python's, then cat's) in any (`RING_SHARDS`).
    let mut sorted = closed.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["train/cls0/img2.jpg", small, "train/cls1/img4.jpg"],
        "{reqs:?}"
    );
    let at = |p: &str| closed.iter().position(|c| *c == p);
    assert!(at(small) < at("train/cls1/img4.jpg"), "{reqs:?}");
}

/// Opens placed files (tier), an unplaced one, a SOURCE_ONLY one and a directory; returns the
/// requests pushed.
fn opens_with_report_flag(on: bool) -> Vec<(u8, String)> {
    let f = fixture();
    f.t().set_reports_opens(on);
    f.drive(f.idx("train/cls1/img4.jpg"), State::SourceOnly);
    let script = r#"
import sys, os
root = sys.argv[1]
for rel in ["a.txt", "train/cls0/img0.jpg", "train/cls1/img4.jpg"]:
    with open(os.path.join(root, rel), "rb") as f:
        f.read()
os.listdir(os.path.join(root, "train"))
"#;
    f.same_py(script);
    // A C program's fopen of a placed file.
    f.same("cat", &[&f.p(common::BIG)]);
    assert!(
        f.counter(job::TIER_FILES) >= 2,
        "a.txt and big.bin from the tier"
    );
    f.requests()
}

#[test]
fn opens_are_reported_only_when_the_agent_asks() {
    let on = opens_with_report_flag(true);
    let opened: Vec<&str> = on
        .iter()
        .filter(|(k, _)| *k == request::OPENED)
        .map(|(_, p)| p.as_str())
        .collect();
    // Placed files (tier) and a source open of a file that is not UNPLACED; the unplaced one
    // says OPEN_UNPLACED instead (one request per open), directories say nothing. Python's in
    // its order, cat's (big.bin) anywhere (`RING_SHARDS`).
    assert_eq!(
        opened
            .iter()
            .filter(|p| **p != common::BIG)
            .collect::<Vec<_>>(),
        [&"a.txt", &"train/cls1/img4.jpg"],
        "{on:?}"
    );
    assert_eq!(
        opened.iter().filter(|p| **p == common::BIG).count(),
        1,
        "{on:?}"
    );
    assert!(
        on.contains(&(request::OPEN_UNPLACED, "train/cls0/img0.jpg".into())),
        "{on:?}"
    );
    let off = opens_with_report_flag(false);
    assert!(
        off.iter().all(|(k, _)| *k != request::OPENED),
        "no OPENED without the flag: {off:?}"
    );
    // Nobody follows opens: the small unplaced file's open says nothing, its close asks for
    // the copy (one request per file).
    assert!(
        !off.contains(&(request::OPEN_UNPLACED, "train/cls0/img0.jpg".into())),
        "{off:?}"
    );
    assert!(
        off.contains(&(request::CLOSED, "train/cls0/img0.jpg".into())),
        "{off:?}"
    );
}
