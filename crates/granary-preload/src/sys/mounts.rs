//! Where this process's mount namespace shows a directory: `/proc/self/mountinfo` read with raw
//! system calls into stack buffers. Used once, when the source root is not at its catalogued
//! path, to tell "bound at another path" from "not bound at all".

use crate::sys::PATH_BUF;
use crate::sys::{self, sys};

/// True when some mount point of this process is the directory `want` (`(st_dev, st_ino)`) on
/// the device `major:minor` (a bind of exactly that directory).
pub fn shows(major: u32, minor: u32, want: (u64, u64)) -> bool {
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        c"/proc/self/mountinfo".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 8192];
    let mut have = 0usize;
    let mut found = false;
    'read: loop {
        let n = sys!(
            libc::SYS_read,
            fd,
            buf.as_mut_ptr().wrapping_add(have),
            buf.len() - have
        );
        let Ok(n) = usize::try_from(n) else { break };
        let eof = n == 0;
        have += n;
        let mut start = 0;
        while let Some(line) = buf.get(start..have).and_then(|rest| {
            let nl = rest.iter().position(|&b| b == b'\n')?;
            rest.get(..nl)
        }) {
            if line_shows(line, major, minor, want) {
                found = true;
                break 'read;
            }
            start += line.len() + 1;
        }
        if eof {
            break;
        }
        if start == 0 && have == buf.len() {
            // A line longer than the buffer (a very long path): skip it.
            have = 0;
            continue;
        }
        buf.copy_within(start..have, 0);
        have -= start;
    }
    sys::raw_close(fd);
    found
}

/// One mountinfo line: `id parent major:minor root mount-point options ...`.
fn line_shows(line: &[u8], major: u32, minor: u32, want: (u64, u64)) -> bool {
    let mut fields = line.split(|&b| b == b' ');
    let (Some(_), Some(_), Some(dev), Some(_), Some(point)) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return false;
    };
    if !same_dev(dev, major, minor) {
        return false;
    }
    let mut path = [0u8; PATH_BUF];
    if unescape(point, &mut path).is_none() {
        return false;
    }
    let mut st = sys::empty_stat();
    let r = sys::raw_newfstatat(
        libc::AT_FDCWD,
        path.as_ptr().cast(),
        (&mut st as *mut libc::stat).cast(),
        0,
    );
    r == 0 && (st.st_dev, st.st_ino) == want
}

fn same_dev(field: &[u8], major: u32, minor: u32) -> bool {
    let Some(colon) = field.iter().position(|&b| b == b':') else {
        return false;
    };
    let num = |s: &[u8]| -> Option<u32> {
        let mut v = 0u32;
        if s.is_empty() {
            return None;
        }
        for &b in s {
            if !b.is_ascii_digit() {
                return None;
            }
            v = v.checked_mul(10)?.checked_add((b - b'0') as u32)?;
        }
        Some(v)
    };
    num(field.get(..colon).unwrap_or(b"")) == Some(major)
        && num(field.get(colon + 1..).unwrap_or(b"")) == Some(minor)
}

/// Mount points escape space, tab, newline and backslash as `\ooo`; the result is
/// NUL-terminated in `out`.
fn unescape(s: &[u8], out: &mut [u8; PATH_BUF]) -> Option<usize> {
    let mut i = 0;
    let mut n = 0;
    while i < s.len() {
        let Some(&(mut b)) = s.get(i) else { break };
        if let (b'\\', Some(&[a, c, d])) = (b, s.get(i + 1..i + 4)) {
            if [a, c, d].iter().all(|x| (b'0'..=b'7').contains(x)) {
                b = ((a - b'0') << 6)
                    .wrapping_add((c - b'0') << 3)
                    .wrapping_add(d - b'0');
                i += 3;
            }
        }
        *out.get_mut(n)? = b;
        n += 1;
        i += 1;
    }
    *out.get_mut(n)? = 0;
    Some(n)
}
