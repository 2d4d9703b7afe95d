//! Property tests over arbitrary and mutated bytes: the readers never panic, never loop, and
//! never return bytes that differ from what was packed. Runs in CI with the normal test suite.

mod common;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use common::{packed, read_all, Packed};
use granary_pack::format::header::reseal_index;
use granary_pack::{Compression, Index, Pack};
use proptest::prelude::*;

fn fixture() -> &'static Packed {
    static P: OnceLock<Packed> = OnceLock::new();
    P.get_or_init(|| packed(Compression::Zstd(1), 2))
}

fn index_bytes() -> &'static Vec<u8> {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| std::fs::read(fixture().pack().join("index")).unwrap())
}

/// Everything a reader can do with an index: every entry, name, listing, lookup, path.
fn exercise(ix: &Index) {
    for i in 0..ix.len().min(10_000) {
        let Some(e) = ix.entry(i) else { continue };
        let _ = ix.name(&e);
        let _ = ix.link_target(&e);
        let p = ix.path_of(i);
        if let Ok(j) = ix.lookup(&p) {
            assert_eq!(j, i, "lookup of an entry's own path finds another entry");
        }
        for c in ix.children(&e).take(10_000) {
            let _ = ix.entry(c);
        }
    }
}

fn mutate(base: &[u8], edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    let mut b = base.to_vec();
    for &(at, x) in edits {
        let n = b.len();
        b[at % n] ^= x.max(1);
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any damage to the index — flipped bytes anywhere, or a cut — is refused: every byte of
    /// it is under a checksum.
    #[test]
    fn damaged_index_is_refused(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
                                cut in prop::option::of(any::<usize>())) {
        let b = mutate(index_bytes(), &edits, cut);
        prop_assert!(Index::parse(b, Path::new("index")).is_err());
    }

    /// Damage whose checksums were recomputed (a forged index) reaches the structural checks:
    /// no panic, and whatever parses is fully usable.
    #[test]
    fn forged_index_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut b = index_bytes().clone();
        // Past the header, so the sections stay where they are and the entries get the damage.
        for (at, x) in edits {
            let n = b.len() - 256;
            b[256 + at % n] ^= x.max(1);
        }
        reseal_index(&mut b);
        let mut h = granary_pack::format::IndexHeader::decode(&b, Path::new("i")).unwrap();
        h.pack_id = granary_pack::index::pack_id(&h);
        b[..256].copy_from_slice(&h.encode());
        if let Ok(ix) = Index::parse(b, Path::new("index")) {
            exercise(&ix);
        }
    }

    /// Arbitrary bytes, with or without a valid-looking header in front.
    #[test]
    fn arbitrary_index_never_panics(mut b in prop::collection::vec(any::<u8>(), 0..4096),
                                    keep_header in any::<bool>()) {
        if keep_header && b.len() >= 256 {
            b[..256].copy_from_slice(&index_bytes()[..256]);
            reseal_index(&mut b);
        }
        if let Ok(ix) = Index::parse(b, Path::new("index")) {
            exercise(&ix);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Damaged or cut partitions: each file reads back exactly or gives an error.
    #[test]
    fn damaged_partition_never_gives_wrong_bytes(part in 0u32..2,
                                                 edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
                                                 cut in prop::option::of(any::<usize>())) {
        let p = fixture();
        let dir = tempfile::tempdir().unwrap();
        for f in ["index", "part-00000", "part-00001"] {
            std::fs::copy(p.pack().join(f), dir.path().join(f)).unwrap();
        }
        let name = format!("part-{part:05}");
        let orig = std::fs::read(dir.path().join(&name)).unwrap();
        std::fs::write(dir.path().join(&name), mutate(&orig, &edits, cut)).unwrap();
        let pack = Pack::open(dir.path()).unwrap();
        let mut errors = 0;
        for (path, r) in read_all(&pack) {
            match r {
                Ok(bytes) => prop_assert_eq!(&bytes, &p.files[&path]),
                Err(_) => errors += 1,
            }
        }
        prop_assert!(errors > 0, "damage to {} went unnoticed", name);
    }
}

fn name_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            Just(b'a'),
            Just(b' '),
            Just(b'\n'),
            Just(0xffu8),
            Just(b'.'),
            1u8..=255
        ],
        1..12,
    )
    .prop_filter("a valid name", |n| {
        granary_pack::format::name::component_problem(n).is_none()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random trees round-trip through every codec and partition count, and packing the same
    /// tree twice gives the same bytes.
    #[test]
    fn random_trees_round_trip(files in prop::collection::btree_map(
                                   prop::collection::vec(name_strategy(), 1..4),
                                   (0usize..200_000, any::<bool>(), any::<u64>()), 1..20),
                               comp in prop_oneof![Just(Compression::None), Just(Compression::Lz4), Just(Compression::Zstd(1))],
                               partitions in 1u32..5) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let mut expect = BTreeMap::new();
        for (parts, (size, compressible, seed)) in files {
            let rel = parts.join(&b'/');
            let path = src.join(std::ffi::OsStr::from_bytes(&rel));
            // A name used as a file and as a directory: keep the first.
            if std::fs::create_dir_all(path.parent().unwrap()).is_err() || path.exists() {
                continue;
            }
            let data = if compressible { vec![(seed % 3) as u8; size] } else { common::noise(seed, size) };
            std::fs::write(&path, &data).unwrap();
            expect.insert(rel, data);
        }
        let opts = granary_pack::Options {
            compression: comp,
            partitions: Some(partitions),
            block_size: 1 << 14,
            sync: false,
            ..Default::default()
        };
        let progress = granary_pack::Progress::default();
        granary_pack::pack(&src, &dir.path().join("p1"), &opts, &progress).unwrap();
        granary_pack::pack(&src, &dir.path().join("p2"), &opts, &progress).unwrap();
        let pack = Pack::open(&dir.path().join("p1")).unwrap();
        let got: BTreeMap<_, _> = read_all(&pack).into_iter().map(|(k, v)| (k, v.unwrap())).collect();
        prop_assert_eq!(got, expect);
        for f in std::fs::read_dir(dir.path().join("p1")).unwrap() {
            let f = f.unwrap();
            let twin = std::fs::read(dir.path().join("p2").join(f.file_name())).unwrap();
            prop_assert!(std::fs::read(f.path()).unwrap() == twin, "{:?} differs between two packs", f.file_name());
        }
    }
}

/// A server maps the index instead of reading it: the mapped view answers exactly as the read one.
#[test]
fn mapped_index_answers_like_a_read_one() {
    let p = fixture();
    let mapped = granary_pack::map_index(&p.pack()).unwrap();
    let read = Index::parse(index_bytes().clone(), Path::new("index")).unwrap();
    assert_eq!(mapped.header(), read.header());
    for i in 0..read.len() {
        let path = read.path_of(i);
        assert_eq!(mapped.path_of(i), path);
        assert_eq!(mapped.lookup(&path).unwrap(), i);
        assert_eq!(mapped.entry(i), read.entry(i));
    }
}
