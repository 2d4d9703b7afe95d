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
//! small_copy_delay = "2s"  # a small file is copied this long after its open if no close came
//! policy = "fill-highest-first" # or "known-order": the access order is known (access_order)
//! access_order = "/home/me/order.txt" # known-order: one path per line, in the program's order
//! prefetch_window = "10G"  # known-order: bytes kept placed ahead (default 25 % of tier 0)
//! page_cache = "auto"      # bytes of copies kept in the page cache: "auto" (from the memory
//!                          # limit), "off" (the kernel decides), or a size; the rest are dropped
//!                          # after each read so they never evict the kept ones
//! [reuse]
//! verify = "checksum"      # or "size": how copies from an earlier run are checked at the walk
//! [mmap]                  # see placement::mapping::config
//! mode = "prefetch"
//! [agent]
//! idle_timeout = "30s"     # exit when no job used the agent this long
//! log_level = "info"
//! log_file = "/tmp/granary-agent.log"
//! ```
//! The file is checked key by key so an error names the key and its line, in one line:
//! `config /x.toml: unknown key `tier[0].capcity` (line 3)`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::size::{parse_duration, parse_size};

pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Large reads reach a PFS's bandwidth limit where the program's 128–256 KiB reads hit its
/// per-request (IOPS) limit.
pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;
/// Per node: many nodes times many streams is what overwhelms a PFS (seed 002's staggering).
pub const DEFAULT_MAX_SOURCE_STREAMS: usize = 4;
pub const DEFAULT_PREFETCH_MIN_SIZE: u64 = 1 << 20;
pub const DEFAULT_CHUNK_SIZE: u64 = 4 << 20;
pub const DEFAULT_SMALL_COPY_DELAY: Duration = Duration::from_secs(2);

/// Which placement policy a source gets (`[placement] policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Fastest tier with room, spill to the next, never evict.
    #[default]
    FillHighestFirst,
    /// The program's access order is known (`access_order`): place ahead, evict what was read.
    KnownOrder,
}

