//! The system calls std does not offer: `statx` (every field the index records) and opening a
//! path below a directory fd in pieces short enough for `PATH_MAX`, so 3,800-byte paths under a
//! long source path still open. With `codec::zstd_dctx`, the only modules with `unsafe`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::format::{Stat, Timestamp};

fn cstr(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL"))
}

/// `statx(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty `name` stats `dirfd` itself.
pub fn statx_at(dir: &impl AsRawFd, name: &[u8]) -> io::Result<Stat> {
    let c = cstr(name)?;
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    statx_raw(dir.as_raw_fd(), &c, flags)
}

fn statx_raw(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<Stat> {
    // SAFETY: an all-zero statx is a valid out-buffer; the kernel writes into it.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and sx is a valid, writable struct statx.
    let ret = unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            flags,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut sx,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat_of(&sx))
}

/// What a pack records of a file's `statx` record: everything but atime, which reading the
/// file to pack it changes — recorded as mtime, so that packing the same tree gives the same
/// bytes.
fn stat_of(sx: &libc::statx) -> Stat {
    let ts = |t: libc::statx_timestamp| Timestamp {
        sec: t.tv_sec,
        nsec: t.tv_nsec,
    };
    Stat {
        mask: sx.stx_mask & !libc::STATX_ATIME,
        blksize: sx.stx_blksize,
        attributes: sx.stx_attributes,
        attributes_mask: sx.stx_attributes_mask,
        nlink: sx.stx_nlink,
        uid: sx.stx_uid,
        gid: sx.stx_gid,
        mode: sx.stx_mode as u32,
        ino: sx.stx_ino,
        size: sx.stx_size,
        blocks: sx.stx_blocks,
        atime: ts(sx.stx_mtime),
        btime: ts(sx.stx_btime),
        ctime: ts(sx.stx_ctime),
        mtime: ts(sx.stx_mtime),
        rdev_major: sx.stx_rdev_major,
        rdev_minor: sx.stx_rdev_minor,
        dev_major: sx.stx_dev_major,
        dev_minor: sx.stx_dev_minor,
    }
}

fn openat(dir: libc::c_int, name: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: c is NUL-terminated; openat returns a new fd we then own, or -1.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly opened descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Below this a relative path is opened in one call.
const CHUNK: usize = 2048;

/// Opens `rel` (relative, `/`-separated) below `dir`: the final component never through a
/// symlink; a directory when `directory`. Long paths are walked in pieces below `CHUNK` bytes.
pub fn open_under(dir: &impl AsRawFd, rel: &[u8], directory: bool) -> io::Result<File> {
    let mut flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOCTTY;
    if directory {
        flags |= libc::O_DIRECTORY;
    }
    if rel.is_empty() {
        return openat(dir.as_raw_fd(), b".", flags).map(File::from);
    }
    let mut base: Option<OwnedFd> = None;
    let mut rest = rel;
    while rest.len() > CHUNK {
        let cut = rest[..CHUNK]
            .iter()
            .rposition(|&b| b == b'/')
            .filter(|&p| p > 0)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
        let at = base.as_ref().map_or(dir.as_raw_fd(), |f| f.as_raw_fd());
        let next = openat(
            at,
            &rest[..cut],
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        base = Some(next);
        rest = &rest[cut + 1..];
    }
    let at = base.as_ref().map_or(dir.as_raw_fd(), |f| f.as_raw_fd());
    openat(at, rest, flags).map(File::from)
}

/// Maps a pack's index read-only. The pack must not be rewritten in place while mapped (packs
/// are immutable: `granary pack` only ever renames a complete new pack into place).
pub fn map_file(file: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: read-only private mapping of a file nobody writes (see above); the bytes are
    // validated before use like any other buffer.
    unsafe { memmap2::Mmap::map(file) }
}

/// `rename(from, to)` that fails instead of replacing an existing `to` (even an empty
/// directory, which plain `rename` would silently replace).
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (f, t) = (
        cstr(from.as_os_str().as_bytes())?,
        cstr(to.as_os_str().as_bytes())?,
    );
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let ret = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
