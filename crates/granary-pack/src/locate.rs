//! What a path named as a pack is: a pack directory (its index opened), or — with an error
//! that says which — nothing, another kind of file, a file of a pack (name its directory), a
//! directory that is no pack, or a pack whose index is missing or damaged.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{PackError, Result};
use crate::format::{partition_file, INDEX_FILE, MAGIC};

/// Opens the index of the pack directory `dir`. A `dir` that is not a pack is
/// `PackError::NotAPack`; a pack that lost its index, or whose index does not start like one,
/// is damage (`PackError::Corrupt`).
pub fn open_index(dir: &Path) -> Result<(PathBuf, File)> {
    let meta = std::fs::metadata(dir).map_err(|e| PackError::io(dir, e))?;
    if !meta.is_dir() {
        let why = if starts_with_magic(dir) {
            match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(p) => format!("a file of one: name its directory, {}", p.display()),
                None => "a file of one: name its directory".to_string(),
            }
        } else {
            "a pack is a directory holding an index and part-NNNNN files".to_string()
        };
        return Err(PackError::NotAPack {
            path: dir.to_path_buf(),
            why,
        });
    }
    let path = dir.join(INDEX_FILE);
    let has_partition = || dir.join(partition_file(0)).exists();
    // One open: the index is read (or mapped) through this file.
    match File::open(&path) {
        Ok(f) if has_magic(&f) => Ok((path, f)),
        Ok(_) if has_partition() => Err(PackError::corrupt(
            &path,
            "not a pack index (no GRANPACK header) beside the pack's partitions: the index is damaged",
        )),
        Ok(_) => Err(PackError::NotAPack {
            path: dir.to_path_buf(),
            why: format!("{INDEX_FILE} is not a pack index"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && has_partition() => Err(
            PackError::corrupt(&path, "missing beside the pack's partitions"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PackError::NotAPack {
            path: dir.to_path_buf(),
            why: format!("no {INDEX_FILE} file"),
        }),
        Err(e) => Err(PackError::io(&path, e)),
    }
}

fn has_magic(f: &File) -> bool {
    let mut head = [0u8; 8];
    f.read_exact_at(&mut head, 0).is_ok_and(|_| head == MAGIC)
}

fn starts_with_magic(path: &Path) -> bool {
    File::open(path).is_ok_and(|f| has_magic(&f))
}
