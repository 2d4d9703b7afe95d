//! A real catalog table over a temporary source tree, and real programs run with and without
//! the preload library.

#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use granary_shm::{
    build, chunks_name, object_id, object_name, part_name, CatalogEntry, Mapping, StatRec, State,
    Table, TableSpec, Ts,
};

pub const SLOT: u32 = 1;
pub const PY: &str = "/usr/bin/python3";

/// The library as `cargo build -p granary-preload` left it. Cargo does not build a
/// cdylib-only crate for its integration tests, so a missing or stale one is an error.
pub fn lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let lib = dir.join("libgranary_preload.so");
    let built = fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build -p granary-preload` first",
                lib.display()
            )
        });
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for f in walk_files(&src) {
        let m = fs::metadata(&f).unwrap().modified().unwrap();
        assert!(
            m <= built,
            "{} is older than {}: run `cargo build -p granary-preload` first",
            lib.display(),
            f.display()
        );
    }
    lib
}

fn walk_files(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// `(st_dev, st_ino)` of a path.
pub fn dev_ino(p: &Path) -> (u64, u64) {
    let m = fs::metadata(p).unwrap();
    (m.dev(), m.ino())
}

/// This process's credentials as the agent records its own in a table.
pub fn creds() -> (u32, u32, u64) {
    // SAFETY: getgroups with a zero size returns the count; then fills `n` ids.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0) as usize;
    let mut g = vec![0u32; n];
    let got = unsafe { libc::getgroups(n as i32, g.as_mut_ptr()) }.max(0) as usize;
    g.truncate(got);
    // SAFETY: plain id getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid, gid, granary_shm::groups_hash(&mut g))
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    /// The source root as programs name it.
    pub src: PathBuf,
    pub tier: PathBuf,
    pub table: PathBuf,
    mapping: Option<(Mapping, Table)>,
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// 128 KiB, a placed file in most tests.
pub const BIG: &str = "train/big.bin";

impl Fixture {
    /// A source tree with files, nested directories and symlinks; `big.bin` and `a.txt` placed.
    pub fn new() -> Fixture {
        Fixture::with_root_link(false)
    }

    /// With `via_link`, programs name the source through a symlink to the real directory.
    pub fn with_root_link(via_link: bool) -> Fixture {
        Fixture::build(via_link, &[], TableSpec::default())
    }

    /// The usual tree plus `large` files (relative path, size, pattern seed) and the placement
    /// parameters of `params` (`prefetch_min_size`, `chunk_size`).
    pub fn with_large(
        large: &[(&str, usize, u8)],
        prefetch_min_size: u64,
        chunk_size: u64,
    ) -> Fixture {
        Fixture::build(
            false,
            large,
            TableSpec {
                prefetch_min_size,
                chunk_size,
                ..Default::default()
            },
        )
    }

    fn build(via_link: bool, large: &[(&str, usize, u8)], params: TableSpec) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let real = dir.path().join("src");
        let s = &real;
        fs::create_dir_all(s.join("train/cls0")).unwrap();
        fs::create_dir_all(s.join("train/cls1/deeper")).unwrap();
        fs::create_dir_all(s.join("emptydir")).unwrap();
        fs::create_dir_all(s.join("locked")).unwrap();
        fs::write(s.join("a.txt"), b"hello granary\n").unwrap();
        fs::write(s.join(BIG), pattern(128 * 1024, 7)).unwrap();
        for i in 0..5 {
            fs::write(
                s.join(format!("train/cls0/img{i}.jpg")),
                pattern(1000 + i * 333, i as u8),
            )
            .unwrap();
            fs::write(
                s.join(format!("train/cls1/img{i}.jpg")),
                pattern(2000 + i * 77, 50 + i as u8),
            )
            .unwrap();
        }
        fs::write(s.join("train/cls1/deeper/x.dat"), pattern(4097, 99)).unwrap();
        fs::write(s.join("with space.txt"), b"spaced\n").unwrap();
        fs::write(s.join("private.txt"), b"root only\n").unwrap();
        fs::set_permissions(s.join("private.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(s.join("locked/inner.txt"), b"behind a locked door\n").unwrap();
        fs::set_permissions(s.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(s.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(s.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        for (rel, len, seed) in large {
            let p = s.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, pattern(*len, *seed)).unwrap();
        }
        symlink("a.txt", s.join("link_rel")).unwrap();
        symlink("train/cls0", s.join("link_dir")).unwrap();
        symlink(s.join(BIG), s.join("link_abs")).unwrap();
        symlink("nowhere", s.join("dangling")).unwrap();
        symlink("../../a.txt", s.join("train/cls1/up_link")).unwrap();
        // Settle access times (relatime updates them on the first read after a write), so that
        // runs with and without the library see the same atimes as the walk.
        // The kernel's clock for timestamps is coarse: step past the creation tick first, or the
        // settled atime still equals mtime and the next read bumps it again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        settle(s);
        let src = if via_link {
            let l = dir.path().join("srclink");
            symlink(&real, &l).unwrap();
            l
        } else {
            real.clone()
        };
        let tier = dir.path().join("tier0");
        fs::create_dir(&tier).unwrap();
        fs::set_permissions(&tier, fs::Permissions::from_mode(0o700)).unwrap();
        let table = dir.path().join("table");
        let entries = walk(&real);
        let parent = stat_rec(dir.path());
        let spec = TableSpec {
            source: src.as_os_str().as_bytes().to_vec(),
            source_real: fs::canonicalize(&real)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec(),
            tier_dirs: vec![tier.as_os_str().as_bytes().to_vec()],
            tier_dir_ids: vec![dev_ino(&tier)],
            creds: creds(),
            root_parent_ino: parent.ino,
            agent_pid: std::process::id(),
            // 64 slots per process's shard (`RING_SHARDS`): a test drains them after.
            ring_cap: 512,
            job_slots: 4,
            prefetch_min_size: params.prefetch_min_size,
            chunk_size: params.chunk_size,
            pack: None,
        };
        let img = build(&spec, &entries).unwrap();
        fs::write(&table, &img).unwrap();
        let mut f = Fixture {
            dir,
            src,
            tier,
            table,
            mapping: None,
        };
        f.map();
        // As the agent's walk leaves it: every entry was read from the source just now.
        let everything: Vec<u64> = vec![u64::MAX; f.t().entry_count().div_ceil(64) as usize];
        granary_shm::lifecycle::validated_by_walk(f.t(), &everything);
        f.place("a.txt");
        f.place(BIG);
        f.place("train/cls0/img1.jpg");
        f
    }

    fn map(&mut self) {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.table)
            .unwrap();
        let len = file.metadata().unwrap().len() as usize;
        self.mapping = Some(Mapping::map(file.as_raw_fd(), len).unwrap());
    }

    pub fn t(&self) -> &Table {
        &self.mapping.as_ref().unwrap().1
    }

    pub fn real_src(&self) -> PathBuf {
        self.dir.path().join("src")
    }

    pub fn object(&self, rel: &str) -> PathBuf {
        let name = object_name(object_id(rel.as_bytes()));
        self.tier.join(std::str::from_utf8(&name).unwrap())
    }

    /// Copies `rel` into tier 0 and marks it placed, as the agent would: mode 0600, its
    /// identity recorded after the last change.
    pub fn place(&self, rel: &str) {
        let obj = self.object(rel);
        fs::copy(self.real_src().join(rel), &obj).unwrap();
        fs::set_permissions(&obj, fs::Permissions::from_mode(0o600)).unwrap();
        let idx = self.t().lookup(rel.as_bytes()).unwrap();
        self.record_identity(rel);
        self.drive(idx, State::Placed);
    }

    /// Moves entry `idx` to `target` (on tier 0) the way the agent does, through the lifecycle's
    /// own transitions (back to UNPLACED first when needed), keeping the copy identity recorded.
    pub fn drive(&self, idx: u32, target: State) {
        use granary_shm::lifecycle as lc;
        let t = self.t();
        let cell = lc::EntryCell { table: t, idx };
        let (ino, ctime) = t.copy_identity(idx);
        let cur = t.state(idx);
        let back = match cur.state() {
            State::Unplaced => true,
            State::Queued => lc::unclaim(&cell),
            State::Placing => lc::give_up(&cell, State::Unplaced),
            State::Placed => lc::withdraw(&cell, cur),
            State::Partial => lc::drop_partial(&cell, cur),
            State::SourceOnly => lc::claim_ahead(&cell, cur) && lc::unclaim(&cell),
            s => panic!("state {s:?} is terminal"),
        };
        assert!(back, "entry {idx} moved under the test");
        let tier = 0;
        let ok = match target {
            State::Unplaced => true,
            State::Queued => lc::claim(&cell),
            State::Placing => {
                lc::claim(&cell) && lc::start(t, idx) && lc::announce_part(t, idx, tier, ino)
            }
            State::Placed => lc::adopt_placed(t, idx, tier, 1, ino, ctime),
            State::Partial => {
                lc::claim(&cell)
                    && lc::start(t, idx)
                    && lc::to_partial(t, idx, t.state(idx), tier, ino)
            }
            State::SourceOnly => {
                lc::claim(&cell) && lc::start(t, idx) && lc::give_up(&cell, State::SourceOnly)
            }
            s => panic!("cannot drive to state {s:?}"),
        };
        assert!(ok, "entry {idx}: no transition to {target:?}");
    }

    /// Records the identity of `rel`'s object file (after the test changed it on purpose, or as
    /// the agent does after writing it).
    pub fn record_identity(&self, rel: &str) {
        let m = fs::symlink_metadata(self.object(rel)).unwrap();
        let ctime = m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64;
        granary_shm::lifecycle::record_copy(self.t(), self.idx(rel), m.ino(), ctime, 1);
    }

    /// Writes a file of the agent's (a `.part` or `.chunks` of `rel`) as the agent does: mode
    /// 0600, its inode recorded before the state names the tier.
    pub fn agent_write(&self, rel: &str, file: &Path, data: &[u8]) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut w = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(file)
            .unwrap();
        w.write_all(data).unwrap();
        self.record_ino(rel, file);
    }

    /// Records only the inode of a file the agent is still writing (`.part`, `.chunks`).
    pub fn record_ino(&self, rel: &str, file: &Path) {
        let m = fs::symlink_metadata(file).unwrap();
        granary_shm::lifecycle::record_part(self.t(), self.idx(rel), m.ino());
    }

    pub fn idx(&self, rel: &str) -> u32 {
        self.t().lookup(rel.as_bytes()).unwrap()
    }

    /// The agent's partial copy of `rel` (`<object>.part`) in tier 0.
    pub fn part(&self, rel: &str) -> PathBuf {
        let name = part_name(object_id(rel.as_bytes()));
        self.tier.join(std::str::from_utf8(&name).unwrap())
    }

    /// The chunk file of `rel` (`<object>.chunks`) in tier 0.
    pub fn chunks(&self, rel: &str) -> PathBuf {
        let name = chunks_name(object_id(rel.as_bytes()));
        self.tier.join(std::str::from_utf8(&name).unwrap())
    }

    /// A heartbeat as the agent would beat it (CLOCK_MONOTONIC).
    pub fn beat(&self) {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime fills the timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        self.t()
            .beat(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
    }

    /// Requests on the ring with their argument: (kind, path, arg).
    pub fn requests_arg(&self) -> Vec<(u8, String, u32)> {
        let mut out = vec![];
        while let Some(granary_shm::Request { kind, entry, arg }) = self.t().pop_request() {
            out.push((
                kind,
                String::from_utf8_lossy(&self.t().rel_path_vec(entry).unwrap()).into_owned(),
                arg,
            ));
        }
        out
    }

    pub fn state_of(&self, rel: &str) -> State {
        self.t()
            .state(self.t().lookup(rel.as_bytes()).unwrap())
            .state()
    }

    pub fn counter(&self, word: usize) -> u64 {
        self.t().job_value(SLOT, word)
    }

    pub fn requests(&self) -> Vec<(u8, String)> {
        let mut out = vec![];
        while let Some(granary_shm::Request {
            kind, entry: idx, ..
        }) = self.t().pop_request()
        {
            out.push((
                kind,
                String::from_utf8_lossy(&self.t().rel_path_vec(idx).unwrap()).into_owned(),
            ));
        }
        out
    }

    pub fn p(&self, rel: &str) -> String {
        if rel.is_empty() {
            return self.src.display().to_string();
        }
        format!("{}/{}", self.src.display(), rel)
    }

    /// Makes the fixture usable by an unprivileged user (table and tier owned by them).
    pub fn hand_to(&self, uid: u32) {
        for p in [&self.table, &self.tier] {
            chown(p, uid);
        }
        for e in fs::read_dir(&self.tier).unwrap() {
            chown(&e.unwrap().path(), uid);
        }
    }

    pub fn cmd(&self, prog: &str, args: &[&str], preload: bool) -> Command {
        let mut c = Command::new(prog);
        c.args(args);
        c.env_remove("LD_PRELOAD")
            .env_remove("GRANARY_DISABLE")
            .env_remove("GRANARY_LOG")
            .env("LC_ALL", "C")
            .env("TZ", "UTC");
        if preload {
            c.env("LD_PRELOAD", lib())
                .env("GRANARY_TABLE", &self.table)
                .env("GRANARY_JOB_SLOT", SLOT.to_string());
            // Debugging aid: GRANARY_TEST_LOG=debug:/path collects the library's decisions.
            if let Ok(log) = std::env::var("GRANARY_TEST_LOG") {
                c.env("GRANARY_LOG", log);
            }
        }
        c
    }

    pub fn run(&self, prog: &str, args: &[&str], preload: bool) -> Output {
        self.cmd(prog, args, preload).output().unwrap()
    }

    /// Runs `prog args` with and without the library and asserts identical status and output.
    pub fn same(&self, prog: &str, args: &[&str]) -> Output {
        let without = self.run(prog, args, false);
        let with = self.run(prog, args, true);
        assert_eq!(
            String::from_utf8_lossy(&with.stderr),
            String::from_utf8_lossy(&without.stderr),
            "stderr of {prog} {args:?}"
        );
        if with.stdout != without.stdout {
            let a = String::from_utf8_lossy(&with.stdout).into_owned();
            let b = String::from_utf8_lossy(&without.stdout).into_owned();
            let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
            let mut diff = String::new();
            for i in 0..la.len().max(lb.len()) {
                let (x, y) = (la.get(i), lb.get(i));
                if x != y {
                    diff += &format!("line {i}\n  with:    {x:?}\n  without: {y:?}\n");
                }
            }
            panic!(
                "stdout of {prog} differs ({} vs {} bytes):\n{diff}",
                with.stdout.len(),
                without.stdout.len()
            );
        }
        assert_eq!(
            with.status.code(),
            without.status.code(),
            "status of {prog} {args:?}"
        );
        with
    }

    /// `same` for a Python script; the script gets the source root as `sys.argv[1]`.
    pub fn same_py(&self, script: &str) -> Output {
        let src = self.p("");
        let out = self.same(PY, &["-c", script, &src]);
        assert!(
            out.status.success(),
            "script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

fn chown(p: &Path, uid: u32) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, uid) }, 0);
}

fn settle(d: &Path) {
    for e in fs::read_dir(d).unwrap() {
        let e = e.unwrap();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            settle(&e.path());
        } else if ft.is_file() {
            let _ = fs::read(e.path());
        } else if ft.is_symlink() {
            // Following a link touches its atime too.
            let _ = fs::read_link(e.path());
            let _ = fs::metadata(e.path());
        }
    }
}

pub fn stat_rec(p: &Path) -> StatRec {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: zeroed statx is valid; statx fills it.
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
    let ts = |t: libc::statx_timestamp| Ts {
        sec: t.tv_sec,
        nsec: t.tv_nsec,
        _pad: 0,
    };
    StatRec {
        mask: x.stx_mask,
        blksize: x.stx_blksize,
        attributes: x.stx_attributes,
        nlink: x.stx_nlink,
        uid: x.stx_uid,
        gid: x.stx_gid,
        mode: x.stx_mode as u32,
        ino: x.stx_ino,
        size: x.stx_size,
        blocks: x.stx_blocks,
        attributes_mask: x.stx_attributes_mask,
        atime: ts(x.stx_atime),
        btime: ts(x.stx_btime),
        ctime: ts(x.stx_ctime),
        mtime: ts(x.stx_mtime),
        rdev_major: x.stx_rdev_major,
        rdev_minor: x.stx_rdev_minor,
        dev_major: x.stx_dev_major,
        dev_minor: x.stx_dev_minor,
        xattrs: 0,
    }
}

/// The agent's walk, in miniature: readdir order, never descending symlinks.
pub fn walk(root: &Path) -> Vec<CatalogEntry> {
    let mut entries = vec![CatalogEntry {
        rel_path: vec![],
        stat: stat_rec(root),
        ..Default::default()
    }];
    let mut i = 0;
    while i < entries.len() {
        if entries[i].stat.is_dir() {
            let rel = entries[i].rel_path.clone();
            let dir = if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(std::ffi::OsStr::from_bytes(&rel))
            };
            for e in fs::read_dir(&dir).unwrap() {
                let e = e.unwrap();
                let mut r = rel.clone();
                if !r.is_empty() {
                    r.push(b'/');
                }
                r.extend_from_slice(e.file_name().as_bytes());
                let st = stat_rec(&e.path());
                let link_target = if st.is_symlink() {
                    fs::read_link(e.path())
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                } else {
                    vec![]
                };
                let idx = entries.len();
                entries.push(CatalogEntry {
                    rel_path: r,
                    stat: st,
                    link_target,
                    ..Default::default()
                });
                entries[i].children.push(idx);
            }
        }
        i += 1;
    }
    entries
}
