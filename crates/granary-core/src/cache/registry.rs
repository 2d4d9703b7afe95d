//! The tier roots the user's agents have used, so `granary cache` finds copies in tiers it is not
//! told about (a `--tier` of last week, a default tier under another `$TMPDIR`):
//! `$XDG_CACHE_HOME/granary/tiers` (default `~/.cache/granary/tiers`), one absolute path a
//! line, most recently used last (a root among the newer half stays where it is), at most `KEEP`
//! lines.
//!
//! Kept in the home directory rather than the runtime directory so it outlives a reboot, as copies
//! on a disk tier do; a home shared by many nodes lists roots of all of them, and `granary cache`
//! shows those that exist on the node it runs on. Nothing in it is trusted: a root is used only
//! if it passes the checks of any tier (`tierdir::open_root`). Best effort: a home that cannot be
//! written (read-only, full) costs only the listing of tiers nobody names.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Roots remembered.
const KEEP: usize = 256;

fn file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("granary").join("tiers"))
}

/// The roots recorded, oldest first.
pub fn known() -> Vec<PathBuf> {
    file().map(|f| read(&f)).unwrap_or_default()
}

fn read(f: &Path) -> Vec<PathBuf> {
    let mut b = Vec::new();
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(f)
        .and_then(|f| f.take(1 << 20).read_to_end(&mut b));
    if ok.is_err() {
        return Vec::new();
    }
    b.split(|&c| c == b'\n')
        .filter(|l| l.first() == Some(&b'/'))
        .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)))
        .collect()
}

/// Records `roots` as used now.
pub fn record(roots: &[PathBuf]) {
    if let Some(f) = file() {
        record_in(&f, roots);
    }
}

fn record_in(f: &Path, roots: &[PathBuf]) {
    let mut all = read(f);
    let fresh: Vec<&PathBuf> = roots
        .iter()
        .filter(|r| r.is_absolute() && !r.as_os_str().as_bytes().contains(&b'\n'))
        .collect();
    let newer = &all[all.len().saturating_sub(KEEP / 2)..];
    if fresh.iter().all(|r| newer.contains(r)) {
        // Known and recent: not rewritten at every job (a home on a shared file system).
        return;
    }
    all.retain(|r| !fresh.contains(&r));
    all.extend(fresh.into_iter().cloned());
    let skip = all.len().saturating_sub(KEEP);
    let mut out = Vec::new();
    for r in &all[skip..] {
        out.extend_from_slice(r.as_os_str().as_bytes());
        out.push(b'\n');
    }
    let res = f
        .parent()
        .map_or(Ok(()), |d| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
        })
        .and_then(|()| crate::catalog::persist::write_atomic(f, &out));
    if let Err(e) = res {
        tracing::debug!("cannot record the tiers used in {}: {e}", f.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_roots_once_most_recent_last() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("granary/tiers");
        assert!(read(&f).is_empty());
        let p = |s: &str| PathBuf::from(s);
        record_in(&f, &[p("/a"), p("/b")]);
        assert_eq!(read(&f), vec![p("/a"), p("/b")]);
        let before = std::fs::metadata(&f).unwrap().modified().unwrap();
        record_in(&f, &[p("/a")]);
        assert_eq!(
            std::fs::metadata(&f).unwrap().modified().unwrap(),
            before,
            "rewritten"
        );
        record_in(&f, &[p("/c"), p("/a"), p("relative"), p("/x\ny")]);
        assert_eq!(read(&f), vec![p("/b"), p("/c"), p("/a")]);
        for i in 0..KEEP + 10 {
            record_in(&f, &[p(&format!("/t{i}"))]);
        }
        let all = read(&f);
        assert_eq!(all.len(), KEEP);
        assert_eq!(all.last(), Some(&p(&format!("/t{}", KEEP + 9))));
        // Foreign lines are skipped, not trusted.
        std::fs::write(&f, "/a\nrelative\n/b\n\n").unwrap();
        assert_eq!(read(&f), vec![p("/a"), p("/b")]);
    }
}
