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
