//! Catalogued `StatRec` → the structs the kernel would have filled for the same file, and the
//! program's buffer an answer goes to (`Out`), written as the kernel writes it.

use core::ffi::c_int;

use granary_shm::StatRec;

use crate::{sys, sys::usermem};

pub fn stat(s: &StatRec, out: &mut libc::stat) {
    *out = crate::sys::empty_stat();
    out.st_dev = libc::makedev(s.dev_major, s.dev_minor);
    out.st_ino = s.ino;
    out.st_nlink = s.nlink as _;
    out.st_mode = s.mode;
    out.st_uid = s.uid;
    out.st_gid = s.gid;
    out.st_rdev = libc::makedev(s.rdev_major, s.rdev_minor);
    out.st_size = s.size as _;
    out.st_blksize = s.blksize as _;
    out.st_blocks = s.blocks as _;
    out.st_atime = s.atime.sec as _;
    out.st_atime_nsec = s.atime.nsec as _;
    out.st_mtime = s.mtime.sec as _;
    out.st_mtime_nsec = s.mtime.nsec as _;
    out.st_ctime = s.ctime.sec as _;
    out.st_ctime_nsec = s.ctime.nsec as _;
}

// `struct stat64` has the same layout as `struct stat` on the 64-bit targets we build for.
const _: () = assert!(core::mem::size_of::<libc::stat>() == core::mem::size_of::<libc::stat64>());

/// Fields `statx` can answer from the catalog: the basic stats and the birth time. Anything
/// newer (mount id, direct-I/O alignment, …) the walk did not keep.
const KNOWN: u32 = libc::STATX_BASIC_STATS | libc::STATX_BTIME;

pub fn statx(s: &StatRec, requested: u32, out: &mut libc::statx) {
    // SAFETY: `struct statx` is plain integers; all-zero is what the kernel leaves unfilled.
    *out = unsafe { core::mem::zeroed() };
    let mask = s.mask & KNOWN & (requested | libc::STATX_BASIC_STATS);
    out.stx_mask = mask;
    out.stx_blksize = s.blksize;
    out.stx_attributes = s.attributes;
    out.stx_nlink = s.nlink;
    out.stx_uid = s.uid;
    out.stx_gid = s.gid;
    out.stx_mode = s.mode as u16;
    out.stx_ino = s.ino;
    out.stx_size = s.size;
    out.stx_blocks = s.blocks;
    out.stx_attributes_mask = s.attributes_mask;
    let ts = |t: &granary_shm::Ts| {
        // SAFETY: plain integers; zero padding is what the kernel writes.
        let mut v: libc::statx_timestamp = unsafe { core::mem::zeroed() };
        v.tv_sec = t.sec;
        v.tv_nsec = t.nsec;
        v
    };
    out.stx_atime = ts(&s.atime);
    if mask & libc::STATX_BTIME != 0 {
        out.stx_btime = ts(&s.btime);
    }
    out.stx_ctime = ts(&s.ctime);
    out.stx_mtime = ts(&s.mtime);
    out.stx_rdev_major = s.rdev_major;
    out.stx_rdev_minor = s.rdev_minor;
    out.stx_dev_major = s.dev_major;
    out.stx_dev_minor = s.dev_minor;
}

/// Where an answer goes.
#[derive(Clone, Copy)]
pub enum Out {
    Stat(*mut libc::stat),
    Statx(u32, *mut libc::statx),
}

impl Out {
    /// Writes the catalog's answer into the program's buffer, as the kernel would: a buffer that
    /// is not writable is not a crash but a pass-through (the kernel then says EFAULT).
    pub fn store(self, s: &StatRec) -> bool {
        match self {
            Out::Stat(p) => {
                let mut st = sys::empty_stat();
                stat(s, &mut st);
                usermem::write_value(p, &st)
            }
            Out::Statx(mask, p) => {
                let mut sx = sys::empty_statx();
                statx(s, mask, &mut sx);
                usermem::write_value(p, &sx)
            }
        }
    }

    /// The kernel's answer for fd `fd` written into the program's buffer (so a bad buffer gets
    /// the kernel's EFAULT); `Err` is the call's return value.
    pub fn kernel_answer(self, fd: c_int) -> Result<Written, c_int> {
        let r = match self {
            Out::Stat(p) => sys::raw_fstat(fd, p),
            Out::Statx(mask, p) => sys::sys!(
                libc::SYS_statx,
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                mask,
                p
            ) as c_int,
        };
        if r != 0 {
            return Err(r);
        }
        // SAFETY: the kernel just wrote the whole struct there, so it is mapped and writable.
        let ino = unsafe {
            match self {
                Out::Stat(p) => (*p).st_ino,
                Out::Statx(_, p) => (*p).stx_ino,
            }
        };
        Ok(Written { out: self, ino })
    }
}

/// The program's buffer once the kernel filled it (`Out::kernel_answer`): mapped and writable.
#[derive(Clone, Copy)]
pub struct Written {
    out: Out,
    /// The inode the kernel described.
    pub ino: u64,
}

impl Written {
    /// The kernel's `struct stat` (`None` for a `statx` buffer).
    pub fn stat(&self) -> Option<libc::stat> {
        match self.out {
            // SAFETY: the kernel wrote the whole struct there (see `Written`).
            Out::Stat(p) => Some(unsafe { *p }),
            Out::Statx(..) => None,
        }
    }

    /// Overwrites the kernel's answer with the catalog's.
    pub fn overwrite(&self, s: &StatRec) {
        // SAFETY: the buffer is mapped and writable (see `Written`).
        unsafe {
            match self.out {
                Out::Stat(p) => stat(s, &mut *p),
                Out::Statx(mask, p) => statx(s, mask, &mut *p),
            }
        }
    }
}
