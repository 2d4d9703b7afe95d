//! `/proc/self/maps`, read with raw system calls through a stack buffer, one line at a time:
//! no allocation, usable inside a hook. Only the rare paths that must know how the program's
//! address space is laid out use it (`mremap` of a mapping granary split).

use crate::sys::{self, sys};

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vma<'a> {
    pub start: usize,
    pub end: usize,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub off: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub ino: u64,
    /// The mapped file's path as the kernel prints it (empty for anonymous memory).
    pub path: &'a [u8],
}

const BUF: usize = 8192;

/// Calls `each` with every mapping in address order until it returns false. False if the file
/// could not be read whole (a line longer than the buffer counts as a failure): the caller must
/// then assume nothing.
///
/// Never inlined: its 8 KiB buffer would otherwise join the frame of every hook that may call
/// it on a rare path (a whole-program optimised build put two copies into `mremap`'s, 17 KiB
/// taken from the program's stack on every call, even one passed straight through).
#[inline(never)]
pub fn for_each(mut each: impl FnMut(&Vma) -> bool) -> bool {
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        c"/proc/self/maps".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; BUF];
    let mut have = 0usize;
    let ok = 'read: loop {
        let Some(room) = buf.get_mut(have..) else {
            break false;
        };
        let n = sys!(libc::SYS_read, fd, room.as_mut_ptr(), room.len());
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            break false;
        }
        let n = n as usize;
        have += n;
        let mut done = 0usize;
        while let Some(nl) = buf
            .get(done..have)
            .and_then(|b| b.iter().position(|&c| c == b'\n'))
        {
            let line = buf.get(done..done + nl).unwrap_or(&[]);
            match parse(line) {
                Some(v) => {
                    if !each(&v) {
                        break 'read true;
                    }
                }
                None => break 'read false,
            }
            done += nl + 1;
        }
        if n == 0 {
            // The last line always ends with a newline: anything left is a torn read.
            break done == have;
        }
        if done == 0 && have == BUF {
            break false;
        }
        buf.copy_within(done..have, 0);
        have -= done;
    };
    sys::raw_close(fd);
    ok
}

fn hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = v << 4 | d as u64;
    }
    Some(v)
}

fn dec(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

/// Splits off the next space-separated field.
fn field(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let s = s.get(s.iter().position(|&c| c != b' ')?..)?;
    match s.iter().position(|&c| c == b' ') {
        Some(p) => Some((s.get(..p)?, s.get(p..)?)),
        None => Some((s, &[])),
    }
}

pub fn parse(line: &[u8]) -> Option<Vma<'_>> {
    let (range, rest) = field(line)?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let start = hex(range.get(..dash)?)? as usize;
    let end = hex(range.get(dash + 1..)?)? as usize;
    let (perms, rest) = field(rest)?;
    if perms.len() != 4 {
        return None;
    }
    let (off, rest) = field(rest)?;
    let (dev, rest) = field(rest)?;
    let colon = dev.iter().position(|&c| c == b':')?;
    let (ino, rest) = field(rest)?;
    let path = match rest.iter().position(|&c| c != b' ') {
        Some(p) => rest.get(p..)?,
        None => &[],
    };
    Some(Vma {
        start,
        end,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
        exec: perms.get(2) == Some(&b'x'),
        shared: perms.get(3) == Some(&b's'),
        off: hex(off)?,
        dev_major: hex(dev.get(..colon)?)? as u32,
        dev_minor: hex(dev.get(colon + 1..)?)? as u32,
        ino: dec(ino)?,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_and_anonymous_lines() {
        let v = parse(b"7f6f55e00000-7f6f56e00000 r--s 00001000 fe:0a 10182881                   /tmp/pm/f bin").unwrap();
        assert_eq!((v.start, v.end), (0x7f6f55e00000, 0x7f6f56e00000));
        assert!(v.read && !v.write && !v.exec && v.shared);
        assert_eq!(
            (v.off, v.dev_major, v.dev_minor, v.ino),
            (0x1000, 0xfe, 0xa, 10182881)
        );
        assert_eq!(v.path, b"/tmp/pm/f bin");
        let a = parse(b"7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(a.write && !a.shared && a.path.is_empty());
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn reads_our_own_maps() {
        let mut n = 0;
        let mut sorted = true;
        let mut last = 0;
        assert!(for_each(|v| {
            n += 1;
            sorted &= v.start >= last;
            last = v.end;
            true
        }));
        assert!(n > 5 && sorted);
    }
}
