//! The logic layer's unit tests run in the test binary itself, without `LD_PRELOAD`: one real
//! table over a temporary source tree and tier, attached to this process as the constructor
//! would attach the job's (`detour::attach`), so `ops` functions are called as the hooks call
//! them. One fixture for the whole binary: the attached table, like the tier's directory fd
//! `copies` keeps, is the process's.
//!
//! With the table attached, the test binary's own calls on paths under the source go through
//! the library's hooks too (they are its exported symbols): what the tests read back is served
//! as a program's reads would be.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use granary_shm::{
    build, lifecycle, object_id, object_name, CatalogEntry, Mapping, StatRec, State, Table,
    TableSpec,
};

use crate::ops::detour;

pub struct Fixture {
    /// The source root (a real directory: no symlink above it).
    pub src: PathBuf,
    pub tier: PathBuf,
    pub table: &'static Table,
}

/// Files of the source: `a.txt`, `train/big.bin` and `tagged.bin` are placed in tier 0.
pub const PLACED: &str = "train/big.bin";
pub const UNPLACED: &str = "train/small.txt";
/// A placed file with an extended attribute (`user.granary`) on the source, not on its copy.
pub const TAGGED: &str = "tagged.bin";
/// A file placed by no one: a test places it where it needs it (`MOVED`'s copy in two tiers).
pub const MOVED: &str = "moved.bin";
/// A file placed by no one, which one test places while an open of it is under way.
pub const LATE: &str = "late.bin";

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(7) as u8 ^ seed)
        .collect()
}

/// The fixture, built and attached on first use.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build_fixture)
}

impl Fixture {
    /// `src/rel` as a C string.
    pub fn path(&self, rel: &str) -> CString {
        let p = if rel.is_empty() {
            self.src.clone()
        } else {
            self.src.join(rel)
        };
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    pub fn idx(&self, rel: &str) -> u32 {
        self.table.lookup(rel.as_bytes()).unwrap()
    }

    pub fn object(&self, rel: &str) -> PathBuf {
        let name = object_name(object_id(rel.as_bytes()));
        self.tier.join(std::str::from_utf8(&name).unwrap())
    }
}

fn build_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap().keep();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let src = fs::canonicalize(&dir).unwrap().join("src");
    fs::create_dir_all(src.join("train/cls0")).unwrap();
    fs::create_dir_all(src.join("gone/inner")).unwrap();
    fs::write(src.join("a.txt"), b"hello granary\n").unwrap();
    fs::write(src.join(PLACED), pattern(64 * 1024, 7)).unwrap();
    fs::write(src.join(UNPLACED), b"not placed\n").unwrap();
    fs::write(src.join(MOVED), pattern(3000, 9)).unwrap();
    fs::write(src.join(LATE), pattern(2500, 11)).unwrap();
    fs::write(src.join("train/cls0/img0.jpg"), pattern(1000, 1)).unwrap();
    fs::write(src.join("changed.txt"), b"changed by the program\n").unwrap();
    fs::write(src.join("gone/inner/f.txt"), b"below a removed directory\n").unwrap();
    symlink("a.txt", src.join("link")).unwrap();
    // A file with an extended attribute of its own (where the file system takes user ones).
    fs::write(src.join(TAGGED), b"tagged\n").unwrap();
    let tagged = CString::new(src.join(TAGGED).as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name, a value of its stated length.
    let _ = unsafe {
        libc::setxattr(
            tagged.as_ptr(),
            c"user.granary".as_ptr(),
            b"yes".as_ptr().cast(),
            3,
            0,
        )
    };
    symlink("/etc/hostname", src.join("outward")).unwrap();
    let tier = dir.join("tier0");
    fs::create_dir(&tier).unwrap();
    fs::set_permissions(&tier, fs::Permissions::from_mode(0o700)).unwrap();
    // A second tier (`TIER1`), empty but for what a test puts there.
    let tier1 = dir.join("tier1");
    fs::create_dir(&tier1).unwrap();
    fs::set_permissions(&tier1, fs::Permissions::from_mode(0o700)).unwrap();
    let entries = walk(&src);
    let tier_meta = fs::metadata(&tier).unwrap();
    let tier1_meta = fs::metadata(&tier1).unwrap();
    // SAFETY: plain id getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let spec = TableSpec {
        source: src.as_os_str().as_bytes().to_vec(),
        source_real: src.as_os_str().as_bytes().to_vec(),
        tier_dirs: vec![
            tier.as_os_str().as_bytes().to_vec(),
            tier1.as_os_str().as_bytes().to_vec(),
        ],
        tier_dir_ids: vec![
            (tier_meta.dev(), tier_meta.ino()),
            (tier1_meta.dev(), tier1_meta.ino()),
        ],
        creds: (uid, gid, 0),
        root_parent_ino: fs::metadata(&dir).unwrap().ino(),
        agent_pid: std::process::id(),
        // 64 slots per process's shard (`RING_SHARDS`).
        ring_cap: 512,
        job_slots: 4,
        ..Default::default()
    };
    let img = build(&spec, &entries).unwrap();
    let table_path = dir.join("table");
    fs::write(&table_path, &img).unwrap();
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&table_path)
        .unwrap();
    let (mapping, table) = Mapping::map(file.as_raw_fd(), img.len()).unwrap();
    mapping.leak();
    let everything = vec![u64::MAX; table.entry_count().div_ceil(64) as usize];
    lifecycle::validated_by_walk(&table, &everything);
    let f = Fixture {
        src,
        tier,
        table: Box::leak(Box::new(table)),
    };
    for rel in ["a.txt", PLACED, TAGGED] {
        place(&f, rel);
    }
    probe_xattrs(&f);
    let void = |rel: &str, how| assert!(lifecycle::void_entry(f.table, f.idx(rel), how));
    void("changed.txt", lifecycle::Void::Stale);
    void("gone", lifecycle::Void::Gone);
    // As the constructor attaches the job's table, for a process with the agent's credentials.
    detour::set_job_slot(1);
    detour::set_creds_match(true);
    detour::attach(table);
    f
}

