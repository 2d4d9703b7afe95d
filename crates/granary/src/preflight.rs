//! What is checked before any command does its work, so that a mistake is the user's one-line
//! error (exit 2) before a job starts rather than a job quietly run without granary, or an
//! error after it ran: every `GRANARY_*` variable (a bad value names the variable and the
//! accepted form; an unknown name is a warning with the likely one), and the files a command
//! will write at its end.

use std::ffi::OsStr;
use std::path::Path;

use anyhow::{bail, Result};

use crate::output::say;

/// Every variable granary reads, with the form it accepts (shown in errors and docs).
/// `GRANARY_TABLE*`, `GRANARY_JOB_SLOT`, `GRANARY_MNT_NS` and `GRANARY_SOURCE` are set by `granary run` for the
/// program; the rest are the user's.
const KNOWN: [(&str, &str); 19] = [
    (
        "GRANARY_LOG",
        "a level (error, warn, info, debug, trace, off), optionally `:FILE`",
    ),
    (
        "GRANARY_AGENT_TIMEOUT",
        "a duration above zero, like 5s or 500ms",
    ),
    (
        "GRANARY_CACHE_DIR",
        "a writable directory (where the default tier goes)",
    ),
    (
        "GRANARY_ATTACH_WAIT",
        "a duration, like 120s (0: do not wait)",
    ),
    ("GRANARY_CONFIG", "a TOML configuration file"),
    (
        "GRANARY_DISABLE",
        "1 to run programs without granary (empty or 0: granary serves)",
    ),
    (
        "GRANARY_STRICT",
        "1 (or true, yes, on) to refuse a job granary cannot serve; 0 (false, no, off)",
    ),
    (
        "GRANARY_RUNTIME_DIR",
        "a directory for the agent's socket and tables",
    ),
    ("GRANARY_PRELOAD", "the path of libgranary_preload.so"),
    (
        "GRANARY_PROGRESS_EVERY",
        "a duration above zero between progress lines in logs, like 10s",
    ),
    ("GRANARY_TABLE", "set by granary run"),
    ("GRANARY_TABLE_FD", "set by granary run"),
    ("GRANARY_TABLE_ID", "set by granary run"),
    ("GRANARY_JOB_SLOT", "set by granary run"),
    ("GRANARY_MNT_NS", "set by granary run"),
    ("GRANARY_SOURCE", "set by granary run"),
    ("GRANARY_EMBED_PRELOAD", "1 or 0, when building granary"),
    ("GRANARY_TEST_LOG", "used by granary's own tests"),
    (
        "GRANARY_BIN",
        "the granary binary granary's tests and benchmarks run",
    ),
];

/// Checks every `GRANARY_*` variable of the environment: a bad value is an error naming it and
/// the accepted form; a name granary does not know is a warning with the closest known one.
pub fn check_env() -> Result<()> {
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with("GRANARY_")) else {
            continue;
        };
        let Some(&(_, form)) = KNOWN.iter().find(|(k, _)| *k == name) else {
            let hint = closest(name)
                .map(|k| format!(" (did you mean {k}?)"))
                .unwrap_or_default();
            say(format!(
                "granary: warning: {name} is not a variable granary reads{hint}; it is ignored"
            ));
            continue;
        };
        if let Err(why) = check_value(name, &value) {
            bail!("{name}={}: {why}; expected {form}", value.to_string_lossy());
        }
    }
    Ok(())
}

