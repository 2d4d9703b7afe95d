//! A small tree with every kind of entry, packed once per test.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use granary_pack::{Compression, Options, Pack, Progress};

pub struct Packed {
    pub dir: tempfile::TempDir,
    /// Path in the pack → the source file's bytes.
    pub files: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Packed {
    pub fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }
    pub fn pack(&self) -> PathBuf {
        self.dir.path().join("pack")
    }
}

pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (xxhash_rust::xxh3::xxh3_64(&(seed << 32 | i).to_le_bytes()) >> 13) as u8)
        .collect()
}

pub fn write_tree(src: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut put = |rel: &[u8], data: Vec<u8>| {
        let p = src.join(std::ffi::OsStr::from_bytes(rel));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        files.insert(rel.to_vec(), data);
    };
    put(b"a/noise", noise(1, 70_000));
    put(b"a/text", b"granary ".repeat(9_000));
    put(b"a/b/empty", Vec::new());
    put(b"with space", noise(2, 3_000));
    put(b"new\nline", b"x".to_vec());
    put(b"bad\xffutf8", noise(3, 10));
    put(b"c/large", [noise(4, 600_000), vec![7u8; 3 << 20]].concat());
    std::os::unix::fs::symlink("noise", src.join("a/link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("outside")).unwrap();
    std::fs::hard_link(src.join("a/noise"), src.join("hard")).unwrap();
    files.insert(b"hard".to_vec(), files[&b"a/noise"[..]].clone());
    files
}

pub fn packed(compression: Compression, partitions: u32) -> Packed {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files = write_tree(&src);
    let opts = Options {
        compression,
        partitions: Some(partitions),
        block_size: 1 << 16,
        sync: false,
        ..Default::default()
    };
    granary_pack::pack(&src, &dir.path().join("pack"), &opts, &Progress::default()).unwrap();
    Packed { dir, files }
}

/// Reads every regular file through `pack`: Ok bytes per path, or the error's text.
pub fn read_all(pack: &Pack) -> BTreeMap<Vec<u8>, Result<Vec<u8>, String>> {
    let ix = pack.index();
    (0..ix.len())
        .filter(|&i| ix.entry(i).is_some_and(|e| e.stat.is_file()))
        .map(|i| (ix.path_of(i), pack.read_file(i).map_err(|e| e.to_string())))
        .collect()
}
