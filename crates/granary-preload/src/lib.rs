//! `libgranary_preload.so`: the LD_PRELOAD interposition library.
//!
//! Path calls under the source are answered from the agent's catalog table (shared memory,
//! lock-free); opens of placed files get a real fd of the cached copy; everything else passes
//! through to libc unchanged. See docs/architecture.md for the contract with the agent and
//! docs/preload-rules.md for the rules every hook obeys.
//!
//! Known blind spots: static binaries, Go programs, raw `syscall()`, io_uring, and libc-internal
//! calls (`fopen`'s internal `open`, stdio's internal `read`: hence the stdio hooks).
//!
//! # Layout
//!
//! Four layers, each a directory, a call going down through them: `hooks` → `ops` → `fds` →
//! `sys`. The lower layers reach the table only as `ops` gives it to them (`ops::detour`'s
//! `Guard`, `ops::lookup::entry`, an entry's source path from `ops::path`); `sys` depends on
//! nothing of granary's.
//!
//! ```text
//! hooks/      the C entry points, one file per family: open, read, map, stat, dir, link,
//!             mutate, attr, lock, fd, exec, creds (C arguments, errno, the real call)
//! ops/        what granary does for each family (same names), testable without LD_PRELOAD;
//!             and what they share:
//!   detour      the attached table, the re-entrancy guard; Detour and Bypass (why a call passes)
//!   lookup      a path argument's live catalog entry (path + Table::find + validate)
//!   path        where a path argument points (lexically, stack buffer); source paths of entries
//!   validate    an entry checked against the source before the agent's validation reached it
//! fds/        the fds granary opens and tracks:
//!   copies      tier files opened safely (verified directory fd, one name, identity checked)
//!   fdtable     which fds granary opened, and for what (static atomics indexed by fd)
//!   tracked     an fd's record with a copy's deferred identity check made first
//!   switch      an fd moved to another file (copy <-> source) when nobody shares it
//!   serve       one read answered from another file, the fd's offset claimed atomically
//!   pagedrop    page-cache residency: a transient copy's pages dropped at close
//! sys/        the kernel and libc, without allocation: raw system calls, the real libc
//!             functions (real!), errno, PATH_BUF; and
//!   log         allocation-free diagnostics (GRANARY_LOG)
//!   env         getenv in the constructor, decimal numbers
//!   statbuf     catalog stat records as the kernel's structs, and the buffer they go to
//!   usermem     the program's memory, touched as the kernel touches it (EFAULT, not SIGSEGV)
//!   procmaps    /proc/self/maps, read without allocation
//!   mounts      /proc/self/mountinfo: where this namespace shows a directory
//!   pid         our pid without a system call (a page wiped on fork; vfork and clone counted)
//! init/       the constructor: symbols resolved, environment read, table attached; and
//!   attach      how a process reaches its job's table (fd or path), what it can see of the job
//!   inherit     fds inherited across exec, adopted at start
//!   jobvars     granary's variables as the process got them, for children started without
//! wait        bounded, interruptible waits on the agent (Gate: signals let in while asleep)
//! overlay     mappings of files not yet local: tier bytes mapped over the source; followed
//! pack        a table that serves a pack: packed files waited for, extracted, stand-in dirs
//! lmdb        LMDB's lock file, node-local while nobody writes
//! ```
//!
//! One placed `open()` goes through one module of each layer: `hooks::open` (C arguments) →
//! `ops` (`ops::open` decides; `ops::detour::enter` the guard, `ops::lookup` the entry with one
//! table lookup: `ops::path::locate`, `Table::find`) → `fds` (`fds::copies` opens the copy,
//! `fds::fdtable` tracks the fd) → `sys` (the `openat` itself; `sys::log` when debugging).
//! docs/architecture.md, "One placed open", follows it call by call.
//!
//! `unsafe` lives in the modules that meet C and the kernel (`hooks`, `sys` and `sys::env`,
//! `init`, `ops::path`'s stack buffer, `sys::usermem`, `sys::statbuf`, `pack`'s mappings and
//! zstd, `ops::exec`'s environment), each with a `// SAFETY:` line.

mod attached;
mod fds;
mod hooks;
mod init;
mod lmdb;
mod map_advice;
mod ops;
mod overlay;
mod pack;
mod sys;
#[cfg(test)]
mod testing;
mod wait;
