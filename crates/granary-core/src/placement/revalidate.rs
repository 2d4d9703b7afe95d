//! A job that attaches while other jobs hold the source's table does not get a new walk (the
//! table, its states and its copies are in use), yet the source may have changed since that walk
//! (`cp -p`, `rsync -t`, a file replaced by rename, an ACL or a `chmod`). Before such a job gets
//! the table, every live entry is checked against the source with `statx`, as a walk would:
//! whatever is no longer the same version (`StatRec::same_version`: device, inode, type, size,
//! mtime, ctime) stops being answered from the catalog, for every job of the table, and its
//! copies are dropped.
//!
//! - a file (or symlink, or anything not a directory) that changed: `STALE`, copies dropped, as
//!   the preload library's INVALIDATE does;
//! - a path that no longer exists: `GONE` (with everything below it);
//! - a directory whose listing or times changed: `STALE` (its listing and stat pass through, its
//!   children stay served); one that is another directory now, has other permissions, or that
//!   these credentials (the user's) can no longer list and search: `GONE`.
//!
//! Costs one `statx` per catalogued path, spread over threads: what the first job's walk costs.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use granary_shm::{state, EntryRec, StatRec};

use super::SourceCtx;
use crate::sys::{self, statx_nofollow};

/// What `revalidate` found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Revalidated {
    pub checked: u64,
    /// Entries made `STALE`.
    pub changed: u64,
    /// Entries made `GONE`.
    pub gone: u64,
}

/// Checks every live entry of `ctx`'s table against the source, with `threads` threads.
pub fn revalidate(ctx: &SourceCtx, threads: usize) -> Revalidated {
    let next = AtomicU32::new(0);
    let (checked, changed, gone) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let count = ctx.table.entry_count();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let idx = next.fetch_add(1, Ordering::Relaxed);
                if idx >= count {
                    break;
                }
                match check(ctx, idx) {
                    Verdict::Skipped => continue,
                    Verdict::Same => {}
                    Verdict::Void(state::GONE) => {
                        gone.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::Void(_) => {
                        changed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                checked.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    let out = Revalidated {
        checked: checked.into_inner(),
        changed: changed.into_inner(),
        gone: gone.into_inner(),
    };
    if out.changed + out.gone > 0 {
        tracing::info!(
            "{}: {} of {} catalogued paths changed since the walk, {} gone: served from the source",
            ctx.source_real.display(),
            out.changed,
            out.checked,
            out.gone
        );
    }
    out
}

enum Verdict {
    Skipped,
    Same,
    Void(u8),
}

fn check(ctx: &SourceCtx, idx: u32) -> Verdict {
    let t = &ctx.table;
    let Some(e) = t.entry(idx) else {
        return Verdict::Skipped;
    };
    if state::is_void(state::state_of(t.state(idx))) {
        return Verdict::Skipped;
    }
    let Some(rel) = t.rel_path(&e) else {
        return Verdict::Skipped;
    };
    let path = if rel.is_empty() {
        ctx.source_real.clone()
    } else {
        ctx.source_real.join(OsStr::from_bytes(rel))
    };
    let to = match statx_nofollow(&path) {
        Ok(now) => match verdict(&e.stat, &now, &path) {
            None => return Verdict::Same,
            Some(to) => to,
        },
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => state::GONE,
        Err(_) => state::STALE,
    };
    void(ctx, idx, &e, to);
    Verdict::Void(to)
}

/// `None` when the entry still describes the source; else the state it must take.
fn verdict(was: &StatRec, now: &StatRec, path: &Path) -> Option<u8> {
    let attrs_same = was.mode == now.mode && was.uid == now.uid && was.gid == now.gid;
    if was.same_version(now) && attrs_same {
        return None;
    }
    if !was.is_dir() {
        return Some(state::STALE);
    }
    let same_dir = now.is_dir() && was.ino == now.ino && was.dev_major == now.dev_major;
    // An ACL changed on a directory shows only as a new ctime: ask the kernel.
    if !same_dir || !attrs_same || !sys::may_list(path) {
        return Some(state::GONE);
    }
    Some(state::STALE)
}

/// Moves the entry to `to` (never making a `GONE` entry merely `STALE`), then drops its copies:
/// a worker copying it meanwhile sees the state change and throws its copy away.
fn void(ctx: &SourceCtx, idx: u32, e: &EntryRec, to: u8) {
    ctx.table.void(idx, to);
    if e.stat.is_file() {
        super::requests::drop_all_copies(ctx, idx, e);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn st(p: &Path) -> StatRec {
        statx_nofollow(p).unwrap()
    }

    #[test]
    fn verdicts_follow_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"0123").unwrap();
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let (f0, d0) = (st(&f), st(&d));
        assert_eq!(verdict(&f0, &st(&f), &f), None);
        assert_eq!(verdict(&d0, &st(&d), &d), None);

        // Same size, mtime put back: the ctime tells.
        std::fs::write(&f, b"abcd").unwrap();
        let mtime =
            std::time::UNIX_EPOCH + std::time::Duration::new(f0.mtime.sec as u64, f0.mtime.nsec);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let f1 = st(&f);
        assert_eq!((f1.size, f1.mtime), (f0.size, f0.mtime));
        assert_eq!(verdict(&f0, &f1, &f), Some(state::STALE));

        // A name added: the listing changed, the directory is still the one catalogued.
        std::fs::write(d.join("new"), b"").unwrap();
        assert_eq!(verdict(&d0, &st(&d), &d), Some(state::STALE));
        // Other permissions decide what lies below: nothing of it is answered any more.
        let d1 = st(&d);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(verdict(&d1, &st(&d), &d), Some(state::GONE));
        // Another directory under the same name.
        std::fs::remove_file(d.join("new")).unwrap();
        std::fs::remove_dir(&d).unwrap();
        std::fs::create_dir(dir.path().join("other")).unwrap();
        std::fs::create_dir(&d).unwrap();
        assert_eq!(verdict(&d1, &st(&d), &d), Some(state::GONE));
    }
}
