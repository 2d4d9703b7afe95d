//! Decoded catalog entries, with the last one remembered per thread: a program opens a file and
//! then `fstat`s and reads it, and every hook on the way needs the same entry. Entries are
//! immutable for the life of the mapped table, so a remembered one never goes stale.

use core::cell::Cell;

use granary_shm::{EntryRec, Table};

thread_local! {
    // const-initialised and destructor-free: usable from any hook, including in a vfork child.
    static LAST: Cell<Option<(u32, EntryRec)>> = const { Cell::new(None) };
}

/// Entry `idx` of the process's table.
#[inline]
pub fn get(table: &Table, idx: u32) -> Option<EntryRec> {
    if let Some((i, e)) = LAST.get() {
        if i == idx {
            return Some(e);
        }
    }
    let e = table.entry(idx)?;
    LAST.set(Some((idx, e)));
    Some(e)
}

/// Remembers an entry decoded elsewhere (by the resolver).
#[inline]
pub fn remember(idx: u32, e: &EntryRec) {
    LAST.set(Some((idx, *e)));
}
