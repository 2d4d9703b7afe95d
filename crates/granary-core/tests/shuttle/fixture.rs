//! A real source for the placement tests: files on disk, a table over them and one tier, as
//! the agent sets them up. The files and the pack are made once per test; the table, the tier
//! directory and every `granary_core::sync` primitive are made inside each Shuttle execution
//! (a Shuttle primitive lives for one execution only).

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use granary_core::placement::residency::{Budget, Residency};
use granary_core::placement::SourceCtx;
use granary_core::stats::AgentCounters;
use granary_core::sync::Arc;
use granary_core::sys;
use granary_core::tiers::{TierSpec, Tiers};
use granary_shm::{object_name, Catalog, CatalogEntry, Mapping, State, TableSpec};

/// `shuttle::check_random` with stacks large enough for the placement code (a copy's path
/// buffers, tracing, `statx` records; Shuttle's default is 32 KiB).
pub fn check_random(f: impl Fn() + Send + Sync + 'static, iterations: usize) {
    let mut config = shuttle::Config::new();
    config.stack_size = 1 << 20;
    shuttle::Runner::new(shuttle::scheduler::RandomScheduler::new(iterations), config).run(f);
}

/// Yields until `done()`, or fails saying `what` never happened (Shuttle does not model time:
/// a bound in steps, generous for these tests).
pub fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200_000 {
        if done() {
            return;
        }
        shuttle::thread::yield_now();
    }
    panic!("never happened: {what}");
}

/// Tier space is counted in blocks of this size.
pub const TIER_BLOCK: u64 = 4096;

/// File `name`'s bytes: distinct per file and per position, compressible in part (a pack then
/// frames them).
pub fn content(name: &str, len: usize) -> Vec<u8> {
    let seed = name
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    (0..len as u64)
        .map(|i| {
            if (i / 512) % 2 == 0 {
                b'a' + (i % 7) as u8
            } else {
                (seed.wrapping_mul(i + 1) >> 13) as u8
            }
        })
        .collect()
}

/// Regular files in one directory (`src/`), and room for a pack beside it.
pub struct Source {
    pub dir: tempfile::TempDir,
    pub files: Vec<(String, Vec<u8>)>,
}

impl Source {
    pub fn new(files: &[(&str, usize)]) -> Source {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let files = files
            .iter()
            .map(|&(name, len)| {
                let bytes = content(name, len);
                std::fs::write(dir.path().join("src").join(name), &bytes).unwrap();
                (name.to_string(), bytes)
            })
            .collect();
        Source { dir, files }
    }

    pub fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }

    /// The catalog a walk would make: the root and its files, with their `statx` records.
    pub fn catalog(&self) -> Catalog {
        let mut entries = vec![CatalogEntry {
            stat: sys::statx_nofollow(&self.src()).unwrap(),
            ..Default::default()
        }];
        for (k, (name, _)) in self.files.iter().enumerate() {
            entries.push(CatalogEntry {
                rel_path: name.as_bytes().to_vec(),
                stat: sys::statx_nofollow(&self.src().join(name)).unwrap(),
                ..Default::default()
            });
            entries[0].children.push(k + 1);
        }
        Catalog::from_entries(&entries).unwrap()
    }
}

/// One execution's placement context: a fresh tier of `capacity` bytes and a table over
/// `cat` that names it. Dropping it removes the tier and the table.
pub struct Placing {
    pub ctx: Arc<SourceCtx>,
    pub objects: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Placing {
    pub fn new(src: &Path, cat: &Catalog, mut spec: TableSpec, capacity: u64) -> Placing {
        let scratch = tempfile::tempdir().unwrap();
        let objects = scratch.path().join("tier/objects");
        std::fs::create_dir_all(&objects).unwrap();
        let m = std::fs::metadata(&objects).unwrap();
        spec.source = src.as_os_str().as_bytes().to_vec();
        spec.source_real = spec.source.clone();
        spec.tier_dirs = vec![objects.as_os_str().as_bytes().to_vec()];
        spec.tier_dir_ids = vec![(m.dev(), m.ino())];
        spec.creds = sys::creds();
        spec.ring_cap = 64;
        spec.job_slots = 2;
        let img = granary_shm::build_catalog(&spec, cat).unwrap();
        let path = scratch.path().join("table");
        std::fs::write(&path, &img).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let tiers = Tiers::new(vec![TierSpec {
            path: scratch.path().join("tier"),
            capacity,
            block_size: TIER_BLOCK,
            ..Default::default()
        }]);
        let ctx = Arc::new(SourceCtx::new(
            Mapping::map(f.as_raw_fd(), img.len()).unwrap(),
            src.to_path_buf(),
            Arc::new(tiers),
            vec![Some(sys::open_dir(&objects).unwrap())],
            Arc::new(AgentCounters::default()),
            Arc::new(Residency::new(Budget::Off)),
        ));
        Placing {
            ctx,
            objects,
            _scratch: scratch,
        }
    }

    pub fn idx(&self, name: &str) -> u32 {
        self.ctx.table.lookup(name.as_bytes()).unwrap()
    }

    pub fn state(&self, name: &str) -> State {
        self.ctx.table.state(self.idx(name)).state()
    }

    /// The copy of `name` in the tier, if there is one.
    pub fn copy(&self, name: &str) -> Option<Vec<u8>> {
        let e = self.ctx.table.entry(self.idx(name)).unwrap();
        let file = self
            .objects
            .join(std::ffi::OsStr::from_bytes(&object_name(e.object)));
        std::fs::read(file).ok()
    }

    /// The names in the tier's object directory.
    pub fn tier_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.objects)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Every file is PLACED with exactly its bytes, or (`void`) STALE with no copy; the tier is
    /// charged for exactly the placed copies, nothing is reserved, nothing else is in the tier,
    /// and no placement work is left.
    pub fn check_placed(&self, files: &[(String, Vec<u8>)], void: &[&str]) {
        let mut charged = 0;
        for (name, bytes) in files {
            if void.contains(&name.as_str()) {
                assert_eq!(self.state(name), State::Stale, "{name}");
                assert!(
                    self.copy(name).is_none(),
                    "{name}: a void file's copy is left"
                );
                continue;
            }
            assert_eq!(self.state(name), State::Placed, "{name} not placed");
            assert!(
                self.copy(name).as_ref() == Some(bytes),
                "{name}: wrong bytes"
            );
            charged += self.ctx.space.tiers.charge(0, bytes.len() as u64);
        }
        let u = &self.ctx.space.tiers.usage()[0];
        assert_eq!((u.used, u.reserved), (charged, 0), "tier accounting");
        assert_eq!(
            self.tier_files().len(),
            files.len() - void.len(),
            "leftovers in the tier: {:?}",
            self.tier_files()
        );
        assert_eq!(
            self.ctx.work.held(),
            0,
            "placement work left (or counted twice)"
        );
    }
}
