//! Every way an index or partition can be damaged or forged gives a clear error: the checksums
//! catch damage; the structural checks catch indexes whose checksums were recomputed on purpose.

mod common;

use common::{packed, read_all};
use granary_pack::format::entry::{codec, flags, IndexEntry, INDEX_ENTRY_LEN};
use granary_pack::format::header::{reseal_index, IndexHeader};
use granary_pack::{Compression, Index, Pack, PackError};
use std::path::Path;

type EntryEdit = Box<dyn FnOnce(&mut IndexEntry)>;
type HeaderEdit = Box<dyn Fn(&mut IndexHeader)>;

fn index_bytes(p: &common::Packed) -> Vec<u8> {
    std::fs::read(p.pack().join("index")).unwrap()
}

fn header(b: &[u8]) -> IndexHeader {
    IndexHeader::decode(b, Path::new("index")).unwrap()
}

/// Applies `f` to entry `i` of the index image, recomputes every checksum, parses.
fn forge(b: &[u8], i: u32, f: impl FnOnce(&mut IndexEntry)) -> Result<Index, PackError> {
    let mut b = b.to_vec();
    let h = header(&b);
    let off = h.entries.off as usize + i as usize * INDEX_ENTRY_LEN;
    let mut e = IndexEntry::decode(&b[off..off + INDEX_ENTRY_LEN]);
    f(&mut e);
    b[off..off + INDEX_ENTRY_LEN].copy_from_slice(&e.encode());
    reseal(&mut b);
    Index::parse(b, Path::new("index"))
}

/// Reseal including the pack id (a forger would recompute it too).
fn reseal(b: &mut [u8]) {
    reseal_index(b);
    let mut h = header(b);
    h.pack_id = granary_pack::index::pack_id(&h);
    b[..256].copy_from_slice(&h.encode());
}

fn find(ix: &Index, path: &[u8]) -> (u32, IndexEntry) {
    let i = ix.lookup(path).unwrap();
    (i, ix.entry(i).unwrap())
}

fn corrupt_msg(r: Result<Index, PackError>) -> String {
    match r {
        Err(PackError::Corrupt { what, .. }) => what,
        Err(e) => panic!("expected a corrupt-pack error, got {e}"),
        Ok(_) => panic!("a forged index was accepted"),
    }
}

#[test]
fn forged_structures_are_refused() {
    let p = packed(Compression::Zstd(1), 2);
    let b = index_bytes(&p);
    let ix = Index::parse(b.clone(), Path::new("index")).unwrap();
    let n = ix.len();
    let (a, _) = find(&ix, b"a");
    // a/noise has a second name (hard), so data forgeries go to a/text.
    let (noise, ne) = find(&ix, b"a/text");
    let (text, _) = find(&ix, b"a/noise");
    let (link, _) = find(&ix, b"a/link");
    let (hard, _) = find(&ix, b"hard");

    // The forged index parses only if the structure holds: reseal alone changes nothing.
    assert!(forge(&b, 0, |_| {}).is_ok());
    let cases: Vec<(&str, &str, u32, EntryEdit)> = vec![
        (
            "children past the end",
            "children out of range",
            a,
            Box::new(move |e| e.first_child = n - 1),
        ),
        (
            "huge child count",
            "children out of range",
            a,
            Box::new(|e| e.child_count = u32::MAX),
        ),
        (
            "cycle: a directory listing itself",
            "before their directory",
            a,
            Box::new(move |e| e.first_child = a),
        ),
        (
            "cycle: listing the root",
            "before their directory",
            a,
            Box::new(|e| e.first_child = 0),
        ),
        (
            "root with a parent",
            "not the root",
            0,
            Box::new(|e| e.parent = 3),
        ),
        (
            "child naming another parent",
            "names 0 as its parent",
            noise,
            Box::new(|e| e.parent = 0),
        ),
        (
            "duplicate name",
            "not strictly sorted",
            text,
            Box::new(move |e| {
                e.name_off = ne.name_off;
                e.name_len = ne.name_len;
            }),
        ),
        (
            "name outside the pool",
            "outside the names section",
            noise,
            Box::new(|e| e.name_off = u64::MAX - 2),
        ),
        (
            "empty name",
            "empty name",
            noise,
            Box::new(|e| e.name_len = 0),
        ),
        (
            "offset past the partition",
            "outside partition",
            noise,
            Box::new(|e| e.offset = 1 << 40),
        ),
        (
            "offset inside the header",
            "outside partition",
            noise,
            Box::new(|e| e.offset = 5),
        ),
        (
            "offset overflow",
            "outside partition",
            noise,
            Box::new(|e| e.offset = u64::MAX - 3),
        ),
        (
            "stored length past the end",
            "outside partition",
            noise,
            Box::new(|e| e.stored_len = u64::MAX),
        ),
        (
            "missing partition",
            "does not exist",
            noise,
            Box::new(|e| e.partition = 99),
        ),
        ("unknown codec", "codec 9", noise, Box::new(|e| e.codec = 9)),
        (
            "size differs from raw stored length",
            "codec 0",
            noise,
            Box::new(|e| {
                e.codec = codec::NONE;
                e.stat.size += 1;
            }),
        ),
        (
            "unknown flags",
            "unknown flags",
            noise,
            Box::new(|e| e.flags |= 0x80),
        ),
        (
            "hard link to nothing",
            "missing entry",
            hard,
            Box::new(|e| {
                e.flags |= flags::HARDLINK;
                e.link_entry = u32::MAX - 1;
            }),
        ),
        (
            "hard link to a directory",
            "data differs",
            hard,
            Box::new(move |e| {
                e.flags |= flags::HARDLINK;
                e.link_entry = a;
            }),
        ),
        (
            "hard link to itself",
            "missing entry",
            hard,
            Box::new(move |e| {
                e.flags |= flags::HARDLINK;
                e.link_entry = hard;
            }),
        ),
        (
            "symlink target outside the pool",
            "symlink target outside",
            link,
            Box::new(|e| e.link_len = u32::MAX),
        ),
        (
            "children on a file",
            "children on a non-directory",
            noise,
            Box::new(|e| e.child_count = 1),
        ),
    ];
    for (what, expect, i, f) in cases {
        let msg = corrupt_msg(forge(&b, i, f));
        assert!(msg.contains(expect), "{what}: {msg}");
        eprintln!("{what}: {msg}");
    }

    // A name with `/` or `..` written into the names pool.
    for bad in [&b".."[..], b"a/b", b"x\0"] {
        let mut m = b.clone();
        let h = header(&m);
        let at = (h.names.off + ne.name_off) as usize;
        m[at..at + bad.len()].copy_from_slice(bad);
        reseal(&mut m);
        let mut m2 = m.clone();
        let off = h.entries.off as usize + noise as usize * INDEX_ENTRY_LEN;
        let mut e = IndexEntry::decode(&m2[off..off + INDEX_ENTRY_LEN]);
        e.name_len = bad.len() as u32;
        m2[off..off + INDEX_ENTRY_LEN].copy_from_slice(&e.encode());
        reseal(&mut m2);
        let msg = corrupt_msg(Index::parse(m2, Path::new("index")));
        assert!(msg.contains(&format!("entry {noise}")), "{msg}");
    }
}

