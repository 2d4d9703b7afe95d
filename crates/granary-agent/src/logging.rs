//! `GRANARY_LOG`: `info`, `debug`, … or `LEVEL:/path/file` (appended). Unset = warnings only.

use std::path::PathBuf;

use tracing_subscriber::filter::LevelFilter;

/// Why `spec` is not a valid `GRANARY_LOG`, if it is not: a level the agent and the preload
/// library both understand, with an optional `:FILE` whose directory exists.
pub fn check(spec: &str) -> Result<(), String> {
    let (lvl, file) = match spec.split_once(':') {
        Some((l, f)) => (l, Some(f)),
        None => (spec, None),
    };
    if lvl.trim().parse::<LevelFilter>().is_err() {
        return Err(format!("`{lvl}` is not a level"));
    }
    if let Some(f) = file {
        let f = std::path::Path::new(f);
        if f.as_os_str().is_empty() {
            return Err("no file after `:`".into());
        }
        let dir = f.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return Err(format!("{}: no such directory", f.display()));
        }
    }
    Ok(())
}

pub fn parse(spec: &str) -> (LevelFilter, Option<PathBuf>) {
    let (lvl, file) = match spec.split_once(':') {
        Some((l, f)) if !f.is_empty() => (l, Some(PathBuf::from(f))),
        _ => (spec, None),
    };
    let level = lvl.trim().parse().unwrap_or(LevelFilter::INFO);
    (level, file)
}

/// Initialises logging from `GRANARY_LOG`, else from the given defaults (the config's).
pub fn init(default_level: Option<&str>, default_file: Option<PathBuf>) {
    let (level, file) = match std::env::var("GRANARY_LOG") {
        Ok(s) if !s.is_empty() => parse(&s),
        _ => (
            default_level
                .and_then(|l| l.parse().ok())
                .unwrap_or(LevelFilter::WARN),
            default_file,
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false)
        .with_ansi(false);
    let writer = file.and_then(|f| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&f)
            .map_err(|e| eprintln!("granary: log file {}: {e}; logging to stderr", f.display()))
            .ok()
    });
    let _ = match writer {
        Some(w) => builder.with_writer(std::sync::Mutex::new(w)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}
