//! Extended attributes the catalog answers for: the ones tools ask every entry about although
//! almost no dataset file has them — `ls -l` asks for the POSIX ACLs and the SELinux label,
//! `ls --color` and `getcap` for file capabilities — and the listing of an entry's attributes
//! (`listxattr`). Each such call otherwise reaches the source, once per entry and tool.
//!
//! What makes an answer provable, for an entry validated in this attach:
//! - the walk's `llistxattr` of the path gave an empty list (`NONE_LISTED` in its record), and
//!   the entry's ctime is unchanged since (every attribute change moves it: the validation's
//!   identity check would have voided the entry);
//! - the agent probed, at this attach, what reading each name answers on one entry of the same
//!   file type on the same device that has no attribute either (`Absent`): the kernel's own
//!   answer — `ENODATA`, or `EOPNOTSUPP` where the file system has no ACLs. A name the probe got
//!   a value or any other error for (a security module labelling every file, say) is never
//!   answered. The agent probes only where the answer for a file without attributes is the
//!   file system's alone: local file systems that store attributes in the inode (ext2/3/4, XFS,
//!   Btrfs, tmpfs) and no security module that answers for labels (SELinux, Smack) —
//!   `granary_core::catalog::xattr`.
//!
//! Nothing else is answered: the value of an attribute an entry has, a name outside `NAMES`, a
//! listing that may depend on the caller's privileges (`trusted.*` is listed only to
//! `CAP_SYS_ADMIN`: an empty listing is everyone's only when the agent had it).

use core::sync::atomic::Ordering;

use crate::layout::{StatRec, H_XATTR};
use crate::Table;

/// `StatRec::xattrs` bit: the walk's `llistxattr` of the path gave an empty list.
pub const NONE_LISTED: u32 = 1;

/// The names whose absence the catalog answers, in the order of the bytes of an `Absent` word.
pub const NAMES: [&[u8]; 4] = [
    b"system.posix_acl_access",
    b"system.posix_acl_default",
    b"security.selinux",
    b"security.capability",
];

/// The file types probed, in the order of the `Absent` words.
pub const TYPES: [u32; 3] = [libc::S_IFREG, libc::S_IFDIR, libc::S_IFLNK];

/// `H_XATTR` flags: the probe's answers are there.
pub const ABSENT_PROBED: u32 = 1;
/// `H_XATTR` flags: the agent had `CAP_SYS_ADMIN` (its empty listings hid no `trusted.*`).
pub const ABSENT_PRIVILEGED: u32 = 2;

const LEN: usize = 12 + 4 * TYPES.len();
const _: () = assert!(H_XATTR + LEN <= crate::layout::H_COPY_BITS_OFF);

/// What reading an attribute a file does not have answers, per file type and name, on the
/// device of the source's root (`H_XATTR`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Absent {
    pub dev_major: u32,
    pub dev_minor: u32,
    /// The agent had `CAP_SYS_ADMIN`.
    pub privileged: bool,
    /// `errno[t][n]`: the error of reading `NAMES[n]` on a file of type `TYPES[t]` without
    /// attributes; 0: not answered.
    pub errno: [[u8; NAMES.len()]; TYPES.len()],
}

impl Absent {
    /// The error reading attribute `name` of the file `stat` describes gives, if provable.
    pub fn errno_for(&self, stat: &StatRec, name: &[u8]) -> Option<i32> {
        if !self.lists_nothing(stat) {
            return None;
        }
        let t = TYPES.iter().position(|&t| t == stat.file_type())?;
        let n = NAMES.iter().position(|&n| n == name)?;
        match self.errno[t][n] {
            0 => None,
            e => Some(e as i32),
        }
    }

    /// True if the file `stat` describes had no attribute at the walk, on the probed device
    /// (whoever lists it: see `privileged`).
    pub fn lists_nothing(&self, stat: &StatRec) -> bool {
        stat.xattrs & NONE_LISTED != 0
            && stat.dev_major == self.dev_major
            && stat.dev_minor == self.dev_minor
    }
}

impl Table {
    /// The agent's probe of this attach (`H_XATTR`), if it made one.
    pub fn xattr_absent(&self) -> Option<Absent> {
        let r = self.region();
        let word = |k: usize| {
            r.atomic_u32(H_XATTR + 4 * k)
                .map(|w| w.load(Ordering::Relaxed))
        };
        let flags = r.atomic_u32(H_XATTR)?.load(Ordering::Acquire);
        if flags & ABSENT_PROBED == 0 {
            return None;
        }
        let mut a = Absent {
            dev_major: word(1)?,
            dev_minor: word(2)?,
            privileged: flags & ABSENT_PRIVILEGED != 0,
            ..Absent::default()
        };
        for (t, e) in a.errno.iter_mut().enumerate() {
            *e = word(3 + t)?.to_le_bytes();
        }
        Some(a)
    }

    /// Agent side: publishes this attach's probe (`None`: nothing is answered). The flags go
    /// last, so a reader sees either no probe or a complete one.
    pub fn set_xattr_absent(&self, a: Option<&Absent>) {
        let r = self.region();
        let Some(flags) = r.atomic_u32(H_XATTR) else {
            return;
        };
        flags.store(0, Ordering::Release);
        let Some(a) = a else { return };
        let put = |k: usize, v: u32| {
            if let Some(w) = r.atomic_u32(H_XATTR + 4 * k) {
                w.store(v, Ordering::Relaxed);
            }
        };
        put(1, a.dev_major);
        put(2, a.dev_minor);
        for (t, e) in a.errno.iter().enumerate() {
            put(3 + t, u32::from_le_bytes(*e));
        }
        let priv_bit = if a.privileged { ABSENT_PRIVILEGED } else { 0 };
        flags.store(ABSENT_PROBED | priv_bit, Ordering::Release);
    }
}
