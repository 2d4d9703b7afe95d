//! The catalog against what std reports, and reuse of copies across walks.

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use granary_core::catalog::{self, Progress};
use granary_core::config::Verify;
use granary_core::sys;
use granary_core::tiers::{TierSpec, Tiers};
use granary_shm::{object_id, object_name, state, Mapping, TableSpec};
use proptest::prelude::*;

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

/// A copy's identity as the agent records it at placement: inode, ctime ns.
fn identity(p: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (
        m.ino(),
        m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64,
    )
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
        let w = catalog::walk(&root, 4, &Progress::default()).unwrap();
        let img = granary_shm::build(&spec(&root, &[]), &w.entries).unwrap();
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
    let w = catalog::walk(&root, 2, &Progress::default()).unwrap();
    std::fs::set_permissions(root.join("closed"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = w.entries.iter().find(|e| e.rel_path == b"closed").unwrap();
    assert_eq!(state::state_of(e.state), state::STALE);
    assert!(e.children.is_empty());
}

/// Walk, "place" some files by hand, save; change, delete and damage some; walk again: only
/// files whose size, mtime and object still match keep their placement.
#[test]
fn reuse_keeps_only_valid_copies() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    let objects = t.path().join("tier/objects");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(&objects).unwrap();
    let names = [
        "keep", "changed", "deleted", "noobject", "badsize", "d/keep2",
    ];
    for n in names {
        std::fs::write(root.join(n), n.repeat(100)).unwrap();
    }
    let tiers = Tiers::new(vec![TierSpec {
        path: t.path().join("tier"),
        capacity: 1 << 20,
        block_size: 4096,
        ..Default::default()
    }]);
    let dirs = vec![objects.clone()];
    let fds = vec![Some(sys::open_dir(&objects).unwrap())];
    let mut w = catalog::walk(&root, 2, &Progress::default()).unwrap();
    let out = catalog::reuse(&mut w.entries, None, &dirs, &fds, &tiers, Verify::Size, 2);
    assert_eq!(out.files, 0);
    for e in w.entries.iter_mut().filter(|e| e.stat.is_file()) {
        let o = objects.join(std::str::from_utf8(&object_name(object_id(&e.rel_path))).unwrap());
        std::fs::copy(root.join(std::ffi::OsStr::from_bytes(&e.rel_path)), &o).unwrap();
        e.state = state::word(state::PLACED, 0);
        e.checksum = 7;
        (e.copy_ino, e.copy_ctime) = identity(&o);
    }
    let saved = t.path().join("catalog.table");
    catalog::save(&saved, &spec(&root, &dirs), &w.entries).unwrap();
    std::fs::write(objects.join(".tmp-leftover-1-1"), b"partial").unwrap();

    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(root.join("changed"), b"new content").unwrap();
    std::fs::remove_file(root.join("deleted")).unwrap();
    let obj =
        |n: &str| objects.join(std::str::from_utf8(&object_name(object_id(n.as_bytes()))).unwrap());
    std::fs::remove_file(obj("noobject")).unwrap();
    std::fs::write(obj("badsize"), b"short").unwrap();

    let prev = catalog::load_persisted(&saved).unwrap();
    let tiers = Tiers::new(tiers.specs());
    let mut w2 = catalog::walk(&root, 2, &Progress::default()).unwrap();
    let out = catalog::reuse(
        &mut w2.entries,
        Some(&prev),
        &dirs,
        &fds,
        &tiers,
        Verify::Size,
        2,
    );
    let placed: Vec<&[u8]> = w2
        .entries
        .iter()
        .filter(|e| state::state_of(e.state) == state::PLACED)
        .map(|e| e.rel_path.as_slice())
        .collect();
    let mut placed = placed;
    placed.sort();
    assert_eq!(placed, vec![b"d/keep2".as_slice(), b"keep".as_slice()]);
    assert_eq!(out.files, 2);
    assert_eq!(tiers.usage()[0].used, 2 * 4096);
    let mut left: Vec<String> = std::fs::read_dir(&objects)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want = vec![
        std::str::from_utf8(&object_name(object_id(b"keep")))
            .unwrap()
            .to_string(),
        std::str::from_utf8(&object_name(object_id(b"d/keep2")))
            .unwrap()
            .to_string(),
    ];
    want.sort();
    assert_eq!(left, want, "stale objects and temporaries are removed");
    let e = w2.entries.iter().find(|e| e.rel_path == b"keep").unwrap();
    assert_eq!(e.checksum, 7);
}

/// With `Verify::Checksum`, a reused copy whose contents changed (same size, one byte flipped)
/// is rejected and deleted; intact copies are kept; a `.part` left by a killed agent is deleted.
#[test]
fn reuse_rehashes_copies() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    let objects = t.path().join("tier/objects");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&objects).unwrap();
    for (i, n) in ["good", "flipped", "truncated"].iter().enumerate() {
        std::fs::write(root.join(n), vec![i as u8 + 1; 10_000]).unwrap();
    }
    let tiers = Tiers::new(vec![TierSpec {
        path: t.path().join("tier"),
        capacity: 1 << 20,
        block_size: 4096,
        ..Default::default()
    }]);
    let dirs = vec![objects.clone()];
    let fds = vec![Some(sys::open_dir(&objects).unwrap())];
    let mut w = catalog::walk(&root, 2, &Progress::default()).unwrap();
    let obj = |n: &[u8]| objects.join(std::str::from_utf8(&object_name(object_id(n))).unwrap());
    for e in w.entries.iter_mut().filter(|e| e.stat.is_file()) {
        let bytes = std::fs::read(root.join(std::ffi::OsStr::from_bytes(&e.rel_path))).unwrap();
        std::fs::write(obj(&e.rel_path), &bytes).unwrap();
        e.state = state::word(state::PLACED, 0);
        e.checksum = xxhash_rust::xxh3::xxh3_64(&bytes).max(1);
        (e.copy_ino, e.copy_ctime) = identity(&obj(&e.rel_path));
    }
    let saved = t.path().join("catalog.table");
    catalog::save(&saved, &spec(&root, &dirs), &w.entries).unwrap();
    let mut f = std::fs::read(obj(b"flipped")).unwrap();
    f[5000] ^= 0x40;
    std::fs::write(obj(b"flipped"), f).unwrap();
    std::fs::write(obj(b"truncated"), [3u8; 100]).unwrap();
    let part = objects.join("0123456789abcdef.part");
    std::fs::write(&part, b"torn").unwrap();

    let prev = catalog::load_persisted(&saved).unwrap();
    let mut w2 = catalog::walk(&root, 2, &Progress::default()).unwrap();
    let out = catalog::reuse(
        &mut w2.entries,
        Some(&prev),
        &dirs,
        &fds,
        &tiers,
        Verify::Checksum,
        4,
    );
    assert_eq!((out.files, out.rejected), (1, 2), "{out:?}");
    let st = |n: &[u8]| {
        let e = w2.entries.iter().find(|e| e.rel_path == n).unwrap();
        state::state_of(e.state)
    };
    assert_eq!(st(b"good"), state::PLACED);
    assert_eq!(st(b"flipped"), state::UNPLACED);
    assert_eq!(st(b"truncated"), state::UNPLACED);
    assert!(obj(b"good").exists());
    assert!(!obj(b"flipped").exists(), "a corrupt copy is deleted");
    assert!(!obj(b"truncated").exists());
    assert!(!part.exists(), "a part left by a killed agent is deleted");
    assert_eq!(
        tiers.usage()[0].used,
        tiers.charge(0, 10_000),
        "only the good copy"
    );
}

