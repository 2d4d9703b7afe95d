//! Known-order placement through the real binary: a dataset twice the size of its tier, an
//! access-order file, and a Python reader that follows that order for 3 epochs, checking every
//! byte. The agent must keep the tier within its capacity, evict only files the program already
//! read in the current epoch, and place upcoming files before the program opens them. No timing
//! assertions: the reader pauses at each epoch boundary (sync files) until the agent settled.

mod common;

use common::{granary_cmd, pattern, sha256_hex, BIN};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const FILES: usize = 40;
const EPOCHS: usize = 3;
const TIER_CAP: u64 = 20 * MIB;

/// argv: order file, source root, manifest (rel -> sha256), epochs, trace out, sync dir.
/// Before epoch e (and after the last) it writes `<sync>/at-e` and waits for `<sync>/go-e`.
/// For every open it records: epoch, path, CLOCK_MONOTONIC ns taken *before* the open, and
/// whether the fd it got is the source file (else a tier copy).
const READER: &str = r##"
import hashlib, json, os, sys, time
order = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
root, want = sys.argv[2], json.load(open(sys.argv[3]))
epochs, trace, sync = int(sys.argv[4]), open(sys.argv[5], "w"), sys.argv[6]
real = os.path.realpath(root)
one = order[:len(want)]
def barrier(e):
    open(os.path.join(sync, f"at-{e}"), "w").close()
    while not os.path.exists(os.path.join(sync, f"go-{e}")):
        time.sleep(0.01)
bad = 0
for e in range(1, epochs + 1):
    barrier(e)
    for rel in one:
        t = time.monotonic_ns()
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        src = os.readlink(f"/proc/self/fd/{fd}").startswith(real + "/")
        h, off = hashlib.sha256(), 0
        while True:
            b = os.pread(fd, 256 * 1024, off)
            if not b:
                break
            h.update(b)
            off += len(b)
        os.close(fd)
        if h.hexdigest() != want[rel]:
            print("MISMATCH", e, rel, file=sys.stderr)
            bad += 1
        trace.write(f"{e} {rel} {t} {int(src)}\n")
        trace.flush()
barrier(epochs + 1)
sys.exit(1 if bad else 0)
"##;

