//! Micro-benchmark (ignored by default; prints, asserts nothing about time):
//!   cargo build --release -p granary-preload &&
//!   cargo test --release -p granary-preload --test bench -- --ignored --nocapture

mod common;

use std::process::Command;

use common::{Fixture, BIG};

/// The process's CPU time per call, openbench's last figure.
fn cpu_ns(out: &std::process::Output) -> f64 {
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    let fields: Vec<&str> = s.split_whitespace().collect();
    fields[fields.len() - 2].parse().unwrap()
}

fn ns(out: &std::process::Output) -> f64 {
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
#[ignore]
fn open_read_close_overhead() {
    let f = Fixture::new();
    let exe = f.dir.path().join("openbench");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bench/openbench.c");
    let st = Command::new("cc")
        .args(["-O2", "-o", exe.to_str().unwrap(), src])
        .status()
        .unwrap();
    assert!(st.success());
    let exe = exe.to_str().unwrap();
    let placed = f.p(BIG);
    let copy = f.object(BIG).display().to_string();
    let outside = f.dir.path().join("outside.bin");
    std::fs::write(&outside, b"x").unwrap();
    let outside = outside.to_str().unwrap();
    for round in 0..3 {
        let with = ns(&f.run(exe, &["read", &placed, "20000"], true));
        let local = ns(&f.run(exe, &["read", &copy, "20000"], false));
        let o_with = ns(&f.run(exe, &["open", outside, "200000"], true));
        let o_without = ns(&f.run(exe, &["open", outside, "200000"], false));
        println!(
            "round {round}: placed 128 KiB open+read+close: {with:.0} ns with granary vs {local:.0} ns local ({:.3}x); \
             open+close outside the source: {o_with:.0} ns vs {o_without:.0} ns ({:.3}x)",
            with / local,
            o_with / o_without
        );
    }
    assert!(f.counter(granary_shm::job::TIER_FILES) >= 60000);
}

/// This build of the library against another one (`GRANARY_BENCH_OTHER_LIB=/path/to/.so`, say
/// the previous commit's release build) on the same table, in alternating runs: a placed
/// file's open+close and open+read+close, and open+close of a path outside the source. Prints
/// each round's CPU time per call (a busy machine inflates the wall clock by whatever share of
/// the cores it lends the run), then the medians and minima; the other build must read the
/// same table format.
///   GRANARY_BENCH_OTHER_LIB=/tmp/old.so \
///   cargo test --release -p granary-preload --test bench -- --ignored --nocapture against
#[test]
#[ignore]
fn open_cost_against_another_build() {
    let Some(other) = std::env::var_os("GRANARY_BENCH_OTHER_LIB") else {
        eprintln!("GRANARY_BENCH_OTHER_LIB is not set: nothing to compare");
        return;
    };
    let f = Fixture::new();
    let exe = f.dir.path().join("openbench");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bench/openbench.c");
    let st = Command::new("cc")
        .args(["-O2", "-o", exe.to_str().unwrap(), src])
        .status()
        .unwrap();
    assert!(st.success());
    let exe = exe.to_str().unwrap();
    let placed = f.p(BIG);
    let outside = f.dir.path().join("outside.bin");
    std::fs::write(&outside, b"x").unwrap();
    let outside = outside.to_str().unwrap();
    let cases: [(&str, &str, &str, &str); 3] = [
        ("placed open+close", "open", &placed, "100000"),
        ("placed 128 KiB open+read+close", "read", &placed, "20000"),
        ("outside open+close", "open", outside, "200000"),
    ];
    let run = |mode: &str, path: &str, n: &str, lib: Option<&std::ffi::OsStr>| {
        let mut c = f.cmd(exe, &[mode, path, n], true);
        if let Some(lib) = lib {
            c.env("LD_PRELOAD", lib);
        }
        cpu_ns(&c.output().unwrap())
    };
    let mut this_ns = vec![vec![]; cases.len()];
    let mut other_ns = vec![vec![]; cases.len()];
    for round in 0..15 {
        for (i, (name, mode, path, n)) in cases.iter().enumerate() {
            // Alternate which goes first, so neither always runs on a warmer machine.
            let (a, b) = if round % 2 == 0 {
                let a = run(mode, path, n, None);
                (a, run(mode, path, n, Some(&other)))
            } else {
                let b = run(mode, path, n, Some(&other));
                (run(mode, path, n, None), b)
            };
            this_ns[i].push(a);
            other_ns[i].push(b);
            println!(
                "round {round}: {name}: this build {a:.0} ns, other {b:.0} ns ({:.3}x)",
                a / b
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for (i, (name, ..)) in cases.iter().enumerate() {
        let (a, b) = (median(&mut this_ns[i]), median(&mut other_ns[i]));
        println!(
            "median: {name}: this build {a:.0} ns, other {b:.0} ns ({:.3}x)",
            a / b
        );
        // Sorted by `median`: the least disturbed round of each.
        let (a, b) = (this_ns[i][0], other_ns[i][0]);
        println!(
            "minimum: {name}: this build {a:.0} ns, other {b:.0} ns ({:.3}x)",
            a / b
        );
    }
}

/// 64 MiB read in 256 KiB `pread`s by Python, three ways in one run: from the partial copy
/// (PLACING, progress complete: open/pread/close of `.part` per call), from the placed copy
/// (open returns the copy's fd), and the copy read directly without the library.
#[test]
#[ignore]
fn partial_copy_vs_placed_copy() {
    const SIZE: usize = 64 << 20;
    const REL: &str = "large/bench.bin";
    let f = common::Fixture::with_large(&[(REL, SIZE, 3)], 1 << 20, 1 << 20);
    let idx = f.idx(REL);
    let data = common::pattern(SIZE, 3);
    std::fs::write(f.part(REL), &data).unwrap();
    std::fs::write(f.object(REL), &data).unwrap();
    let script = r#"
import sys, os, time
p, reps = sys.argv[1], int(sys.argv[2])
fd = os.open(p, os.O_RDONLY)
size = os.fstat(fd).st_size
best = None
for _ in range(reps):
    t = time.perf_counter()
    off = 0
    while off < size:
        off += len(os.pread(fd, 262144, off))
    d = time.perf_counter() - t
    best = d if best is None else min(best, d)
print(best * 1e9)
"#;
    let src = f.p(REL);
    let copy = f.object(REL).display().to_string();
    for round in 0..3 {
        f.drive(idx, granary_shm::State::Placing);
        granary_shm::lifecycle::progress(f.t(), idx, SIZE as u64);
        let part = ns(&f.run(common::PY, &["-c", script, &src, "20"], true));
        f.drive(idx, granary_shm::State::Placed);
        let placed = ns(&f.run(common::PY, &["-c", script, &src, "20"], true));
        let local = ns(&f.run(common::PY, &["-c", script, &copy, "20"], false));
        println!(
            "round {round}: 64 MiB in 256 KiB preads: from .part {:.1} ms, placed copy {:.1} ms \
             ({:.3}x), copy without granary {:.1} ms (placed/local {:.3}x)",
            part / 1e6,
            placed / 1e6,
            part / placed,
            local / 1e6,
            placed / local
        );
    }
    assert_eq!(f.counter(granary_shm::job::SOURCE_BYTES), 0);
}

/// The path one `open()` of a placed file takes through the library's source: gdb steps through
/// a process's second such call line by line (a debug build: `cargo build -p granary-preload`) and this prints the
/// files it passed through, in order, with the number of stops and crossings between the
/// preload and shm crates (a stop: consecutive lines in one file). Needs gdb; prints, asserts
/// nothing but that the open was stepped through.
///   cargo test -p granary-preload --test bench -- --ignored --nocapture placed_open_path
#[test]
#[ignore]
fn placed_open_path() {
    let f = Fixture::new();
    let exe = f.dir.path().join("openbench");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bench/openbench.c");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bench/trace_open.py");
    let st = Command::new("cc")
        .args(["-O0", "-g", "-o", exe.to_str().unwrap(), src])
        .status()
        .unwrap();
    assert!(st.success());
    let trace = f.dir.path().join("trace.txt");
    let placed = f.p(BIG);
    let out = f
        .cmd("gdb", &["-nx", "-batch", "-x", script, "--args"], false)
        .arg(&exe)
        .args(["open", &placed, "2"])
        .env("TRACE_LIB", common::lib())
        .env("TRACE_OUT", &trace)
        .env("GRANARY_TABLE", &f.table)
        .env("GRANARY_JOB_SLOT", common::SLOT.to_string())
        .output()
        .expect("gdb");
    let lines = std::fs::read_to_string(&trace).unwrap_or_else(|_| {
        panic!(
            "gdb left no trace: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let crate_of = |p: &str| {
        ["granary-preload/src/", "granary-shm/src/"]
            .iter()
            .find_map(|c| {
                p.split_once(c)
                    .map(|(_, f)| (c.split('/').next().unwrap(), f.to_string()))
            })
    };
    let mut stops: Vec<(&str, String)> = vec![];
    for l in lines.lines() {
        if let Some(at) = crate_of(l) {
            if stops.last() != Some(&at) {
                stops.push(at);
            }
        }
    }
    assert!(
        !stops.is_empty(),
        "no line of the library was stepped through"
    );
    let mut files: Vec<&(&str, String)> = vec![];
    for s in &stops {
        if !files.contains(&s) {
            files.push(s);
        }
    }
    let crossings = |a: &str, b: &str| {
        stops
            .windows(2)
            .filter(|w| w[0].0 == a && w[1].0 == b)
            .count()
    };
    for (c, file) in &files {
        println!("{c}: {file}");
    }
    let n = |c: &str| files.iter().filter(|(k, _)| *k == c).count();
    println!(
        "one placed open(): {} preload files, {} shm files; {} stops; preload->shm {} / shm->preload {} crossings",
        n("granary-preload"),
        n("granary-shm"),
        stops.len(),
        crossings("granary-preload", "granary-shm"),
        crossings("granary-shm", "granary-preload")
    );
    println!(
        "stops: {}",
        stops
            .iter()
            .map(|(_, f)| f.as_str())
            .collect::<Vec<_>>()
            .join(" > ")
    );
}