/// A copy is reused only while the source is the same version: the same size and mtime are not
/// enough (`cp -p`, `touch -d` restore mtime; ctime and inode tell). And a copy changed after
/// placement (its ctime moved) is rejected without being hashed.
#[test]
fn reuse_needs_the_same_source_version_and_the_same_copy() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("src");
    let objects = t.path().join("tier/objects");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&objects).unwrap();
    for n in ["same", "rewritten", "replaced", "touched-copy"] {
        std::fs::write(root.join(n), n.repeat(50)).unwrap();
    }
    let tiers = Tiers::new(vec![TierSpec {
        path: t.path().join("tier"),
        capacity: 1 << 20,
        block_size: 4096,
        ..Default::default()
    }]);
    let dirs = vec![objects.clone()];
    let fds = vec![Some(sys::open_dir(&objects).unwrap())];
    let obj = |n: &[u8]| objects.join(std::str::from_utf8(&object_name(object_id(n))).unwrap());
    let mut w = catalog::walk(&root, 2, &Progress::default()).unwrap();
    for e in w.entries.iter_mut().filter(|e| e.stat.is_file()) {
        std::fs::copy(
            root.join(std::ffi::OsStr::from_bytes(&e.rel_path)),
            obj(&e.rel_path),
        )
        .unwrap();
        e.state = state::word(state::PLACED, 0);
        e.checksum = 7;
        (e.copy_ino, e.copy_ctime) = identity(&obj(&e.rel_path));
    }
    let saved = t.path().join("catalog.table");
    catalog::save(&saved, &spec(&root, &dirs), &w.entries).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Same size, mtime restored: only the ctime tells.
    let keep_mtime = |p: &Path, f: &dyn Fn()| {
        let m = std::fs::metadata(p).unwrap().modified().unwrap();
        f();
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(m)
            .unwrap();
    };
    let r = root.join("rewritten");
    keep_mtime(&r, &|| std::fs::write(&r, "X".repeat(9 * 50)).unwrap());
    // Another inode, same size and mtime.
    let p = root.join("replaced");
    keep_mtime(&p, &|| {
        std::fs::write(root.join("tmp"), "replaced".repeat(50)).unwrap();
        std::fs::rename(root.join("tmp"), &p).unwrap();
    });
    // The copy touched after placement (same bytes): its ctime moved.
    std::fs::write(obj(b"touched-copy"), "touched-copy".repeat(50)).unwrap();

    let prev = catalog::load_persisted(&saved).unwrap();
    let mut w2 = catalog::walk(&root, 2, &Progress::default()).unwrap();
    let out = catalog::reuse(
        &mut w2.entries,
        Some(&prev),
        &dirs,
        &fds,
        &tiers,
        Verify::Size,
        2,
    );
    let placed: Vec<&[u8]> = w2
        .entries
        .iter()
        .filter(|e| state::state_of(e.state) == state::PLACED)
        .map(|e| e.rel_path.as_slice())
        .collect();
    assert_eq!(placed, vec![b"same".as_slice()], "{out:?}");
    assert_eq!(out.rejected, 1, "the touched copy: {out:?}");
}
