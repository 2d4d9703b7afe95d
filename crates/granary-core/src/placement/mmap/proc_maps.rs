//! A process's mappings of catalogued files, from `/proc/<pid>/maps`: which entry each mapping
//! shows, what file offsets, and which parts a tier file backs (local) rather than the source.

use std::os::unix::ffi::OsStrExt;

use granary_shm::{chunk_data_offset, parse_object_name, resolve, Resolved, Table};

/// One line of `/proc/<pid>/maps` naming a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub write: bool,
    pub off: u64,
    pub dev: (u32, u32),
    pub ino: u64,
    pub path: Vec<u8>,
}

/// Parses the file-backed lines of a maps text (anonymous ones are skipped).
pub fn parse(text: &[u8]) -> Vec<Vma> {
    text.split(|&c| c == b'\n').filter_map(line).collect()
}

fn line(l: &[u8]) -> Option<Vma> {
    let mut f = l.splitn(6, |&c| c == b' ');
    let range = f.next()?;
    let perms = f.next()?;
    let off = f.next()?;
    let dev = f.next()?;
    let ino = f.next()?;
    let path = f.next().unwrap_or(b"");
    let path = &path[path.iter().position(|&c| c != b' ').unwrap_or(path.len())..];
    let hex = |s: &[u8]| u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok();
    let dash = range.iter().position(|&c| c == b'-')?;
    let colon = dev.iter().position(|&c| c == b':')?;
    let ino: u64 = std::str::from_utf8(ino).ok()?.parse().ok()?;
    if ino == 0 || path.first() != Some(&b'/') || perms.len() != 4 {
        return None;
    }
    Some(Vma {
        start: hex(&range[..dash])?,
        end: hex(&range[dash + 1..])?,
        write: perms[1] == b'w',
        off: hex(off)?,
        dev: (hex(&dev[..colon])? as u32, hex(&dev[colon + 1..])? as u32),
        ino,
        path: path.to_vec(),
    })
}

/// What a mapped file is to the catalog: entry `idx`, the file offset of the VMA's first byte,
/// and whether a tier file (a copy, its part, its chunk file) backs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backing {
    pub idx: u32,
    pub file_off: u64,
    pub local: bool,
}

/// Identifies `v` against `table` (whose source root, symlinks resolved, is `source_real`).
pub fn backing(table: &Table, source_real: &[u8], v: &Vma) -> Option<Backing> {
    // A file unlinked since it was mapped (a withdrawn copy) still holds its bytes.
    let path = v.path.strip_suffix(b" (deleted)").unwrap_or(&v.path);
    for t in 0..granary_shm::layout::MAX_TIERS as u32 {
        let Some(dir) = table.tier_dir(t) else { break };
        let Some(name) = path.strip_prefix(dir).and_then(|r| r.strip_prefix(b"/")) else {
            continue;
        };
        let (stem, suffix) = name.split_at(name.len().min(16));
        let idx = table.lookup_object(parse_object_name(stem)?)?;
        let e = table.entry(idx)?;
        let base = match suffix {
            b"" | b".part" => 0,
            b".chunks" => chunk_data_offset(e.stat.size, table.chunk_size()),
            _ => return None,
        };
        return Some(Backing {
            idx,
            file_off: v.off.checked_sub(base)?,
            local: true,
        });
    }
    let rel = granary_shm::strip_root(path, source_real)?;
    let Resolved::Entry(idx, e) = resolve(table, rel, false) else {
        return None;
    };
    let same =
        e.stat.is_file() && e.stat.ino == v.ino && (e.stat.dev_major, e.stat.dev_minor) == v.dev;
    same.then_some(Backing {
        idx,
        file_off: v.off,
        local: false,
    })
}

/// One mapping the program made of a catalogued file, as the kernel shows it now: possibly
/// several VMAs (granary's overlays), one file offset per address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub idx: u32,
    /// Address of file offset 0 (`va = base + file offset`).
    pub base: u64,
    /// File offsets mapped, `[start, end)`, page-aligned.
    pub start: u64,
    pub end: u64,
    /// File ranges backed by tier files, ascending.
    pub local: Vec<(u64, u64)>,
}

/// Groups a process's VMAs into the mappings of catalogued files: adjacent VMAs of one entry
/// whose addresses follow the file's offsets are one mapping.
pub fn group(table: &Table, source_real: &std::path::Path, vmas: &[Vma]) -> Vec<Mapped> {
    let root = source_real.as_os_str().as_bytes();
    let mut out: Vec<Mapped> = Vec::new();
    for v in vmas {
        let Some(b) = backing(table, root, v) else {
            continue;
        };
        let base = v.start.wrapping_sub(b.file_off);
        let (s, e) = (b.file_off, b.file_off + (v.end - v.start));
        match out.last_mut() {
            Some(m) if m.idx == b.idx && m.base == base && m.end == s => {
                m.end = e;
                if b.local {
                    push_range(&mut m.local, s, e);
                }
            }
            _ => out.push(Mapped {
                idx: b.idx,
                base,
                start: s,
                end: e,
                local: if b.local { vec![(s, e)] } else { vec![] },
            }),
        }
    }
    out
}

fn push_range(v: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    match v.last_mut() {
        Some(last) if last.1 == s => last.1 = e,
        _ => v.push((s, e)),
    }
}

/// Reads and groups `/proc/<pid>/maps`; `None` if the process is gone or hidden from us.
pub fn of_process(pid: u32, table: &Table, source_real: &std::path::Path) -> Option<Vec<Mapped>> {
    let text = std::fs::read(format!("/proc/{pid}/maps")).ok()?;
    Some(group(table, source_real, &parse(&text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_lines_only() {
        let text = b"00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n\
7f6f55e00000-7f6f56e00000 r--s 00001000 fe:0a 10182881                   /tmp/pm/f bin (deleted)\n\
7ffd1000-7ffd2000 rw-p 00000000 00:00 0 \n\
7ffe1000-7ffe2000 rw-p 00000000 00:00 0                          [stack]\n";
        let v = parse(text);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].start, 0x7f6f55e00000);
        assert_eq!(v[1].off, 0x1000);
        assert_eq!(v[1].dev, (0xfe, 0xa));
        assert_eq!(v[1].path, b"/tmp/pm/f bin (deleted)");
        assert!(!v[1].write && v[0].ino == 173521);
    }
}
