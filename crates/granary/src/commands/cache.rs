//! `granary cache`: the copies on this node, per source and tier — listed, removed, verified —
//! with or without an agent running. With one, it is asked first: it records the copies it
//! placed since its last save, says which sources jobs use, and removes what no job uses;
//! without one, the command holds the agent's lock while it takes directories away, so none
//! starts meanwhile. (`granary_core::cache` has the model; docs/cache.md the rules.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use granary_agent::client::{self, CacheAnswer};
use granary_core::cache::{copies, inventory, registry, remove, verify};
use granary_core::runtime::Runtime;
use granary_core::size::format_size;

use crate::flags::cache::{CacheAction, CacheArgs, CleanArgs, VerifyArgs};
use crate::output::{out, say};

pub fn main(a: CacheArgs) -> Result<i32> {
    let rt = Runtime::open()?;
    match &a.action {
        None => list(&a, &rt),
        Some(CacheAction::Clean(c)) => clean(&a, c, &rt),
        Some(CacheAction::Verify(v)) => verify_all(&a, v, &rt),
    }
}

/// The running agent's answer (`None`: no agent), its copies recorded first.
fn ask_agent(rt: &Runtime, clean: Vec<PathBuf>) -> Result<Option<CacheAnswer>> {
    client::cache(rt, clean).map_err(|e| match client::silent_pid(&e) {
        Some(_) => anyhow::anyhow!("{e}; `granary stop` ends it, then run this again"),
        None => e,
    })
}

