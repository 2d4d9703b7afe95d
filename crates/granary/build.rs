//! Embeds the preload library in release builds of `granary`, so that an installed binary (a
//! wheel, `cargo install`) carries it and needs no build tree: the library is built here by a
//! nested `cargo build` of `granary-preload` for the same target, with the same environment —
//! so a `maturin build --zig` wheel gets a library linked by zig against the same old glibc as
//! the binary. `granary` writes it out once per version (`preload::locate`).
//!
//! Debug builds embed nothing (the library lies next to the binary in the build tree);
//! `GRANARY_EMBED_PRELOAD=1` or `=0` forces the choice.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let blob = out.join("preload.bin");
    println!("cargo:rerun-if-env-changed=GRANARY_EMBED_PRELOAD");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let crates = manifest.parent().expect("crates dir").to_path_buf();
    for dep in ["granary-preload", "granary-shm"] {
        println!("cargo:rerun-if-changed={}", crates.join(dep).display());
    }
    let embed = match std::env::var("GRANARY_EMBED_PRELOAD").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::env::var("PROFILE").as_deref() == Ok("release"),
    };
    if !embed {
        std::fs::write(&blob, b"").expect("writing an empty preload blob");
        return;
    }
    let preload = crates.join("granary-preload/Cargo.toml");
    assert!(
        preload.is_file(),
        "{} not found: build granary from a clone of its repository (or set \
         GRANARY_EMBED_PRELOAD=0 and install libgranary_preload.so next to the binary)",
        preload.display()
    );
    let lib = build_preload(&preload, &out);
    std::fs::copy(&lib, &blob).expect("copying the preload library");
}

fn build_preload(manifest: &Path, out: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let target_dir = out.join("preload-target");
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--offline")
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target")
        .arg(&target)
        .arg("--target-dir")
        .arg(&target_dir)
        // Debug info would triple the binary; the exported symbols stay.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if let Ok(jobs) = std::env::var("NUM_JOBS") {
        cmd.arg("-j").arg(jobs);
    }
    let status = cmd
        .status()
        .expect("running cargo to build granary-preload");
    assert!(
        status.success(),
        "building granary-preload for embedding failed ({status}); set GRANARY_EMBED_PRELOAD=0 \
         to build without it"
    );
    target_dir
        .join(target)
        .join("release")
        .join("libgranary_preload.so")
}