/// How a copy left by an earlier run is checked before it is served again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Every open checks the copy's identity (inode, ctime, size, type, owner) against what the
    /// agent recorded when it wrote it: anything done to it through the file system is caught.
    #[default]
    Identity,
    /// Also re-hash each reused copy (xxh3) in the background, at idle priority with direct I/O,
    /// against the checksum recorded when it was placed: catches damage below the file system.
    Checksum,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierConfig {
    pub path: PathBuf,
    /// Bytes; `None` = 90 % of the free space of the tier's file system.
    pub capacity: Option<u64>,
    pub block_size: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub tiers: Vec<TierConfig>,
    pub workers: Option<usize>,
    pub block_size: Option<u64>,
    pub max_source_streams: Option<usize>,
    pub prefetch_min_size: Option<u64>,
    pub chunk_size: Option<u64>,
    pub small_copy_delay: Option<Duration>,
    pub policy: Option<PolicyKind>,
    /// The access-order file (relative paths are resolved against the config file's directory).
    pub access_order: Option<PathBuf>,
    pub prefetch_window: Option<u64>,
    /// Page-cache residency budget (`None`: auto).
    pub page_cache: Option<crate::placement::residency::Budget>,
    pub verify: Option<Verify>,
    /// `[catalog] immutable`: the datasets of jobs using this configuration never change in
    /// place; a re-attach validates one `statx` per directory.
    pub immutable: Option<bool>,
    /// `[catalog] validate_threads`: threads of the background validation of an attach (0: none,
    /// each entry is checked by the first program that uses it).
    pub validate_threads: Option<usize>,
    pub idle_timeout: Option<Duration>,
    pub log_level: Option<String>,
    pub log_file: Option<PathBuf>,
    /// `[mmap]`: following programs through their mappings.
    pub mmap: Option<crate::placement::mapping::MmapConfig>,
}

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

    /// Parses TOML text; the error is one line naming the key (and its line when known).
    pub fn parse(src: &str) -> Result<Config, String> {
        let doc: toml::Table = src.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|s| src[..s.start.min(src.len())].matches('\n').count() + 1);
            let msg = e
                .message()
                .lines()
                .next()
                .unwrap_or("syntax error")
                .to_string();
            match line {
                Some(l) => format!("{msg} (line {l})"),
                None => msg,
            }
        })?;
        let err = |key: &str, what: &str| -> String {
            match find_line(src, key) {
                Some(l) => format!("{what} `{key}` (line {l})"),
                None => format!("{what} `{key}`"),
            }
        };
        let mut cfg = Config::default();
        for (k, v) in &doc {
            match k.as_str() {
                "tier" => {
                    let arr = v
                        .as_array()
                        .ok_or_else(|| err("tier", "expected [[tier]] tables for key"))?;
                    for (i, t) in arr.iter().enumerate() {
                        let base = format!("tier[{i}]");
                        let t = t
                            .as_table()
                            .ok_or_else(|| err(&base, "expected a table for key"))?;
                        let mut path = None;
                        let mut capacity = None;
                        let mut block_size = None;
                        for (k, v) in t {
                            let key = format!("{base}.{k}");
                            match k.as_str() {
                                "path" => {
                                    path =
                                        Some(PathBuf::from(v.as_str().ok_or_else(|| {
                                            err(&key, "expected a string for key")
                                        })?))
                                }
                                "capacity" => {
                                    capacity = Some(size_value(v).ok_or_else(|| {
                                        err(&key, "expected a size like \"8G\" for key")
                                    })?)
                                }
                                "block_size" => {
                                    let b = size_value(v).filter(|b| *b > 0).ok_or_else(|| {
                                        err(&key, "expected a non-zero size like \"4K\" for key")
                                    })?;
                                    block_size = Some(b)
                                }
                                _ => return Err(err(&key, "unknown key")),
                            }
                        }
                        let path =
                            path.ok_or_else(|| err(&format!("{base}.path"), "missing key"))?;
                        cfg.tiers.push(TierConfig {
                            path,
                            capacity,
                            block_size,
                        });
                    }
                }
                "placement" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| err("placement", "expected a table for key"))?;
                    for (k, v) in t {
                        let key = format!("placement.{k}");
                        match k.as_str() {
                            "workers" => {
                                let n =
                                    v.as_integer().filter(|n| *n > 0 && *n <= 1024).ok_or_else(
                                        || err(&key, "expected an integer 1..1024 for key"),
                                    )?;
                                cfg.workers = Some(n as usize);
                            }
                            "block_size" => {
                                let b = size_value(v)
                                    .filter(|b| (4096..=1 << 30).contains(b))
                                    .ok_or_else(|| {
                                        err(&key, "expected a size 4K..1G like \"8M\" for key")
                                    })?;
                                cfg.block_size = Some(b);
                            }
                            "max_source_streams" => {
                                let n =
                                    v.as_integer().filter(|n| *n > 0 && *n <= 1024).ok_or_else(
                                        || err(&key, "expected an integer 1..1024 for key"),
                                    )?;
                                cfg.max_source_streams = Some(n as usize);
                            }
                            "prefetch_min_size" => {
                                cfg.prefetch_min_size = Some(size_value(v).ok_or_else(|| {
                                    err(&key, "expected a size like \"1M\" for key")
                                })?);
                            }
                            "chunk_size" => {
                                let c = size_value(v)
                                    .filter(|c| *c > 0 && c % 4096 == 0)
                                    .ok_or_else(|| {
                                        err(
                                            &key,
                                            "expected a non-zero multiple of 4K like \"4M\" for key",
                                        )
                                    })?;
                                cfg.chunk_size = Some(c);
                            }
                            "small_copy_delay" => {
                                cfg.small_copy_delay =
                                    Some(duration_value(v).ok_or_else(|| {
                                        err(&key, "expected a duration like \"2s\" for key")
                                    })?);
                            }
                            "policy" => {
                                cfg.policy = Some(match v.as_str() {
                                    Some("fill-highest-first") => PolicyKind::FillHighestFirst,
                                    Some("known-order") => PolicyKind::KnownOrder,
                                    _ => {
                                        return Err(err(
                                            &key,
                                            "expected \"fill-highest-first\" or \"known-order\" for key",
                                        ))
                                    }
                                });
                            }
                            "access_order" => {
                                cfg.access_order = Some(
                                    v.as_str()
                                        .filter(|s| !s.is_empty())
                                        .ok_or_else(|| err(&key, "expected a file path for key"))?
                                        .into(),
                                );
                            }
                            "prefetch_window" => {
                                cfg.prefetch_window =
                                    Some(size_value(v).filter(|w| *w > 0).ok_or_else(|| {
                                        err(&key, "expected a non-zero size like \"2G\" for key")
                                    })?);
                            }
                            "page_cache" => {
                                cfg.page_cache = Some(
                                    v.as_str()
                                        .and_then(crate::placement::residency::Budget::parse)
                                        .ok_or_else(|| {
                                            err(
                                                &key,
                                                "expected \"auto\", \"off\" or a size like \"200G\" for key",
                                            )
                                        })?,
                                );
                            }
                            _ => return Err(err(&key, "unknown key")),
                        }
                    }
                }
                "reuse" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| err("reuse", "expected a table for key"))?;
                    for (k, v) in t {
                        let key = format!("reuse.{k}");
                        match k.as_str() {
                            "verify" => {
                                cfg.verify = Some(match v.as_str() {
                                    Some("checksum") => Verify::Checksum,
                                    // "size" was the old name of the cheap check.
                                    Some("identity" | "size") => Verify::Identity,
                                    _ => {
                                        return Err(err(
                                            &key,
                                            "expected \"identity\" or \"checksum\" for key",
                                        ))
                                    }
                                });
                            }
                            _ => return Err(err(&key, "unknown key")),
                        }
                    }
                }
                "catalog" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| err("catalog", "expected a table for key"))?;
                    for (k, v) in t {
                        let key = format!("catalog.{k}");
                        match k.as_str() {
                            "immutable" => {
                                cfg.immutable =
                                    Some(v.as_bool().ok_or_else(|| {
                                        err(&key, "expected true or false for key")
                                    })?);
                            }
                            "validate_threads" => {
                                let n = v
                                    .as_integer()
                                    .filter(|n| (0..=256).contains(n))
                                    .ok_or_else(|| {
                                        err(&key, "expected an integer 0..256 for key")
                                    })?;
                                cfg.validate_threads = Some(n as usize);
                            }
                            _ => return Err(err(&key, "unknown key")),
                        }
                    }
                }
                "mmap" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| err("mmap", "expected a table for key"))?;
                    cfg.mmap = Some(crate::placement::mapping::MmapConfig::parse(
                        t, &err, size_value,
                    )?);
                }
                "agent" => {
                    let t = v
                        .as_table()
                        .ok_or_else(|| err("agent", "expected a table for key"))?;
                    for (k, v) in t {
                        let key = format!("agent.{k}");
                        match k.as_str() {
                            "idle_timeout" => {
                                cfg.idle_timeout = Some(duration_value(v).ok_or_else(|| {
                                    err(&key, "expected a duration like \"30s\" for key")
                                })?);
                            }
                            "log_level" => {
                                let s = v
                                    .as_str()
                                    .filter(|s| {
                                        ["error", "warn", "info", "debug", "trace", "off"]
                                            .contains(s)
                                    })
                                    .ok_or_else(|| {
                                        err(&key, "expected one of error/warn/info/debug/trace/off for key")
                                    })?;
                                cfg.log_level = Some(s.to_string());
                            }
                            "log_file" => {
                                cfg.log_file = Some(PathBuf::from(
                                    v.as_str()
                                        .ok_or_else(|| err(&key, "expected a string for key"))?,
                                ))
                            }
                            _ => return Err(err(&key, "unknown key")),
                        }
                    }
                }
                other => return Err(err(other, "unknown key")),
            }
        }
        Ok(cfg)
    }
}

