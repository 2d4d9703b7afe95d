//! Whose permissions the catalog speaks for. The agent walks and copies the source with the
//! user's credentials, so what the catalog says is readable (a listing it made, a copy it placed)
//! is what the kernel lets *those* credentials read — POSIX ACLs, other security attributes and
//! all. A process with other credentials (a setuid program, another group list after `newgrp`,
//! `setgroups`, `setuid`) must not be answered from the catalog: it passes everything through.
//!
//! Checked once in the constructor and again after every credential change we see (the
//! `set*id`/`setgroups` hooks, `hooks::creds`). A change made by a raw system call is a blind spot, like
//! every raw system call.

use core::ffi::c_int;

use granary_shm::{groups_hash, Table};

use crate::sys::sys;

/// This process's credentials as the table records the agent's: `None` when real, effective,
/// saved and file-system ids are not all one uid and one gid (access(2) would then judge with
/// other ids than open(2)), or the group list is too long to read here.
fn current() -> Option<(u32, u32, u64)> {
    let (mut r, mut e, mut s) = (0u32, 0u32, 0u32);
    sys!(
        libc::SYS_getresuid,
        &mut r as *mut u32,
        &mut e as *mut u32,
        &mut s as *mut u32
    );
    // setfsuid with an invalid id only reports the current one.
    let fsu = sys!(libc::SYS_setfsuid, -1i64) as u32;
    if r != e || e != s || fsu != e {
        return None;
    }
    let uid = e;
    sys!(
        libc::SYS_getresgid,
        &mut r as *mut u32,
        &mut e as *mut u32,
        &mut s as *mut u32
    );
    let fsg = sys!(libc::SYS_setfsgid, -1i64) as u32;
    if r != e || e != s || fsg != e {
        return None;
    }
    let mut groups = [0u32; 1024];
    let n = sys!(libc::SYS_getgroups, groups.len(), groups.as_mut_ptr());
    let n = usize::try_from(n).ok()?;
    Some((uid, e, groups_hash(groups.get_mut(..n)?)))
}

/// Compares this process's credentials with the agent's; the answer holds until the next change.
pub fn check(table: &Table) -> bool {
    let same = current() == Some(table.agent_creds());
    crate::ops::detour::set_creds_match(same);
    same
}

/// A credential call returned `r` (0: it changed something): the match is checked again.
pub fn changed(r: c_int) -> c_int {
    if r == 0 {
        let _keep = crate::sys::KeepErrno::new();
        if let Some(t) = crate::ops::detour::table() {
            check(t);
        }
    }
    r
}
