//! `MADV_SEQUENTIAL` on a program's read-only mapping of a file the agent follows (a large file
//! not complete locally), unless the file is an LMDB data file.
//!
//! A page fault in a mapping reads 128 KiB around the faulting page by default (read-around,
//! half of it before the page); advised sequential, it reads ahead from the faulting page on.
//! A shuffled reader of records laid out in sequence (Hugging Face `datasets` over Arrow shards)
//! reads each record from its start: read-around fetches what lies before the record, which that
//! reader wants only much later, so each record costs about two requests at the source; read-ahead
//! fetches the record. Measured (docs/benchmarks.md, "Issue 26's rows"): the shuffled Arrow pass
//! under a 256 MiB cap made half of PFS-direct's device requests, and under a 768 MiB cap it ran
//! at the source's bandwidth.
//!
//! Not for an LMDB data file: its B-tree's branch pages are read again and again, and the kernel
//! ignores a `VM_SEQ_READ` mapping's page references at reclaim, so they were evicted and read
//! again (3 processes on one LMDB under a cap: up to 6 % more source bytes). The file is known by
//! its first meta page (LMDB's magic, 16 bytes in), read from the program's own fd — the page
//! LMDB read when it opened the environment, and the page an Arrow reader reads next (its
//! schema). A mapping that can write, or of a file already local, is not advised.
//!
//! The advice changes no byte, only which pages a fault reads; a failure is ignored.
//! `[mmap] sequential_advice = false` in the agent's configuration turns it off: the agent sets
//! `FLAG_NO_SEQUENTIAL_ADVICE` in the table's header (`Table::sequential_advice`).

use core::ffi::{c_int, c_void};

use crate::sys::sys;

/// Advises `[addr, addr + len)`, a fresh read-only mapping of fd `fd` (a followed file), to be
/// read ahead from each fault, unless the file is an LMDB data file or the agent's
/// configuration turned the advice off. errno is the caller's to keep.
pub fn followed_mapping(fd: c_int, addr: *mut c_void, len: usize, prot: c_int) {
    let on = crate::ops::detour::table().is_some_and(|t| t.sequential_advice());
    if !on || prot & libc::PROT_WRITE != 0 || len == 0 || crate::lmdb::starts_as_data_file(fd) {
        return;
    }
    // Not interposed (a raw system call): the program's own `madvise` is its business.
    let _ = sys!(libc::SYS_madvise, addr, len, libc::MADV_SEQUENTIAL);
}