/// Seconds as an integer, or a string like "2s", "500ms".
fn duration_value(v: &toml::Value) -> Option<Duration> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Some(Duration::from_secs(*n as u64)),
        toml::Value::String(s) => parse_duration(s),
        _ => None,
    }
}

fn size_value(v: &toml::Value) -> Option<u64> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Some(*n as u64),
        toml::Value::String(s) => parse_size(s),
        _ => None,
    }
}

/// `--tier PATH[=SIZE]`.
pub fn parse_tier_flag(s: &str) -> Result<TierConfig, ConfigError> {
    let (path, cap) = match s.rsplit_once('=') {
        Some((p, c)) => (
            p,
            Some(parse_size(c).ok_or_else(|| ConfigError::TierFlag(s.to_string()))?),
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

/// Line of `key` (`tier[1].capacity`, `agent`, `placement.workers`) in the source text: a plain
/// scan of table headers and `key =` lines, enough for error messages.
fn find_line(src: &str, key: &str) -> Option<usize> {
    let (section, leaf) = match key.rsplit_once('.') {
        Some((s, l)) => (s.to_string(), l),
        None => (String::new(), key),
    };
    let mut current = String::new();
    let mut tier_count = 0usize;
    for (n, line) in src.lines().enumerate() {
        let l = line.trim();
        if let Some(h) = l.strip_prefix("[[").and_then(|h| h.split("]]").next()) {
            let h = h.trim();
            if h == "tier" {
                current = format!("tier[{tier_count}]");
                tier_count += 1;
            } else {
                current = h.to_string();
            }
            if section.is_empty() && h == leaf {
                return Some(n + 1);
            }
            continue;
        }
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.split(']').next()) {
            current = h.trim().to_string();
            if section.is_empty() && current == leaf {
                return Some(n + 1);
            }
            continue;
        }
        if let Some((k, _)) = l.split_once('=') {
            let k = k.trim().trim_matches('"');
            if current == section && k == leaf {
                return Some(n + 1);
            }
        }
    }
    None
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
        let e = Config::parse("[[tier]]\ncapacity = 1\n").unwrap_err();
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
    }
}

/// The default tier when neither flags nor a config name one: `<dir>/granary-<user>` in the
/// first writable of `$GRANARY_CACHE_DIR`, `$SLURM_TMPDIR`, `$TMPDIR`, `/tmp`.
pub fn default_tier() -> Option<TierConfig> {
    let user = crate::sys::user_name();
    let mut dirs: Vec<PathBuf> = ["GRANARY_CACHE_DIR", "SLURM_TMPDIR", "TMPDIR"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    dirs.push(PathBuf::from("/tmp"));
    dirs.into_iter()
        .find(|d| {
            let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).ok();
            // SAFETY: access(2) on a NUL-terminated path.
            d.is_dir()
                && c.is_some_and(
                    |c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0,
                )
        })
        .map(|d| TierConfig {
            path: d.join(format!("granary-{user}")),
            capacity: None,
            block_size: None,
        })
}

#[derive(Debug, thiserror::Error)]
#[error("tier {path}: {cause}")]
pub struct TierError {
    pub path: PathBuf,
    pub cause: std::io::Error,
}

/// Creates each tier's directory (mode 0700) and fills in capacities (90 % of the free space)
/// and block sizes. The flag `true` in the result marks capacities that were defaulted.
pub fn resolve_tiers(cfg: &[TierConfig]) -> Result<Vec<(crate::tiers::TierSpec, bool)>, TierError> {
    cfg.iter()
        .map(|t| {
            let err = |cause| TierError {
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
                },
                defaulted,
            ))
        })
        .collect()
}
