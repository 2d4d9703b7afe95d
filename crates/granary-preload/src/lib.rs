//! `libgranary_preload.so`: the LD_PRELOAD interposition library.
//!
//! Path calls under the source are answered from the agent's catalog table (shared memory,
//! lock-free); opens of placed files get a real fd of the cached copy; everything else passes
//! through to libc unchanged. See docs/architecture.md for the contract with the agent and
//! /work/shared/notes/design.md ("Rules for the preload library") for the rules every hook obeys.
//!
//! Known blind spots: static binaries, Go programs, raw `syscall()`, io_uring, and libc-internal
//! calls (e.g. `scandirat` or `nftw` given one of our shadow directory fds).

mod config;
mod detour;
mod fdtable;
mod fill;
mod hooks;
mod log;
mod path;
mod perm;
mod place;
mod residency;
