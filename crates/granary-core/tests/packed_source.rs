//! A pack's index as the catalog (`granary_core::packed_source`), against the real tree: the same
//! paths and `statx` records as a walk, a locator for every packed file, and the per-directory
//! check finding what changed since packing (and, for a job joining others, since the table
//! was built).

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use granary_core::catalog::{self, Progress};
use granary_core::packed_source::{self, catalog::Options, PackIndex};
use granary_shm::{Catalog, Mapping, StatRec, State, StateWord, Table, TableSpec};

fn tree(root: &Path) {
    for d in ["a", "b", "b/deep", "c"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (i, f) in ["a/1", "a/2", "b/3", "b/deep/4", "c/5", "top"]
        .iter()
        .enumerate()
    {
        std::fs::write(root.join(f), vec![b'a' + i as u8; 1000 * (i + 1)]).unwrap();
    }
    std::os::unix::fs::symlink("a/1", root.join("link")).unwrap();
    std::fs::hard_link(root.join("a/1"), root.join("c/hard")).unwrap();
}

fn pack(src: &Path, out: &Path) -> PackIndex {
    let opts = granary_pack::Options {
        sync: false,
        ..Default::default()
    };
    granary_pack::pack(src, out, &opts, &granary_pack::Progress::default()).unwrap();
    PackIndex::open(out).unwrap()
}

/// Relative path → (record, locator present) of every node.
fn nodes(cat: &Catalog) -> BTreeMap<Vec<u8>, (StatRec, bool, StateWord)> {
    let mut paths = vec![Vec::new(); cat.len()];
    let mut out = BTreeMap::new();
    for i in 0..cat.len() {
        let n = &cat.nodes[i];
        if i > 0 {
            let mut p = paths[n.disk.parent as usize].clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(cat.name(i));
            paths[i] = p;
        }
        let packed = cat.locators.get(i).is_some_and(|l| l.is_packed());
        out.insert(paths[i].clone(), (cat.stat(i).unwrap(), packed, n.state));
    }
    out
}

/// What a pack's record and a walk's must share: all but the atime (a pack keeps the mtime there)
/// and what the walk learnt of attributes (a pack records none: nothing of them is answered for
/// a packed entry).
fn comparable(mut s: StatRec) -> StatRec {
    s.atime = Default::default();
    s.xattrs = 0;
    s
}

#[test]
fn the_index_is_the_tree_a_walk_sees() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let p = pack(&src, &t.path().join("pack"));
    let walk = catalog::walk(&src, None, 2, &Progress::default()).unwrap();
    let opts = Options {
        source: Some(&src),
        prev: None,
        root_parent_ino: 0,
    };
    let built = packed_source::build(&p.index, &opts).unwrap();
    let (w, b) = (nodes(&walk.catalog), nodes(&built.catalog));
    assert_eq!(w.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (path, (ws, _, _)) in &w {
        let (bs, packed, st) = b[path];
        assert_eq!(comparable(*ws), comparable(bs), "{path:?}");
        assert_eq!(packed, ws.is_file(), "{path:?}");
        assert!(!st.is_void(), "{path:?}");
    }
    assert_eq!(built.stats.files, 7);
    assert_eq!(built.stats.pack_files, 7);
    assert_eq!(built.stats.pack_dirs_checked, 5);
    assert_eq!(built.stats.pack_dirs_changed, 0);
    // Only the pack: the same records, nothing asked of any tree.
    std::fs::rename(&src, t.path().join("gone")).unwrap();
    let alone = Options {
        source: None,
        prev: None,
        root_parent_ino: 7,
    };
    let m = packed_source::build(&p.index, &alone).unwrap();
    assert_eq!(m.root_parent_ino, 7);
    let mm = nodes(&m.catalog);
    for (path, (ws, _, _)) in &w {
        assert_eq!(comparable(*ws), comparable(mm[path].0), "{path:?}");
    }
}

fn change(src: &Path) {
    let tmp = src.join("../replacement");
    std::fs::write(&tmp, b"replaced").unwrap();
    std::fs::rename(&tmp, src.join("a/2")).unwrap();
    std::fs::write(src.join("a/new"), b"new").unwrap();
    std::fs::remove_file(src.join("b/3")).unwrap();
    std::fs::create_dir(src.join("c/more")).unwrap();
    std::fs::write(src.join("c/more/x"), b"x").unwrap();
}

#[test]
fn changed_directories_are_listed_and_their_changes_come_from_the_source() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let p = pack(&src, &t.path().join("pack"));
    change(&src);
    let opts = Options {
        source: Some(&src),
        prev: None,
        root_parent_ino: 0,
    };
    let b = packed_source::build(&p.index, &opts).unwrap();
    let n = nodes(&b.catalog);
    let walk = nodes(
        &catalog::walk(&src, None, 2, &Progress::default())
            .unwrap()
            .catalog,
    );
    assert_eq!(
        n.keys().collect::<Vec<_>>(),
        walk.keys().collect::<Vec<_>>()
    );
    for (path, packed) in [
        (&b"a/1"[..], true),
        (b"a/2", false),
        (b"a/new", false),
        (b"c/5", true),
        (b"c/more/x", false),
        (b"top", true),
    ] {
        assert_eq!(n[path].1, packed, "{:?}", String::from_utf8_lossy(path));
        assert_eq!(comparable(n[path].0), comparable(walk[path].0), "{path:?}");
    }
    assert!(!n.contains_key(&b"b/3"[..]));
    // a, b and c changed (and the new c/more was walked); the root and b/deep did not.
    assert_eq!(b.stats.pack_dirs_changed, 3, "{:?}", b.stats);
    assert_eq!(b.stats.pack_source_files, 3, "{:?}", b.stats);
}

