//! What a name in a pack may be. Checked when packing and again when reading, so a damaged or
//! hostile index can never make a reader (or a later extraction) step outside its tree.

/// Longest single component (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Why `name` cannot be one component of a path in a pack, or `None` if it can.
pub fn component_problem(name: &[u8]) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty name")
    } else if name.len() > NAME_MAX {
        Some("name longer than 255 bytes")
    } else if name == b"." || name == b".." {
        Some("`.` or `..` as a name")
    } else if name.contains(&b'/') {
        Some("`/` inside a name")
    } else if name.contains(&0) {
        Some("NUL byte in a name")
    } else {
        None
    }
}

/// Splits a path relative to the pack's root into components, checking each. A leading `/`
/// (the pack's root) and `.` components are accepted, `..` never.
pub fn split_relative(path: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        if c.is_empty() || c == b"." {
            continue;
        }
        if let Some(p) = component_problem(c) {
            return Err(format!(
                "{}: {p}",
                String::from_utf8_lossy(path).escape_debug()
            ));
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escapes_and_nul() {
        assert!(split_relative(b"a/../b").is_err());
        assert!(split_relative(b"a/b\0c").is_err());
        assert!(split_relative(&[b'x'; 256]).is_err());
        assert_eq!(
            split_relative(b"/a/./b c/\n").unwrap(),
            vec![&b"a"[..], b"b c", b"\n"]
        );
        assert!(component_problem(b"\xff\xfe").is_none());
    }
}
