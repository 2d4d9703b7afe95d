//! `ls -l`-style lines from the index: mode string, links, owner, size, mtime (UTC), name —
//! names escaped like `ls -b` so newlines and non-UTF-8 bytes stay on one visible line.

use std::fmt::Write;

use crate::format::{IndexEntry, Timestamp};
use crate::index::Index;

/// `name` with backslash escapes for control characters, backslashes and bytes that are not
/// UTF-8 (`\n`, `\t`, `\\`, `\ooo`).
pub fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => {
                    let mut b = [0u8; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        let _ = write!(out, "\\{byte:03o}");
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\{byte:03o}");
        }
    }
    out
}

/// `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`, with setuid/setgid/sticky letters.
pub fn mode_string(mode: u32) -> String {
    let t = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    let bit = |m: u32, c: char| if mode & m != 0 { c } else { '-' };
    let special = |x: u32, sp: u32, lower: char, upper: char| match (mode & x != 0, mode & sp != 0)
    {
        (true, true) => lower,
        (false, true) => upper,
        (true, false) => 'x',
        (false, false) => '-',
    };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(0o100, 0o4000, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(0o010, 0o2000, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(0o001, 0o1000, 't', 'T'));
    s
}

/// `YYYY-MM-DD HH:MM` in UTC (days to civil date after Howard Hinnant's algorithm).
pub fn time_string(t: Timestamp) -> String {
    let days = t.sec.div_euclid(86_400);
    let secs = t.sec.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// One `ls -l` line for entry `e`, shown as `shown` (its name, or its path).
pub fn long_line<B: AsRef<[u8]>>(ix: &Index<B>, e: &IndexEntry, shown: &[u8]) -> String {
    let s = &e.stat;
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>12} {} {}",
        mode_string(s.mode),
        s.nlink,
        s.uid,
        s.gid,
        s.size,
        time_string(s.mtime),
        escape(shown)
    );
    if s.is_symlink() {
        line.push_str(" -> ");
        line.push_str(&escape(ix.link_target(e)));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(escape(b"a b\n\xffc\\"), "a b\\n\\377c\\\\");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(
            time_string(Timestamp { sec: 0, nsec: 0 }),
            "1970-01-01 00:00"
        );
        assert_eq!(
            time_string(Timestamp {
                sec: 1_709_251_199,
                nsec: 0
            }),
            "2024-02-29 23:59"
        );
    }
}
