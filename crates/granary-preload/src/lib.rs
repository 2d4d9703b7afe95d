//! `libgranary_preload.so`: the LD_PRELOAD interposition library.
//!
//! Path calls under the source are answered from the agent's catalog table (shared memory,
//! lock-free); opens of placed files get a real fd of the cached copy; everything else passes
//! through to libc unchanged. See docs/architecture.md for the contract with the agent and
//! docs/preload-rules.md for the rules every hook obeys.
//!
//! Known blind spots: static binaries, Go programs, raw `syscall()`, io_uring, and libc-internal
//! calls (`fopen`'s internal `open`, stdio's internal `read`: hence the stdio hooks).

mod attach;
mod copies;
mod detour;
mod env;
mod fdtable;
mod hooks;
mod inherit;
mod init;
mod lmdb;
mod log;
mod lookup;
mod mounts;
mod ops;
mod overlay;
mod pack;
mod pagedrop;
mod path;
mod procmaps;
mod serve;
mod statbuf;
mod switch;
mod sys;
#[cfg(test)]
mod testing;
mod tracked;
mod usermem;
mod validate;
mod wait;
