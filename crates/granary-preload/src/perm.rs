//! Whether the kernel would certainly grant an access, judged from catalogued mode bits.
//! "Not certain" is always a safe answer: the caller then asks the real file system, which also
//! produces the exact errno. A file a user could not read on the source is never served to them.

use granary_shm::{StatRec, Table};

use crate::detour::sys;

pub const R: u32 = 4;
pub const X: u32 = 1;

/// The caller's uid and gid, or `u32::MAX` when real and effective ids differ: `access` checks
/// the real ids and everything else the effective ones, and only when they agree is one answer
/// right for both.
fn ids() -> (u32, u32) {
    let (ruid, euid) = (
        sys!(libc::SYS_getuid) as u32,
        sys!(libc::SYS_geteuid) as u32,
    );
    let (rgid, egid) = (
        sys!(libc::SYS_getgid) as u32,
        sys!(libc::SYS_getegid) as u32,
    );
    if ruid != euid || rgid != egid {
        return (u32::MAX, u32::MAX);
    }
    (euid, egid)
}

/// True only if `want` (a combination of `R`, `X`) is certainly granted on `st`.
pub fn certain(st: &StatRec, want: u32) -> bool {
    let mode = st.mode;
    let other = mode & 0o7;
    let group = (mode >> 3) & 0o7;
    // Granted to group and other alike: membership does not matter, only ownership could.
    let everyone = other & group & want == want;
    let owner_bits = (mode >> 6) & 0o7;
    if everyone && owner_bits & want == want {
        return true;
    }
    let (uid, gid) = ids();
    if uid == u32::MAX {
        return false;
    }
    if uid == 0 {
        // Root reads anything and searches directories; executing needs some x bit.
        return want & X == 0 || st.is_dir() || mode & 0o111 != 0;
    }
    if uid == st.uid {
        return owner_bits & want == want;
    }
    if gid == st.gid {
        return group & want == want;
    }
    everyone
}

/// Every catalogued ancestor of `idx` is searchable. The root's own ancestors lie outside the
/// catalog; the agent (same user) reached them.
pub fn ancestors_searchable(table: &Table, idx: u32) -> bool {
    let Some(mut e) = table.entry(idx) else {
        return false;
    };
    let mut cur = idx;
    // Bounded by the depth limit of a path.
    for _ in 0..4096 {
        if cur == 0 {
            return true;
        }
        let parent = e.parent;
        let Some(p) = table.entry(parent) else {
            return false;
        };
        if !p.stat.is_dir() || !certain(&p.stat, X) {
            return false;
        }
        cur = parent;
        e = p;
    }
    false
}
