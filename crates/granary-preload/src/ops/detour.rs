//! Whether a hooked call may consult the job's table — the table this process attached to (set
//! once, by the constructor), whether its credentials are the agent's, and the re-entrancy
//! guard — and what the logic layer decides for a call: a `Detour`, granary's answer or a
//! `Bypass` (the real function runs with the caller's arguments) with its reason, which the
//! debug log prints. Every call that might answer from the table starts with `enter`.

use core::cell::Cell;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use granary_shm::{Miss, Table};

use crate::sys::log;
use crate::sys::KeepErrno;

/// The job slot this process counts in (`GRANARY_JOB_SLOT`).
static JOB_SLOT: AtomicU32 = AtomicU32::new(0);
/// True while this process's credentials are the agent's (`creds`): only then may the catalog
/// answer for what the kernel would let the process see.
static CREDS_MATCH: AtomicBool = AtomicBool::new(false);

thread_local! {
    // const-initialised and destructor-free: usable from any hook, including in a vfork child.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

pub use crate::attached::{attach, table};

pub fn set_job_slot(slot: u32) {
    JOB_SLOT.store(slot, Ordering::Relaxed);
}

pub fn job_slot() -> u32 {
    JOB_SLOT.load(Ordering::Relaxed)
}

/// Records whether this process's credentials are the agent's (checked by `creds`).
pub fn set_creds_match(same: bool) {
    CREDS_MATCH.store(same, Ordering::Relaxed);
}

/// True while this process's credentials are the agent's (the catalog may answer for it).
#[inline]
pub fn creds_match() -> bool {
    CREDS_MATCH.load(Ordering::Relaxed)
}

/// Proof that the current call may consult the catalog; clears the guard when dropped.
pub struct Guard {
    pub table: &'static Table,
    pub slot: u32,
}

impl Drop for Guard {
    fn drop(&mut self) {
        IN_HOOK.with(|g| g.set(false));
    }
}

/// Sets the guard for this thread on the attached table.
#[inline]
fn guard() -> Result<Guard, Bypass> {
    let table = table().ok_or(Bypass::NoTable)?;
    let entered = IN_HOOK.with(|g| {
        if g.get() {
            false
        } else {
            g.set(true);
            true
        }
    });
    if !entered {
        return Err(Bypass::Reentered);
    }
    Ok(Guard {
        table,
        slot: job_slot(),
    })
}

/// The guard when granary is active, the table valid, this process's credentials the agent's
/// and this thread not already inside a hook; otherwise why the caller must pass the call
/// through untouched.
#[inline]
pub fn enter() -> Result<Guard, Bypass> {
    let guard = guard()?;
    // An `Err` drops the guard, which clears the flag.
    if !guard.table.is_valid() {
        return Err(Bypass::Withdrawn);
    }
    if !creds_match() {
        return Err(Bypass::OtherCredentials);
    }
    Ok(guard)
}

/// Like `enter`, but whatever this process's credentials, for what does not depend on them: the
/// hooks that tell the table the program changed the source (every process of the job must
/// learn of it), and calls on fds granary already tracks (what an open fd reads or describes is
/// the same whoever asks: the kernel checked access when it was opened).
#[inline]
pub fn enter_any_creds() -> Result<Guard, Bypass> {
    let guard = guard()?;
    if !guard.table.is_valid() {
        return Err(Bypass::Withdrawn);
    }
    Ok(guard)
}

impl Guard {
    pub fn count(&self, word: usize, n: u64) {
        self.table.count(self.slot, word, n);
    }
}

/// What the logic layer decided for one call: granary's answer, or the real function (why, and
/// what to do with its result).
#[must_use]
pub enum Detour<T, Then = ()> {
    /// Granary answers: the hook returns this.
    Answer(T),
    /// Granary answers with a failure: the hook sets this errno and returns the call's error.
    Fail(c_int),
    /// The real function runs with the caller's arguments; `Then` is what the logic layer needs
    /// to finish after it (what to track or count).
    Bypass(Bypass, Then),
}

/// Why a call passes through to the real function. `GRANARY_LOG=debug` prints it for calls on
/// the dataset (`Bypass::log`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bypass {
    /// No table: granary is off (`GRANARY_DISABLE`), its table unusable, or the constructor has
    /// not run yet.
    NoTable,
    /// A call made from inside one of our hooks (libc calling itself, our own I/O).
    Reentered,
    /// The agent withdrew the table (it stopped, or replaced the catalog).
    Withdrawn,
    /// This process's credentials are not the agent's (`creds`): the catalog cannot speak for
    /// what it may see.
    OtherCredentials,
    /// The path is not (provably) under the source.
    Outside,
    /// The path names the source root through the user's symlink to it, without following it.
    RootLink,
    /// The catalog has no live entry for the path.
    Catalog(Miss),
    /// Ahead of the agent's validation, the source could not confirm the entry (or it changed).
    Unconfirmed,
    /// The fd is not one granary opened or knows (nothing to do but count, if that).
    Untracked,
    /// The call may write, create or change what it names: the real call, then the entry is
    /// voided for every process of the job.
    Writes,
    /// Flags granary does not serve (`O_PATH`, `O_TMPFILE`, `O_DIRECT`, a `*at` flag, a mode
    /// other than existence or read and search).
    Flags,
    /// Not a regular file (a device, a FIFO), or a file opened as a directory.
    NotAFile,
    /// The file has no complete copy yet: the source is opened (and the agent asked for it).
    NotPlaced,
    /// The copy could not be used: gone, damaged, replaced, or its fd beyond the fd table.
    CopyUnusable,
    /// The file is the source's, not a copy's: the kernel describes or reads it as it is.
    OnSource,
    /// The fd itself reads what granary put under it (its copy, or the source while no copy
    /// is ready): the real call, counted. The common case of every read of a tracked fd.
    ByFd,
    /// The program's buffer is not writable (or too small): the kernel reports it.
    BadBuffer,
    /// Only the kernel can grant it (write access, or a file no copy vouches for).
    KernelDecides,
    /// A symlink the catalog names is not one here, or the name is one (`readlink`, `realpath`).
    Link,
    /// Extended attributes the catalog does not prove (the entry has some, the name is not one
    /// it answers, the source's file system was not probed): `ops::xattr`.
    Xattrs,
}

