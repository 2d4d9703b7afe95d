//! The C entry points of the memory-mapping calls: `mmap`, `mmap64`, `munmap`, `mremap`. What
//! granary does for them is `ops::map`. `mremap` is the one memory call granary's mappings can
//! change the answer of: a mapping of a file that is partly local is several mappings in the
//! kernel's eyes (`overlay`), and growing or moving a range that spans several fails with
//! EFAULT; granary then maps the source back over the range (the same bytes) and the call is
//! made again.

use core::ffi::{c_int, c_void};

use crate::ops::map;
use crate::sys::{self, real, sys};

type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let r = real!(MUNMAP as MunmapFn, (addr, len) else sys!(libc::SYS_munmap, addr, len) as c_int);
    if r == 0 {
        map::unmapped(addr as usize, len, None);
    }
    r
}

/// The fifth argument exists only with `MREMAP_FIXED` (x86-64/aarch64 ABI: taken as a fixed
/// register argument, passed on only then).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_size: usize,
    new_size: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        core::ptr::null_mut()
    };
    let call = || {
        real!(MREMAP as MremapFn, (old, old_size, new_size, flags, new_addr)
            else sys!(libc::SYS_mremap, old, old_size, new_size, flags, new_addr) as *mut c_void)
    };
    let p = call();
    if p != libc::MAP_FAILED {
        map::unmapped(old as usize, old_size, Some((p as usize, new_size)));
        return p;
    }
    if sys::errno() != libc::EFAULT || old_size == 0 {
        return p;
    }
    if !map::unsplit(old as usize, old_size) {
        sys::set_errno(libc::EFAULT);
        return p;
    }
    let p = call();
    if p != libc::MAP_FAILED {
        map::unmapped(old as usize, old_size, Some((p as usize, new_size)));
    }
    p
}

macro_rules! mmap_hook {
    ($name:ident, $slot:ident) => {
        /// Anonymous mappings (fd -1) and untracked fds cost one bounds check or one load.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: libc::off_t,
        ) -> *mut c_void {
            map::map(fd, len, prot, flags, off, |fd| {
                real!($slot as MmapFn, (addr, len, prot, flags, fd, off)
                    else sys!(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void)
            })
        }
    };
}
mmap_hook!(mmap, MMAP);
mmap_hook!(mmap64, MMAP64);
