//! The program's memory, touched only the way the kernel touches it: a bad pointer the kernel
//! would answer with `EFAULT` must not become a SIGSEGV inside granary. Answers written into the
//! program's buffers and arrays read from it (an iovec) go through `process_vm_writev`/`readv` on
//! our own process, which copy exactly like a system call's arguments and fail with `EFAULT`.
//!
//! Our pid comes from `pid::current` (no system call outside a vfork child): in a child that
//! shares our memory the parent's pid names the same memory.
//!
//! When those calls are refused (a seccomp profile, an old kernel), the helpers say so and the
//! caller passes the call through to the kernel: slower, never wrong.

use core::ffi::c_void;

use crate::sys::sys;

/// Copies `src` into the program's memory at `dst`; false if any byte of it is not writable
/// (or the copy is refused): the caller then lets the real call report the error.
pub fn write(dst: *mut c_void, src: &[u8]) -> bool {
    if dst.is_null() {
        return false;
    }
    if src.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: src.as_ptr() as *mut c_void,
        iov_len: src.len(),
    };
    let remote = libc::iovec {
        iov_base: dst,
        iov_len: src.len(),
    };
    let pid = crate::sys::pid::current();
    let n = sys!(
        libc::SYS_process_vm_writev,
        pid,
        &local as *const libc::iovec,
        1,
        &remote as *const libc::iovec,
        1,
        0
    );
    n == src.len() as libc::c_long
}

/// Writes a plain-old-data value (a `struct stat`, a `struct statx`) into the program's memory.
pub fn write_value<T: Copy>(dst: *mut T, v: &T) -> bool {
    // SAFETY: `v` is a live value of `size_of::<T>()` bytes; viewing it as bytes only reads it.
    let bytes = unsafe {
        core::slice::from_raw_parts((v as *const T).cast::<u8>(), core::mem::size_of::<T>())
    };
    write(dst.cast(), bytes)
}

/// Copies `dst.len()` bytes of the program's memory at `src` into `dst`; false if they are not
/// all readable (or the copy is refused).
pub fn read(src: *const c_void, dst: &mut [u8]) -> bool {
    if src.is_null() {
        return false;
    }
    if dst.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src as *mut c_void,
        iov_len: dst.len(),
    };
    let pid = crate::sys::pid::current();
    let n = sys!(
        libc::SYS_process_vm_readv,
        pid,
        &local as *const libc::iovec,
        1,
        &remote as *const libc::iovec,
        1,
        0
    );
    n == dst.len() as libc::c_long
}

/// The most iovec entries a served `readv` copies; longer vectors pass through.
pub const MAX_IOV: usize = 64;

/// The program's iovec array, copied: `None` when it is not readable, longer than `MAX_IOV`,
/// or its lengths overflow — the real call then answers (EFAULT, EINVAL) as it would anyway.
pub fn iovecs(
    iov: *const libc::iovec,
    cnt: i32,
    out: &mut [libc::iovec; MAX_IOV],
) -> Option<(usize, u64)> {
    let n = usize::try_from(cnt).ok().filter(|&n| n <= MAX_IOV)?;
    // SAFETY: `out` is our own array of `iovec`s (plain integers and pointers); we view its
    // first `n` entries as bytes to fill them.
    let bytes = unsafe {
        core::slice::from_raw_parts_mut(
            out.as_mut_ptr().cast::<u8>(),
            n * core::mem::size_of::<libc::iovec>(),
        )
    };
    if !read(iov.cast(), bytes) {
        return None;
    }
    let mut total = 0u64;
    for v in out.iter().take(n) {
        total = total.checked_add(v.iov_len as u64)?;
    }
    (total <= isize::MAX as u64).then_some((n, total))
}

/// Calls `each` with every fd `msg`'s `SCM_RIGHTS` control messages pass. Reads the header and
/// control buffer only through `read` (a bad pointer is the kernel's to report); a control
/// buffer longer than 1 KiB is looked at up to there.
pub fn sent_fds(msg: *const libc::msghdr, mut each: impl FnMut(core::ffi::c_int)) {
    let mut hdr = [0u8; core::mem::size_of::<libc::msghdr>()];
    if !read(msg.cast(), &mut hdr) {
        return;
    }
    // SAFETY: `hdr` holds a copy of a `msghdr` (plain integers and pointers).
    let h: libc::msghdr = unsafe { core::ptr::read_unaligned(hdr.as_ptr().cast()) };
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return;
    }
    let mut ctl = [0u8; 1024];
    let len = (h.msg_controllen as usize).min(ctl.len());
    if !read(h.msg_control, &mut ctl[..len]) {
        return;
    }
    let hdr_len = core::mem::size_of::<libc::cmsghdr>();
    let mut off = 0usize;
    while off + hdr_len <= len {
        // SAFETY: `ctl[off..off + hdr_len]` is a copied `cmsghdr` (plain integers).
        let c: libc::cmsghdr = unsafe { core::ptr::read_unaligned(ctl.as_ptr().add(off).cast()) };
        let clen = c.cmsg_len as usize;
        if clen < hdr_len || off + clen > len {
            break;
        }
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
            for fd in ctl[off + hdr_len..off + clen].chunks_exact(4) {
                each(core::ffi::c_int::from_ne_bytes([
                    fd[0], fd[1], fd[2], fd[3],
                ]));
            }
        }
        off += (clen + 7) & !7;
    }
}