#[test]
fn forged_headers_are_refused() {
    let p = packed(Compression::None, 1);
    let b = index_bytes(&p);
    let edits: Vec<(&str, HeaderEdit)> = vec![
        (
            "huge entry count",
            Box::new(|h| h.entry_count = u64::MAX / 2),
        ),
        (
            "entry count beyond the section",
            Box::new(|h| h.entry_count += 1),
        ),
        ("no entries", Box::new(|h| h.entry_count = 0)),
        (
            "huge partition count",
            Box::new(|h| h.partition_count = u32::MAX),
        ),
        ("section past the end", Box::new(|h| h.names.len += 1)),
        (
            "section inside the header",
            Box::new(|h| h.partitions.off = 8),
        ),
        (
            "section offset overflow",
            Box::new(|h| h.names.off = u64::MAX - 1),
        ),
        ("odd block size", Box::new(|h| h.block_size = 1000)),
        ("short entries", Box::new(|h| h.entry_len = 100)),
    ];
    for (what, edit) in edits {
        let mut m = b.clone();
        let mut h = header(&m);
        edit(&mut h);
        m[..256].copy_from_slice(&h.encode());
        reseal(&mut m);
        let msg = corrupt_msg(Index::parse(m, Path::new("index")));
        eprintln!("{what}: {msg}");
    }
    // A newer major version is named as such.
    let mut m = b.clone();
    m[12] = 2;
    reseal_index(&mut m);
    assert!(matches!(
        Index::parse(m, Path::new("index")),
        Err(PackError::Version { major: 2, .. })
    ));
}

#[test]
fn damaged_partitions_give_errors_never_wrong_bytes() {
    let p = packed(Compression::Zstd(1), 2);
    let part = p.pack().join("part-00000");
    let orig = std::fs::read(&part).unwrap();

    // A cut partition: refused as a whole, naming the truncation.
    std::fs::write(&part, &orig[..orig.len() - 1]).unwrap();
    let pack = Pack::open(&p.pack()).unwrap();
    let e = pack.partition(0).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");

    // One flipped byte in the data: the file holding it fails its checksum, others read.
    let mut flipped = orig.clone();
    let at = orig.len() - 10;
    flipped[at] ^= 0x40;
    std::fs::write(&part, &flipped).unwrap();
    let pack = Pack::open(&p.pack()).unwrap();
    let all = read_all(&pack);
    let bad: Vec<_> = all.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(!bad.is_empty(), "a flipped byte went unnoticed");
    for (path, r) in &all {
        if let Ok(bytes) = r {
            assert_eq!(bytes, &p.files[path], "{}", String::from_utf8_lossy(path));
        }
    }

    // A flipped header byte; a partition of another pack.
    let mut h = orig.clone();
    h[40] ^= 1;
    std::fs::write(&part, &h).unwrap();
    let e = Pack::open(&p.pack())
        .unwrap()
        .partition(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("header checksum"), "{e}");
    let other = packed(Compression::None, 2);
    std::fs::copy(other.pack().join("part-00000"), &part).unwrap();
    let e = Pack::open(&p.pack())
        .unwrap()
        .partition(0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("another pack") || e.contains("bytes long"),
        "{e}"
    );

    // Missing partition and missing index.
    std::fs::remove_file(&part).unwrap();
    assert!(Pack::open(&p.pack()).unwrap().partition(0).is_err());
    std::fs::remove_file(p.pack().join("index")).unwrap();
    assert!(Pack::open(&p.pack()).is_err());
}
