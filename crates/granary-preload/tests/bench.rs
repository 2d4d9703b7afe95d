//! Micro-benchmark (ignored by default; prints, asserts nothing about time):
//!   cargo build --release -p granary-preload &&
//!   cargo test --release -p granary-preload --test bench -- --ignored --nocapture

mod common;

use std::process::Command;

use common::{Fixture, BIG};

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
