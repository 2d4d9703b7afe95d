//! `granary run --pack PACK [--mount PATH]`: which path the program reads and which pack
//! serves it, checked before anything starts.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cli::RunArgs;

/// The path the program reads: `--source` (a directory that must exist) or `--mount` (where
/// the program expects a tree that exists only in the pack), lexically normalised.
pub fn target(args: &RunArgs) -> Result<PathBuf> {
    if let Some(m) = &args.mount {
        let m = granary_core::source::normalize(m)?;
        if m == Path::new("/") {
            bail!("--mount /: choose the directory where the program expects the dataset");
        }
        if std::env::var_os("GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!(
                "granary: GRANARY_DISABLE is set: {} exists only in the pack, the program will \
                 not find it",
                m.display()
            );
        }
        return Ok(m);
    }
    let Some(src) = &args.source else {
        bail!("--source DIR or --pack PACK --mount PATH is required");
    };
    let source = granary_core::source::normalize(src)?;
    // Without a pack, a missing source runs the program without granary (`run`), as any other
    // reason granary cannot serve; with one, the user meant `--mount`.
    if !source.is_dir() && args.pack.is_some() {
        bail!(
            "source {} is not a directory; to serve the pack alone there, use --mount {} \
             instead of --source",
            source.display(),
            source.display()
        );
    }
    Ok(source)
}

/// `--pack`, absolute, checked to look like a pack (its index is read by the agent).
pub fn pack_dir(args: &RunArgs) -> Result<Option<PathBuf>> {
    let Some(p) = &args.pack else {
        return Ok(None);
    };
    let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let index = p.join(granary_pack::format::INDEX_FILE);
    std::fs::metadata(&index).with_context(|| {
        format!(
            "pack {}: no index (make one with `granary pack SRC {}`)",
            p.display(),
            p.display()
        )
    })?;
    Ok(Some(p))
}
