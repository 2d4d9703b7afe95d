//! Configuration: the administrator's TOML file, merged with command-line flags by the binary.
//!
//! ```toml
//! [[tier]]                 # ordered: fastest first
//! path = "/dev/shm/granary"
//! capacity = "8G"          # optional: default 90 % of the free space
//! block_size = "4K"        # optional: accounting granularity
//! [[tier]]
//! path = "/local/ssd/granary"
//! capacity = "400G"
//! [placement]
//! workers = 4              # default: from the core count
//! block_size = "8M"        # size of the agent's reads of the source (large-file fetches)
//! max_source_streams = 4   # source reads in flight at once on this node, all jobs together
//! prefetch_min_size = "1M" # files this large are fetched whole by the agent from their first
//!                          # open; smaller ones are copied from the page cache after the program
//! chunk_size = "4M"        # chunks of files too large for any tier (a multiple of 4096)
//! small_copy_delay = "2s"  # a reported small open is copied this long after if no close came
//! policy = "fill-highest-first" # or "known-order": the access order is known (access_order)
//! access_order = "/home/me/order.txt" # known-order: one path per line, in the program's order
//! prefetch_window = "10G"  # known-order: bytes kept placed ahead (default 25 % of tier 0)
//! page_cache = "auto"      # bytes of copies kept in the page cache: "auto" (from the memory
//!                          # limit), "off" (the kernel decides), or a size; the rest are dropped
//!                          # after each read so they never evict the kept ones
//! [catalog]
//! immutable = false        # true: a later job validates the catalog per directory
//! validate_threads = 4     # background validation of a reused catalog (0: inline only)
//! pin_inodes = true        # between jobs, hold the source's inodes in the kernel's cache
//! [reuse]
//! verify = "identity"      # or "checksum": also re-hash reused copies in the background
//! [mmap]                  # see placement::mmap::config
//! mode = "prefetch"
//! [agent]
//! idle_timeout = "30s"     # exit when no job used the agent this long
//! log_level = "info"
//! log_file = "/tmp/granary-agent.log"
//! ```
//! The schema (`schema`) refuses unknown keys and checks each value, so an error names the key
//! and its line, in one line: `config /x.toml: unknown key `tier[0].capcity` (line 3)`. What it
//! makes is `settings`' `Config`.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod agent_wide;
mod schema;
mod settings;

pub use settings::{Config, PolicyKind, TierConfig, Verify};

pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {file}: {cause}")]
    Read {
        file: PathBuf,
        cause: std::io::Error,
    },
    #[error("config {file}: {msg}")]
    Invalid { file: PathBuf, msg: String },
    #[error("bad --tier `{0}`: expected PATH or PATH=SIZE (e.g. /dev/shm/granary=8G)")]
    TierFlag(String),
    #[error("bad --tier `{0}`: {1}")]
    TierCapacity(String, String),
}

/// Placement reads no configuration itself: the configuration names placement's parameters.
impl crate::placement::Params {
    /// The configuration's values over the defaults.
    pub fn from_config(cfg: &Config) -> crate::placement::Params {
        let d = crate::placement::Params::default();
        crate::placement::Params {
            block_size: cfg.block_size.unwrap_or(d.block_size),
            max_source_streams: cfg.max_source_streams.unwrap_or(d.max_source_streams),
            prefetch_min_size: cfg.prefetch_min_size.unwrap_or(d.prefetch_min_size),
            chunk_size: cfg.chunk_size.unwrap_or(d.chunk_size),
            small_copy_delay: cfg.small_copy_delay.unwrap_or(d.small_copy_delay),
        }
    }
}

impl Config {
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let src = std::fs::read_to_string(file).map_err(|cause| ConfigError::Read {
            file: file.to_path_buf(),
            cause,
        })?;
        let mut cfg = Config::parse(&src).map_err(|msg| ConfigError::Invalid {
            file: file.to_path_buf(),
            msg,
        })?;
        // A relative access order belongs with the file that names it, not with wherever the
        // job happens to be started.
        if let (Some(a), Some(dir)) = (&cfg.access_order, file.parent()) {
            if a.is_relative() {
                cfg.access_order = Some(dir.join(a));
            }
        }
        Ok(cfg)
    }

    /// Parses TOML text; the error is one line naming the key (and its line when known):
    /// `unknown key `tier[0].capcity` (line 3)`, `expected a size like "8G" for key
    /// `tier[1].capacity` (line 5)`.
    pub fn parse(src: &str) -> Result<Config, String> {
        let de = toml::Deserializer::parse(src).map_err(|e| one_line(src, &e, None))?;
        match serde_path_to_error::deserialize::<_, schema::File>(de) {
            Ok(f) => Ok(f.into_config()),
            Err(e) => {
                let key = e.path().to_string();
                Err(one_line(src, e.inner(), Some(&key)))
            }
        }
    }
}

