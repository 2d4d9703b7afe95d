//! Path resolution inside a pack, following symlinks as the kernel would but never leaving the
//! pack: an absolute target, or a `..` above the root, is an error naming the link.

use crate::error::{PackError, Result};
use crate::format::name::split_relative;
use crate::index::Index;

/// As Linux's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

pub fn resolve<B: AsRef<[u8]>>(ix: &Index<B>, path: &[u8]) -> Result<u32> {
    let mut todo: Vec<Vec<u8>> = split_relative(path)
        .map_err(PackError::Invalid)?
        .into_iter()
        .rev()
        .map(<[u8]>::to_vec)
        .collect();
    let mut stack: Vec<u32> = vec![0];
    let mut links = 0;
    let shown = || String::from_utf8_lossy(path).into_owned();
    while let Some(part) = todo.pop() {
        let cur = *stack.last().unwrap_or(&0);
        if part == b".." {
            if stack.len() == 1 {
                return Err(PackError::Invalid(format!(
                    "{}: leads outside the pack",
                    shown()
                )));
            }
            stack.pop();
            continue;
        }
        if part == b"." {
            continue;
        }
        let dir = ix.entry(cur).ok_or_else(|| PackError::NotFound(shown()))?;
        if !dir.stat.is_dir() {
            return Err(PackError::NotFound(shown()));
        }
        let child = ix
            .find_child(&dir, &part)
            .ok_or_else(|| PackError::NotFound(shown()))?;
        let e = ix
            .entry(child)
            .ok_or_else(|| PackError::NotFound(shown()))?;
        if !e.stat.is_symlink() {
            stack.push(child);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(PackError::Invalid(format!(
                "{}: too many levels of symlinks",
                shown()
            )));
        }
        let target = ix.link_target(&e);
        if target.starts_with(b"/") {
            return Err(PackError::Invalid(format!(
                "{}: symlink {} points outside the pack ({})",
                shown(),
                String::from_utf8_lossy(&ix.path_of(child)),
                String::from_utf8_lossy(target)
            )));
        }
        // The target's components replace the link's, before what followed it.
        for c in target.split(|&b| b == b'/').rev() {
            if !c.is_empty() {
                todo.push(c.to_vec());
            }
        }
    }
    Ok(*stack.last().unwrap_or(&0))
}
