//! Owning a table mapping. Uses raw syscalls rather than libc's wrappers: inside the preload
//! library, `mmap`/`munmap` may resolve to granary's own hooks.

use crate::region::Region;
use crate::table::{Table, TableError};

/// A `MAP_SHARED` read-write mapping of a whole table file, unmapped on drop.
pub struct Mapping {
    region: Region,
}

impl Mapping {
    /// Maps `len` bytes of the open table file `fd` and validates the table header.
    /// The fd may be closed afterwards.
    pub fn map(fd: i32, len: usize) -> Result<(Mapping, Table), MapError> {
        if len == 0 {
            return Err(MapError::Table(TableError::TooShort));
        }
        // `syscall` is variadic and reads every argument as a long: pass longs, or the upper
        // halves of the registers are garbage (a random file offset).
        // SAFETY: plain mmap syscall on a caller-provided fd; the result is checked below.
        let addr = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                0 as libc::c_long,
                len as libc::c_long,
                (libc::PROT_READ | libc::PROT_WRITE) as libc::c_long,
                libc::MAP_SHARED as libc::c_long,
                fd as libc::c_long,
                0 as libc::c_long,
            )
        };
        if addr < 0 {
            return Err(MapError::Errno(-addr as i32));
        }
        // SAFETY: the kernel just mapped `len` bytes at `addr` (page-aligned), and they stay
        // mapped until `Mapping::drop`, which outlives every `Table` the caller keeps by contract
        // of holding the `Mapping` (or leaking it, as the preload library does).
        let region = unsafe { Region::new(addr as *mut u8, len) };
        let mapping = Mapping { region };
        let table = Table::new(region).map_err(MapError::Table)?;
        Ok((mapping, table))
    }

    pub fn region(&self) -> Region {
        self.region
    }

    /// Keeps the mapping for the life of the process (the preload library's table).
    pub fn leak(self) {
        core::mem::forget(self);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; Tables derived from it must not be used
        // after this (the owner keeps the Mapping alive as long as its Tables).
        unsafe {
            libc::syscall(
                libc::SYS_munmap,
                self.region.base() as libc::c_long,
                self.region.len() as libc::c_long,
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    Errno(i32),
    Table(TableError),
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MapError::Errno(e) => {
                write!(f, "mmap failed: {}", std::io::Error::from_raw_os_error(*e))
            }
            MapError::Table(t) => t.fmt(f),
        }
    }
}

impl std::error::Error for MapError {}
