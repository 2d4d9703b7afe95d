//! This process's pid, without a system call wherever that is provably the kernel's answer.
//!
//! Two hooks need it on their fast paths: `usermem` (`process_vm_writev` on our own process, for
//! every `stat` answered from the catalog) and the fd table's owner check (`fdtable::owned`,
//! for every close of a tracked fd), which must be false in a child that runs in its parent's
//! memory (a vfork child) so that the child never rewrites its parent's table.
//!
//! The pid is cached in a private anonymous page marked `MADV_WIPEONFORK`: the kernel hands
//! every child that does not share our memory — `fork`, a raw `clone` or `clone3` system call
//! without `CLONE_VM` — that page zeroed, and a zero means "ask the kernel". A child that does
//! share our memory (`vfork`, `clone(CLONE_VM)`) would read the parent's pid from it, so the
//! cache is used only while no such child can exist: the interposed `vfork` counts the vforks
//! in flight (it returns in the parent only once the child has exec'd or exited), and a
//! `clone` with `CLONE_VM` but not `CLONE_THREAD` turns the cache off for good. Children made
//! by libc without a hook of ours (`posix_spawn`) run no hook before their `exec`. Without
//! `MADV_WIPEONFORK` (Linux < 4.14) the cache is never filled: every call asks the kernel, as
//! before. What stays blind: a memory-sharing child made by a raw `clone` system call
//! (`syscall(SYS_clone, …)`, Go's runtime), as every raw system call is.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

use crate::sys::sys;

/// The page holding the cached pid (an `AtomicI32` at its start); null: no cache.
static PAGE: AtomicPtr<AtomicI32> = AtomicPtr::new(core::ptr::null_mut());

/// Memory-sharing children that may be running: vforks in flight (counted in and out by the
/// `vfork` hook), plus `FOREVER` once a `clone(CLONE_VM)` made one whose end we cannot see.
static SHARERS: AtomicUsize = AtomicUsize::new(0);
const FOREVER: usize = 1 << 40;

/// Maps and marks the page. Constructor only (before any hook can read it). Only where `vfork`
/// is interposed (x86-64, built by Rust ≥ 1.88: `build.rs`): elsewhere a vfork child could not
/// be told from its parent.
pub fn init() {
    if cfg!(not(all(target_arch = "x86_64", granary_naked))) {
        return;
    }
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    // SAFETY: `p` is the page just mapped.
    if unsafe { libc::madvise(p, 4096, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: unmapping the page just mapped, which nothing else refers to.
        unsafe { libc::munmap(p, 4096) };
        return;
    }
    PAGE.store(p.cast(), Ordering::Release);
}

/// True while no child that shares our memory (`vfork`, `clone(CLONE_VM)`) can be running: code
/// running now is this process's (or a child's with memory of its own). One load. Where `vfork`
/// is not interposed, always true: such a child cannot be told from its parent there.
#[inline]
pub fn no_memory_sharers() -> bool {
    SHARERS.load(Ordering::Acquire) == 0
}

/// `getpid()`, from the cache when no memory-sharing child can be running this code.
#[inline]
pub fn current() -> c_int {
    if SHARERS.load(Ordering::Acquire) == 0 {
        let page = PAGE.load(Ordering::Acquire);
        if !page.is_null() {
            // SAFETY: the page is mapped for the process's life (never unmapped once published)
            // and holds an `AtomicI32` at its start (zeroed memory is a valid one).
            let cached = unsafe { &*page };
            let v = cached.load(Ordering::Relaxed);
            if v != 0 {
                return v;
            }
            let v = sys!(libc::SYS_getpid) as c_int;
            cached.store(v, Ordering::Relaxed);
            return v;
        }
    }
    sys!(libc::SYS_getpid) as c_int
}

// `vfork`, interposed to count the vforks in flight. It cannot be a Rust function calling the
// real one: the child returns from the real `vfork` into the caller's stack frame and goes on
// calling on that stack, so the parent, resumed later, must not need anything the child may have
// overwritten — no frame of ours. Like glibc's own, it keeps its return address in a register the
// system call preserves, and raises the count before the system call and lowers it only in the
// parent, after the child has exec'd or exited. The child finds the count raised (the memory is
// shared) and asks the kernel for its pid.
#[cfg(all(target_arch = "x86_64", granary_naked))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    core::arch::naked_asm!(
        "lock add qword ptr [rip + {sharers}], 1",
        "pop rdi",
        "mov eax, {nr}",
        "syscall",
        "push rdi",
        "test rax, rax",
        "jz 2f",
        // The parent (or a failed call: no child).
        "lock sub qword ptr [rip + {sharers}], 1",
        "cmp rax, -4095",
        "jae 3f",
        "2:",
        "ret",
        "3:",
        "mov edi, eax",
        "neg edi",
        "jmp {failed}",
        sharers = sym SHARERS,
        nr = const libc::SYS_vfork,
        failed = sym vfork_failed,
    )
}

/// `vfork`'s failure: errno set, -1 returned.
#[cfg(all(target_arch = "x86_64", granary_naked))]
extern "C" fn vfork_failed(e: c_int) -> libc::pid_t {
    crate::sys::set_errno(e);
    -1
}

extern "C" {
    /// glibc's `clone`, by its other public name (ours interposes `clone`).
    fn __clone(
        f: extern "C" fn(*mut c_void) -> c_int,
        stack: *mut c_void,
        flags: c_int,
        arg: *mut c_void,
        ...
    ) -> c_int;
}

/// `clone`, interposed: a child that shares our memory but is no thread of ours (its own pid,
/// maybe its own fd table) turns the pid cache off for the process's life — its end is nothing
/// this library sees. The optional arguments are taken as fixed ones (x86-64/aarch64 ABI) and
/// passed on as they came; glibc reads them only when the flags say they exist.
///
/// # Safety
/// As glibc's `clone`: the caller's arguments go to it unchanged.
#[no_mangle]
pub unsafe extern "C" fn clone(
    f: extern "C" fn(*mut c_void) -> c_int,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    parent_tid: *mut libc::pid_t,
    tls: *mut c_void,
    child_tid: *mut libc::pid_t,
) -> c_int {
    if flags & libc::CLONE_VM != 0 && flags & libc::CLONE_THREAD == 0 {
        SHARERS.fetch_add(FOREVER, Ordering::AcqRel);
    }
    // SAFETY: the caller's own arguments, to the function it called.
    unsafe { __clone(f, stack, flags, arg, parent_tid, tls, child_tid) }
}