/// What the agent's probe publishes (`granary_core::catalog::xattr::probe`), for the fixture's
/// file system: the kernel's answer for each name on a sample of each type without attributes.
fn probe_xattrs(f: &Fixture) {
    use granary_shm::xattr::{Absent, NAMES};
    let root = stat_rec(&f.src);
    let mut a = Absent {
        dev_major: root.dev_major,
        dev_minor: root.dev_minor,
        privileged: crate::sys::has_cap_sys_admin(),
        ..Absent::default()
    };
    for (t, sample) in ["a.txt", "train", "link"].iter().enumerate() {
        let p = f.path(sample);
        for (n, name) in NAMES.iter().enumerate() {
            let name = CString::new(*name).unwrap();
            // SAFETY: NUL-terminated path and name; a NULL value of size 0 asks for the size.
            let r = unsafe { libc::lgetxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if r < 0 && (e == libc::ENODATA || e == libc::EOPNOTSUPP) {
                a.errno[t][n] = e as u8;
            }
        }
    }
    f.table.set_xattr_absent(Some(&a));
}

/// Copies `rel` into tier 0 and records it placed, as the agent does.
pub fn place(f: &Fixture, rel: &str) {
    let obj = f.object(rel);
    fs::copy(f.src.join(rel), &obj).unwrap();
    fs::set_permissions(&obj, fs::Permissions::from_mode(0o600)).unwrap();
    let m = fs::symlink_metadata(&obj).unwrap();
    let ctime = m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64;
    let idx = f.idx(rel);
    assert!(lifecycle::adopt_placed(f.table, idx, 0, 1, m.ino(), ctime));
    assert_eq!(f.table.state(idx).state(), State::Placed);
}

fn stat_rec(p: &Path) -> StatRec {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: statx fills the zeroed struct (plain integers) for a NUL-terminated path.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut x,
        )
    };
    assert_eq!(r, 0, "statx {}", p.display());
    let mut s = StatRec::from_statx(&x);
    // As the agent's walk records it (`granary_core::catalog::xattr::listed`).
    // SAFETY: a NUL-terminated path; a NULL list of size 0 asks for the size only.
    if unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) } == 0 {
        s.xattrs = granary_shm::xattr::NONE_LISTED;
    }
    s
}

/// The catalog of `root` as the agent's walk makes it (children listed in name order).
fn walk(root: &Path) -> Vec<CatalogEntry> {
    let mut entries = vec![CatalogEntry {
        rel_path: vec![],
        stat: stat_rec(root),
        ..Default::default()
    }];
    let mut i = 0;
    while i < entries.len() {
        if entries[i].stat.is_dir() {
            let rel = entries[i].rel_path.clone();
            let dir = root.join(std::ffi::OsStr::from_bytes(&rel));
            let mut names: Vec<_> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for name in names {
                let mut r = rel.clone();
                if !r.is_empty() {
                    r.push(b'/');
                }
                r.extend_from_slice(name.as_bytes());
                let p = dir.join(&name);
                let link_target = fs::read_link(&p)
                    .map(|t| t.as_os_str().as_bytes().to_vec())
                    .unwrap_or_default();
                let child = entries.len();
                entries.push(CatalogEntry {
                    rel_path: r,
                    stat: stat_rec(&p),
                    link_target,
                    ..Default::default()
                });
                entries[i].children.push(child);
            }
        }
        i += 1;
    }
    entries
}

mod tests {
    use crate::ops::detour::{enter, enter_any_creds, Bypass};

    #[test]
    fn the_guard_is_one_per_thread() {
        let _f = super::fixture();
        let g = enter().ok().unwrap();
        assert_eq!(g.slot, 1);
        assert_eq!(enter().err(), Some(Bypass::Reentered));
        assert_eq!(enter_any_creds().err(), Some(Bypass::Reentered));
        drop(g);
        assert!(enter().is_ok());
    }
}