/// The tier roots to look at: those `--tier` names, else the configuration's, the default
/// tier, the ones this user's agents used and the running agent's. Only existing directories.
fn roots(a: &CacheArgs, agent: Option<&CacheAnswer>) -> Result<Vec<PathBuf>> {
    let mut named = Vec::new();
    for t in &a.tiers {
        named.push(granary_core::config::parse_tier_flag(t)?.path);
    }
    if !named.is_empty() {
        for t in &named {
            granary_core::tierdir::open_root(t)?;
        }
        return Ok(dedup(named));
    }
    let mut all = Vec::new();
    let file = a.config.clone().or_else(|| {
        std::env::var_os("GRANARY_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    if let Some(f) = file {
        let cfg = granary_core::config::Config::load(&f)?;
        all.extend(cfg.tiers.into_iter().map(|t| t.path));
    }
    match granary_core::config::default_tier_path() {
        Ok(p) => all.push(p),
        Err(e) => say(format!("granary cache: {e}")),
    }
    all.extend(registry::known());
    if let Some(ans) = agent {
        all.extend(ans.tiers.iter().cloned());
    }
    Ok(dedup(all)
        .into_iter()
        .filter(|r| granary_core::tierdir::open_root(r).is_ok())
        .collect())
}

/// Absolute, resolved where possible, each once, in the order given.
fn dedup(v: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        let p = granary_core::source::normalize(&p).unwrap_or(p);
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Every source directory in `roots`.
fn stores(roots: &[PathBuf]) -> Vec<inventory::Store> {
    let mut v = Vec::new();
    for r in roots {
        match inventory::stores(r) {
            Ok(s) => v.extend(s),
            Err(e) => say(format!("granary cache: {e}")),
        }
    }
    v
}

/// How a source was served, in words.
fn served_as(s: &inventory::Store) -> String {
    match (&s.pack, s.mount) {
        (Some(p), true) => format!(" (pack {}, mounted here)", p.display()),
        (Some(p), false) => format!(" (from pack {})", p.display()),
        (None, _) => String::new(),
    }
}

fn source_name(s: &inventory::Store) -> String {
    s.source.as_ref().map_or_else(
        || format!("unknown source ({})", s.id),
        |p| p.display().to_string(),
    )
}

fn ago(t: Option<i64>) -> String {
    let Some(t) = t else {
        return "never".into();
    };
    let now = (copies::now_ns() / 1_000_000_000) as i64;
    let d = (now - t).max(0);
    match d {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", d / 60),
        3600..172_800 => format!("{} h ago", d / 3600),
        _ => format!("{} days ago", d / 86_400),
    }
}

/// Whether a directory's copies are valid, in words. `jobs`: the running agent's jobs on a
/// table of its source id (`None`: it holds none).
fn state(s: &inventory::Store, jobs: Option<usize>) -> String {
    let mut wrong = Vec::new();
    if s.source_present == Some(false) {
        let gone = match (&s.pack, s.mount) {
            (Some(p), true) => p.display().to_string(),
            _ => source_name(s),
        };
        wrong.push(format!("{gone} is gone"));
    }
    if let Some(p) = &s.record_problem {
        wrong.push(format!("record of copies unusable ({p})"));
    }
    if s.unrecorded > 0 && jobs.is_none() {
        wrong.push(format!(
            "{} not recorded (removed at the source's next job)",
            s.unrecorded
        ));
    }
    if s.missing > 0 {
        wrong.push(format!("{} recorded but gone", s.missing));
    }
    if s.changed > 0 {
        wrong.push(format!(
            "{} changed since placed (never served; replaced at the source's next job)",
            s.changed
        ));
    }
    let mut v = if wrong.is_empty() {
        vec![if s.files > 0 { "valid" } else { "empty" }.to_string()]
    } else {
        wrong
    };
    if s.unrecorded > 0 && jobs.is_some() {
        v.push(format!(
            "{} just placed (recorded at the agent's next save)",
            s.unrecorded
        ));
    }
    if let Some(n) = jobs.filter(|n| *n > 0) {
        v.push(format!("in use by {n} job(s)"));
    }
    v.join(", ")
}

fn list(a: &CacheArgs, rt: &Runtime) -> Result<i32> {
    let agent = ask_agent(rt, Vec::new())?;
    let roots = roots(a, agent.as_ref())?;
    let stores = stores(&roots);
    // The agent's jobs on a table of this directory's source id with a tier at its root.
    let jobs = |s: &inventory::Store| -> Option<usize> {
        let held: Vec<usize> = agent
            .as_ref()
            .map(|ans| {
                ans.in_use
                    .iter()
                    .filter(|u| u.id == s.id && dedup(u.tiers.clone()).contains(&s.tier))
                    .map(|u| u.jobs)
                    .collect()
            })
            .unwrap_or_default();
        (!held.is_empty()).then(|| held.iter().sum())
    };
    if a.json {
        let v = serde_json::json!({
            "agent_running": agent.is_some(),
            "tiers": roots,
            "sources": stores.iter().map(|s| {
                let mut j = serde_json::to_value(s).unwrap_or_default();
                j["jobs"] = jobs(s).unwrap_or(0).into();
                j["dir"] = serde_json::to_value(s.dir()).unwrap_or_default();
                j
            }).collect::<Vec<_>>(),
        });
        out(&serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    if stores.is_empty() {
        out(&format!(
            "granary cache: no copies in {}",
            if roots.is_empty() {
                "any tier (none found; name one with --tier)".to_string()
            } else {
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
        return Ok(0);
    }
    // One block per source (and way it was served), its tiers below.
    let mut by_source: BTreeMap<String, Vec<&inventory::Store>> = BTreeMap::new();
    for s in &stores {
        by_source
            .entry(format!("{}{}", source_name(s), served_as(s)))
            .or_default()
            .push(s);
    }
    let (mut files, mut bytes, mut disk) = (0, 0, 0);
    for (src, ss) in &by_source {
        out(src);
        for s in ss {
            out(&format!(
                "  tier {}: {} files, {}, last used {}: {}",
                s.tier.display(),
                s.files,
                format_size(s.bytes),
                ago(s.last_use),
                state(s, jobs(s))
            ));
            files += s.files;
            bytes += s.bytes;
            disk += s.disk_bytes;
        }
    }
    out(&format!(
        "{} copies, {} ({} on disk with catalogs) in {} director{}; agent {}. \
         `granary cache verify` re-reads them, `granary cache clean` removes them.",
        files,
        format_size(bytes),
        format_size(disk),
        stores.len(),
        if stores.len() == 1 { "y" } else { "ies" },
        if agent.is_some() {
            "running"
        } else {
            "not running"
        }
    ));
    Ok(0)
}

/// True if `s` is the source `want` names: the path a job gave (`--source`, `--mount`) or the
/// pack, as given or resolved.
fn names(want: &Path, s: &inventory::Store) -> bool {
    let given = granary_core::source::normalize(want).unwrap_or_else(|_| want.to_path_buf());
    let real = std::fs::canonicalize(&given).unwrap_or_else(|_| given.clone());
    [s.source.as_deref(), s.pack.as_deref()]
        .into_iter()
        .flatten()
        .any(|p| p == given || p == real)
}

fn clean(a: &CacheArgs, c: &CleanArgs, rt: &Runtime) -> Result<i32> {
    let older = match &c.older_than {
        Some(d) => Some(granary_core::size::parse_duration(d).with_context(|| {
            format!("bad --older-than `{d}`: expected a duration like 12h or 7d")
        })?),
        None => None,
    };
    // The agent records its copies first, so the last use compared is today's.
    let agent = ask_agent(rt, Vec::new())?;
    let roots = roots(a, agent.as_ref())?;
    let now = (copies::now_ns() / 1_000_000_000) as i64;
    let chosen: Vec<inventory::Store> = stores(&roots)
        .into_iter()
        .filter(|s| c.all || c.source.as_deref().is_none_or(|w| names(w, s)))
        .filter(|s| {
            older.is_none_or(|d: Duration| s.last_use.is_none_or(|t| now - t >= d.as_secs() as i64))
        })
        .collect();
    let leftovers: Vec<PathBuf> = roots.iter().flat_map(|r| remove::leftovers(r)).collect();
    if let (Some(w), true) = (&c.source, chosen.is_empty()) {
        say(format!(
            "granary cache clean: no copies of {} in {} (`granary cache` lists what there is)",
            w.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if c.dry_run {
        for s in &chosen {
            out(&format!(
                "would remove {}: copies of {}{}, {} files, {}",
                s.dir().display(),
                source_name(s),
                served_as(s),
                s.files,
                format_size(s.disk_bytes)
            ));
        }
        return Ok(0);
    }
    let dirs: Vec<PathBuf> = chosen.iter().map(|s| s.dir()).collect();
    let (taken, refused) = take_away(rt, dirs)?;
    let mut freed = 0;
    for (dir, trash) in taken
        .iter()
        .map(|(d, t)| (d, t))
        .chain(leftovers.iter().map(|l| (l, l)))
    {
        match remove::delete(trash) {
            Ok(()) => {
                if let Some(s) = chosen.iter().find(|s| &s.dir() == dir) {
                    freed += s.disk_bytes;
                    out(&format!(
                        "removed {}: copies of {}{}, {} files, {}",
                        dir.display(),
                        source_name(s),
                        served_as(s),
                        s.files,
                        format_size(s.disk_bytes)
                    ));
                } else {
                    out(&format!(
                        "removed {} (left by an interrupted clean)",
                        dir.display()
                    ));
                }
            }
            Err(e) => say(format!("granary cache clean: {}: {e}", trash.display())),
        }
    }
    for (dir, why) in &refused {
        say(format!(
            "granary cache clean: kept {}: {why}",
            dir.display()
        ));
    }
    if taken.is_empty() && refused.is_empty() && c.source.is_none() {
        out("granary cache clean: nothing to remove");
    } else if !taken.is_empty() {
        out(&format!(
            "granary cache clean: {} director{} removed, {} freed{}",
            taken.len(),
            if taken.len() == 1 { "y" } else { "ies" },
            format_size(freed),
            if refused.is_empty() {
                String::new()
            } else {
                format!("; {} kept (in use)", refused.len())
            }
        ));
    }
    Ok(if refused.is_empty() { 0 } else { 1 })
}

/// Takes `dirs` away (renamed to trash): through the running agent, which keeps those its jobs
/// use; with none running, under the agent's lock, so none starts meanwhile. Returns the
/// directories taken (with their trash) and those kept (with why).
#[allow(clippy::type_complexity)]
fn take_away(
    rt: &Runtime,
    dirs: Vec<PathBuf>,
) -> Result<(Vec<(PathBuf, PathBuf)>, Vec<(PathBuf, String)>)> {
    if dirs.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    for _ in 0..50 {
        let alive = rt
            .open_alive()
            .with_context(|| format!("opening {}", rt.alive().display()))?;
        if granary_core::sys::flock_exclusive_within(&alive, Duration::ZERO)? {
            let (mut taken, mut refused) = (Vec::new(), Vec::new());
            for d in dirs {
                let (Some(root), Some(id)) = (d.parent(), d.file_name().and_then(|n| n.to_str()))
                else {
                    continue;
                };
                match remove::take_away(root, id) {
                    Ok(Some(t)) => taken.push((d, t)),
                    Ok(None) => {}
                    Err(e) => refused.push((d, e.to_string())),
                }
            }
            drop(alive);
            return Ok((taken, refused));
        }
        drop(alive);
        // An agent holds the lock: it decides (unless it is gone by now, or still starting).
        if let Some(ans) = ask_agent(rt, dirs.clone())? {
            return Ok((
                ans.taken.into_iter().map(|t| (t.dir, t.trash)).collect(),
                ans.refused.into_iter().map(|r| (r.dir, r.reason)).collect(),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "an agent holds {} but does not answer on its socket; `granary stop` ends it",
        rt.alive().display()
    )
}

fn verify_all(a: &CacheArgs, v: &VerifyArgs, rt: &Runtime) -> Result<i32> {
    let agent = ask_agent(rt, Vec::new())?;
    let roots = roots(a, agent.as_ref())?;
    let chosen: Vec<inventory::Store> = stores(&roots)
        .into_iter()
        .filter(|s| v.source.as_deref().is_none_or(|w| names(w, s)))
        .collect();
    let (mut valid, mut bad) = (0u64, 0u64);
    for s in &chosen {
        let head = format!(
            "{}{}, tier {}",
            source_name(s),
            served_as(s),
            s.tier.display()
        );
        let rec = match granary_core::cache::inventory::read_record(&s.tier, &s.id) {
            Ok(Some(r)) => r,
            Ok(None) => {
                out(&format!(
                    "{head}: {} files, none recorded (no checksum to compare; the source's next \
                     job re-reads them)",
                    s.files
                ));
                continue;
            }
            Err(e) => {
                out(&format!("{head}: record of copies unusable: {e}"));
                bad += s.files;
                continue;
            }
        };
        let catalog = verify::find_catalog(&roots, &s.id);
        let tree = match (&s.source, s.mount) {
            (Some(src), false) => Some(src.as_path()),
            _ => None,
        };
        let r = verify::verify(&s.tier, &s.id, &rec, catalog.as_ref().map(|c| &c.1), tree)?;
        valid += r.valid;
        bad += (r.damaged.len() + r.missing.len() + r.changed.len()) as u64;
        let mut parts = vec![format!("{} valid", r.valid)];
        let show = |what: &str, v: &[String]| {
            let first: Vec<&str> = v.iter().take(5).map(|s| s.as_str()).collect();
            format!(
                "{} {what} ({}{})",
                v.len(),
                first.join(", "),
                if v.len() > 5 { ", …" } else { "" }
            )
        };
        if !r.damaged.is_empty() {
            parts.push(show("damaged", &r.damaged));
        }
        if !r.missing.is_empty() {
            parts.push(show("gone or replaced", &r.missing));
        }
        if !r.changed.is_empty() {
            parts.push(show("changed on the source", &r.changed));
        }
        if r.source_unchecked > 0 && tree.is_some() {
            parts.push(format!(
                "{} not checked against the source (no catalog)",
                r.source_unchecked
            ));
        }
        if s.unrecorded > 0 {
            parts.push(format!("{} not recorded", s.unrecorded));
        }
        out(&format!("{head}: {}", parts.join(", ")));
    }
    if bad > 0 {
        out(&format!(
            "granary cache verify: {bad} copies are not valid (of {}): never served — every \
             open checks its copy — and replaced at the source's next job; `granary cache \
             clean --source S` removes them now",
            valid + bad
        ));
        return Ok(1);
    }
    out(&format!("granary cache verify: {valid} copies valid"));
    Ok(0)
}
