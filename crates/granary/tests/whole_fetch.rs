//! Mid-size files on a source that charges per request: on a loop device with a 128 KiB
//! readahead (the benchmark's emulated PFS), files larger than one readahead window are fetched
//! whole by the agent (one large request each) and the program's reads are served from the
//! copy, while files within one window are read by the program and copied from the page cache,
//! as before. Counted by the kernel (`/sys/block/loopN/stat`) and by granary's stats, with the
//! page cache dropped before each run. Needs root (losetup, mount); skipped otherwise.

mod common;

use common::{ensure_preload, granary_cmd, ok, pattern, sha256_hex, LoopFs};

use std::process::Command;

/// Reads every file of the manifest in 64 KiB `read`s (a chunked decoder's pattern), checks
/// its sha256, exits 1 on any mismatch.
const READER: &str = r#"
import hashlib, json, sys
bad = 0
for path, want in json.load(open(sys.argv[1])):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(64 * 1024)
            if not b:
                break
            h.update(b)
    if h.hexdigest() != want:
        print("MISMATCH", path, file=sys.stderr)
        bad += 1
sys.exit(1 if bad else 0)
"#;

#[test]
fn mid_size_files_are_fetched_whole_in_fewer_requests() {
    ensure_preload();
    let d = tempfile::tempdir().unwrap();
    let Some(fs) = LoopFs::new(d.path(), 96) else {
        eprintln!("SKIPPED mid_size_files_are_fetched_whole_in_fewer_requests: needs root and loop devices");
        return;
    };
    let src = fs.mnt.join("data");
    let mut manifest = Vec::new();
    let (mut mid, mut small) = (0u64, 0u64);
    for i in 0..16u64 {
        // npz samples of ~700 KB, and JPEG-sized files well within one 128 KiB window.
        for (dir, len) in [("mid", 700_000 + 977 * i), ("small", 60_000 + 131 * i)] {
            let p = src.join(dir).join(format!("f{i:02}"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let bytes = pattern(100 + i * 2 + (dir == "mid") as u64, len as usize);
            std::fs::write(&p, &bytes).unwrap();
            manifest.push((p.display().to_string(), sha256_hex(&bytes)));
            if dir == "mid" {
                mid += len;
            } else {
                small += len;
            }
        }
    }
    let mf = d.path().join("manifest.json");
    std::fs::write(&mf, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let reader = d.path().join("reader.py");
    std::fs::write(&reader, READER).unwrap();
    fs.set_readahead_kb(128);

    // The program alone: readahead-sized requests.
    fs.drop_cache();
    let before = fs.reads();
    ok(&Command::new("python3")
        .arg(&reader)
        .arg(&mf)
        .output()
        .unwrap());
    let direct = (fs.reads().0 - before.0, fs.reads().1 - before.1);

    // Under granary.
    let rt = d.path().join("rt");
    let stats = d.path().join("stats.json");
    fs.drop_cache();
    let before = fs.reads();
    let o = granary_cmd(&rt)
        .arg("run")
        .arg("-q")
        .arg("--source")
        .arg(&src)
        .arg("--tier")
        .arg(format!("{}=1G", d.path().join("tier").display()))
        .arg("--stats-json")
        .arg(&stats)
        .args(["--", "python3"])
        .arg(&reader)
        .arg(&mf)
        .output()
        .unwrap();
    ok(&o);
    // The program's counters are final when the job ends; the agent's once it settled (the
    // last small files are copied after their close).
    let agent = common::settle(&rt);
    let _ = granary_cmd(&rt).arg("stop").output();
    let after = fs.reads();
    let gran = (after.0 - before.0, after.1 - before.1);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let p = &agent["placement"];
    let why =
        format!("direct {direct:?}, granary {gran:?} (requests, bytes); job {st}; agent {agent}");

    eprintln!("{why}");
    // Every mid-size file was read from the source by the agent alone, whole…
    assert_eq!(p["agent_source_bytes"].as_u64(), Some(mid), "{why}");
    // …and every small one by the program alone, copied from the page cache afterwards.
    assert_eq!(st["source_io"]["bytes"].as_u64(), Some(small), "{why}");
    assert_eq!(p["page_cache_bytes"].as_u64(), Some(small), "{why}");
    assert_eq!(p["duplicate_bytes"].as_u64(), Some(0), "{why}");
    assert_eq!(p["files_placed"].as_u64(), Some(32), "{why}");
    // The device read every byte once (plus metadata), in far fewer requests than the
    // program's own reads took.
    let data = mid + small;
    assert!(
        gran.1 >= data && gran.1 <= data + (2 << 20),
        "the device read {} bytes for {data} bytes of files: {why}",
        gran.1
    );
    assert!(
        gran.0 * 2 <= direct.0,
        "granary took {} device requests, the program alone {}: {why}",
        gran.0,
        direct.0
    );
    // One request per file: a mid-size file is one direct read into a huge page (through the
    // page cache its ~170 scattered pages were two requests), a small one the program's read
    // within one readahead window; a few more for the inodes and directories.
    assert!(
        gran.0 <= 32 + 8,
        "granary took {} device requests for 32 files: {why}",
        gran.0
    );
}

/// The first read of a job, made at once (`cat` starts within a millisecond): the table is
/// published with a heartbeat, so the read waits for the agent's fetch instead of taking the
/// agent for dead and reading the source itself (the file's bytes read twice).
#[test]
fn the_first_read_of_a_job_waits_for_the_fetch() {
    ensure_preload();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let bytes = pattern(7, 8 << 20);
    std::fs::write(src.join("shard"), &bytes).unwrap();
    let stats = d.path().join("stats.json");
    let rt = d.path().join("rt");
    let o = granary_cmd(&rt)
        .arg("run")
        .arg("-q")
        .arg("--source")
        .arg(&src)
        .arg("--tier")
        .arg(format!("{}=1G", d.path().join("tier").display()))
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .arg("cat")
        .arg(src.join("shard"))
        .output()
        .unwrap();
    let _ = granary_cmd(&rt).arg("stop").output();
    assert!(o.status.success(), "{o:?}");
    assert!(o.stdout == bytes, "cat's output differs from the file");
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(st["source_io"]["bytes"].as_u64(), Some(0), "{st}");
    // The agent fetched the file once: from the source, or from the page cache where the file's
    // pages still were after it was written.
    let p = &st["placement"];
    assert_eq!(
        p["agent_source_bytes"].as_u64().unwrap() + p["page_cache_bytes"].as_u64().unwrap(),
        bytes.len() as u64,
        "{st}"
    );
    assert_eq!(p["duplicate_bytes"].as_u64(), Some(0), "{st}");
}