impl Bypass {
    /// What the log says.
    pub fn why(self) -> &'static [u8] {
        match self {
            Bypass::NoTable => b"no table",
            Bypass::Reentered => b"inside a hook",
            Bypass::Withdrawn => b"the table was withdrawn",
            Bypass::OtherCredentials => b"other credentials than the agent's",
            Bypass::Outside => b"not under the source",
            Bypass::RootLink => b"the source root's symlink itself",
            Bypass::Catalog(Miss::NotCatalogued) => b"not in the catalog",
            Bypass::Catalog(Miss::Unprovable) => b"a symlink the catalog cannot follow",
            Bypass::Catalog(Miss::Void) => b"changed by the program",
            Bypass::Catalog(Miss::AncestorGone) => b"below a directory the program changed",
            Bypass::Catalog(Miss::NotADirectory) => b"not a directory",
            Bypass::Unconfirmed => b"the source did not confirm the catalog",
            Bypass::Untracked => b"an fd granary does not track",
            Bypass::Writes => b"may write",
            Bypass::Flags => b"flags granary does not serve",
            Bypass::NotAFile => b"not a regular file",
            Bypass::NotPlaced => b"no complete copy yet",
            Bypass::CopyUnusable => b"the copy is unusable",
            Bypass::OnSource => b"the source's own file",
            Bypass::ByFd => b"the fd reads its own file",
            Bypass::BadBuffer => b"the buffer is the kernel's to judge",
            Bypass::KernelDecides => b"only the kernel can tell",
            Bypass::Link => b"a symlink",
            Bypass::Xattrs => b"attributes the catalog does not prove",
        }
    }

    /// True for the reasons that concern the dataset (a path under the source, a tracked fd),
    /// which the debug log shows; the others are every other call of the program.
    pub fn on_dataset(self) -> bool {
        !matches!(
            self,
            Bypass::NoTable
                | Bypass::Reentered
                | Bypass::Outside
                | Bypass::Untracked
                | Bypass::ByFd
        )
    }

    /// `<call> passed through (<why>): <what>` in the debug log, for calls on the dataset.
    #[inline]
    pub fn log(self, call: &[u8], what: &[u8]) {
        if self.on_dataset() && log::enabled() {
            let _keep = KeepErrno::new();
            log::line(&[call, b" passed through (", self.why(), b"): ", what]);
        }
    }

    /// `log` of the program's C path argument, measured only when the line is written: every
    /// pass-through of a path call goes by here, logging or not.
    #[inline]
    pub fn log_path(self, call: &[u8], path: *const core::ffi::c_char) {
        if log::enabled() && self.on_dataset() {
            self.log(call, crate::ops::path::bytes(path).unwrap_or(b"?"));
        }
    }

    /// `log` for a call on fd `fd`.
    #[inline]
    pub fn log_fd(self, call: &[u8], fd: c_int) {
        if log::enabled() && self.on_dataset() {
            let _keep = KeepErrno::new();
            let mut d = [0u8; 20];
            let n = log::num(fd as u64, &mut d);
            log::line(&[call, b" passed through (", self.why(), b"): fd ", n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_says_why_and_only_dataset_ones_are_logged() {
        let all = [
            Bypass::NoTable,
            Bypass::Reentered,
            Bypass::Withdrawn,
            Bypass::OtherCredentials,
            Bypass::Outside,
            Bypass::RootLink,
            Bypass::Catalog(Miss::NotCatalogued),
            Bypass::Catalog(Miss::Unprovable),
            Bypass::Catalog(Miss::Void),
            Bypass::Catalog(Miss::AncestorGone),
            Bypass::Catalog(Miss::NotADirectory),
            Bypass::Unconfirmed,
            Bypass::Untracked,
            Bypass::Writes,
            Bypass::Flags,
            Bypass::NotAFile,
            Bypass::NotPlaced,
            Bypass::CopyUnusable,
            Bypass::OnSource,
            Bypass::ByFd,
            Bypass::BadBuffer,
            Bypass::KernelDecides,
            Bypass::Link,
            Bypass::Xattrs,
        ];
        let mut seen: Vec<&[u8]> = vec![];
        for b in all {
            assert!(!b.why().is_empty());
            assert!(
                !seen.contains(&b.why()),
                "{b:?} says what another reason says"
            );
            seen.push(b.why());
        }
        let quiet: Vec<Bypass> = all.into_iter().filter(|b| !b.on_dataset()).collect();
        assert_eq!(
            quiet,
            [
                Bypass::NoTable,
                Bypass::Reentered,
                Bypass::Outside,
                Bypass::Untracked,
                Bypass::ByFd
            ]
        );
    }
}
