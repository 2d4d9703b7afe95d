//! Naming a source: the path the user gave (lexically normalised, absolute) and a stable id that
//! names its table, its cache directory in every tier and its persisted catalog.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Absolute, lexically normalised path (`.` and `..` removed, no trailing `/`), the way the
/// preload library normalises the paths a program passes. Symlinks are not resolved.
pub fn normalize(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

/// True if `path` lies inside the source `source` (normalized) whose real path is
/// `source_real`: as written, or once the part of it that exists is resolved (a symlink leading
/// into the dataset counts), so a tier that does not exist yet can be judged before it is made.
pub fn contains(source: &Path, source_real: &Path, path: &Path) -> bool {
    let Ok(path) = normalize(path) else {
        return false;
    };
    if path.starts_with(source) {
        return true;
    }
    let mut base = path.as_path();
    let mut rest = Vec::new();
    while !base.exists() {
        let (Some(name), Some(parent)) = (base.file_name(), base.parent()) else {
            return false;
        };
        rest.push(name);
        base = parent;
    }
    let mut real = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    real.extend(rest.iter().rev());
    real.starts_with(source_real)
}

/// `<sanitized basename>-<xxh3 of the canonical path, 16 hex digits>`: readable in `ls`, unique
/// per canonical source path.
pub fn source_id(canonical: &Path) -> String {
    let base = canonical
        .file_name()
        .unwrap_or(OsStr::new("root"))
        .as_bytes();
    let mut name: String = base
        .iter()
        .take(32)
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        name.push_str("root");
    }
    let hash = xxhash_rust::xxh3::xxh3_64(canonical.as_os_str().as_bytes());
    format!("{name}-{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(
            normalize(Path::new("/a/./b/../c/")).unwrap(),
            PathBuf::from("/a/c")
        );
        assert_eq!(normalize(Path::new("/..")).unwrap(), PathBuf::from("/"));
    }

    #[test]
    fn ids() {
        let a = source_id(Path::new("/pfs/image net"));
        assert!(a.starts_with("image_net-"), "{a}");
        assert_eq!(a.len(), "image_net-".len() + 16);
        assert_ne!(a, source_id(Path::new("/other/image net")));
        assert!(source_id(Path::new("/")).starts_with("root-"));
    }
}