/// A TOML or schema error as one line: what was wrong, the key, the line.
fn one_line(src: &str, e: &toml::de::Error, key: Option<&str>) -> String {
    let line = e
        .span()
        .map(|s| src[..s.start.min(src.len())].matches('\n').count() + 1);
    let msg = e.message().lines().next().unwrap_or("syntax error");
    let named = msg
        .strip_prefix("unknown field `")
        .map(|r| ("unknown key", r))
        .or_else(|| {
            msg.strip_prefix("missing field `")
                .map(|r| ("missing key", r))
        });
    let (what, key) = match (named, key) {
        // serde names the field (and lists the others); the key's path says it all.
        (Some((what, rest)), Some(k)) => {
            let field = rest.split('`').next().unwrap_or("");
            let full = if k.is_empty() || k == "?" || k == "." {
                field.to_string()
            } else if k.ends_with(field) {
                k.to_string()
            } else {
                format!("{k}.{field}")
            };
            (what.to_string(), Some(full))
        }
        (_, Some(k)) if !k.is_empty() && k != "?" && k != "." => {
            (format!("{msg} for key"), Some(k.to_string()))
        }
        _ => (msg.to_string(), None),
    };
    match (key, line) {
        (Some(k), Some(l)) => format!("{what} `{k}` (line {l})"),
        (Some(k), None) => format!("{what} `{k}`"),
        (None, Some(l)) => format!("{what} (line {l})"),
        (None, None) => what,
    }
}