fn status(rt: &Path) -> serde_json::Value {
    let o = granary_cmd(rt).args(["status", "--json"]).output().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// `pending == 0` twice, a few prefetch-thread wake-ups apart (it may be between two files).
fn settle(rt: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut quiet = 0;
    while quiet < 2 {
        let s = status(rt);
        let src = &s["sources"][0];
        if src["pending"].as_u64() == Some(0) && src["busy"].as_bool() == Some(false) {
            quiet += 1;
        } else {
            quiet = 0;
        }
        assert!(Instant::now() < deadline, "placement never settled: {s}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Bytes of every file in the tier's object directories (copies, parts, temporaries).
fn tier_bytes(tier: &Path) -> u64 {
    let mut n = 0;
    for s in std::fs::read_dir(tier).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(s.path().join("objects"))
            .into_iter()
            .flatten()
            .flatten()
        {
            n += f.metadata().map_or(0, |m| m.len());
        }
    }
    n
}

#[test]
fn known_order_prefetches_ahead_and_evicts_only_what_was_read() {
    let lib = Path::new(BIN).with_file_name("libgranary_preload.so");
    if !lib.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        assert!(Command::new(cargo)
            .args(["build", "-p", "granary-preload"])
            .status()
            .unwrap()
            .success());
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, tier, rt, sync) = (
        dir.path().join("src"),
        dir.path().join("tier"),
        dir.path().join("rt"),
        dir.path().join("sync"),
    );
    std::fs::create_dir_all(&sync).unwrap();
    let mut rels = Vec::new();
    for i in 0..FILES {
        let rel = format!("d{}/f{i:02}.bin", i % 4);
        let p = src.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(i as u64 + 1, MIB as usize)).unwrap();
        rels.push(rel);
    }
    let sums: Vec<String> = rels
        .iter()
        .map(|r| sha256_hex(&std::fs::read(src.join(r)).unwrap()))
        .collect();
    let manifest: serde_json::Map<String, serde_json::Value> = rels
        .iter()
        .zip(&sums)
        .map(|(r, s)| (r.clone(), s.clone().into()))
        .collect();
    std::fs::write(
        dir.path().join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    // A fixed shuffle (multiplicative: 7 is coprime with 40), listed for every epoch, plus one
    // line naming nothing (reported, not fatal).
    let order: Vec<&str> = (0..FILES)
        .map(|i| rels[(i * 7 + 3) % FILES].as_str())
        .collect();
    let mut listing = String::from("# shuffled order, 3 epochs\nno/such/file.bin\n");
    for _ in 0..EPOCHS {
        for r in &order {
            listing.push_str(r);
            listing.push('\n');
        }
    }
    let order_file = dir.path().join("order.txt");
    std::fs::write(&order_file, &listing).unwrap();
    std::fs::write(dir.path().join("reader.py"), READER).unwrap();
    // The reader's own list: the listing without the unknown line.
    let reader_order = dir.path().join("reader-order.txt");
    std::fs::write(&reader_order, order.join("\n")).unwrap();
    let log = dir.path().join("agent.log");
    let trace = dir.path().join("trace.txt");
    let stats = dir.path().join("stats.json");

    let mut c = granary_cmd(&rt);
    c.env("GRANARY_LOG", format!("info:{}", log.display()))
        .arg("run")
        .arg("-q")
        .arg("--source")
        .arg(&src)
        .arg("--tier")
        .arg(format!("{}=20M", tier.display()))
        .arg("--access-order")
        .arg(&order_file)
        .arg("--idle-timeout=30s")
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .arg("python3")
        .arg(dir.path().join("reader.py"))
        .arg(&reader_order)
        .arg(&src)
        .arg(dir.path().join("manifest.json"))
        .arg(EPOCHS.to_string())
        .arg(&trace)
        .arg(&sync);
    let mut child = c.spawn().unwrap();

    // Between epochs: let the agent settle (the window ahead is placed), check the tier on
    // disk and in the agent's accounting, then let the reader go on.
    let mut max_used = 0u64;
    for e in 1..=EPOCHS + 1 {
        let at = sync.join(format!("at-{e}"));
        let deadline = Instant::now() + Duration::from_secs(300);
        while !at.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("granary run ended early: {st}");
            }
            let s = status(&rt);
            for t in s["sources"][0]["tiers"].as_array().into_iter().flatten() {
                let (u, r, cap) = (
                    t["used"].as_u64().unwrap_or(0),
                    t["reserved"].as_u64().unwrap_or(0),
                    t["capacity"].as_u64().unwrap_or(0),
                );
                assert!(u + r <= cap, "tier over capacity: {t}");
                max_used = max_used.max(u + r);
            }
            assert!(Instant::now() < deadline, "reader never reached epoch {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
        settle(&rt);
        let on_disk = tier_bytes(&tier);
        assert!(
            on_disk <= TIER_CAP,
            "before epoch {e}: {on_disk} bytes in a {TIER_CAP}-byte tier"
        );
        std::fs::write(sync.join(format!("go-{e}")), b"").unwrap();
    }
    let st = child.wait().unwrap();
    let _ = granary_cmd(&rt).arg("stop").output();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        st.success(),
        "reader failed (bytes wrong?); agent log:\n{log_text}"
    );
    assert!(max_used > 0, "the tier was never used");

    // The trace: (epoch, path) -> CLOCK_MONOTONIC before the open; source opens per epoch.
    let trace_text = std::fs::read_to_string(&trace).unwrap();
    let mut opened = std::collections::HashMap::new();
    let mut source_opens = [0usize; EPOCHS + 1];
    let mut lines = 0;
    for l in trace_text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let (e, rel, t, s): (usize, String, u64, bool) = (
            f[0].parse().unwrap(),
            f[1].to_string(),
            f[2].parse().unwrap(),
            f[3] == "1",
        );
        opened.insert((e, rel), t);
        source_opens[e] += s as usize;
        lines += 1;
    }
    assert_eq!(lines, FILES * EPOCHS, "every file read every epoch");
    for (e, n) in source_opens.iter().enumerate().skip(1) {
        assert!(
            *n < FILES,
            "epoch {e}: {n} of {FILES} opens went to the source: nothing was prefetched"
        );
    }

    // Every eviction: a file the reader had opened in the agent's current epoch, before it.
    let mut evictions = 0;
    for l in log_text.lines().filter(|l| l.contains("evicted ")) {
        let rest = &l[l.find("evicted ").unwrap() + 8..];
        let rel = rest.split(' ').next().unwrap().to_string();
        let num = |key: &str| -> u64 {
            let i = rest.find(key).unwrap_or_else(|| panic!("{key} in {l}")) + key.len();
            rest[i..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        };
        let (epoch, at) = (num("(epoch ") as usize, num("t_mono_ns "));
        let read_at = opened.get(&(epoch, rel.clone()));
        assert!(
            read_at.is_some_and(|&t| t < at),
            "evicted {rel} in epoch {epoch} at {at}, but the reader opened it then at {read_at:?}"
        );
        evictions += 1;
    }
    assert!(evictions > 0, "a dataset twice the tier needs evictions");
    let js: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(
        js["placement"]["evictions"].as_u64(),
        Some(evictions as u64),
        "{js}"
    );
    assert!(
        js["placement"]["prefetched"].as_u64().unwrap_or(0) > 0,
        "{js}"
    );
    assert!(
        log_text.contains("1 line(s) name no file of the source"),
        "the unknown line is reported: {log_text}"
    );
}
