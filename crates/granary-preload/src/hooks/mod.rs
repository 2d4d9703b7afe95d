//! The interposed C entry points, one module per family of calls. Each takes the C arguments,
//! asks the family's logic in `ops` what to do, and either returns granary's answer (setting
//! errno for a failure) or calls the real libc function (`real!`) with the caller's original
//! arguments — and, for a pass-through on the dataset, says why in the debug log.

// C ABI entry points: their safety contract is libc's, documented in the man pages.
#![allow(clippy::missing_safety_doc)]

pub mod attr;
pub mod creds;
pub mod dir;
pub mod exec;
pub mod fd;
pub mod link;
pub mod lock;
pub mod map;
pub mod mutate;
pub mod open;
pub mod read;
pub mod stat;
pub mod xattr;
