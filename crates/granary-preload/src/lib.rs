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
//! Two layers: `hooks/<family>.rs` are the C entry points (arguments, errno, the real call);
//! `ops/<family>.rs` decide what granary does (a `detour::Detour`: the answer, or why the real
//! call runs). One placed `open()` goes `hooks::open` → `ops::open` (the entry found with one
//! table lookup, `lookup` → `Table::find`) → `copies` (its copy opened) → `fdtable` (tracked).
//!
//! ```text
//! hooks/      C entry points, one file per family: open, read, map, stat, dir, link,
//!             mutate, attr, lock, fd, exec, creds
//! ops/        what granary does for each family (same names), testable without LD_PRELOAD
//! detour      the attached table, the re-entrancy guard; Detour and Bypass (why a call passes)
//! lookup      a path argument's live catalog entry (path + Table::find + validate)
//! path        where a path argument points (lexically, stack buffer); source paths of entries
//! validate    an entry checked against the source before the agent's validation reached it
//! copies      tier files opened safely (verified directory fd, one name, identity checked)
//! fdtable     which fds granary opened, and for what (static atomics indexed by fd)
//! tracked     an fd's record with a copy's deferred identity check made first
//! switch      an fd moved to another file (copy <-> source) when nobody shares it
//! serve       one read answered from another file, the fd's offset claimed atomically
//! wait        bounded, interruptible waits on the agent (Gate: signals let in while asleep)
//! overlay     mappings of files not yet local: tier bytes mapped over the source; followed
//! pack        a table that serves a pack: packed files waited for, extracted, stand-in dirs
//! lmdb        LMDB's lock file, node-local while nobody writes
//! pagedrop    page-cache residency: a transient copy's pages dropped at close
//! inherit     fds inherited across exec, adopted at start
//! attach      how a process reaches its job's table (fd or path), what it can see of the job
//! init        the constructor: symbols resolved, environment read, table attached
//! env         getenv in the constructor, decimal numbers
//! sys         raw system calls, the real libc functions (real!), errno
//! log         allocation-free diagnostics (GRANARY_LOG)
//! statbuf     catalog stat records as the kernel's structs, and the buffer they go to
//! usermem     the program's memory, touched as the kernel touches it (EFAULT, not SIGSEGV)
//! procmaps    /proc/self/maps, read without allocation
//! mounts      /proc/self/mountinfo: where this namespace shows a directory
//! ```
//!
//! `unsafe` lives in the modules that meet C and the kernel (`hooks`, `sys`, `init` and `env`,
//! `path`'s stack buffer, `usermem`, `statbuf`, `pack`'s mappings and zstd, `ops::exec`'s
//! environment), each with a `// SAFETY:` line.

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
