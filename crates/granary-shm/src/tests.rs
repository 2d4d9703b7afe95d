//! Table round trips against a plain in-memory model of the tree.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsRawFd;

use proptest::prelude::*;

use crate::layout::{home_slot, H_VERSION, SLOT_LEN};
use crate::*;

/// Held by tests that change or depend on this process's shard (`set_counter_shard`), a
/// process-wide setting the test threads share.
static SHARD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn shard_lock() -> std::sync::MutexGuard<'static, ()> {
    SHARD.lock().unwrap_or_else(|e| e.into_inner())
}

fn map_image(img: &[u8]) -> (Mapping, Table, tempfile::NamedTempFile) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, img).unwrap();
    let (m, t) = Mapping::map(f.as_file().as_raw_fd(), img.len()).unwrap();
    (m, t, f)
}

/// A mapped table of `files` regular files `f0..` in the root (for per-entry bitmaps).
fn flat_table(files: u64) -> (Mapping, Table, tempfile::NamedTempFile) {
    let mut m = Model::new();
    for i in 0..files {
        m.add(
            0,
            &format!("f{i}"),
            stat(libc::S_IFREG | 0o644, 2 + i, 10),
            "",
        );
    }
    map_image(&build(&Model::spec(), &m.entries).unwrap())
}

fn stat(mode: u32, ino: u64, size: u64) -> StatRec {
    StatRec {
        mode,
        ino,
        size,
        nlink: 1,
        mask: 0x7ff,
        ..Default::default()
    }
}

/// A model tree: relative path → (is_dir, children names in listing order, symlink target).
struct Model {
    entries: Vec<CatalogEntry>,
}

impl Model {
    fn new() -> Model {
        let root = CatalogEntry {
            stat: stat(libc::S_IFDIR | 0o755, 1, 4096),
            ..Default::default()
        };
        Model {
            entries: vec![root],
        }
    }
    fn add(&mut self, parent: usize, name: &str, st: StatRec, link: &str) -> usize {
        let p = &self.entries[parent].rel_path;
        let mut rel = p.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.as_bytes());
        let idx = self.entries.len();
        self.entries.push(CatalogEntry {
            rel_path: rel,
            stat: st,
            link_target: link.as_bytes().to_vec(),
            ..Default::default()
        });
        self.entries[parent].children.push(idx);
        idx
    }
    fn spec() -> TableSpec {
        TableSpec {
            source: b"/pfs/data".to_vec(),
            source_real: b"/lustre/data".to_vec(),
            tier_dirs: vec![b"/dev/shm/g/objects".to_vec(), b"/tmp/g/objects".to_vec()],
            tier_dir_ids: vec![(7, 70), (8, 80)],
            creds: (1000, 100, 0xfeed),
            ring_cap: 8,
            job_slots: 4,
            ..Default::default()
        }
    }
}

#[test]
fn a_view_that_forgot_the_spelling_resolves_through_the_real_root_only() {
    let mut m = Model::new();
    let d = m.add(0, "d", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    m.add(d, "f", stat(libc::S_IFREG | 0o644, 3, 10), "");
    m.add(
        0,
        "abs",
        stat(libc::S_IFLNK | 0o777, 4, 13),
        "/pfs/data/d/f",
    );
    m.add(
        0,
        "absreal",
        stat(libc::S_IFLNK | 0o777, 5, 16),
        "/lustre/data/d/f",
    );
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, mut t, _f) = map_image(&img);
    let target = t.lookup(b"d/f").unwrap();
    assert_eq!(t.source_root(), b"/pfs/data");
    assert!(matches!(resolve(&t, b"abs", true), Resolved::Entry(i, _) if i == target));
    // The spelling (a symlink) leads elsewhere now: a link's absolute target through it names
    // whatever the symlink leads to, which the catalog does not describe.
    t.forget_spelling();
    assert_eq!(t.source_root(), b"/lustre/data");
    assert_eq!(resolve(&t, b"abs", true), Resolved::PassThrough);
    assert!(matches!(resolve(&t, b"absreal", true), Resolved::Entry(i, _) if i == target));
}

#[test]
fn header_round_trip() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    m.add(d, "a.jpg", stat(libc::S_IFREG | 0o644, 3, 110_000), "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert!(t.is_valid());
    assert_eq!(t.source_root(), b"/pfs/data");
    assert_eq!(t.source_real_root(), b"/lustre/data");
    assert_eq!(t.tier_count(), 2);
    assert_eq!(t.tier_dir(1).unwrap(), b"/tmp/g/objects");
    assert!(t.tier_dir(2).is_none());
    let idx = t.lookup(b"train/a.jpg").unwrap();
    let e = t.entry(idx).unwrap();
    assert_eq!(e.stat.size, 110_000);
    assert_eq!(t.name(&e).unwrap(), b"a.jpg");
    assert_eq!(e.object, object_id(b"train/a.jpg"));
    assert_eq!(t.lookup(b""), Some(0));
    assert_eq!(t.lookup(b"train/b.jpg"), None);
    t.set_valid(false);
    assert!(!t.is_valid());
}

#[test]
fn what_the_walk_and_the_probe_learnt_of_attributes_round_trips() {
    use crate::xattr::{Absent, NONE_LISTED};
    let mut m = Model::new();
    let bare = StatRec {
        xattrs: NONE_LISTED,
        dev_major: 8,
        dev_minor: 1,
        ..stat(libc::S_IFREG | 0o644, 2, 10)
    };
    m.add(0, "bare", bare, "");
    // The same class of file but with attributes: a class of its own.
    m.add(0, "tagged", StatRec { xattrs: 0, ..bare }, "");
    m.add(
        0,
        "elsewhere",
        StatRec {
            dev_minor: 2,
            ..bare
        },
        "",
    );
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let e = |n: &[u8]| t.entry(t.lookup(n).unwrap()).unwrap().stat;
    assert_eq!(e(b"bare").xattrs, NONE_LISTED);
    assert_eq!(e(b"tagged").xattrs, 0);
    assert_eq!(t.xattr_absent(), None, "nothing probed: nothing answered");
    let mut a = Absent {
        dev_major: 8,
        dev_minor: 1,
        privileged: true,
        ..Absent::default()
    };
    a.errno[0] = [
        libc::ENODATA as u8,
        libc::ENODATA as u8,
        0,
        libc::EOPNOTSUPP as u8,
    ];
    t.set_xattr_absent(Some(&a));
    let got = t.xattr_absent().unwrap();
    assert_eq!(got, a);
    let acl = b"system.posix_acl_access";
    assert_eq!(got.errno_for(&e(b"bare"), acl), Some(libc::ENODATA));
    assert_eq!(
        got.errno_for(&e(b"bare"), b"security.capability"),
        Some(libc::EOPNOTSUPP)
    );
    // A name the probe had no failure for, one it never asks, a file with attributes, a file
    // on another device, a type it did not probe: not answered.
    assert_eq!(got.errno_for(&e(b"bare"), b"security.selinux"), None);
    assert_eq!(got.errno_for(&e(b"bare"), b"user.x"), None);
    assert_eq!(got.errno_for(&e(b"tagged"), acl), None);
    assert_eq!(got.errno_for(&e(b"elsewhere"), acl), None);
    let dir = StatRec {
        mode: libc::S_IFDIR | 0o755,
        ..bare
    };
    assert_eq!(got.errno_for(&dir, acl), None);
    t.set_xattr_absent(None);
    assert_eq!(t.xattr_absent(), None);
}

#[test]
fn pack_section_round_trips() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    m.add(d, "a.jpg", stat(libc::S_IFREG | 0o644, 3, 110_000), "");
    m.add(d, "b.jpg", stat(libc::S_IFREG | 0o644, 4, 7), "");
    let plain = build(&Model::spec(), &m.entries).unwrap();
    let (_pm, pt, _pf) = map_image(&plain);
    assert!(!pt.is_packed() && !pt.pack_mount());
    assert_eq!(pt.locator(0), None);
    let mut cat = Catalog::from_entries(&m.entries).unwrap();
    let a = (0..cat.len()).find(|&i| cat.name(i) == b"a.jpg").unwrap();
    let b = (0..cat.len()).find(|&i| cat.name(i) == b"b.jpg").unwrap();
    cat.locators = vec![Locator::default(); cat.len()];
    cat.locators[a] = Locator {
        offset: 128,
        stored_len: 110_000,
        checksum: 0xabcdef,
        partition: 3,
        codec: 0,
        flags: layout::pack::LOC_PACKED,
    };
    // Known to the pack but changed since: no locator is served.
    cat.locators[b] = Locator {
        offset: 9,
        flags: 0,
        ..Default::default()
    };
    let mut spec = Model::spec();
    spec.pack = Some(PackSpec {
        dir: b"/pfs/data.granary".to_vec(),
        empty_dir: b"/dev/shm/g/empty".to_vec(),
        block_size: 1 << 20,
        partitions: 4,
        id: [7; 16],
        mount: true,
    });
    let img = build_catalog(&spec, &cat).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert!(t.is_packed() && t.pack_mount());
    assert_eq!(t.pack_dir(), Some(&b"/pfs/data.granary"[..]));
    assert_eq!(t.pack_empty_dir(), Some(&b"/dev/shm/g/empty"[..]));
    assert_eq!((t.pack_block_size(), t.pack_partitions()), (1 << 20, 4));
    assert_eq!(t.pack_id(), Some(&[7u8; 16][..]));
    assert_eq!(t.locator(a as u32), Some(cat.locators[a]));
    assert_eq!(t.locator(b as u32), None);
    assert_eq!(t.locator(0), None);
    assert_eq!(t.locator(t.entry_count()), None);
    assert_eq!(t.pack_streamed(), 0);
    t.add_pack_streamed(5);
    assert_eq!(t.pack_streamed(), 5);
    // A damaged section is refused as a whole.
    let mut bad = img.clone();
    let off = u64::from_ne_bytes(
        bad[layout::H_PACK_OFF..layout::H_PACK_OFF + 8]
            .try_into()
            .unwrap(),
    );
    bad[off as usize] ^= 1;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &bad).unwrap();
    assert!(Mapping::map(f.as_file().as_raw_fd(), bad.len()).is_err());
}

