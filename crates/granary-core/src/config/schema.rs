//! The configuration file's schema: serde structs that refuse unknown keys, and value types that
//! check what they accept, so an error names the key (`serde_path_to_error`) and its line (the
//! TOML span) in one line.

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::settings::{Config, PolicyKind, TierConfig, Verify};
use crate::size::{parse_duration, parse_size};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    tier: Vec<Tier>,
    #[serde(default)]
    placement: Placement,
    #[serde(default)]
    catalog: Catalog,
    #[serde(default)]
    reuse: Reuse,
    #[serde(default)]
    agent: Agent,
    mmap: Option<Mmap>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tier {
    path: PathBuf,
    capacity: Option<Checked<CapacityRule>>,
    block_size: Option<Checked<NonZeroSize<4>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Placement {
    workers: Option<Checked<Count<1, 1024>>>,
    block_size: Option<Checked<BlockSize>>,
    max_source_streams: Option<Checked<Count<1, 1024>>>,
    prefetch_min_size: Option<Checked<AnySize<1>>>,
    chunk_size: Option<Checked<ChunkSize>>,
    small_copy_delay: Option<Checked<Dur<2>>>,
    policy: Option<Checked<Policy>>,
    access_order: Option<Checked<FilePath>>,
    prefetch_window: Option<Checked<NonZeroSize<2>>>,
    page_cache: Option<Checked<PageCache>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Catalog {
    immutable: Option<Checked<Bool>>,
    validate_threads: Option<Checked<Count<0, 256>>>,
    pin_inodes: Option<Checked<Bool>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Reuse {
    verify: Option<Checked<VerifyRule>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Mmap {
    mode: Option<Checked<MmapMode>>,
    distance: Option<Checked<MapSize>>,
    size: Option<Checked<MapSize>>,
    threshold: Option<Checked<Percent>>,
    lmdb_index: Option<Checked<Bool>>,
    sequential_advice: Option<Checked<Bool>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Agent {
    idle_timeout: Option<Checked<Dur<30>>>,
    log_level: Option<Checked<LogLevel>>,
    log_file: Option<Checked<FilePath>>,
}

impl File {
    pub(super) fn into_config(self) -> Config {
        let p = self.placement;
        Config {
            tiers: self
                .tier
                .into_iter()
                .map(|t| TierConfig {
                    path: t.path,
                    capacity: t.capacity.map(|c| c.0),
                    block_size: t.block_size.map(|c| c.0),
                })
                .collect(),
            workers: p.workers.map(|c| c.0 as usize),
            block_size: p.block_size.map(|c| c.0),
            max_source_streams: p.max_source_streams.map(|c| c.0 as usize),
            prefetch_min_size: p.prefetch_min_size.map(|c| c.0),
            chunk_size: p.chunk_size.map(|c| c.0),
            small_copy_delay: p.small_copy_delay.map(|c| c.0),
            policy: p.policy.map(|c| c.0),
            access_order: p.access_order.map(|c| c.0),
            prefetch_window: p.prefetch_window.map(|c| c.0),
            page_cache: p.page_cache.map(|c| c.0),
            verify: self.reuse.verify.map(|c| c.0),
            immutable: self.catalog.immutable.map(|c| c.0),
            validate_threads: self.catalog.validate_threads.map(|c| c.0 as usize),
            pin_inodes: self.catalog.pin_inodes.map(|c| c.0),
            idle_timeout: self.agent.idle_timeout.map(|c| c.0),
            log_level: self.agent.log_level.map(|c| c.0),
            log_file: self.agent.log_file.map(|c| c.0),
            mmap: self.mmap.map(|m| crate::placement::mmap::MmapConfig {
                mode: m.mode.map(|c| c.0),
                distance: m.distance.map(|c| c.0),
                size: m.size.map(|c| c.0),
                threshold_pct: m.threshold.map(|c| c.0),
                lmdb_index: m.lmdb_index.map(|c| c.0),
                sequential_advice: m.sequential_advice.map(|c| c.0),
            }),
        }
    }
}

/// A value of `R::Out` that `R` accepted; a refused value is the error "expected …".
struct Checked<R: Rule>(R::Out);

/// What a key accepts: what it expects (for the error) and how a TOML value becomes it.
trait Rule {
    type Out;
    const EXPECTED: &'static str;
    fn int(_v: i64) -> Option<Self::Out> {
        None
    }
    fn str(_v: &str) -> Option<Self::Out> {
        None
    }
    fn bool(_v: bool) -> Option<Self::Out> {
        None
    }
    /// A reason more precise than `EXPECTED`, for a value of the right kind that is refused.
    fn why(_v: &str) -> Option<String> {
        None
    }
}

impl<'de, R: Rule> Deserialize<'de> for Checked<R> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<R>(PhantomData<R>);
        impl<R: Rule> V<R> {
            fn refuse<E: de::Error>(shown: &str) -> E {
                match R::why(shown) {
                    Some(why) => E::custom(why),
                    None => E::custom(format!("expected {}", R::EXPECTED)),
                }
            }
        }
        impl<R: Rule> Visitor<'_> for V<R> {
            type Value = Checked<R>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(R::EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                R::int(v)
                    .map(Checked)
                    .ok_or_else(|| Self::refuse(&v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                R::str(v).map(Checked).ok_or_else(|| Self::refuse(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                R::bool(v)
                    .map(Checked)
                    .ok_or_else(|| E::custom(format!("expected {}", R::EXPECTED)))
            }
            fn visit_f64<E: de::Error>(self, _v: f64) -> Result<Self::Value, E> {
                Err(E::custom(format!("expected {}", R::EXPECTED)))
            }
        }
        d.deserialize_any(V::<R>(PhantomData))
    }
}

fn size_of(v: &str) -> Option<u64> {
    parse_size(v)
}

fn int_size(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

struct Count<const MIN: i64, const MAX: i64>;
impl<const MIN: i64, const MAX: i64> Rule for Count<MIN, MAX> {
    type Out = u64;
    const EXPECTED: &'static str = "an integer in range";
    fn int(v: i64) -> Option<u64> {
        (MIN..=MAX).contains(&v).then_some(v as u64)
    }
    fn why(_v: &str) -> Option<String> {
        Some(format!("expected an integer {MIN}..{MAX}"))
    }
}

/// Any size; `E` picks the example shown (`1M`).
struct AnySize<const E: u8>;
impl<const E: u8> Rule for AnySize<E> {
    type Out = u64;
    const EXPECTED: &'static str = "a size like \"1M\"";
    fn int(v: i64) -> Option<u64> {
        int_size(v)
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v)
    }
}

/// A non-zero size; `E` picks the example shown (4 → `4K`, 2 → `2G`).
struct NonZeroSize<const E: u8>;
impl<const E: u8> Rule for NonZeroSize<E> {
    type Out = u64;
    const EXPECTED: &'static str = "a non-zero size";
    fn int(v: i64) -> Option<u64> {
        int_size(v).filter(|n| *n > 0)
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v).filter(|n| *n > 0)
    }
    fn why(_v: &str) -> Option<String> {
        Some(match E {
            4 => "expected a non-zero size like \"4K\"".into(),
            _ => "expected a non-zero size like \"2G\"".into(),
        })
    }
}

struct BlockSize;
impl Rule for BlockSize {
    type Out = u64;
    const EXPECTED: &'static str = "a size 4K..1G like \"8M\"";
    fn int(v: i64) -> Option<u64> {
        int_size(v).filter(|b| (4096..=1 << 30).contains(b))
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v).filter(|b| (4096..=1 << 30).contains(b))
    }
}

struct ChunkSize;
impl Rule for ChunkSize {
    type Out = u64;
    const EXPECTED: &'static str = "a non-zero multiple of 4K like \"4M\"";
    fn int(v: i64) -> Option<u64> {
        int_size(v).filter(|c| *c > 0 && c % 4096 == 0)
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v).filter(|c| *c > 0 && c % 4096 == 0)
    }
}

struct CapacityRule;
impl Rule for CapacityRule {
    type Out = u64;
    const EXPECTED: &'static str = "a size like \"8G\"";
    fn int(v: i64) -> Option<u64> {
        int_size(v).filter(|c| crate::size::check_capacity(*c).is_ok())
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v).filter(|c| crate::size::check_capacity(*c).is_ok())
    }
    fn why(v: &str) -> Option<String> {
        match crate::size::parse_capacity(v) {
            Err(why) if why.starts_with('(') => Some(format!("capacity {why}")),
            Err(why) => Some(why),
            Ok(_) => None,
        }
    }
}

/// Seconds as an integer, or a string like "2s", "500ms"; `E` is the example's seconds.
struct Dur<const E: u64>;
impl<const E: u64> Rule for Dur<E> {
    type Out = Duration;
    const EXPECTED: &'static str = "a duration";
    fn int(v: i64) -> Option<Duration> {
        u64::try_from(v).ok().map(Duration::from_secs)
    }
    fn str(v: &str) -> Option<Duration> {
        parse_duration(v)
    }
    fn why(_v: &str) -> Option<String> {
        Some(format!("expected a duration like \"{E}s\""))
    }
}

struct Policy;
impl Rule for Policy {
    type Out = PolicyKind;
    const EXPECTED: &'static str = "\"fill-highest-first\" or \"known-order\"";
    fn str(v: &str) -> Option<PolicyKind> {
        match v {
            "fill-highest-first" => Some(PolicyKind::FillHighestFirst),
            "known-order" => Some(PolicyKind::KnownOrder),
            _ => None,
        }
    }
}

struct PageCache;
impl Rule for PageCache {
    type Out = crate::placement::residency::Budget;
    const EXPECTED: &'static str = "\"auto\", \"off\" or a size like \"200G\"";
    fn str(v: &str) -> Option<Self::Out> {
        crate::placement::residency::Budget::parse(v)
    }
}

struct VerifyRule;
impl Rule for VerifyRule {
    type Out = Verify;
    const EXPECTED: &'static str = "\"identity\" or \"checksum\"";
    fn str(v: &str) -> Option<Verify> {
        match v {
            "checksum" => Some(Verify::Checksum),
            // "size" was the old name of the cheap check.
            "identity" | "size" => Some(Verify::Identity),
            _ => None,
        }
    }
}

struct Bool;
impl Rule for Bool {
    type Out = bool;
    const EXPECTED: &'static str = "true or false";
    fn bool(v: bool) -> Option<bool> {
        Some(v)
    }
}

struct FilePath;
impl Rule for FilePath {
    type Out = PathBuf;
    const EXPECTED: &'static str = "a file path";
    fn str(v: &str) -> Option<PathBuf> {
        (!v.is_empty()).then(|| PathBuf::from(v))
    }
}

struct LogLevel;
impl Rule for LogLevel {
    type Out = String;
    const EXPECTED: &'static str = "one of error/warn/info/debug/trace/off";
    fn str(v: &str) -> Option<String> {
        matches!(v, "error" | "warn" | "info" | "debug" | "trace" | "off").then(|| v.to_string())
    }
}

struct MmapMode;
impl Rule for MmapMode {
    type Out = crate::placement::mmap::Mode;
    const EXPECTED: &'static str = "\"prefetch\", \"watch\" or \"off\"";
    fn str(v: &str) -> Option<Self::Out> {
        crate::placement::mmap::Mode::parse(v)
    }
}

struct MapSize;
impl Rule for MapSize {
    type Out = u64;
    const EXPECTED: &'static str = "a size 4K..1T like \"8M\"";
    fn int(v: i64) -> Option<u64> {
        int_size(v).filter(|n| (4096..=1 << 40).contains(n))
    }
    fn str(v: &str) -> Option<u64> {
        size_of(v).filter(|n| (4096..=1 << 40).contains(n))
    }
}

struct Percent;
impl Rule for Percent {
    type Out = u64;
    const EXPECTED: &'static str = "a percentage 1..100 like 75";
    fn int(v: i64) -> Option<u64> {
        (1..=100).contains(&v).then_some(v as u64)
    }
    fn str(v: &str) -> Option<u64> {
        let n: i64 = v.trim_end_matches('%').trim().parse().ok()?;
        Self::int(n)
    }
}
