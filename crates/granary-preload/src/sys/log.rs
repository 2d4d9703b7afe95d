//! Diagnostics with raw `write(2)`: no std I/O, no allocation, usable inside any hook.

use core::sync::atomic::{AtomicI32, Ordering};

use crate::sys;

/// Where diagnostics go; -1 = silent.
static FD: AtomicI32 = AtomicI32::new(-1);

/// `debug` → stderr; `debug:/path` → appended to that file. Constructor only.
pub fn configure(spec: &[u8]) {
    if spec == b"debug" {
        FD.store(2, Ordering::Relaxed);
    } else if let Some(path) = spec.strip_prefix(b"debug:") {
        let mut buf = [0u8; 4096];
        let Some(dst) = buf.get_mut(..path.len()) else {
            return;
        };
        dst.copy_from_slice(path);
        let fd = sys::raw_openat(
            libc::AT_FDCWD,
            buf.as_ptr().cast(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        if fd >= 0 {
            FD.store(fd, Ordering::Relaxed);
        }
    }
}

pub fn enabled() -> bool {
    FD.load(Ordering::Relaxed) >= 0
}

/// One line made of `parts`, prefixed with the pid; truncated at 1 KiB.
pub fn line(parts: &[&[u8]]) {
    let fd = FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 1024];
    let mut w = Writer {
        buf: &mut buf,
        len: 0,
    };
    w.put(b"granary-preload[");
    w.num(sys::sys!(libc::SYS_getpid) as u64);
    w.put(b"]: ");
    for p in parts {
        w.put(p);
    }
    w.put(b"\n");
    let len = w.len;
    sys::raw_write(fd, buf.get(..len).unwrap_or(&[]));
}

/// Decimal digits of `v` in a small buffer, for `line`.
pub fn num(v: u64, out: &mut [u8; 20]) -> &[u8] {
    let mut i = out.len();
    let mut v = v;
    loop {
        i -= 1;
        if let Some(d) = out.get_mut(i) {
            *d = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    out.get(i..).unwrap_or(&[])
}

struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(d) = self.buf.get_mut(self.len) {
                *d = b;
                self.len += 1;
            }
        }
    }
    fn num(&mut self, v: u64) {
        let mut d = [0u8; 20];
        let s = num(v, &mut d);
        let mut tmp = [0u8; 20];
        let n = s.len();
        if let Some(t) = tmp.get_mut(..n) {
            t.copy_from_slice(s);
        }
        self.put(tmp.get(..n).unwrap_or(&[]));
    }
}