/// `--tier PATH[=SIZE]`.
pub fn parse_tier_flag(s: &str) -> Result<TierConfig, ConfigError> {
    let (path, cap) = match s.rsplit_once('=') {
        Some((p, c)) => (
            p,
            Some(
                crate::size::parse_capacity(c)
                    .map_err(|why| ConfigError::TierCapacity(s.to_string(), why))?,
            ),
        ),
        None => (s, None),
    };
    if path.is_empty() {
        return Err(ConfigError::TierFlag(s.to_string()));
    }
    Ok(TierConfig {
        path: PathBuf::from(path),
        capacity: cap,
        block_size: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file() {
        let c = Config::parse(
            "[[tier]]\npath = \"/dev/shm/g\"\ncapacity = \"8G\"\nblock_size = 4096\n\
             [[tier]]\npath = \"/ssd/g\"\n[placement]\nworkers = 3\n\
             [agent]\nidle_timeout = \"5s\"\nlog_level = \"debug\"\nlog_file = \"/tmp/l\"\n",
        )
        .unwrap();
        assert_eq!(c.tiers.len(), 2);
        assert_eq!(c.tiers[0].capacity, Some(8 << 30));
        assert_eq!(c.tiers[0].block_size, Some(4096));
        assert_eq!(c.tiers[1].capacity, None);
        assert_eq!(c.workers, Some(3));
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.log_level.as_deref(), Some("debug"));
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = Config::parse("[[tier]]\npath = \"/a\"\ncapcity = \"8G\"\n").unwrap_err();
        assert_eq!(e, "unknown key `tier[0].capcity` (line 3)");
        let e = Config::parse("[[tier]]\npath=\"/a\"\n[[tier]]\npath=\"/b\"\ncapacity=\"lots\"\n")
            .unwrap_err();
        assert!(e.contains("`tier[1].capacity` (line 5)"), "{e}");
        let e = Config::parse("[agent]\nidle = 3\n").unwrap_err();
        assert_eq!(e, "unknown key `agent.idle` (line 2)");
        let e = Config::parse("[[tier]]\ncapacity = \"1G\"\n").unwrap_err();
        assert!(e.starts_with("missing key `tier[0].path`"), "{e}");
        let e = Config::parse("bogus = 1\n").unwrap_err();
        assert_eq!(e, "unknown key `bogus` (line 1)");
        let e = Config::parse("[[tier]\n").unwrap_err();
        assert!(e.contains("(line 1)") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn placement_keys() {
        let c = Config::parse(
            "[placement]\nblock_size = \"2M\"\nmax_source_streams = 2\n\
             prefetch_min_size = \"512K\"\nchunk_size = \"8M\"\nsmall_copy_delay = \"500ms\"\n\
             [reuse]\nverify = \"size\"\n",
        )
        .unwrap();
        assert_eq!(c.block_size, Some(2 << 20));
        assert_eq!(c.max_source_streams, Some(2));
        assert_eq!(c.prefetch_min_size, Some(512 << 10));
        assert_eq!(c.chunk_size, Some(8 << 20));
        assert_eq!(c.small_copy_delay, Some(Duration::from_millis(500)));
        assert_eq!(c.verify, Some(Verify::Identity));
        let c = Config::parse(
            "[placement]\npolicy = \"known-order\"\naccess_order = \"o.txt\"\n\
             prefetch_window = \"64M\"\n",
        )
        .unwrap();
        assert_eq!(c.policy, Some(PolicyKind::KnownOrder));
        assert_eq!(c.access_order, Some(PathBuf::from("o.txt")));
        assert_eq!(c.prefetch_window, Some(64 << 20));
        let e = Config::parse("[placement]\n\npolicy = \"lru\"\n").unwrap_err();
        assert_eq!(
            e,
            "expected \"fill-highest-first\" or \"known-order\" for key `placement.policy` (line 3)"
        );
        use crate::placement::residency::Budget;
        for (text, want) in [
            ("auto", Budget::Auto),
            ("off", Budget::Off),
            ("200G", Budget::Fixed(200 << 30)),
            ("0", Budget::Fixed(0)),
        ] {
            let c = Config::parse(&format!("[placement]\npage_cache = \"{text}\"\n")).unwrap();
            assert_eq!(c.page_cache, Some(want), "{text}");
        }
        let e = Config::parse("[placement]\npage_cache = \"most\"\n").unwrap_err();
        assert_eq!(
            e,
            "expected \"auto\", \"off\" or a size like \"200G\" for key `placement.page_cache` (line 2)"
        );
        let e = Config::parse("[placement]\nprefetch_window = 0\n").unwrap_err();
        assert!(e.contains("`placement.prefetch_window` (line 2)"), "{e}");
        let e = Config::parse("[placement]\nchunk_size = 5000\n").unwrap_err();
        assert!(e.contains("`placement.chunk_size` (line 2)"), "{e}");
        let e = Config::parse("[placement]\nmax_source_streams = 0\n").unwrap_err();
        assert!(e.contains("`placement.max_source_streams` (line 2)"), "{e}");
        let e = Config::parse("[reuse]\nverify = \"md5\"\n").unwrap_err();
        assert_eq!(
            e,
            "expected \"identity\" or \"checksum\" for key `reuse.verify` (line 2)"
        );
        let e = Config::parse("[reuse]\nverfy = 1\n").unwrap_err();
        assert_eq!(e, "unknown key `reuse.verfy` (line 2)");
    }

    #[test]
    fn tier_flags() {
        let t = parse_tier_flag("/dev/shm/g=8G").unwrap();
        assert_eq!(t.path, PathBuf::from("/dev/shm/g"));
        assert_eq!(t.capacity, Some(8 << 30));
        assert_eq!(parse_tier_flag("/x").unwrap().capacity, None);
        assert!(parse_tier_flag("/x=huge").is_err());
        for bad in ["/x=1.5", "/x=0", "/x=2000P", "/x=12"] {
            let e = parse_tier_flag(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("bad --tier `{bad}`: ")), "{e}");
        }
        let e = Config::parse("[[tier]]\npath = \"/a\"\ncapacity = 0\n").unwrap_err();
        assert!(
            e.contains("less than one 4 KiB block") && e.contains("`tier[0].capacity` (line 3)"),
            "{e}"
        );
        let e = Config::parse("[[tier]]\npath = \"/a\"\ncapacity = \"1.5\"\n").unwrap_err();
        assert!(e.contains("`tier[0].capacity`"), "{e}");
    }
}

/// The default tier when neither flags nor a config name one: `<dir>/granary-<user>` in the
/// first writable of `$GRANARY_CACHE_DIR`, `$SLURM_TMPDIR`, `$TMPDIR`, `/tmp`, the user's name
/// coming from the uid (never from `$USER`).
///
/// The directory is granary's own: created 0700 if missing, narrowed back to 0700 if it is the
/// user's and was widened. One that exists and is not the user's (another user pre-created it
/// to plant files in it) is refused, with the fix: never served from.
pub fn default_tier() -> Result<TierConfig, String> {
    let path = default_tier_path()?;
    own_default_dir(&path)?;
    Ok(TierConfig {
        path,
        capacity: None,
        block_size: None,
    })
}

/// Where the default tier is (see `default_tier`), nothing created. `$GRANARY_CACHE_DIR` set to
/// what is not a writable directory is an error: a mistyped value must not quietly put the cache
/// somewhere else.
pub fn default_tier_path() -> Result<PathBuf, String> {
    let user = crate::sys::user_name();
    let writable = |d: &Path| {
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).ok();
        // SAFETY: access(2) on a NUL-terminated path.
        d.is_dir()
            && c.is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0)
    };
    if let Some(v) = std::env::var_os("GRANARY_CACHE_DIR").filter(|v| !v.is_empty()) {
        let d = PathBuf::from(v);
        if !writable(&d) {
            let why = match std::fs::metadata(&d) {
                Err(e) => e.to_string(),
                Ok(m) if !m.is_dir() => "not a directory".into(),
                Ok(_) => "not writable by you".into(),
            };
            return Err(format!(
                "GRANARY_CACHE_DIR={}: {why}; expected a directory you can write (the default \
                 tier goes in it): create it, correct the variable or unset it",
                d.display()
            ));
        }
        return Ok(d.join(format!("granary-{user}")));
    }
    let mut dirs: Vec<PathBuf> = ["SLURM_TMPDIR", "TMPDIR"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    dirs.push(PathBuf::from("/tmp"));
    let dir = dirs.into_iter().find(|d| writable(d)).ok_or(
        "no writable directory for a default tier ($GRANARY_CACHE_DIR, $SLURM_TMPDIR, \
         $TMPDIR, /tmp); use --tier",
    )?;
    Ok(dir.join(format!("granary-{user}")))
}

/// See `default_tier`.
fn own_default_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("default tier {}: {e}", path.display())),
    }
    let md = std::fs::symlink_metadata(path)
        .map_err(|e| format!("default tier {}: {e}", path.display()))?;
    let me = crate::sys::uid();
    if md.file_type().is_symlink() || !md.is_dir() || md.uid() != me {
        return Err(format!(
            "default tier {} exists and is not your directory ({}, owner uid {}): another user \
             may have created it to plant files in your cache; not using it (remove it, or pass \
             --tier DIR)",
            path.display(),
            if md.file_type().is_symlink() {
                "a symlink"
            } else if md.is_dir() {
                "a directory"
            } else {
                "not a directory"
            },
            md.uid()
        ));
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("default tier {}: {e}", path.display()))?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("tier {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The root exists but is not safe to serve from (another user's, open to others).
    #[error(transparent)]
    Unsafe(#[from] crate::tierdir::TierDirError),
}

/// Creates each tier's directory (mode 0700) and fills in capacities (90 % of the free space)
/// and block sizes. The flag `true` in the result marks capacities that were defaulted. A root
/// that exists must be the user's and closed to others' writes (`tierdir::open_root`).
pub fn resolve_tiers(cfg: &[TierConfig]) -> Result<Vec<(crate::tiers::TierSpec, bool)>, TierError> {
    cfg.iter()
        .map(|t| {
            let err = |cause| TierError::Io {
                path: t.path.clone(),
                cause,
            };
            let path = crate::source::normalize(&t.path).map_err(err)?;
            if std::fs::symlink_metadata(&path).is_err() {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&path)
                    .map_err(err)?;
            }
            if !std::fs::metadata(&path).map_err(err)?.is_dir() {
                return Err(err(std::io::Error::other("not a directory")));
            }
            crate::tierdir::open_root(&path)?;
            let (capacity, defaulted) = match t.capacity {
                Some(c) => (c, false),
                None => (crate::sys::free_space(&path).map_err(err)? / 10 * 9, true),
            };
            Ok((
                crate::tiers::TierSpec {
                    path,
                    capacity,
                    block_size: t.block_size.unwrap_or(crate::tiers::DEFAULT_BLOCK_SIZE),
                    default_capacity: defaulted,
                    staging: false,
                },
                defaulted,
            ))
        })
        .collect()
}