#[test]
fn an_adopted_pack_table_gets_this_nodes_empty_dir_and_serves_the_same_pack() {
    let mut m = Model::new();
    m.add(0, "a", stat(libc::S_IFREG | 0o644, 3, 10), "");
    let mut cat = Catalog::from_entries(&m.entries).unwrap();
    let a = (0..cat.len()).find(|&i| cat.name(i) == b"a").unwrap();
    cat.locators = vec![Locator::default(); cat.len()];
    cat.locators[a] = Locator {
        offset: 4096,
        stored_len: 10,
        checksum: 5,
        partition: 1,
        codec: 0,
        flags: layout::pack::LOC_PACKED | layout::pack::LOC_REPLICATE,
    };
    let ps = PackSpec {
        dir: b"/pfs/data.granary".to_vec(),
        empty_dir: b"/dev/shm/rank0-with-a-longer-name/empty".to_vec(),
        block_size: 1 << 20,
        partitions: 2,
        id: [7; 16],
        mount: true,
    };
    let mut spec = Model::spec();
    spec.pack = Some(ps.clone());
    let img = build_catalog(&spec, &cat).unwrap();
    {
        let (_m, t, _f) = map_image(&img);
        t.add_pack_streamed(77);
    }
    let mut mine = spec.clone();
    mine.pack = Some(PackSpec {
        empty_dir: b"/dev/shm/r1/empty".to_vec(),
        ..ps.clone()
    });
    assert_eq!(
        crate::image_source_real(&img).as_deref(),
        Some(&spec.source_real[..])
    );
    assert_eq!(crate::image_source_real(&img[..100]), None);
    let mut adopted = img.clone();
    rebase(&mut adopted, &mine).unwrap();
    let (_m, t, _f) = map_image(&adopted);
    assert_eq!(t.pack_empty_dir(), Some(&b"/dev/shm/r1/empty"[..]));
    assert_eq!(t.pack_dir(), Some(&b"/pfs/data.granary"[..]));
    assert_eq!(t.pack_streamed(), 0, "this node has streamed nothing yet");
    assert_eq!(t.locator(a as u32), Some(cat.locators[a]));
    // Another pack, another mode, or none at all: refused.
    let refused = |edit: &dyn Fn(&mut TableSpec)| {
        let mut s = mine.clone();
        edit(&mut s);
        matches!(rebase(&mut img.clone(), &s), Err(BuildError::Foreign(_)))
    };
    assert!(refused(&|s| s.pack.as_mut().unwrap().id = [8; 16]));
    assert!(refused(
        &|s| s.pack.as_mut().unwrap().dir = b"/pfs/other".to_vec()
    ));
    assert!(refused(&|s| s.pack.as_mut().unwrap().mount = false));
    assert!(refused(&|s| s.pack.as_mut().unwrap().partitions = 3));
    assert!(refused(&|s| s.pack = None));
    let plain = build(&Model::spec(), &m.entries).unwrap();
    assert!(matches!(
        rebase(&mut plain.clone(), &mine),
        Err(BuildError::Foreign(_))
    ));
}

#[test]
fn report_opens_flag_is_independent_of_valid() {
    let mut m = Model::new();
    m.add(0, "a", stat(libc::S_IFREG | 0o644, 3, 10), "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    // A new table asks for nothing: clients stay silent about placed files.
    assert!(!t.reports_opens());
    t.set_reports_opens(true);
    assert!(t.reports_opens());
    assert!(t.is_valid(), "setting the flag must not touch FLAG_VALID");
    t.set_valid(false);
    assert!(
        t.reports_opens(),
        "clearing VALID must not clear REPORT_OPENS"
    );
    t.set_valid(true);
    t.set_reports_opens(false);
    assert!(!t.reports_opens());
    assert!(t.is_valid());
    let e = t.lookup(b"a").unwrap();
    assert!(t.push_request(request::OPENED, e));
    let r = t.pop_request().unwrap();
    assert_eq!((r.kind, r.entry), (request::OPENED, e));
}

#[test]
fn names_are_found_exactly() {
    const ENTRY_NAME_MAX: usize = 40;
    let mut m = Model::new();
    let d = m.add(0, "d", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    let fit = "f".repeat(ENTRY_NAME_MAX);
    let long = "g".repeat(ENTRY_NAME_MAX + 1);
    let a = m.add(d, &fit, stat(libc::S_IFREG | 0o644, 3, 10), "");
    let b = m.add(d, &long, stat(libc::S_IFREG | 0o644, 4, 11), "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    for (rel, size) in [(&m.entries[a].rel_path, 10), (&m.entries[b].rel_path, 11)] {
        let idx = t.lookup(rel).expect("catalogued");
        assert_eq!(t.entry(idx).unwrap().stat.size, size);
        assert_eq!(&t.rel_path_vec(idx).unwrap(), rel);
        assert_eq!(t.lookup_object(object_id(rel)), Some(idx));
    }
    // One byte short, one byte more, another directory: not these entries.
    for miss in [
        format!("d/{}", "f".repeat(ENTRY_NAME_MAX - 1)),
        format!("d/{}", "f".repeat(ENTRY_NAME_MAX + 1)),
        format!("e/{fit}"),
        fit.clone(),
    ] {
        assert_eq!(t.lookup(miss.as_bytes()), None, "{miss}");
    }
}

#[test]
fn damaged_images_are_rejected() {
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let mut bad = img.clone();
    bad[0] ^= 1;
    let f = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut &f, &bad).unwrap();
    assert!(matches!(
        Mapping::map(f.as_raw_fd(), bad.len()),
        Err(MapError::Table(TableError::BadMagic))
    ));
    // A truncated file: the header's total length no longer matches.
    let short = &img[..img.len() - 4096];
    let (r, _f) = {
        let f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &f, short).unwrap();
        (Mapping::map(f.as_raw_fd(), short.len()).map(|_| ()), f)
    };
    assert!(matches!(r, Err(MapError::Table(TableError::BadLayout(_)))));
}

