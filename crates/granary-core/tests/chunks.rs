//! Chunk files (`placement::chunks`) against real files: format, validation on reuse,
//! coalescing against a model.

use std::os::unix::fs::{FileExt, MetadataExt};

use granary_core::placement::chunks::{self, ChunkFile, ChunkGeometry};
use granary_core::sys;
use granary_shm::layout::{chunk_data_offset, CHUNK_MAGIC};
use proptest::prelude::*;

const CHUNK: u64 = 4096;

fn source(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn geo(size: u64) -> ChunkGeometry {
    ChunkGeometry {
        chunk_size: CHUNK,
        size,
        mtime: (1_700_000_000, 123),
        ctime: (1_700_000_001, 5),
        dev: (8, 1),
        ino: 4242,
    }
}

#[test]
fn write_validate_and_reject() {
    let d = tempfile::tempdir().unwrap();
    let dir = sys::open_dir(d.path()).unwrap();
    // Five chunks, the last one short.
    let size = 4 * CHUNK + 100;
    let data = source(size as usize);
    let src_path = d.path().join("src");
    std::fs::write(&src_path, &data).unwrap();
    let g = geo(size);
    let cf = ChunkFile::create(&dir, b"x.chunks", g).unwrap();
    assert!(
        ChunkFile::create(&dir, b"x.chunks", g).is_err(),
        "O_EXCL: never reuses a file by accident"
    );
    let meta = std::fs::metadata(d.path().join("x.chunks")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.len(), chunk_data_offset(size, CHUNK) + size);
    assert_eq!(cf.validate().unwrap(), vec![0], "nothing present yet");

    // Chunks 1 and 4 (the short one), from the source.
    let src = std::fs::File::open(&src_path).unwrap();
    let mut buf = Vec::new();
    let mut done = Vec::new();
    assert_eq!(
        chunks::fetch(&src, &cf, 1, 1, &mut buf, |k| done.push(k)).unwrap(),
        CHUNK
    );
    assert_eq!(
        chunks::fetch(&src, &cf, 4, 1, &mut buf, |k| done.push(k)).unwrap(),
        100
    );
    assert_eq!(done, vec![1, 4]);
    assert!(
        cf.write_chunk(4, &data[..CHUNK as usize]).is_err(),
        "last chunk is short"
    );
    assert!(cf.write_chunk(5, &[0; 1]).is_err(), "no chunk 5");
    assert_eq!(cf.validate().unwrap(), vec![0b10010]);

    // The bytes sit where the layout (and the preload library) expects them.
    let raw = std::fs::read(d.path().join("x.chunks")).unwrap();
    let off = chunk_data_offset(size, CHUNK) as usize;
    assert_eq!(&raw[..8], &CHUNK_MAGIC.to_le_bytes());
    assert_eq!(
        &raw[off + CHUNK as usize..off + 2 * CHUNK as usize],
        &data[CHUNK as usize..2 * CHUNK as usize]
    );
    assert_eq!(
        &raw[off + 4 * CHUNK as usize..],
        &data[4 * CHUNK as usize..]
    );
    drop(cf);

    // Reopened with the same geometry: the same chunks. Corrupt chunk 1: it is dropped.
    let cf = ChunkFile::open_matching(&dir, b"x.chunks", g)
        .unwrap()
        .unwrap();
    assert_eq!(cf.validate().unwrap(), vec![0b10010]);
    cf.file()
        .write_all_at(b"garbage", off as u64 + CHUNK + 10)
        .unwrap();
    assert_eq!(cf.validate().unwrap(), vec![0b10000]);
    assert_eq!(
        cf.recorded(1).unwrap(),
        0,
        "the bad checksum is gone for good"
    );
    assert_eq!(chunks::present_bytes(&g, &[0b10000]), 100);
    assert_eq!(chunks::present_bytes(&g, &[0b10010]), CHUNK + 100);

    // Another source version, chunk size or format: not ours.
    for other in [
        ChunkGeometry {
            mtime: (1_700_000_000, 124),
            ..g
        },
        // Same size and mtime, another version (ctime) or another file (inode): not ours.
        ChunkGeometry {
            ctime: (1_700_000_002, 5),
            ..g
        },
        ChunkGeometry { ino: 4243, ..g },
        ChunkGeometry {
            size: size + 1,
            ..g
        },
        ChunkGeometry {
            chunk_size: 2 * CHUNK,
            ..g
        },
    ] {
        assert!(ChunkFile::open_matching(&dir, b"x.chunks", other)
            .unwrap()
            .is_none());
    }
    cf.file().write_all_at(&[9], 8).unwrap();
    assert!(
        ChunkFile::open_matching(&dir, b"x.chunks", g)
            .unwrap()
            .is_none(),
        "version"
    );
}

#[test]
fn chunk_file_is_sparse() {
    let d = tempfile::tempdir().unwrap();
    let dir = sys::open_dir(d.path()).unwrap();
    let g = ChunkGeometry {
        chunk_size: 1 << 20,
        ..geo(1 << 30)
    };
    let cf = ChunkFile::create(&dir, b"big.chunks", g).unwrap();
    cf.write_chunk(7, &vec![1u8; 1 << 20]).unwrap();
    let m = std::fs::metadata(d.path().join("big.chunks")).unwrap();
    assert!(m.len() > 1 << 30);
    // One chunk plus the header; generous for file systems with large allocation units.
    assert!(
        m.blocks() * 512 < 8 << 20,
        "{} bytes allocated",
        m.blocks() * 512
    );
}

#[test]
fn coalesced_fetch_is_one_read_of_the_missing_run() {
    let d = tempfile::tempdir().unwrap();
    let dir = sys::open_dir(d.path()).unwrap();
    let size = 10 * CHUNK - 7;
    let data = source(size as usize);
    std::fs::write(d.path().join("src"), &data).unwrap();
    let src = std::fs::File::open(d.path().join("src")).unwrap();
    let g = geo(size);
    let cf = ChunkFile::create(&dir, b"y.chunks", g).unwrap();
    cf.write_chunk(5, &data[5 * CHUNK as usize..6 * CHUNK as usize])
        .unwrap();
    let present = |k: u64| k == 5;
    // Missing 2, 3, 4 then 5 is present: three chunks, though the block allows four.
    let n = chunks::coalesce(&g, 2, 4 * CHUNK, present);
    assert_eq!(n, 3);
    let mut buf = Vec::new();
    assert_eq!(
        chunks::fetch(&src, &cf, 2, n, &mut buf, |_| {}).unwrap(),
        3 * CHUNK
    );
    // The tail: 6..=9 with the short last chunk, in one read.
    let n = chunks::coalesce(&g, 6, 64 * CHUNK, |k| k <= 5);
    assert_eq!(n, 4);
    assert_eq!(
        chunks::fetch(&src, &cf, 6, n, &mut buf, |_| {}).unwrap(),
        4 * CHUNK - 7
    );
    assert_eq!(cf.validate().unwrap(), vec![0b11_1111_1100]);
    let mut back = vec![0u8; (size - 2 * CHUNK) as usize];
    cf.file()
        .read_exact_at(&mut back, chunk_data_offset(size, CHUNK) + 2 * CHUNK)
        .unwrap();
    assert_eq!(back, &data[2 * CHUNK as usize..]);
}

proptest! {
    /// `coalesce` against a model: the run starts at the requested chunk, contains only missing
    /// chunks, stops at a present chunk, the end, or the block size, whichever comes first.
    #[test]
    fn coalesce_matches_model(size in 1u64..200 * CHUNK,
                              present in proptest::collection::vec(any::<bool>(), 200),
                              first in 0u64..210,
                              block_chunks in 0u64..12) {
        let g = geo(size);
        let is = |k: u64| present.get(k as usize).copied().unwrap_or(false);
        let n = chunks::coalesce(&g, first, block_chunks * CHUNK, is);
        let mut model = 0;
        if first < g.count() && !is(first) {
            model = 1;
            while model < block_chunks.max(1) && first + model < g.count() && !is(first + model) {
                model += 1;
            }
        }
        prop_assert_eq!(n, model);
    }
}
