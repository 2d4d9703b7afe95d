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