/// Why `value` is not a valid value of `name`, if it is not.
fn check_value(name: &str, value: &OsStr) -> Result<(), String> {
    let v = value.to_str().ok_or("not UTF-8")?;
    match name {
        "GRANARY_LOG" => granary_agent::logging::check(v),
        "GRANARY_AGENT_TIMEOUT" | "GRANARY_PROGRESS_EVERY" => {
            match granary_core::size::parse_duration(v) {
                Some(d) if !d.is_zero() => Ok(()),
                Some(_) => Err("zero is not a wait".into()),
                None => Err("not a duration".into()),
            }
        }
        "GRANARY_CACHE_DIR" => writable_dir(Path::new(v)),
        "GRANARY_ATTACH_WAIT" => granary_core::size::parse_duration(v)
            .map(|_| ())
            .ok_or_else(|| "not a duration".into()),
        "GRANARY_STRICT" => strict_value(v).map(|_| ()),
        // May not exist yet (the agent makes it) and may hold `{rank}`: only what is there is
        // checked.
        "GRANARY_RUNTIME_DIR" => match std::fs::metadata(v) {
            Ok(m) if !m.is_dir() => Err("exists and is not a directory".into()),
            _ => Ok(()),
        },
        "GRANARY_CONFIG" | "GRANARY_PRELOAD" if !v.is_empty() => match std::fs::metadata(v) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err("not a regular file".into()),
            Err(e) => Err(e.to_string()),
        },
        _ => Ok(()),
    }
}

/// `GRANARY_STRICT`'s value as a switch.
pub fn strict_value(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err("not a switch".into()),
    }
}

/// Whether `GRANARY_STRICT` asks for strict jobs (checked by `check_env` first).
pub fn strict_env() -> bool {
    std::env::var("GRANARY_STRICT")
        .ok()
        .and_then(|v| strict_value(&v).ok())
        .unwrap_or(false)
}

fn writable_dir(p: &Path) -> Result<(), String> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err("not a directory".into()),
        Err(e) => return Err(e.to_string()),
    }
    if granary_core::sys::may_write_in(p) {
        Ok(())
    } else {
        Err("not writable by you".into())
    }
}

/// A file the command writes when it is done (`--stats-json`, `--metrics-file`): its
/// directory must exist and be writable now, and the file, if it exists, be a regular file.
pub fn check_output(flag: &str, p: &Path) -> Result<()> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Err(why) = writable_dir(dir) {
        bail!(
            "{flag} {}: its directory {}: {why}",
            p.display(),
            dir.display()
        );
    }
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if !m.is_file() {
            bail!("{flag} {}: exists and is not a regular file", p.display());
        }
    }
    Ok(())
}

/// The known variable a mistyped name most likely meant: the closest by edit distance, if
/// close enough to be a typo.
fn closest(name: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .map(|(k, _)| (*k, edit_distance(name, k)))
        .filter(|(_, d)| *d <= 3)
        .min_by_key(|(_, d)| *d)
        .map(|(k, _)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        let bad = |n: &str, v: &str| check_value(n, OsStr::new(v)).is_err();
        assert!(bad("GRANARY_LOG", "shouty"));
        assert!(!bad("GRANARY_LOG", "debug"));
        assert!(!bad("GRANARY_LOG", "info:/tmp/x.log"));
        for v in ["abc", "0", "-1s", ""] {
            assert!(bad("GRANARY_AGENT_TIMEOUT", v), "{v}");
        }
        assert!(!bad("GRANARY_AGENT_TIMEOUT", "500ms"));
        assert!(bad("GRANARY_CACHE_DIR", "/nonexistent/granary"));
        assert!(!bad("GRANARY_CACHE_DIR", "/tmp"));
        assert!(bad("GRANARY_STRICT", "maybe"));
        assert!(!bad("GRANARY_STRICT", "yes"));
        assert!(bad("GRANARY_CONFIG", "/nonexistent.toml"));
        assert!(!bad("GRANARY_DISABLE", "anything"));
    }

    #[test]
    fn typos() {
        // Built, so that the docs check does not take them for variables granary reads.
        let v = |s: &str| format!("GRANARY_{s}");
        assert_eq!(closest(&v("CACHEDIR")), Some("GRANARY_CACHE_DIR"));
        assert_eq!(closest(&v("STRICTT")), Some("GRANARY_STRICT"));
        assert_eq!(closest(&v("SOMETHING_ELSE_ENTIRELY")), None);
    }

    #[test]
    fn outputs() {
        assert!(check_output("--stats-json", Path::new("/nonexistent/x.json")).is_err());
        assert!(check_output("--stats-json", Path::new("/tmp")).is_err());
        assert!(check_output("--stats-json", Path::new("/tmp/granary-preflight.json")).is_ok());
    }
}
