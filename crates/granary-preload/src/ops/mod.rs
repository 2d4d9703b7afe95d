//! What granary does for each family of hooked calls, as plain Rust, one family per module
//! (the C entry points are `hooks`, one module per family too).
//!
//! Families that answer or pass through — `open`, `stat`, `link`, `dir`, `read`, `xattr` — return a
//! `Detour`: granary's answer, a failure with its errno, or `Bypass(why, then)`: the real call
//! runs, `why` says why (the debug log prints it), `then` is what to finish after it. Families
//! that act around the real call — `mutate`, `attr`, `lock`, `fd`, `map`, `exec`, `creds` — run
//! before and after it, or take it as a closure when it may have to run on another file (the
//! source instead of a copy).
//!
//! What the families share: `detour` (whether a call may consult the table: the guard; `Detour`
//! and `Bypass`), `lookup` (the live entry a path argument names), `path` (where a path
//! argument points, decided lexically) and `validate` (an entry checked against the source
//! ahead of the agent).

pub mod attr;
pub mod creds;
pub mod detour;
pub mod dir;
pub mod exec;
pub mod fd;
pub mod link;
pub mod lock;
pub mod lookup;
pub mod map;
pub mod mutate;
pub mod open;
pub mod path;
pub mod read;
pub mod stat;
pub mod validate;
pub mod xattr;