#[test]
fn symlinks_resolve_inside_the_catalog_only() {
    let mut m = Model::new();
    let d = m.add(0, "d", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    let f = m.add(d, "f", stat(libc::S_IFREG | 0o644, 3, 10), "");
    m.add(0, "rel", stat(libc::S_IFLNK | 0o777, 4, 3), "d/f");
    m.add(d, "up", stat(libc::S_IFLNK | 0o777, 5, 4), "../d/f");
    m.add(
        0,
        "abs",
        stat(libc::S_IFLNK | 0o777, 6, 13),
        "/pfs/data/d/f",
    );
    m.add(
        0,
        "absreal",
        stat(libc::S_IFLNK | 0o777, 7, 16),
        "/lustre/data/d/f",
    );
    m.add(0, "out", stat(libc::S_IFLNK | 0o777, 8, 4), "/etc/passwd");
    m.add(0, "above", stat(libc::S_IFLNK | 0o777, 9, 5), "../x");
    m.add(0, "mid", stat(libc::S_IFLNK | 0o777, 10, 8), "d/../d/f");
    m.add(0, "chain", stat(libc::S_IFLNK | 0o777, 11, 3), "rel");
    m.add(0, "loop", stat(libc::S_IFLNK | 0o777, 12, 4), "loop");
    let _ = f;
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let target = t.lookup(b"d/f").unwrap();
    for p in ["rel", "d/up", "abs", "absreal", "chain"] {
        assert_eq!(
            resolve(&t, p.as_bytes(), true),
            Resolved::Entry(target, t.entry(target).unwrap()),
            "{p}"
        );
    }
    for p in ["out", "above", "mid", "loop", "missing"] {
        assert_eq!(
            resolve(&t, p.as_bytes(), true),
            Resolved::PassThrough,
            "{p}"
        );
    }
    let link = t.lookup(b"rel").unwrap();
    assert_eq!(
        resolve(&t, b"rel", false),
        Resolved::Entry(link, t.entry(link).unwrap())
    );
    assert_eq!(t.link_target(&t.entry(link).unwrap()).unwrap(), b"d/f");
    // The links followed on the way, in order (whoever answers from the target must check
    // them too): none for the file itself, the whole chain for a chain.
    let links = |p: &str| {
        let mut seen = vec![];
        let found = t.find_hashed_with(
            p.as_bytes(),
            path_hash(p.as_bytes()),
            true,
            false,
            |i, _| {
                seen.push(i);
                true
            },
        );
        (seen, found.is_ok())
    };
    assert_eq!(links("d/f"), (Vec::<u32>::new(), true));
    assert_eq!(links("rel"), (vec![link], true));
    assert_eq!(
        links("chain"),
        (vec![t.lookup(b"chain").unwrap(), link], true)
    );
    assert_eq!(links("loop").0.len(), 40);
    assert!(!links("loop").1);
    // A refusal stops the walk at once.
    let mut asked = 0;
    let found = t.find_hashed_with(b"chain", path_hash(b"chain"), true, false, |_, _| {
        asked += 1;
        false
    });
    assert_eq!(found.err(), Some(Miss::Unprovable));
    assert_eq!(asked, 1);
    // Not following, no link is asked about.
    let found = t.find_hashed_with(b"chain", path_hash(b"chain"), false, false, |_, _| false);
    assert!(found.unwrap().entry.stat.is_symlink());
}

#[test]
fn ring_is_fifo_and_bounded() {
    let _one = shard_lock();
    let m = Model::new();
    let mut spec = Model::spec();
    // Eight slots per shard: one process's pushes all go to one.
    spec.ring_cap = 8 * crate::layout::RING_SHARDS as u32;
    let img = build(&spec, &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    for round in 0..3u32 {
        assert_eq!(t.ring_backlog(), 0);
        for i in 0..8 {
            assert!(t.push_request(request::OPEN_UNPLACED, round * 8 + i));
            assert_eq!(t.ring_backlog(), u64::from(i) + 1);
        }
        assert!(
            !t.push_request(request::OPEN_UNPLACED, 99),
            "a shard of 8 accepted a 9th"
        );
        assert_eq!(t.ring_backlog(), 8, "a refused push is not counted");
        for i in 0..8 {
            assert_eq!(
                t.pop_request(),
                Some(Request {
                    kind: request::OPEN_UNPLACED,
                    entry: round * 8 + i,
                    arg: 0
                })
            );
            assert_eq!(t.ring_backlog(), 7 - u64::from(i));
        }
        assert_eq!(t.pop_request(), None);
    }
    let mut seen = [u64::MAX; crate::layout::RING_SHARDS];
    assert!(
        !t.skip_stuck_request(&mut seen),
        "nothing claimed, nothing to skip"
    );
    assert!(
        !t.skip_stuck_request(&mut seen),
        "nothing claimed, nothing to skip"
    );
}

#[test]
fn counters_fall_back_to_slot_zero() {
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    t.count(2, job::OPENS, 5);
    t.count(77, job::OPENS, 1);
    t.count(2, job::PROCESSES, 3);
    assert_eq!(t.job_value(2, job::OPENS), 5);
    assert_eq!(t.job_value(0, job::OPENS), 1);
    assert_eq!(t.job_value(2, job::PROCESSES), 3);
    assert!(t.counter(0, job::WORDS).is_none());
}

#[test]
fn counters_of_processes_in_other_shards_add_up_and_clear_together() {
    let _one = shard_lock();
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    // Processes with pids in every shard (and beyond), each counting in its own.
    for pid in 100..100 + 2 * crate::layout::COUNTER_SHARDS as u32 {
        crate::set_counter_shard(pid);
        t.count(3, job::OPENS, 1);
        t.count(3, job::TIER_BYTES + 1, 1000);
    }
    // A call counted in one process and taken back in another.
    crate::set_counter_shard(1);
    t.count(3, job::FALLBACKS, 1);
    crate::set_counter_shard(2);
    t.uncount(3, job::FALLBACKS, 1);
    crate::set_counter_shard(0);
    let n = 2 * crate::layout::COUNTER_SHARDS as u64;
    assert_eq!(t.job_value(3, job::OPENS), n);
    assert_eq!(t.job_value(3, job::TIER_BYTES + 1), 1000 * n);
    assert_eq!(t.job_value(3, job::FALLBACKS), 0);
    // The shards are the slot's own: its neighbours saw nothing.
    assert_eq!(t.job_value(2, job::OPENS) + t.job_value(4, job::OPENS), 0);
    t.counter(3, job::OWNER)
        .unwrap()
        .store(9, std::sync::atomic::Ordering::Relaxed);
    t.clear_job(3);
    assert_eq!(t.job_value(3, job::OPENS), 0);
    assert_eq!(t.job_value(3, job::TIER_BYTES + 1), 0);
    assert_eq!(t.job_value(3, job::OWNER), 9);
}

#[test]
fn the_first_unserved_program_is_named_and_every_one_counted() {
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert_eq!(t.unserved(2), None);
    t.record_unserved(
        2,
        crate::seen::EXEC_STATIC,
        b"/opt/tools/cat",
        b"/pfs/data/a.jpg",
    );
    let long = [b'x'; 300];
    t.record_unserved(2, crate::seen::EXEC_SECURE, &long, &long);
    let u = t.unserved(2).unwrap();
    assert_eq!(
        (u.count, u.why, &u.program[..], &u.arg[..]),
        (
            2,
            crate::seen::EXEC_STATIC,
            &b"/opt/tools/cat"[..],
            &b"/pfs/data/a.jpg"[..]
        )
    );
    let seen = t
        .counter(2, job::SEEN)
        .unwrap()
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(seen, crate::seen::EXEC_STATIC | crate::seen::EXEC_SECURE);
    // Longer than the table keeps: the tail, marked.
    t.record_unserved(3, crate::seen::EXEC_SECURE, &long, b"-");
    let u = t.unserved(3).unwrap();
    let kept = job::NAME_WORDS * 8;
    assert_eq!(u.program, ["…".as_bytes(), &long[..kept]].concat());
    assert_eq!(u.arg, b"-");
}

#[test]
fn ring_survives_concurrent_producers() {
    let m = Model::new();
    let mut spec = Model::spec();
    spec.ring_cap = 1024;
    let img = build(&spec, &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let per = 200u32;
    let mut got = Vec::new();
    std::thread::scope(|s| {
        for p in 0..4u32 {
            s.spawn(move || {
                for i in 0..per {
                    while !t.push_request(request::OPEN_UNPLACED, p * per + i) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        while got.len() < (4 * per) as usize {
            match t.pop_request() {
                Some(r) => got.push(r.entry),
                None => std::thread::yield_now(),
            }
        }
    });
    got.sort();
    assert_eq!(got, (0..4 * per).collect::<Vec<_>>());
}

fn arb_tree() -> impl Strategy<Value = Vec<(usize, String, bool)>> {
    // (parent choice, name, is_dir) — parent is resolved modulo the directories so far.
    prop::collection::vec((any::<usize>(), "[a-z0-9._-]{1,48}", any::<bool>()), 1..200)
}

proptest! {
    #[test]
    fn every_path_is_found_with_its_listing(ops in arb_tree()) {
        let mut m = Model::new();
        let mut dirs = vec![0usize];
        let mut model: BTreeMap<Vec<u8>, (bool, u64)> = BTreeMap::new();
        for (i, (p, name, is_dir)) in ops.into_iter().enumerate() {
            let parent = dirs[p % dirs.len()];
            let exists = m.entries[parent].children.iter().any(|&c| m.entries[c].rel_path.ends_with(format!("/{name}").as_bytes()) || m.entries[c].rel_path == name.as_bytes());
            if exists || name == "." || name == ".." { continue; }
            let mode = if is_dir { libc::S_IFDIR | 0o755 } else { libc::S_IFREG | 0o644 };
            let idx = m.add(parent, &name, stat(mode, 100 + i as u64, i as u64), "");
            if is_dir { dirs.push(idx); }
            model.insert(m.entries[idx].rel_path.clone(), (is_dir, i as u64));
        }
        let img = build(&Model::spec(), &m.entries).unwrap();
        let (_m, t, _f) = map_image(&img);
        prop_assert_eq!(t.entry_count() as usize, model.len() + 1);
        for (path, (is_dir, size)) in &model {
            let idx = t.lookup(path).expect("catalogued path not found");
            let e = t.entry(idx).unwrap();
            prop_assert_eq!(e.stat.is_dir(), *is_dir);
            prop_assert_eq!(e.stat.size, *size);
            prop_assert_eq!(t.rel_path_vec(idx).unwrap(), path.clone());
            // Parent's listing contains this entry.
            let parent = t.entry(e.parent).unwrap();
            prop_assert!((parent.first_child..parent.first_child + parent.child_count).contains(&idx));
        }
        // Listings in the table match the model's listing order, breadth first.
        let mut queue = VecDeque::from([0usize]);
        while let Some(old) = queue.pop_front() {
            let rel = &m.entries[old].rel_path;
            let e = t.entry(t.lookup(rel).unwrap()).unwrap();
            let names: Vec<&[u8]> = (e.first_child..e.first_child + e.child_count)
                .map(|c| t.name(&t.entry(c).unwrap()).unwrap()).collect();
            let want: Vec<&[u8]> = m.entries[old].children.iter().map(|&c| {
                let p = &m.entries[c].rel_path;
                &p[p.iter().rposition(|&b| b == b'/').map_or(0, |x| x + 1)..]
            }).collect();
            prop_assert_eq!(names, want);
            queue.extend(m.entries[old].children.iter().copied());
        }
    }
}

#[test]
fn progress_only_moves_forward() {
    let mut m = Model::new();
    m.add(0, "big", stat(libc::S_IFREG | 0o644, 2, 100 << 20), "");
    m.add(0, "small", stat(libc::S_IFREG | 0o644, 3, 100 << 10), "");
    let mut spec = Model::spec();
    spec.prefetch_min_size = 1 << 20;
    let img = build(&spec, &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let small = t.lookup(b"small").unwrap();
    assert!(
        !t.has_large_record(small),
        "only files fetched whole carry progress"
    );
    t.set_progress(small, 5);
    assert_eq!(t.progress(small), 0);
    let idx = t.lookup(b"big").unwrap();
    assert!(t.has_large_record(idx));
    assert_eq!(t.progress(idx), 0);
    t.set_progress(idx, 8 << 20);
    t.set_progress(idx, 4 << 20); // a late, smaller publication must not move it back
    assert_eq!(t.progress(idx), 8 << 20);
    t.reset_progress(idx);
    assert_eq!(t.progress(idx), 0);
    assert_eq!(
        t.progress(9999),
        0,
        "out-of-range entries read as nothing copied"
    );
}

#[test]
fn a_gone_entry_never_comes_back_as_merely_stale() {
    let mut m = Model::new();
    m.add(0, "f", stat(libc::S_IFREG | 0o644, 2, 10), "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let idx = t.lookup(b"f").unwrap();
    t.set_state(idx, StateWord::new(State::Placed, 1));
    let cell = |idx| lifecycle::EntryCell { table: &t, idx };
    assert!(lifecycle::void(&cell(idx), lifecycle::Void::Stale));
    assert!(
        !lifecycle::void(&cell(idx), lifecycle::Void::Stale),
        "already stale: nothing changed"
    );
    assert!(lifecycle::void(&cell(idx), lifecycle::Void::Gone));
    assert!(!lifecycle::void(&cell(idx), lifecycle::Void::Stale));
    assert_eq!(t.state(idx).parts(), (State::Gone, 0));
}

#[test]
fn chunk_bitmaps_exist_for_large_files_only() {
    let mut m = Model::new();
    let chunk = 4u64 << 20;
    m.add(0, "small", stat(libc::S_IFREG | 0o644, 2, chunk), "");
    m.add(
        0,
        "huge",
        stat(libc::S_IFREG | 0o644, 3, 130 * chunk + 1),
        "",
    );
    let pre = m.add(0, "reused", stat(libc::S_IFREG | 0o644, 4, 3 * chunk), "");
    m.entries[pre].chunks = vec![0b101];
    m.add(0, "dir", stat(libc::S_IFDIR | 0o755, 5, 200 * chunk), "");
    let mut spec = Model::spec();
    spec.chunk_size = chunk;
    spec.prefetch_min_size = 1 << 20;
    let img = build(&spec, &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert_eq!(t.chunk_size(), chunk);
    assert_eq!(t.prefetch_min_size(), 1 << 20);
    let small = t.lookup(b"small").unwrap();
    let huge = t.lookup(b"huge").unwrap();
    let reused = t.lookup(b"reused").unwrap();
    assert_eq!(
        t.chunk_count(small),
        0,
        "a file of one chunk needs no bitmap"
    );
    assert_eq!(t.chunk_count(t.lookup(b"dir").unwrap()), 0);
    assert_eq!(t.chunk_count(huge), 131);
    for k in [0, 63, 64, 130] {
        assert!(!t.chunk_present(huge, k));
        t.set_chunk(huge, k, true);
        assert!(t.chunk_present(huge, k));
    }
    assert!(!t.chunk_present(huge, 65));
    assert!(!t.chunk_present(huge, 131), "past the last chunk");
    t.set_chunk(huge, 131, true); // ignored, must not touch a neighbour's bitmap
    t.set_chunk(huge, 63, false);
    assert!(!t.chunk_present(huge, 63) && t.chunk_present(huge, 64));
    assert_eq!(
        (0..3)
            .map(|k| t.chunk_present(reused, k))
            .collect::<Vec<_>>(),
        [true, false, true],
        "initial bitmap from the catalog entry"
    );
}

#[test]
fn transient_bits_are_per_entry() {
    // 130 files: the bitmap spans three words, and the last entry sits in the last one.
    let (_m, t, _f) = flat_table(130);
    let n = t.entry_count();
    assert_eq!(n, 131);
    assert!((0..n).all(|i| !t.is_transient(i)), "resident by default");
    let mut model = vec![false; n as usize];
    for (i, on) in [
        (1, true),
        (63, true),
        (64, true),
        (130, true),
        (63, false),
        (5, false),
    ] {
        assert_eq!(
            t.set_transient(i, on),
            model[i as usize],
            "returns the old bit"
        );
        model[i as usize] = on;
        assert_eq!((0..n).map(|k| t.is_transient(k)).collect::<Vec<_>>(), model);
    }
    assert!(!t.set_transient(n, true), "past the last entry: ignored");
    assert!(!t.is_transient(n));
    assert_eq!((0..n).map(|k| t.is_transient(k)).collect::<Vec<_>>(), model);
}

#[test]
fn earlier_versions_are_rejected_cleanly() {
    let mut m = Model::new();
    m.add(0, "f", stat(libc::S_IFREG | 0o644, 2, 10), "");
    let mut img = build(&Model::spec(), &m.entries).unwrap();
    for old in [1u32, 2, 3, 4, 5, 6] {
        img[H_VERSION..H_VERSION + 4].copy_from_slice(&old.to_ne_bytes());
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &img).unwrap();
        let err = Mapping::map(file.as_file().as_raw_fd(), img.len()).err();
        assert!(
            matches!(&err, Some(e) if e.to_string().contains(&format!("version {old}"))),
            "{err:?}"
        );
    }
}

#[test]
fn identities_and_objects() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    for i in 0..200 {
        m.add(
            d,
            &format!("f{i}"),
            stat(libc::S_IFREG | 0o644, 10 + i, 5),
            "",
        );
    }
    m.entries[5].copy_ino = 4242;
    m.entries[5].copy_ctime = 99;
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert_eq!(t.tier_dir_id(0), Some((7, 70)));
    assert_eq!(t.tier_dir_id(1), Some((8, 80)));
    assert_eq!(t.tier_dir_id(2), None);
    assert_eq!(t.agent_creds(), (1000, 100, 0xfeed));
    // Every copy's name leads back to its entry.
    for i in 0..t.entry_count() {
        let e = t.entry(i).unwrap();
        let name = object_name(e.object);
        assert_eq!(parse_object_name(&name), Some(e.object));
        assert_eq!(t.lookup_object(e.object), Some(i));
    }
    assert_eq!(t.lookup_object(object_id(b"train/nope")), None);
    assert_eq!(parse_object_name(b"0123456789abcdeg"), None);
    assert_eq!(parse_object_name(b"0123"), None);
    // Model entry 5 is `train/f3` (root, train, f0, f1, f2, f3).
    let f3 = t.lookup(b"train/f3").unwrap();
    assert_eq!(t.copy_identity(f3), (4242, 99));
    t.set_copy_identity(f3, 7, 8);
    assert_eq!(t.copy_identity(f3), (7, 8));
    assert_eq!(t.copy_identity(t.lookup(b"train/f4").unwrap()), (0, 0));
}

#[test]
fn chunk_size_must_be_page_multiple() {
    let m = Model::new();
    let mut spec = Model::spec();
    spec.chunk_size = 1000;
    assert_eq!(
        build(&spec, &m.entries),
        Err(BuildError::BadChunkSize(1000))
    );
}

#[test]
fn heartbeat_tells_a_live_agent_from_a_dead_one() {
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert!(!t.agent_alive(10), "no heartbeat yet");
    t.beat(1_000_000_000);
    assert!(t.agent_alive(1_500_000_000));
    assert!(!t.agent_alive(1_000_000_000 + layout::HEARTBEAT_STALE_MS * 1_000_000));
    assert_eq!(t.prefetch_min_size(), u64::MAX, "0 in the spec means never");
}

#[test]
fn requests_carry_an_argument() {
    let m = Model::new();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert!(t.push_request_arg(request::CHUNK, 7, 51_199));
    assert!(t.push_request_arg(request::CHUNK, u32::MAX, request::ARG_MAX + 5));
    assert_eq!(
        t.pop_request(),
        Some(Request {
            kind: request::CHUNK,
            entry: 7,
            arg: 51_199
        })
    );
    let r = t.pop_request().unwrap();
    assert_eq!(
        (r.entry, r.arg),
        (u32::MAX, 4),
        "arg is truncated to 24 bits"
    );
}

#[test]
fn derived_object_names() {
    let id = 0x0123_4567_89ab_cdef;
    assert_eq!(&part_name(id), b"0123456789abcdef.part");
    assert_eq!(&chunks_name(id), b"0123456789abcdef.chunks");
    assert_eq!(chunk_data_offset(10 << 20, 4 << 20), 4096);
    assert_eq!(
        chunk_data_offset(600 << 20, 1 << 20),
        8192,
        "64 + 8 × 600 bytes of header"
    );
}

#[test]
fn validation_bits_start_over_each_attach() {
    let (_m, t, _f) = flat_table(200);
    let n = t.entry_count();
    assert!((0..n).all(|i| !t.is_validated(i)));
    let mut model = vec![false; n as usize];
    for (first, count) in [(3u32, 1u32), (60, 10), (64, 64), (130, 71), (0, 0)] {
        t.set_validated_range(first, count);
        for k in first..(first + count).min(n) {
            model[k as usize] = true;
        }
        assert_eq!((0..n).map(|k| t.is_validated(k)).collect::<Vec<_>>(), model);
    }
    t.set_validated(1);
    assert!(t.is_validated(1));
    t.set_validated_range(n - 1, 100); // clipped at the last entry
    assert!(!t.is_validated(n));
    assert_eq!(t.bump_epoch(), 1);
    t.clear_validated();
    assert!((0..n).all(|i| !t.is_validated(i)));
    assert_eq!(t.epoch(), 1);
    assert!(!t.immutable());
    t.set_immutable(true);
    assert!(t.immutable() && t.is_valid());
}

#[test]
fn an_entry_is_checked_by_one_party_per_attach() {
    use crate::lifecycle::{self, Check, Verdict};
    let (_m, t, _f) = flat_table(130);
    let n = t.entry_count();
    // The claim bits are their own bitmap: claiming never validates, even at word edges.
    let edge = [1u32, 63, 64, 127, n - 1];
    let claims: Vec<_> = edge
        .iter()
        .map(|&i| match lifecycle::claim_check(&t, i) {
            Check::Mine(c) => c,
            _ => panic!("entry {i}: the first party must get the claim"),
        })
        .collect();
    for &i in &edge {
        assert!(lifecycle::is_being_checked(&t, i));
        assert!(
            matches!(lifecycle::claim_check(&t, i), Check::Busy),
            "entry {i}"
        );
        assert!(!t.is_validated(i));
    }
    assert!(!lifecycle::is_being_checked(&t, 2) && !lifecycle::is_being_checked(&t, 65));
    let mut it = claims.into_iter();
    // Finished `Same`: validated, released; a later party has nothing to do.
    assert!(it.next().unwrap().finish(Verdict::Same));
    assert!(!lifecycle::is_being_checked(&t, 1) && t.is_validated(1));
    assert!(matches!(lifecycle::claim_check(&t, 1), Check::Validated));
    // Finished `Unknown`: released, not validated: the next party checks.
    assert!(!it.next().unwrap().finish(Verdict::Unknown));
    assert!(matches!(lifecycle::claim_check(&t, 63), Check::Mine(_)));
    // Dropped unfinished (a panic): released.
    drop(it.next());
    assert!(!lifecycle::is_being_checked(&t, 64));
    // A claim left behind (its holder died) does not survive the next attach.
    let left: Vec<_> = it.collect();
    std::mem::forget(left);
    assert!(lifecycle::is_being_checked(&t, 127));
    lifecycle::new_attach(&t, false);
    assert!((0..n).all(|i| !lifecycle::is_being_checked(&t, i) && !t.is_validated(i)));
    assert!(matches!(lifecycle::claim_check(&t, 127), Check::Mine(_)));
}

#[test]
fn deep_paths_are_rebuilt_from_names() {
    let mut m = Model::new();
    let mut parent = 0;
    let mut want = Vec::new();
    for depth in 0..300 {
        let name = format!("d{depth}");
        parent = m.add(
            parent,
            &name,
            stat(libc::S_IFDIR | 0o755, 10 + depth, 4096),
            "",
        );
        if !want.is_empty() {
            want.push(b'/');
        }
        want.extend_from_slice(name.as_bytes());
    }
    let f = m.add(parent, "leaf", stat(libc::S_IFREG | 0o644, 9999, 1), "");
    let rel = m.entries[f].rel_path.clone();
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let idx = t.lookup(&rel).unwrap();
    assert_eq!(t.rel_path_vec(idx).unwrap(), rel);
    let dir = t.lookup(&want).unwrap();
    assert_eq!(t.rel_path_vec(dir).unwrap(), want);
    let mut small = [0u8; 8];
    assert_eq!(
        t.write_rel_path(idx, &mut small),
        None,
        "a short buffer is refused"
    );
    assert_eq!(t.rel_path_vec(0).unwrap(), b"");
    // A suffix of a real path, or the same names under another parent, is not that path.
    assert_eq!(t.lookup(b"d1/d2"), None);
    assert_eq!(t.lookup(&rel[3..]), None);
}

#[test]
fn times_and_classes_round_trip() {
    let mut m = Model::new();
    let mut a = stat(libc::S_IFREG | 0o640, 2, 7);
    a.uid = 1234;
    a.gid = 55;
    a.mtime = Ts {
        sec: 1_700_000_000,
        nsec: 123_456_789,
        _pad: 0,
    };
    a.ctime = Ts {
        sec: -5,
        nsec: 7,
        _pad: 0,
    };
    a.btime = Ts {
        sec: 0,
        nsec: 999_999_999,
        _pad: 0,
    };
    a.blocks = 8;
    a.dev_major = 259;
    a.dev_minor = 3;
    m.add(0, "a", a, "");
    let mut far = a;
    far.mtime = Ts {
        sec: 1 << 40,
        nsec: 0,
        _pad: 0,
    }; // beyond 2262
    m.add(0, "far", far, "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let e = t.entry(t.lookup(b"a").unwrap()).unwrap();
    assert_eq!(e.stat, a);
    let far_idx = t.lookup(b"far").unwrap();
    assert_eq!(
        t.state(far_idx).state(),
        State::Stale,
        "metadata that does not fit is never served"
    );
}

#[test]
fn a_million_files_fit_the_budget() {
    // ImageNet-like: 1,000 directories of 1,000 files named like n01440764_10026.JPEG.
    let mut m = Model::new();
    for d in 0..1000u64 {
        let dir = m.add(
            0,
            &format!("n{d:08}"),
            stat(libc::S_IFDIR | 0o755, 1 + d, 4096),
            "",
        );
        for f in 0..1000u64 {
            m.add(
                dir,
                &format!("n{d:08}_{f:05}.JPEG"),
                stat(libc::S_IFREG | 0o644, 10_000 + d * 1000 + f, 1024),
                "",
            );
        }
    }
    let mut spec = Model::spec();
    spec.ring_cap = 16384;
    spec.job_slots = 64;
    spec.prefetch_min_size = 1 << 20;
    spec.chunk_size = 4 << 20;
    let cat = Catalog::from_entries(&m.entries).unwrap();
    let len = image_len(&spec, &cat).unwrap();
    let per_file = len as f64 / 1_001_001.0;
    assert!(per_file <= 161.0, "{per_file:.1} bytes per entry");
}

#[test]
fn an_adopted_image_keeps_the_catalog_and_forgets_the_copies() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    let placed = m.add(d, "placed", stat(libc::S_IFREG | 0o644, 3, 9 << 20), "");
    m.entries[placed].chunks = vec![0b11];
    m.add(d, "stale", stat(libc::S_IFREG | 0o644, 4, 10), "");
    m.add(d, "plain", stat(libc::S_IFREG | 0o644, 5, 10), "");
    let mut spec = Model::spec();
    spec.chunk_size = 4 << 20;
    spec.prefetch_min_size = 1;
    let mut img = build(&spec, &m.entries).unwrap();
    let dir_word;
    let seed;
    {
        // What rank 0 holds: a copy, a chunk file's bits, a void entry, validation done.
        let (_m, t, _f) = map_image(&img);
        seed = t.check_seed();
        let p = t.lookup(b"train/placed").unwrap();
        assert!(lifecycle::adopt_placed(&t, p, 1, 0xabc, 77, 88));
        lifecycle::progress(&t, p, 5);
        lifecycle::set_transient(&t, p, true);
        let s = t.lookup(b"train/stale").unwrap();
        lifecycle::void(
            &lifecycle::EntryCell { table: &t, idx: s },
            lifecycle::Void::Stale,
        );
        t.set_validated_range(0, t.entry_count());
        dir_word = t.state(t.lookup(b"train").unwrap());
        img = t.region().bytes(0, img.len()).unwrap().to_vec();
    }
    let mut mine = spec.clone();
    mine.tier_dirs = vec![b"/dev/shm/rank1/objects".to_vec()];
    mine.tier_dir_ids = vec![(9, 90)];
    mine.agent_pid = 4242;
    rebase(&mut img, &mine).unwrap();
    let (_m, t, _f) = map_image(&img);
    lifecycle::forget_placement(&t);
    // The entries' second hashes were made with rank 0's seed: the adopted table keeps it.
    assert_eq!(t.check_seed(), seed);
    for e in &m.entries {
        assert!(t.lookup(&e.rel_path).is_some());
    }
    assert_eq!(t.tier_count(), 1);
    assert_eq!(t.tier_dir(0), Some(&b"/dev/shm/rank1/objects"[..]));
    assert_eq!(t.tier_dir_id(0), Some((9, 90)));
    assert_eq!(t.tier_dir(1), None, "the other node's second tier is gone");
    assert_eq!(t.agent_pid(), 4242);
    let p = t.lookup(b"train/placed").unwrap();
    assert_eq!(t.state(p).state(), State::Unplaced);
    assert_eq!(
        (t.copy_identity(p), t.checksum(p), t.progress(p)),
        ((0, 0), 0, 0)
    );
    assert!(!t.is_transient(p) && !t.chunk_present(p, 0) && !t.chunk_present(p, 1));
    let s = t.lookup(b"train/stale").unwrap();
    assert_eq!(t.state(s).state(), State::Stale, "void stays void");
    assert!(
        (0..t.entry_count()).all(|i| t.is_validated(i)),
        "validation holds"
    );
    let dir = t.lookup(b"train").unwrap();
    assert_eq!(t.state(dir), dir_word, "a directory is left as it was");
}

#[test]
fn a_foreign_image_is_refused_when_its_layout_or_owner_differs() {
    let mut m = Model::new();
    m.add(0, "f", stat(libc::S_IFREG | 0o644, 2, 10), "");
    let spec = Model::spec();
    let img = build(&spec, &m.entries).unwrap();
    let refused = |edit: &dyn Fn(&mut TableSpec)| {
        let mut s = spec.clone();
        edit(&mut s);
        rebase(&mut img.clone(), &s).unwrap_err()
    };
    assert!(matches!(
        refused(&|s| s.creds.0 += 1),
        BuildError::Foreign(_)
    ));
    assert!(matches!(
        refused(&|s| s.job_slots += 1),
        BuildError::Foreign(_)
    ));
    assert!(matches!(
        refused(&|s| s.chunk_size = 8192),
        BuildError::Foreign(_)
    ));
    assert!(matches!(
        refused(&|s| s.source_real = b"/x".to_vec()),
        BuildError::Foreign(_)
    ));
    assert!(matches!(
        refused(&|s| s.tier_dirs = vec![vec![b'x']; 9]),
        BuildError::TooManyTiers(9)
    ));
    let mut cut = img.clone();
    cut.truncate(img.len() - 4096);
    assert!(matches!(
        rebase(&mut cut, &spec),
        Err(BuildError::BadLength)
    ));
    rebase(&mut img.clone(), &spec).unwrap();
}

#[test]
fn a_requeued_entry_forgets_its_part() {
    let mut m = Model::new();
    m.add(0, "f", stat(libc::S_IFREG | 0o644, 2, 1 << 20), "");
    let mut spec = Model::spec();
    spec.prefetch_min_size = 1;
    let img = build(&spec, &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    let f = t.lookup(b"f").unwrap();
    let cell = lifecycle::EntryCell { table: &t, idx: f };
    assert!(
        !lifecycle::requeue(&t, f),
        "only a copy in progress is handed back"
    );
    assert!(lifecycle::claim(&cell) && lifecycle::start(&t, f));
    assert!(lifecycle::announce_part(&t, f, 1, 55));
    lifecycle::progress(&t, f, 4096);
    assert!(lifecycle::requeue(&t, f));
    assert_eq!(t.state(f).parts(), (State::Queued, 0));
    assert_eq!((t.progress(f), t.copy_identity(f)), (0, (0, 0)));
    assert!(lifecycle::start(&t, f), "a worker may take it again");
}

#[test]
fn the_cluster_flag_is_independent_of_the_others() {
    let mut m = Model::new();
    m.add(0, "f", stat(libc::S_IFREG | 0o644, 2, 10), "");
    let img = build(&Model::spec(), &m.entries).unwrap();
    let (_m, t, _f) = map_image(&img);
    assert!(!t.cluster());
    t.set_cluster(true);
    t.set_immutable(true);
    assert!(t.cluster() && t.is_valid() && t.immutable());
    t.set_cluster(false);
    assert!(!t.cluster() && t.is_valid() && t.immutable());
}

#[test]
fn find_answers_only_for_live_entries_and_says_why_not() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    m.add(d, "a.jpg", stat(libc::S_IFREG | 0o644, 3, 10), "");
    m.add(d, "b.jpg", stat(libc::S_IFREG | 0o644, 4, 10), "");
    m.add(0, "to_a", stat(libc::S_IFLNK | 0o777, 5, 11), "train/a.jpg");
    m.add(0, "out", stat(libc::S_IFLNK | 0o777, 6, 4), "/etc");
    let (_m, t, _f) = map_image(&build(&Model::spec(), &m.entries).unwrap());
    let a = t.lookup(b"train/a.jpg").unwrap();
    let found = t.find(b"train/a.jpg", true, false).unwrap();
    assert_eq!((found.idx, found.entry.stat.ino), (a, 3));
    assert_eq!(found.word, t.state(a));
    assert_eq!(found.validated, lifecycle::is_validated(&t, a));
    // A final symlink: followed or named itself.
    assert_eq!(t.find(b"to_a", true, false).unwrap().idx, a);
    assert!(t
        .find(b"to_a", false, false)
        .unwrap()
        .entry
        .stat
        .is_symlink());
    assert_eq!(t.find(b"out", true, false).unwrap_err(), Miss::Unprovable);
    assert_eq!(
        t.find(b"nope", true, false).unwrap_err(),
        Miss::NotCatalogued
    );
    assert_eq!(
        t.find(b"train/a.jpg", true, true).unwrap_err(),
        Miss::NotADirectory
    );
    assert!(t.find(b"train", true, true).is_ok());
    // Changed by the program: the entry itself, then everything below a removed directory.
    assert!(lifecycle::void_entry(&t, a, lifecycle::Void::Stale));
    assert_eq!(t.find(b"train/a.jpg", true, false).unwrap_err(), Miss::Void);
    assert_eq!(t.is_live(a), Err(Miss::Void));
    let train = t.lookup(b"train").unwrap();
    assert!(lifecycle::void_entry(&t, train, lifecycle::Void::Gone));
    assert_eq!(
        t.find(b"train/b.jpg", true, false).unwrap_err(),
        Miss::AncestorGone
    );
    assert_eq!(
        t.is_live(t.lookup(b"train/b.jpg").unwrap()),
        Err(Miss::AncestorGone)
    );
    assert_eq!(t.is_live(0), Ok(()));
}

#[test]
fn a_damaged_hash_slot_never_finds_another_path() {
    let mut m = Model::new();
    for i in 0..300u64 {
        m.add(
            0,
            &format!("f{i}"),
            stat(libc::S_IFREG | 0o644, 2 + i, i),
            "",
        );
    }
    let img = build(&Model::spec(), &m.entries).unwrap();
    let u32_at = |img: &[u8], off: usize| u32::from_ne_bytes(img[off..off + 4].try_into().unwrap());
    let u64_at = |img: &[u8], off: usize| u64::from_ne_bytes(img[off..off + 8].try_into().unwrap());
    let hash_off = u64_at(&img, crate::layout::H_HASH_OFF) as usize;
    let slots = u32_at(&img, crate::layout::H_HASH_SLOTS) as usize;
    let used: Vec<usize> = (0..slots)
        .map(|s| hash_off + s * SLOT_LEN)
        .filter(|&off| u32_at(&img, off + 4) != 0)
        .collect();
    assert_eq!(used.len(), 300 + 1, "every entry has a slot");
    // Probe sequences run past the last slot to the first: some path's slot lies before its
    // home slot (with 301 entries in 402 slots, several do).
    let wrapped = m.entries.iter().filter(|e| {
        let h = path_hash(&e.rel_path);
        let idx1 = m
            .entries
            .iter()
            .position(|x| x.rel_path == e.rel_path)
            .unwrap() as u32
            + 1;
        let at = used
            .iter()
            .find(|&&off| u32_at(&img, off + 4) & !crate::layout::SLOT_FLAGS == idx1)
            .unwrap();
        ((at - hash_off) / SLOT_LEN) < home_slot(h, slots as u32) as usize
    });
    assert!(wrapped.count() > 0, "no probe sequence wraps in this table");
    let check = |img: &[u8], broken: Option<&[u8]>| {
        let (_m, t, _f) = map_image(img);
        for e in &m.entries[1..] {
            let got = t.lookup(&e.rel_path);
            if Some(&e.rel_path[..]) == broken {
                assert!(got.is_none_or(|i| t.rel_path_vec(i).unwrap() == e.rel_path));
            } else {
                let i = got.expect("catalogued");
                assert_eq!(t.rel_path_vec(i).unwrap(), e.rel_path);
            }
        }
        assert_eq!(t.lookup(b"f300"), None);
    };
    check(&img, None);
    // A slot naming an entry past the end, or another entry: its path is not found (or found
    // as itself), no other path is found in its place.
    for w in [u32::MAX, 302, 2] {
        let mut bad = img.clone();
        let off = used[used.len() / 2];
        let victim = m.entries[(u32_at(&img, off + 4) & !crate::layout::SLOT_FLAGS) as usize - 1]
            .rel_path
            .clone();
        bad[off + 4..off + 8].copy_from_slice(&w.to_ne_bytes());
        check(&bad, Some(&victim));
    }
    // An entry whose second hash of the path (`DiskEntry::check`) is not its path's: the
    // lookup does not take it (the first hash, its object id, and the slot still lead there).
    let entries_off = u64_at(&img, crate::layout::H_ENTRIES_OFF) as usize;
    for i in [1usize, 150, 300] {
        let mut bad = img.clone();
        let at = entries_off
            + i * crate::layout::ENTRY_LEN
            + core::mem::offset_of!(crate::layout::DiskEntry, check);
        bad[at] ^= 1;
        let (_m, t, _f) = map_image(&bad);
        let victim = &m.entries[i].rel_path;
        assert_eq!(
            t.lookup(victim),
            None,
            "{}",
            String::from_utf8_lossy(victim)
        );
        assert!(t.find(victim, true, false).is_err());
        assert!(t.find_file(victim, path_hash(victim), false).is_none());
        check(&bad, Some(victim));
    }
}

#[test]
fn a_hash_slot_says_which_entries_are_small_files() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    for i in 0..20 {
        m.add(
            d,
            &format!("s{i}"),
            stat(libc::S_IFREG | 0o644, 10 + i, 999),
            "",
        );
    }
    m.add(d, "large", stat(libc::S_IFREG | 0o644, 40, 1000), "");
    m.add(0, "to_s0", stat(libc::S_IFLNK | 0o777, 5, 8), "train/s0");
    let spec = TableSpec {
        prefetch_min_size: 1000,
        ..Model::spec()
    };
    let (_m, t, _f) = map_image(&build(&spec, &m.entries).unwrap());
    let slot_of = |rel: &[u8]| t.small_file_slot(layout::path_hash(rel));
    for i in 0..20 {
        let rel = format!("train/s{i}");
        let e = t.lookup(rel.as_bytes()).expect("catalogued");
        assert_eq!(slot_of(rel.as_bytes()), Some(e), "{rel}");
        assert_eq!(t.entry(e).unwrap().stat.size, 999);
    }
    // At the whole-fetch size, a directory, a symlink to a small file, the root, a path the
    // catalog does not hold: not small files.
    assert!(t.lookup(b"train/large").is_some());
    for rel in [&b"train/large"[..], b"train", b"to_s0", b"", b"train/s20"] {
        assert_eq!(slot_of(rel), None, "{}", String::from_utf8_lossy(rel));
    }
    // Every lookup still finds its own entry (the flag is not part of the index).
    for i in 0..20 {
        let rel = format!("train/s{i}");
        let e = t.lookup(rel.as_bytes()).unwrap();
        assert_eq!(t.rel_path_vec(e).unwrap(), rel.as_bytes());
    }
    // Without a whole-fetch size every regular file is small.
    let (_m, t, _f) = map_image(&build(&Model::spec(), &m.entries).unwrap());
    assert!(t
        .small_file_slot(layout::path_hash(b"train/large"))
        .is_some());
    assert_eq!(t.small_file_slot(layout::path_hash(b"train")), None);
}

#[test]
fn the_copy_bitmap_says_no_copy_only_of_files_never_placed() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    let names: Vec<String> = (0..40).map(|i| format!("train/f{i}")).collect();
    for i in 0..40 {
        m.add(
            d,
            &format!("f{i}"),
            stat(libc::S_IFREG | 0o644, 10 + i, 10),
            "",
        );
    }
    m.add(0, "to_f0", stat(libc::S_IFLNK | 0o777, 5, 8), "train/f0");
    // A copy an earlier table recorded, carried over.
    let carried = m.add(0, "kept", stat(libc::S_IFREG | 0o644, 6, 10), "");
    m.entries[carried].state = lifecycle::carried(StateWord::new(State::Placed, 0), 0).unwrap();
    let (_m, t, _f) = map_image(&build(&Model::spec(), &m.entries).unwrap());
    // A symlink may lead to a copy, a carried copy is one.
    assert!(!t.no_copy_yet(b"to_f0"));
    assert!(!t.no_copy_yet(b"kept"));
    // Files nobody placed: every one whose bit no symlink or copy shares.
    let taken = |rel: &[u8]| {
        [&b"to_f0"[..], b"kept"].iter().any(|o| {
            layout::copy_bit(layout::path_hash(o), t.copy_bits())
                == layout::copy_bit(layout::path_hash(rel), t.copy_bits())
        })
    };
    let free: Vec<&String> = names.iter().filter(|n| !taken(n.as_bytes())).collect();
    assert!(free.len() > 30, "{} of 40", free.len());
    for n in &free {
        assert!(t.no_copy_yet(n.as_bytes()), "{n}");
    }
    // Placed now: the bit is set before the word says PLACED, and stays set after the copy goes.
    let f0 = t.lookup(free[0].as_bytes()).unwrap();
    let cell = lifecycle::EntryCell { table: &t, idx: f0 };
    assert!(lifecycle::claim(&cell));
    assert!(lifecycle::begin(&cell, t.state(f0), 1));
    assert!(t.no_copy_yet(free[0].as_bytes()), "placing is not placed");
    assert!(lifecycle::complete(&cell, 1));
    assert!(!t.no_copy_yet(free[0].as_bytes()));
    assert!(lifecycle::withdraw(&cell, t.state(f0)));
    assert!(!t.no_copy_yet(free[0].as_bytes()));
    // Adopted copies too; the others are untouched.
    let f1 = t.lookup(free[1].as_bytes()).unwrap();
    assert!(lifecycle::adopt_placed(&t, f1, 0, 1, 2, 3));
    assert!(!t.no_copy_yet(free[1].as_bytes()));
    let untouched = free[2..]
        .iter()
        .filter(|n| {
            let b = layout::copy_bit(layout::path_hash(n.as_bytes()), t.copy_bits());
            [free[0], free[1]]
                .iter()
                .all(|p| layout::copy_bit(layout::path_hash(p.as_bytes()), t.copy_bits()) != b)
        })
        .collect::<Vec<_>>();
    assert!(!untouched.is_empty());
    for n in untouched {
        assert!(t.no_copy_yet(n.as_bytes()), "{n}");
    }
}

#[test]
fn the_copy_hint_tells_a_symlinks_path_from_a_files() {
    // A Hugging Face cache's shape: blobs, and as many links to them. Hundreds of entries, so
    // that many slots lie several probes from their home.
    let mut m = Model::new();
    let blobs = m.add(0, "blobs", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    let snap = m.add(0, "snap", stat(libc::S_IFDIR | 0o755, 3, 4096), "");
    let mut files = Vec::new();
    let mut links = Vec::new();
    for i in 0..600u64 {
        let e = m.add(
            blobs,
            &format!("{i:040x}"),
            stat(libc::S_IFREG | 0o644, 10 + i, 1024),
            "",
        );
        if i % 2 == 0 {
            m.entries[e].state = StateWord::new(State::Placed, 0);
        }
        files.push((format!("blobs/{i:040x}"), i % 2 == 0));
        let target = format!("../blobs/{i:040x}");
        m.add(
            snap,
            &format!("f{i}"),
            stat(libc::S_IFLNK | 0o777, 1000 + i, target.len() as u64),
            &target,
        );
        links.push(format!("snap/f{i}"));
    }
    let (_m, t, _f) = map_image(&build(&Model::spec(), &m.entries).unwrap());
    for l in &links {
        assert_eq!(
            t.copy_hint(layout::path_hash(l.as_bytes())),
            CopyHint::Link,
            "{l}"
        );
        // The mark changes nothing else: the link is found, and followed to its blob.
        let f = t.find(l.as_bytes(), true, false).unwrap();
        assert!(f.entry.stat.is_file(), "{l}");
        assert!(t
            .find(l.as_bytes(), false, false)
            .unwrap()
            .entry
            .stat
            .is_symlink());
    }
    for (f, placed) in &files {
        let hint = t.copy_hint(layout::path_hash(f.as_bytes()));
        if *placed {
            assert_eq!(hint, CopyHint::Maybe, "{f}");
        } else {
            assert_ne!(hint, CopyHint::Link, "{f}");
        }
        assert!(t.lookup(f.as_bytes()).is_some(), "{f}");
    }
}

#[test]
fn a_table_without_a_copy_bitmap_always_looks_up() {
    let mut m = Model::new();
    m.add(0, "a", stat(libc::S_IFREG | 0o644, 3, 10), "");
    let mut img = build(&Model::spec(), &m.entries).unwrap();
    // As a table made before the bitmap existed: zeros in its header fields.
    img[layout::H_COPY_BITS_OFF..layout::H_COPY_BITS_OFF + 16].fill(0);
    let (_m, t, _f) = map_image(&img);
    assert!(!t.no_copy_yet(b"a"));
    assert!(t.lookup(b"a").is_some());
    // A bitmap whose length is not a power of two is refused.
    let mut img = build(&Model::spec(), &m.entries).unwrap();
    img[layout::H_COPY_BITS..layout::H_COPY_BITS + 8].copy_from_slice(&100u64.to_ne_bytes());
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &img).unwrap();
    assert!(Mapping::map(f.as_file().as_raw_fd(), img.len()).is_err());
}

/// A table whose request ring has four slots per shard.
fn four_slots_a_shard() -> (Mapping, Table, tempfile::NamedTempFile) {
    let mut spec = Model::spec();
    spec.ring_cap = 4 * crate::layout::RING_SHARDS as u32;
    map_image(&build(&spec, &Model::new().entries).unwrap())
}

#[test]
fn processes_push_into_their_own_shards_and_the_agent_drains_them_all() {
    let _one = shard_lock();
    let (_m, t, _f) = four_slots_a_shard();
    // Process 1 fills its shard; process 2 (another shard) is not turned away.
    crate::set_counter_shard(1);
    for i in 0..4 {
        assert!(t.push_request(request::OPEN_UNPLACED, 10 + i));
    }
    assert!(!t.push_hint_arg(request::CLOSED, 99, 0), "a full shard");
    crate::set_counter_shard(2);
    for i in 0..3 {
        assert!(t.push_hint_arg(request::CLOSED, 20 + i, 0));
    }
    crate::set_counter_shard(0);
    assert_eq!(t.ring_backlog(), 7);
    let mut got = Vec::new();
    while let Some(r) = t.pop_request() {
        got.push(r.entry);
    }
    // Every request once, each process's in its order.
    let of = |lo: u32| {
        got.iter()
            .copied()
            .filter(|e| e / 10 == lo / 10)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(10), vec![10, 11, 12, 13]);
    assert_eq!(of(20), vec![20, 21, 22]);
    assert_eq!(got.len(), 7);
    assert_eq!(t.ring_backlog(), 0);
    // A push after every shard drained is taken, and no slot is left to skip (a producer that
    // died mid-push: `a_dead_producers_slot_is_skipped_while_other_shards_keep_the_consumer_busy`).
    crate::set_counter_shard(3);
    assert!(t.push_request(request::OPEN_UNPLACED, 30));
    crate::set_counter_shard(0);
    assert_eq!(t.pop_request().map(|r| r.entry), Some(30));
    let mut seen = [u64::MAX; crate::layout::RING_SHARDS];
    assert!(!t.skip_stuck_request(&mut seen));
}

#[test]
fn a_dead_producers_slot_is_skipped_while_other_shards_keep_the_consumer_busy() {
    let _one = shard_lock();
    let (_m, t, _f) = four_slots_a_shard();
    // Process 3 dies between claim and publication; its shard-mate 11 asks after it.
    crate::set_counter_shard(3);
    assert!(t.ring().claim_only());
    crate::set_counter_shard(11);
    assert!(t.push_request(request::OPEN_UNPLACED, 11));
    let mut seen = [u64::MAX; crate::layout::RING_SHARDS];
    // The consumer never finds the ring empty: process 2 asks between every look. A slot is
    // skipped once it looked stuck at two looks (the agent's, a second apart), not at one.
    let mut got = Vec::new();
    let mut skips = 0;
    for round in 0..3 {
        crate::set_counter_shard(2);
        assert!(t.push_request(request::OPEN_UNPLACED, 20 + round));
        crate::set_counter_shard(0);
        while let Some(r) = t.pop_request() {
            got.push(r.entry);
        }
        if t.skip_stuck_request(&mut seen) {
            skips += 1;
            assert!(round >= 1, "skipped at its first look");
        }
    }
    assert_eq!(skips, 1);
    while let Some(r) = t.pop_request() {
        got.push(r.entry);
    }
    got.sort();
    assert_eq!(
        got,
        vec![11, 20, 21, 22],
        "the dead producer's shard-mate was served"
    );
}

#[test]
fn object_names_are_lowercase_hex_of_the_id() {
    let by_digit = |object: u64| -> [u8; 16] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = HEX[((object >> (60 - 4 * i)) & 0xf) as usize];
        }
        out
    };
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for v in [
        0,
        1,
        9,
        10,
        15,
        16,
        u64::MAX,
        0x0123_4567_89ab_cdef,
        0xa9a9_a9a9_9a9a_9a9a,
    ] {
        assert_eq!(object_name(v), by_digit(v), "{v:#x}");
    }
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_eq!(object_name(x), by_digit(x), "{x:#x}");
        assert_eq!(parse_object_name(&object_name(x)), Some(x));
    }
}

#[test]
fn find_file_answers_only_as_find_does() {
    let mut m = Model::new();
    let d = m.add(0, "train", stat(libc::S_IFDIR | 0o755, 2, 4096), "");
    m.add(d, "a.jpg", stat(libc::S_IFREG | 0o644, 3, 10), "");
    m.add(d, "b.jpg", stat(libc::S_IFREG | 0o600, 4, 20), "");
    m.add(0, "to_a", stat(libc::S_IFLNK | 0o777, 5, 11), "train/a.jpg");
    m.add(0, "out", stat(libc::S_IFLNK | 0o777, 6, 4), "/etc");
    let (_m, t, _f) = map_image(&build(&Model::spec(), &m.entries).unwrap());
    let paths: [&[u8]; 7] = [
        b"train",
        b"train/a.jpg",
        b"train/b.jpg",
        b"to_a",
        b"out",
        b"nope",
        b"",
    ];
    let check = |t: &Table| {
        for p in paths {
            for must_dir in [false, true] {
                let Some(hit) = t.find_file(p, path_hash(p), must_dir) else {
                    continue;
                };
                for follow in [false, true] {
                    let f = t.find(p, follow, must_dir).unwrap();
                    assert_eq!(hit.idx, f.idx);
                    assert_eq!(hit.object, f.entry.object);
                    assert_eq!(hit.size, f.entry.stat.size);
                    assert_eq!((hit.mode, hit.uid), (f.entry.stat.mode, f.entry.stat.uid));
                    assert_eq!(hit.word, f.word);
                    assert_eq!(hit.validated, f.validated);
                    assert_eq!(hit.is_file(), f.entry.stat.is_file());
                }
            }
        }
    };
    // Symlinks are left to `find`.
    assert!(t.find_file(b"to_a", path_hash(b"to_a"), false).is_none());
    assert!(t
        .find_file(b"train/a.jpg", path_hash(b"train/a.jpg"), false)
        .is_some());
    assert!(t
        .find_file(b"train/a.jpg", path_hash(b"train/a.jpg"), true)
        .is_none());
    check(&t);
    // An entry the program changed, and a directory it removed: no answer where `find` has none.
    let a = t.lookup(b"train/a.jpg").unwrap();
    let train = t.lookup(b"train").unwrap();
    assert!(lifecycle::void_entry(&t, a, lifecycle::Void::Stale));
    assert!(t
        .find_file(b"train/a.jpg", path_hash(b"train/a.jpg"), false)
        .is_none());
    assert!(lifecycle::void_entry(&t, train, lifecycle::Void::Gone));
    assert!(t
        .find_file(b"train/b.jpg", path_hash(b"train/b.jpg"), false)
        .is_none());
    check(&t);
}

#[test]
fn each_table_keys_the_second_hash_of_its_paths_with_a_seed_of_its_own() {
    let mut m = Model::new();
    for d in 0..8 {
        let dir = m.add(
            0,
            &format!("d{d}"),
            stat(libc::S_IFDIR | 0o755, 2 + d, 4096),
            "",
        );
        for f in 0..40 {
            m.add(
                dir,
                &format!("f{f}.jpg"),
                stat(libc::S_IFREG | 0o644, 100 + 100 * d + f, 10),
                "",
            );
        }
        m.add(dir, "up", stat(libc::S_IFLNK | 0o777, 50 + d, 2), "..");
    }
    // Two tables of the same tree.
    let a = build(&Model::spec(), &m.entries).unwrap();
    let b = build(&Model::spec(), &m.entries).unwrap();
    let (_ma, ta, _fa) = map_image(&a);
    let (_mb, tb, _fb) = map_image(&b);
    assert_ne!(ta.check_seed(), tb.check_seed());
    let u64_at = |img: &[u8], off: usize| u64::from_ne_bytes(img[off..off + 8].try_into().unwrap());
    let seed_at = crate::layout::H_CHECK_SEED;
    assert_eq!(u64_at(&a, seed_at), ta.check_seed(), "read from the header");
    let entries_off = u64_at(&a, crate::layout::H_ENTRIES_OFF) as usize;
    let check_of = |img: &[u8], idx: u32| {
        u64_at(
            img,
            entries_off
                + idx as usize * crate::layout::ENTRY_LEN
                + core::mem::offset_of!(crate::layout::DiskEntry, check),
        )
    };
    for t in [&ta, &tb] {
        for e in &m.entries {
            let idx = t
                .lookup(&e.rel_path)
                .unwrap_or_else(|| panic!("{} not found", String::from_utf8_lossy(&e.rel_path)));
            assert_eq!(t.rel_path_vec(idx).as_deref(), Some(&e.rel_path[..]));
            assert!(t.find(&e.rel_path, false, false).is_ok());
        }
        for p in [
            &b"d0/f40.jpg"[..],
            b"d8",
            b"d0/f1.jpg/x",
            b"f0.jpg",
            b"d00/f1.jpg",
        ] {
            assert_eq!(t.lookup(p), None, "{}", String::from_utf8_lossy(p));
            assert!(t.find(p, true, false).is_err());
            assert!(t.find_file(p, path_hash(p), false).is_none());
        }
    }
    // The entries are the same but for their second hashes, each its own table's.
    for e in &m.entries {
        let (ia, ib) = (
            ta.lookup(&e.rel_path).unwrap(),
            tb.lookup(&e.rel_path).unwrap(),
        );
        assert_eq!(ia, ib);
        assert_eq!(check_of(&a, ia), path_check(&e.rel_path, ta.check_seed()));
        assert_eq!(check_of(&b, ib), path_check(&e.rel_path, tb.check_seed()));
        assert_ne!(check_of(&a, ia), check_of(&b, ib));
    }
    // Under another seed (the other table's, here) no entry is found: a lookup keys the
    // path's second hash with the seed in its own table's header.
    let mut other = a.clone();
    other[seed_at..seed_at + 8].copy_from_slice(&tb.check_seed().to_ne_bytes());
    let (_mo, to, _fo) = map_image(&other);
    for e in &m.entries {
        assert_eq!(to.lookup(&e.rel_path), None);
    }
}