fn table_of(cat: &Catalog, src: &Path, dir: &Path) -> (Mapping, Table) {
    let spec = TableSpec {
        source: src.as_os_str().as_bytes().to_vec(),
        source_real: src.as_os_str().as_bytes().to_vec(),
        ring_cap: 64,
        job_slots: 2,
        ..Default::default()
    };
    map_table(&spec, cat, dir)
}

/// The table `spec` gives `cat`, written to `dir/table` and mapped as a job maps it.
fn map_table(spec: &TableSpec, cat: &Catalog, dir: &Path) -> (Mapping, Table) {
    let img = granary_shm::build_catalog(spec, cat).unwrap();
    let path = dir.join("table");
    std::fs::write(&path, &img).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), img.len()).unwrap()
}

#[test]
fn a_joining_job_voids_what_changed_per_directory() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let p = pack(&src, &t.path().join("pack"));
    let opts = Options {
        source: Some(&src),
        prev: None,
        root_parent_ino: 0,
    };
    let b = packed_source::build(&p.index, &opts).unwrap();
    let (_m, table) = table_of(&b.catalog, &src, t.path());
    assert_eq!(packed_source::recheck(&table, &src).dirs_changed, 0);
    change(&src);
    let r = packed_source::recheck(&table, &src);
    assert_eq!((r.dirs_checked, r.dirs_changed), (5, 3), "{r:?}");
    let st = |rel: &[u8]| table.state(table.lookup(rel).unwrap()).state();
    assert_eq!(st(b"a"), State::Stale);
    assert_eq!(st(b"a/2"), State::Stale);
    assert_eq!(st(b"b/3"), State::Gone);
    assert_eq!(st(b"a/1"), State::Unplaced);
    assert_eq!(st(b"b/deep/4"), State::Unplaced);
}

/// What a program waiting for one file makes the source read first is its segment: consecutive
/// files spanning at most 512 KiB of the partition (a read that costs the source no more than
/// its request, docs/pack-format.md), a larger file alone; a block read of the sweep spans
/// several.
#[test]
fn a_waited_for_file_costs_at_most_a_512_kib_segment() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 8 files of 200 KiB: segments of two (400 KiB; three would span 600 KiB), then one of
    // 700 KiB alone, then one of 10 KiB.
    let mut sizes = vec![200 << 10; 8];
    sizes.extend([700 << 10, 10 << 10]);
    for (i, &n) in sizes.iter().enumerate() {
        std::fs::write(src.join(format!("f{i:02}")), vec![i as u8; n]).unwrap();
    }
    let p = pack(&src, &t.path().join("pack"));
    let b = packed_source::build(
        &p.index,
        &Options {
            source: Some(&src),
            prev: None,
            root_parent_ino: 0,
        },
    )
    .unwrap();
    let h = *p.index.header();
    let spec = TableSpec {
        source: src.as_os_str().as_bytes().to_vec(),
        source_real: src.as_os_str().as_bytes().to_vec(),
        ring_cap: 64,
        job_slots: 2,
        pack: Some(granary_shm::PackSpec {
            dir: t.path().join("pack").as_os_str().as_bytes().to_vec(),
            empty_dir: t.path().as_os_str().as_bytes().to_vec(),
            block_size: h.block_size,
            partitions: h.partition_count,
            id: h.pack_id,
            mount: false,
        }),
        ..Default::default()
    };
    let (_m, table) = map_table(&spec, &b.catalog, t.path());
    let st = granary_core::placement::pack_streamer::Streamer::new(&table, p.partitions(), 8 << 20);
    // f00+f01, f02+f03, f04+f05, f06+f07, f08, f09.
    assert_eq!(st.segments(), 6);
}
