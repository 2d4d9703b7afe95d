//! The catalog against what std reports; a walk that takes over an earlier table; saved
//! catalogs; the validation of a reused catalog against every identity field.

use granary_core::catalog::{self, Progress};
use granary_core::sys;
use granary_shm::{lifecycle, Mapping, State, Table, TableSpec};
use proptest::prelude::*;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn spec(root: &Path, tier_dirs: &[PathBuf]) -> TableSpec {
    TableSpec {
        source: root.as_os_str().as_bytes().to_vec(),
        source_real: root.as_os_str().as_bytes().to_vec(),
        creds: sys::creds(),
        tier_dirs: tier_dirs
            .iter()
            .map(|d| d.as_os_str().as_bytes().to_vec())
            .collect(),
        root_parent_ino: 1,
        agent_pid: 1,
        ring_cap: 64,
        job_slots: 4,
        ..Default::default()
    }
}

fn map(img: &[u8], dir: &Path) -> (Mapping, granary_shm::Table) {
    let p = dir.join("t.table");
    std::fs::write(&p, img).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    Mapping::map(f.as_raw_fd(), img.len()).unwrap()
}

/// Builds a tree from a list of (depth-limited) names: directories, files and symlinks.
fn make_tree(root: &Path, items: &[(u8, u8, u16)]) {
    for (i, &(kind, parent, size)) in items.iter().enumerate() {
        let parent_dir = if parent % 3 == 0 {
            root.to_path_buf()
        } else {
            root.join(format!("d{}", parent % 4))
        };
        std::fs::create_dir_all(&parent_dir).unwrap();
        let p = parent_dir.join(format!("n{i}"));
        match kind % 3 {
            0 => std::fs::write(&p, vec![b'x'; size as usize]).unwrap(),
            1 => std::fs::create_dir_all(&p).unwrap(),
            _ => std::os::unix::fs::symlink(format!("../target{i}"), &p).unwrap(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Every path of a generated tree is in the table with exactly the metadata std reports,
    /// symlinks are not followed, and each directory lists exactly its entries.
    #[test]
    fn walk_matches_std(items in proptest::collection::vec((0u8..3, 0u8..12, 0u16..5000), 0..40)) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("src");
        std::fs::create_dir(&root).unwrap();
        make_tree(&root, &items);
        let w = catalog::walk(&root, None, 4, &Progress::default()).unwrap();
        let img = granary_shm::build_catalog(&spec(&root, &[]), &w.catalog).unwrap();
        let (_m, table) = map(&img, t.path());
        let mut seen = 0;
        for entry in walkdir(&root) {
            let rel = entry.strip_prefix(&root).unwrap();
            let idx = table.lookup(rel.as_os_str().as_bytes());
            prop_assert!(idx.is_some(), "missing {}", rel.display());
            let e = table.entry(idx.unwrap()).unwrap();
            let md = std::fs::symlink_metadata(&entry).unwrap();
            prop_assert_eq!(e.stat.mode, md.mode());
            prop_assert_eq!(e.stat.ino, md.ino());
            prop_assert_eq!(e.stat.nlink as u64, md.nlink());
            prop_assert_eq!(e.stat.uid, md.uid());
            prop_assert_eq!(e.stat.size, md.size());
            prop_assert_eq!(e.stat.mtime.sec, md.mtime());
            prop_assert_eq!(e.stat.mtime.nsec as i64, md.mtime_nsec());
            prop_assert_eq!(e.stat.blocks, md.blocks());
            if md.file_type().is_symlink() {
                let target = std::fs::read_link(&entry).unwrap();
                prop_assert_eq!(table.link_target(&e).unwrap(), target.as_os_str().as_bytes());
            }
            if md.is_dir() {
                let mut want: Vec<Vec<u8>> = std::fs::read_dir(&entry).unwrap()
                    .map(|d| d.unwrap().file_name().as_bytes().to_vec()).collect();
                let mut got: Vec<Vec<u8>> = (e.first_child..e.first_child + e.child_count)
                    .map(|c| table.name(&table.entry(c).unwrap()).unwrap().to_vec()).collect();
                want.sort();
                got.sort();
                prop_assert_eq!(got, want);
            }
            seen += 1;
        }
        prop_assert_eq!(seen + 1, table.entry_count() as usize);
    }
}

fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn unreadable_directory_is_stale_not_empty() {
    if sys::uid() == 0 {
        return; // root reads everything
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    std::fs::create_dir_all(root.join("closed")).unwrap();
    std::fs::write(root.join("closed/f"), b"x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("closed"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let w = catalog::walk(&root, None, 2, &Progress::default()).unwrap();
    std::fs::set_permissions(root.join("closed"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cat = &w.catalog;
    let i = (0..cat.len()).find(|&i| cat.name(i) == b"closed").unwrap();
    assert_eq!(cat.nodes[i].state.state(), State::Stale);
    assert_eq!(cat.nodes[i].disk.aux2, 0);
}

/// A tree of 3 directories of files.
fn tree(root: &Path) {
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        for i in 0..5 {
            std::fs::write(
                root.join(d).join(format!("f{i}")),
                vec![b'0' + i; 100 + i as usize],
            )
            .unwrap();
        }
    }
}

fn table_of(
    root: &Path,
    dir: &Path,
    prev: Option<&catalog::Prev<'_>>,
) -> (Mapping, Table, catalog::Walk) {
    let w = catalog::walk(root, prev, 2, &Progress::default()).unwrap();
    let img = granary_shm::build_catalog(&spec(root, &[PathBuf::from("/t/objects")]), &w.catalog)
        .unwrap();
    let (m, t) = map(&img, dir);
    lifecycle::validated_by_walk(&t, &w.fresh);
    // `map` writes `t.table`: a second table of the same test needs its own file.
    let _ = std::fs::rename(
        dir.join("t.table"),
        dir.join(format!("t{}.table", t.entry_count())),
    );
    (m, t, w)
}

/// A walk with an earlier table lists only the directories that table voided and re-reads
/// only the files it voided; everything else (placements on kept tiers included) is taken over.
#[test]
fn a_walk_takes_over_what_the_earlier_table_vouches_for() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    tree(&root);
    let (_m1, t1, w1) = table_of(&root, t.path(), None);
    assert_eq!(w1.stats.files, 15);
    let idx = |t: &Table, p: &str| t.lookup(p.as_bytes()).unwrap();
    // A placed copy on tier 0, a directory whose names changed, a file that changed.
    let placed = idx(&t1, "a/f1");
    assert!(lifecycle::adopt_placed(&t1, placed, 0, 77, 5, 6));
    lifecycle::void_entry(&t1, idx(&t1, "b"), lifecycle::Void::Stale);
    lifecycle::void_entry(&t1, idx(&t1, "c/f2"), lifecycle::Void::Stale);
    std::fs::write(root.join("b/new"), b"new").unwrap();
    std::fs::write(root.join("c/f2"), b"other contents").unwrap();
    // Changed behind the earlier table's back, in a directory it vouches for: taken over as it
    // was (the attach's validation finds it).
    std::fs::write(root.join("a/f3"), b"unseen").unwrap();
    let prev = catalog::Prev {
        table: &t1,
        tier_map: vec![Some(0)],
        chunk_size: 0,
    };
    let (_m2, t2, w2) = table_of(&root, t.path(), Some(&prev));
    assert_eq!(w2.stats.files, 16);
    assert!(
        t2.lookup(b"b/new").is_some(),
        "the voided directory was listed again"
    );
    let c2 = t2.entry(idx(&t2, "c/f2")).unwrap();
    assert_eq!(c2.stat.size, 14, "the voided file was stat'ed again");
    assert!(t2.is_validated(idx(&t2, "c/f2")) && t2.is_validated(idx(&t2, "b/new")));
    let a3 = idx(&t2, "a/f3");
    assert_eq!(
        t2.entry(a3).unwrap().stat.size,
        103,
        "taken over without a call"
    );
    assert!(!t2.is_validated(a3), "and left to the validation");
    let p2 = idx(&t2, "a/f1");
    assert_eq!(t2.state(p2).parts(), (State::Placed, 0));
    assert_eq!((t2.checksum(p2), t2.copy_identity(p2)), (77, (5, 6)));
    assert!(w2.stats.carried >= 10, "{:?}", w2.stats);
    // A tier the new table does not have: the copy is not carried.
    let prev = catalog::Prev {
        table: &t1,
        tier_map: vec![None],
        chunk_size: 0,
    };
    let (_m3, t3, _) = table_of(&root, t.path(), Some(&prev));
    assert_eq!(t3.state(idx(&t3, "a/f1")).parts(), (State::Unplaced, 0));
}

fn validate(t: &Table, root: &Path, immutable: bool) -> catalog::Validation {
    let epoch = lifecycle::new_attach(t, immutable);
    let v = catalog::Validation::new(t, epoch, immutable);
    catalog::validate::run(t, root, || false, &v);
    v
}

/// Every identity field: a file is validated only while device, inode, type, size, mtime and
/// ctime all hold — `cp -p`/`touch -d` restoring mtime is caught by ctime.
#[test]
fn validation_catches_every_identity_change() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    tree(&root);
    let (_m, table, _) = table_of(&root, t.path(), None);
    let set_mtime = |p: &Path, from: &Path| {
        let m = std::fs::metadata(from).unwrap();
        let ft = std::fs::FileTimes::new().set_modified(m.modified().unwrap());
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_times(ft)
            .unwrap();
    };
    let keep = t.path().join("keep");
    std::fs::copy(root.join("a/f0"), &keep).unwrap();
    set_mtime(&keep, &root.join("a/f0"));
    // Same size, mtime restored (only ctime tells).
    std::fs::write(root.join("a/f0"), vec![b'X'; 100]).unwrap();
    set_mtime(&root.join("a/f0"), &keep);
    // Replaced by rename (inode).
    std::fs::write(t.path().join("tmp"), vec![b'1'; 101]).unwrap();
    std::fs::rename(t.path().join("tmp"), root.join("a/f1")).unwrap();
    set_mtime(&root.join("a/f1"), &keep);
    // chmod and back (ctime only).
    use std::os::unix::fs::PermissionsExt;
    let f2 = root.join("a/f2");
    let mode = std::fs::metadata(&f2).unwrap().permissions().mode();
    std::fs::set_permissions(&f2, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&f2, std::fs::Permissions::from_mode(mode)).unwrap();
    // Removed; and a directory that gained a name.
    std::fs::remove_file(root.join("a/f3")).unwrap();
    std::fs::write(root.join("b/extra"), b"x").unwrap();
    let v = validate(&table, &root, false);
    let st = |p: &str| table.state(table.lookup(p.as_bytes()).unwrap()).state();
    let ok = |p: &str| table.is_validated(table.lookup(p.as_bytes()).unwrap());
    assert_eq!(st("a/f0"), State::Stale);
    assert_eq!(st("a/f1"), State::Stale);
    assert_eq!(st("a/f2"), State::Stale);
    assert_eq!(st("a/f3"), State::Gone);
    assert_eq!(
        st("b"),
        State::Stale,
        "a directory whose names changed lists from the source"
    );
    assert_eq!(
        st("a"),
        State::Stale,
        "renamed over and removed in: its names changed"
    );
    for p in ["a/f4", "b/f0", "b/f4", "c", "c/f1", ""] {
        assert!(ok(p), "{p} unchanged: validated");
    }
    assert_eq!(v.changed.load(std::sync::atomic::Ordering::Relaxed), 6);
}

/// An immutable source: one call per directory; an unchanged directory vouches for its files
/// (even one rewritten in place — that is what "immutable" promises), a changed one does not.
#[test]
fn immutable_validation_checks_directories() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    tree(&root);
    let (_m, table, _) = table_of(&root, t.path(), None);
    std::fs::write(root.join("c/f1"), vec![b'Z'; 101]).unwrap(); // in place: not seen
    std::fs::write(root.join("b/extra"), b"x").unwrap();
    std::fs::write(root.join("b/f0"), b"changed").unwrap();
    let v = validate(&table, &root, true);
    let idx = |p: &str| table.lookup(p.as_bytes()).unwrap();
    assert!(
        table.is_validated(idx("c/f1")),
        "vouched for by its directory"
    );
    assert_eq!(table.state(idx("b")).state(), State::Stale);
    assert_eq!(
        table.state(idx("b/f0")).state(),
        State::Stale,
        "checked one by one"
    );
    assert!(table.is_validated(idx("b/f1")));
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(v.dirs_checked.load(Relaxed), 4);
    assert_eq!(
        v.files_checked.load(Relaxed),
        5,
        "only the changed directory's files"
    );
}

/// The validator never checks an entry a client is checking at that moment (the source would
/// see two calls for it): it leaves the file to the client and waits for the client's verdict on
/// a directory; a claim left behind by a client that never finished does not stop the rest.
#[test]
fn the_validator_leaves_an_entry_a_client_is_checking() {
    use std::sync::atomic::Ordering::Relaxed;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    tree(&root);
    let (_m, table, _) = table_of(&root, t.path(), None);
    let epoch = lifecycle::new_attach(&table, false);
    let idx = |p: &str| table.lookup(p.as_bytes()).unwrap();
    let lifecycle::Check::Mine(file) = lifecycle::claim_check(&table, idx("a/f1")) else {
        panic!("a fresh attach: the first party claims")
    };
    let lifecycle::Check::Mine(dir) = lifecycle::claim_check(&table, idx("b")) else {
        panic!("a fresh attach: the first party claims")
    };
    let v = catalog::Validation::new(&table, epoch, false);
    std::thread::scope(|s| {
        let client = s.spawn(|| {
            // The client's `statx` of the directory takes a while; the validator waits for it.
            std::thread::sleep(std::time::Duration::from_millis(10));
            dir.finish(lifecycle::Verdict::Same)
        });
        catalog::validate::run(&table, &root, || false, &v);
        assert!(client.join().unwrap());
    });
    assert!(!table.is_validated(idx("a/f1")), "left to the client");
    assert!(table.is_validated(idx("b")) && table.is_validated(idx("b/f3")));
    assert_eq!(
        v.dirs_checked.load(Relaxed),
        3,
        "root, a, c: b was the client's"
    );
    assert_eq!(v.files_checked.load(Relaxed), 14);
    assert!(file.finish(lifecycle::Verdict::Same));
    assert!(table.is_validated(idx("a/f1")));
}

/// A saved catalog comes back as it was saved, minus what belongs to one run; it is refused for
/// another source, other credentials or other tiers.
#[test]
fn saved_catalogs_round_trip_and_are_refused_elsewhere() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    tree(&root);
    let (_m, table, _) = table_of(&root, t.path(), None);
    let placed = table.lookup(b"a/f1").unwrap();
    assert!(lifecycle::adopt_placed(&table, placed, 0, 9, 3, 4));
    let busy = table.lookup(b"a/f2").unwrap();
    let cell = lifecycle::EntryCell {
        table: &table,
        idx: busy,
    };
    assert!(lifecycle::claim(&cell) && lifecycle::start(&table, busy));
    table.push_request(granary_shm::request::OPEN_UNPLACED, 1);
    table.count(1, granary_shm::job::OPENS, 5);
    let saved = t.path().join("catalog.table");
    catalog::save(&saved, &table).unwrap();
    let dirs = vec![b"/t/objects".to_vec()];
    let ids = vec![(0, 0)];
    let root_b = root.as_os_str().as_bytes();
    let expect = catalog::Expect {
        source_real: root_b,
        creds: sys::creds(),
        tier_dirs: &dirs,
        tier_dir_ids: &ids,
    };
    let loaded = catalog::load(&saved, &t.path().join("live.table"), &expect).unwrap();
    let back = loaded.table;
    assert_eq!(back.entry_count(), table.entry_count());
    for i in 0..table.entry_count() {
        assert_eq!(back.entry(i), table.entry(i));
        assert!(
            !back.is_validated(i),
            "nothing is trusted before this attach's validation"
        );
    }
    assert_eq!(back.state(placed).parts(), (State::Placed, 0));
    assert_eq!(
        (back.checksum(placed), back.copy_identity(placed)),
        (9, (3, 4))
    );
    assert_eq!(
        back.state(busy).parts(),
        (State::Unplaced, 0),
        "a copy in progress is not one"
    );
    assert!(back.pop_request().is_none());
    assert_eq!(
        back.counter(1, granary_shm::job::OPENS)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(back.agent_pid(), std::process::id());
    let other = t.path().join("other");
    let mut e2 = catalog::Expect {
        source_real: other.as_os_str().as_bytes(),
        ..expect
    };
    assert!(matches!(
        catalog::load(&saved, &t.path().join("x.table"), &e2),
        Err(catalog::LoadError::Source(_))
    ));
    e2.source_real = root_b;
    e2.creds = (12345, 1, 2);
    assert!(matches!(
        catalog::load(&saved, &t.path().join("x.table"), &e2),
        Err(catalog::LoadError::Creds)
    ));
    e2.creds = sys::creds();
    let dirs2 = vec![b"/elsewhere".to_vec()];
    e2.tier_dirs = &dirs2;
    assert!(matches!(
        catalog::load(&saved, &t.path().join("x.table"), &e2),
        Err(catalog::LoadError::Tiers)
    ));
    assert!(
        !t.path().join("x.table").exists(),
        "a refused catalog leaves no table behind"
    );
    // A catalog an older agent saved in an earlier table layout is refused (the source is
    // walked again), and the log says why in words, not as a debug dump.
    let good = std::fs::read(&saved).unwrap();
    let mut bytes = good.clone();
    let v = granary_shm::layout::H_VERSION;
    bytes[v..v + 4].copy_from_slice(&(granary_shm::layout::VERSION - 1).to_ne_bytes());
    std::fs::write(&saved, &bytes).unwrap();
    let why = match catalog::load(&saved, &t.path().join("x.table"), &expect) {
        Err(e @ catalog::LoadError::Table(_)) => e.to_string(),
        other => panic!("an older layout loaded: {:?}", other.err()),
    };
    assert_eq!(
        why,
        format!(
            "not a usable table: table version {}, this build reads version {}",
            granary_shm::layout::VERSION - 1,
            granary_shm::layout::VERSION
        )
    );
    // A damaged file is refused, never trusted.
    let mut bytes = good;
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&saved, &bytes).unwrap();
    assert!(matches!(
        catalog::load(&saved, &t.path().join("x.table"), &expect),
        Err(catalog::LoadError::Table(_))
    ));
    assert!(matches!(
        catalog::load(&t.path().join("none"), &t.path().join("x.table"), &expect),
        Err(catalog::LoadError::Missing)
    ));
}
