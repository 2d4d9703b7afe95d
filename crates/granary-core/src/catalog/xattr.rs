//! The agent's side of the extended attributes the catalog answers (`granary_shm::xattr`): the
//! walk records which paths list no attribute (`listed`), and each attach probes what reading
//! an attribute a file does not have answers on the source (`probe`). The preload library
//! answers from both only what they prove; everything else passes through.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use granary_shm::xattr::{Absent, NAMES, NONE_LISTED, TYPES};
use granary_shm::Table;

/// File systems whose answer for an attribute a file does not store is the file system's alone
/// and the same for every file of a type: they keep attributes with the inode and list every
/// stored one (`statfs` magic numbers: ext2/3/4, XFS, Btrfs, tmpfs). Network and FUSE file
/// systems answer from a server or a program granary cannot reason about: not probed, so every
/// call passes through there.
const PROBED_FS: [i64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994];

/// Security modules that answer for `security.*` labels themselves (a label the file system
/// does not store, a permission check on reading one): with one active nothing is answered.
const LABELLING_LSMS: [&str; 2] = ["selinux", "smack"];

/// True if the walk should record the attribute lists of the paths under `root`: the file
/// system is one the probe answers for.
pub fn worth_listing(root: &Path) -> bool {
    fs_type(root).is_some_and(|t| PROBED_FS.contains(&t)) && !labelling_lsm()
}

/// `StatRec::xattrs` for `path` (not following a final symlink): `NONE_LISTED` if it lists no
/// attribute, 0 if it lists some or the list cannot be read.
pub fn listed(path: &Path) -> u32 {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: a NUL-terminated path; a NULL list of size 0 asks for the list's size only.
    let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if n == 0 {
        NONE_LISTED
    } else {
        0
    }
}

/// Probes, for this attach, what reading each of `NAMES` answers on a file of each of `TYPES`
/// that lists no attribute, on the device of `table`'s root, and publishes it in the table
/// (`Table::set_xattr_absent`); publishes nothing where the answer would not be provable.
/// A few system calls: one entry per type, one `lgetxattr` per name.
pub fn probe(table: &Table, root: &Path) {
    table.set_xattr_absent(None);
    if !worth_listing(root) {
        return;
    }
    let Some(root_entry) = table.entry(0) else {
        return;
    };
    let mut a = Absent {
        dev_major: root_entry.stat.dev_major,
        dev_minor: root_entry.stat.dev_minor,
        privileged: has_cap_sys_admin(),
        ..Absent::default()
    };
    let mut any = false;
    for (t, &ty) in TYPES.iter().enumerate() {
        let Some(path) = sample(table, root, ty, &a) else {
            continue;
        };
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            continue;
        };
        // Still no attribute now (the sample may have changed since the walk).
        if listed(&path) != NONE_LISTED {
            continue;
        }
        for (n, name) in NAMES.iter().enumerate() {
            a.errno[t][n] = absent_errno(&c, name);
            any |= a.errno[t][n] != 0;
        }
    }
    if any {
        table.set_xattr_absent(Some(&a));
    }
}

/// The errno of `lgetxattr(path, name)` if it is an answer for a missing attribute (`ENODATA`,
/// or `EOPNOTSUPP` where the file system has no such attributes); 0 otherwise (a value, or an
/// error that may depend on the caller).
fn absent_errno(path: &CString, name: &[u8]) -> u8 {
    let Ok(n) = CString::new(name) else { return 0 };
    // SAFETY: NUL-terminated path and name; a NULL value of size 0 asks for the size only.
    let r = unsafe { libc::lgetxattr(path.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if r >= 0 {
        return 0;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(e @ (libc::ENODATA | libc::EOPNOTSUPP)) => e as u8,
        _ => 0,
    }
}

/// A live entry of type `ty` on the probed device that listed no attribute at the walk, and its
/// path on the source.
fn sample(table: &Table, root: &Path, ty: u32, a: &Absent) -> Option<std::path::PathBuf> {
    (0..table.entry_count()).find_map(|i| {
        let e = table.entry(i)?;
        if e.stat.file_type() != ty || !a.lists_nothing(&e.stat) || table.state(i).is_void() {
            return None;
        }
        let rel = table.rel_path_vec(i)?;
        Some(if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(std::ffi::OsStr::from_bytes(&rel))
        })
    })
}

fn fs_type(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed statfs is valid; statfs fills it for a NUL-terminated path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::statfs(c.as_ptr(), &mut s) } == 0).then_some(s.f_type as i64)
}

/// True if a security module that labels files is active (or may be: its file system is there).
fn labelling_lsm() -> bool {
    if let Ok(list) = std::fs::read_to_string("/sys/kernel/security/lsm") {
        return list.split(',').any(|m| LABELLING_LSMS.contains(&m.trim()));
    }
    Path::new("/sys/fs/selinux").exists() || Path::new("/sys/fs/smackfs").exists()
}

/// `CAP_SYS_ADMIN`'s bit number (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// True if this process has `CAP_SYS_ADMIN` in its effective set (`/proc/self/status`).
fn has_cap_sys_admin() -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}
