//! The only place that turns the mapped table into Rust references.
//!
//! Another process (of the same user) writes the same memory, and a damaged or truncated file
//! may be mapped, so every access is bounds- and alignment-checked and returns `None` instead of
//! trusting an offset. Mutable words are only ever touched as atomics.

use core::sync::atomic::{AtomicU32, AtomicU64};

/// Plain-old-data records: every bit pattern is a valid value.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers, with no padding-dependent invariants.
pub unsafe trait Pod: Copy {}

// SAFETY: repr(C) structs of integer fields only.
unsafe impl Pod for crate::layout::DiskEntry {}
// SAFETY: repr(C) structs of integer fields only.
unsafe impl Pod for crate::layout::StatClass {}

/// A mapped table: a base pointer and a length.
#[derive(Clone, Copy)]
pub struct Region {
    base: *mut u8,
    len: usize,
}

// SAFETY: the region is shared memory accessed through atomics or plain reads of immutable data;
// handing the pointer to another thread adds no hazard beyond the cross-process one we already
// handle.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// # Safety
    /// `base .. base + len` must be mapped readable and writable (MAP_SHARED) for as long as the
    /// region or anything borrowed from it is used, and `base` must be page-aligned.
    pub const unsafe fn new(base: *mut u8, len: usize) -> Region {
        Region { base, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    fn check(&self, off: usize, size: usize, align: usize) -> Option<usize> {
        let end = off.checked_add(size)?;
        if end > self.len || off % align != 0 {
            return None;
        }
        Some(off)
    }

    pub fn u32_at(&self, off: usize) -> Option<u32> {
        self.atomic_u32(off)
            .map(|a| a.load(core::sync::atomic::Ordering::Relaxed))
    }

    pub fn u64_at(&self, off: usize) -> Option<u64> {
        self.atomic_u64(off)
            .map(|a| a.load(core::sync::atomic::Ordering::Relaxed))
    }

    pub fn atomic_u32(&self, off: usize) -> Option<&AtomicU32> {
        let off = self.check(off, 4, 4)?;
        // SAFETY: in bounds and 4-aligned (base is page-aligned); the memory is mapped for the
        // region's lifetime (constructor contract) and only accessed atomically by all parties.
        Some(unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) })
    }

    pub fn atomic_u64(&self, off: usize) -> Option<&AtomicU64> {
        let off = self.check(off, 8, 8)?;
        // SAFETY: in bounds and 8-aligned; see `atomic_u32`.
        Some(unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) })
    }

    /// A copy of a POD record. The bytes are immutable after build, so a plain read is fine.
    pub fn read<T: Pod>(&self, off: usize) -> Option<T> {
        let off = self.check(off, core::mem::size_of::<T>(), 1)?;
        // SAFETY: in bounds; `T: Pod` accepts any bit pattern; read_unaligned needs no alignment.
        Some(unsafe { core::ptr::read_unaligned(self.base.add(off).cast::<T>()) })
    }

    /// Asks the CPU to start loading the cache line at `off` (a hint: nothing happens on other
    /// architectures or outside the region). The caller goes on while the line arrives.
    #[inline]
    pub fn prefetch(&self, off: usize) {
        #[cfg(target_arch = "x86_64")]
        if off < self.len {
            // SAFETY: a prefetch reads nothing the program sees and cannot fault; the address is
            // inside the mapping anyway.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    self.base.add(off).cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    /// Immutable bytes (paths, names) of the table.
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        let off = self.check(off, len, 1)?;
        // SAFETY: in bounds; these bytes are written once before the table is published and
        // never again, so no one mutates them while borrowed.
        Some(unsafe { core::slice::from_raw_parts(self.base.add(off), len) })
    }
}

/// Wakes one process sleeping in `futex_wait` on `word` (a word of a shared mapping: the futex
/// is keyed by the page, so processes mapping the table at other addresses meet on it).
/// Async-signal-safe: one system call, no allocation.
pub fn futex_wake(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: FUTEX_WAKE reads no memory but the word's address, which is valid (a reference).
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// Wakes every process sleeping in `futex_wait` on `word`.
pub fn futex_wake_all(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: as in `futex_wake`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Sleeps while `word` holds `expected`, until woken (`futex_wake`), `timeout` passes or a
/// signal arrives (whichever first; spurious returns are the caller's to handle). True if a
/// signal ended it (EINTR). Async-signal-safe; errno is the caller's to keep.
pub fn futex_wait(
    word: &core::sync::atomic::AtomicU32,
    expected: u32,
    timeout: core::time::Duration,
) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the word is valid (a reference) and 4-aligned; `ts` lives across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    // SAFETY: reads this thread's errno.
    r < 0 && unsafe { *libc::__errno_location() } == libc::EINTR
}
