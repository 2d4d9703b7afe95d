//! The environment, read with `getenv` in the constructor only (hooks never read it: no
//! `env::var`, no allocation), and the decimal numbers in it.

use core::ffi::{c_char, CStr};

pub fn var_ptr(name: &CStr) -> Option<*const c_char> {
    // SAFETY: getenv with a NUL-terminated name, in the constructor (no concurrent setenv yet).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    (!p.is_null()).then_some(p.cast_const())
}

pub fn var(name: &CStr) -> Option<&'static [u8]> {
    let p = var_ptr(name)?;
    // SAFETY: getenv returned a NUL-terminated string that lives in the environment block.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

pub fn parse_u32(s: &[u8]) -> Option<u32> {
    u32::try_from(parse_u64(s)?).ok()
}

pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as u64)?;
    }
    Some(v)
}
