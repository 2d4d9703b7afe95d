//! The preload library a release build of `granary` carries (`build.rs` embeds it), written out
//! once per version and content: `<cache>/granary/<version>-<hash>/libgranary_preload.so`, the
//! cache being `$XDG_CACHE_HOME`, else `~/.cache` (bound into Apptainer containers by default),
//! else the runtime directory. An installed `granary` (a wheel, `cargo install`) so needs no
//! build tree and no environment variable.
//!
//! The file is code every process of a job loads: its directory is the user's own and private
//! (`ensure_private_dir`), it is never opened through a symlink, and it is used only when it is
//! a regular file of ours, closed to others' writes, with exactly the embedded bytes.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use granary_core::runtime::ensure_private_dir;

static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/preload.bin"));

const NAME: &str = "libgranary_preload.so";

/// The embedded library on disk, written out if needed; `None` when this build embeds none.
pub fn embedded() -> Result<Option<PathBuf>> {
    if EMBEDDED.is_empty() {
        return Ok(None);
    }
    let version = format!(
        "{}-{:016x}",
        env!("CARGO_PKG_VERSION"),
        xxhash_rust::xxh3::xxh3_64(EMBEDDED)
    );
    let mut tried = Vec::new();
    for base in bases() {
        match write_out(&base, &version) {
            Ok(p) => return Ok(Some(p)),
            Err(e) => tried.push(format!("{}: {e:#}", base.display())),
        }
    }
    bail!(
        "cannot write out the preload library ({}); set GRANARY_PRELOAD to a copy of it",
        tried.join("; ")
    )
}

fn bases() -> Vec<PathBuf> {
    let abs = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_dir())
    };
    let mut out = Vec::new();
    if let Some(x) = abs(std::env::var_os("XDG_CACHE_HOME")) {
        out.push(x.join("granary"));
    }
    if let Some(h) = abs(std::env::var_os("HOME")) {
        out.push(h.join(".cache").join("granary"));
    }
    if let Ok(rt) = granary_core::runtime::Runtime::open() {
        out.push(rt.dir.join("lib"));
    }
    out
}

fn write_out(base: &Path, version: &str) -> Result<PathBuf> {
    if let Some(parent) = base.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    ensure_private_dir(base)?;
    let dir = base.join(version);
    ensure_private_dir(&dir)?;
    let path = dir.join(NAME);
    if is_ours_and_same(&path) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(EMBEDDED)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(path)
}

/// A regular file of ours that only we may write, holding exactly the embedded bytes.
fn is_ours_and_same(path: &Path) -> bool {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    let Ok(md) = f.metadata() else { return false };
    if !md.is_file()
        || md.uid() != granary_core::sys::uid()
        || md.mode() & 0o022 != 0
        || md.len() != EMBEDDED.len() as u64
    {
        return false;
    }
    let mut buf = Vec::with_capacity(EMBEDDED.len());
    f.read_to_end(&mut buf).is_ok() && buf == EMBEDDED
}

/// `libgranary_preload.so`: `$GRANARY_PRELOAD`, next to this executable, in `../lib`, or the
/// copy a release build carries (`embedded`).
pub fn find() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GRANARY_PRELOAD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("GRANARY_PRELOAD={} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("finding the granary executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut tried = Vec::new();
    // Test binaries live in target/<profile>/deps; the library one level up.
    for cand in [
        dir.join("libgranary_preload.so"),
        dir.join("../lib/libgranary_preload.so"),
        dir.join("../libgranary_preload.so"),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    if let Some(p) = embedded()? {
        return Ok(p);
    }
    bail!(
        "cannot find libgranary_preload.so (tried {}); build it with `cargo build --release` \
         (the whole workspace) or set GRANARY_PRELOAD",
        tried.join(", ")
    )
}
