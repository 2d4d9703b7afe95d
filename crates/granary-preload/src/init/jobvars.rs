//! granary's variables as this process got them — the entry of `LD_PRELOAD` that names this
//! library, and the `GRANARY_*` variables a process of the job reads — saved by the constructor
//! so that `ops::exec` can put them back into the environment of a program started without
//! them (`subprocess.run(..., env={...})`, `env -i`). Written once, before any hook can read
//! it; read without allocation or lock afterwards.

use core::ffi::c_int;
use std::sync::OnceLock;

use crate::sys::env::{parse_u32, var};

/// The variables besides `LD_PRELOAD`, as `granary run` sets them (`GRANARY_LOG` too, so a
/// child logs as its parent does).
pub const NAMES: [&[u8]; 7] = [
    b"GRANARY_TABLE",
    b"GRANARY_TABLE_FD",
    b"GRANARY_TABLE_ID",
    b"GRANARY_MNT_NS",
    b"GRANARY_JOB_SLOT",
    b"GRANARY_LOG",
    b"GRANARY_SOURCE",
];

/// Index of `GRANARY_TABLE_FD` in `NAMES`: put back only while the fd is open.
pub const TABLE_FD: usize = 1;

/// Room for all of them as `NAME=value\0` strings (`GRANARY_SOURCE` may be a path of up to
/// 4 KiB).
const ROOM: usize = 3 * 4096;

pub struct Saved {
    buf: [u8; ROOM],
    /// `LD_PRELOAD=<this library>`, then `NAMES`: (start, length without the NUL), length 0
    /// when the variable was not set.
    at: [(u16, u16); 1 + NAMES.len()],
    /// The number in `GRANARY_TABLE_FD`, -1 when none.
    pub table_fd: c_int,
}

static SAVED: OnceLock<Saved> = OnceLock::new();

impl Saved {
    fn new() -> Saved {
        Saved {
            buf: [0; ROOM],
            at: [(0, 0); 1 + NAMES.len()],
            table_fd: -1,
        }
    }

    /// Appends `name=value` (NUL-terminated) as variable `i`; false when there is no room.
    fn put(&mut self, i: usize, used: &mut usize, name: &[u8], value: &[u8]) -> bool {
        let len = name.len() + 1 + value.len();
        let Some(dst) = self.buf.get_mut(*used..*used + len + 1) else {
            return false;
        };
        dst[..name.len()].copy_from_slice(name);
        dst[name.len()] = b'=';
        dst[name.len() + 1..len].copy_from_slice(value);
        dst[len] = 0;
        if let Some(a) = self.at.get_mut(i) {
            *a = (*used as u16, len as u16);
        }
        *used += len + 1;
        true
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let &(start, len) = self.at.get(i)?;
        if len == 0 {
            return None;
        }
        self.buf.get(start as usize..start as usize + len as usize)
    }

    /// `LD_PRELOAD=<this library>`; a NUL follows it (so do `var`'s).
    pub fn preload(&self) -> Option<&[u8]> {
        self.get(0)
    }

    /// `NAMES[i]=value`.
    pub fn var(&self, i: usize) -> Option<&[u8]> {
        self.get(1 + i)
    }
}

/// Saves the variables from `lookup` (the constructor: `getenv`). `LD_PRELOAD`'s entry is the
/// one naming a `libgranary_preload*` library; without one (the library was loaded some other
/// way) nothing is saved: a child could not be given it.
pub fn save_from(lookup: impl Fn(&[u8]) -> Option<&'static [u8]>) {
    let Some(entry) = lookup(b"LD_PRELOAD").and_then(preload_entry) else {
        return;
    };
    let mut s = Saved::new();
    let mut used = 0;
    if !s.put(0, &mut used, b"LD_PRELOAD", entry) {
        return;
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = lookup(name) {
            if !s.put(1 + i, &mut used, name, v) {
                return;
            }
        }
    }
    s.table_fd = lookup(NAMES[TABLE_FD])
        .and_then(parse_u32)
        .map_or(-1, |fd| fd as c_int);
    let _ = SAVED.set(s);
}

/// The constructor's call.
pub fn save() {
    save_from(|name| {
        let mut cname = [0u8; 32];
        cname.get_mut(..name.len())?.copy_from_slice(name);
        let cname = core::ffi::CStr::from_bytes_until_nul(&cname).ok()?;
        var(cname)
    });
}

/// What was saved, if anything.
pub fn saved() -> Option<&'static Saved> {
    SAVED.get()
}

/// The entry of an `LD_PRELOAD` value (separated by `:` or spaces) that names this library.
pub fn preload_entry(v: &[u8]) -> Option<&[u8]> {
    v.split(|&b| b == b':' || b == b' ')
        .find(|lib| is_ours(lib))
}

/// True for a path whose file name starts `libgranary_preload`.
pub fn is_ours(lib: &[u8]) -> bool {
    let base = match lib.iter().rposition(|&b| b == b'/') {
        Some(i) => lib.get(i + 1..).unwrap_or(b""),
        None => lib,
    };
    base.starts_with(b"libgranary_preload")
}
