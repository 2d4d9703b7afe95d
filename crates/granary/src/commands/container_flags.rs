//! `granary container-flags`: what a container started by a daemon (`docker run`) needs to be
//! served, as one line of flags: the binds of the source, the tiers, the runtime directory and
//! the preload library, the user and groups, and the job's variables (`jobenv::JOB_VARS`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::flags::container::{ContainerFlagsArgs, Runtime};
use crate::flags::tiers::TierArgs;
use crate::jobenv::JOB_VARS;

/// `granary container-flags`: one line of flags on stdout.
pub fn main(a: ContainerFlagsArgs) -> Result<i32> {
    let targs = TierArgs {
        tiers: a.tiers,
        config: a.config,
        ..TierArgs::default()
    };
    let cfg = targs.config()?;
    let source = granary_core::source::normalize(&a.source)?;
    let tiers: Vec<_> = targs
        .job_tiers(&cfg, false)?
        .into_iter()
        .map(|t| t.0)
        .collect();
    let runtime = granary_core::runtime::Runtime::open()?.dir;
    let preload = crate::preload::find()?;
    let libdir = preload.parent().unwrap_or(Path::new("/")).to_path_buf();
    let mut binds: Vec<(PathBuf, bool)> = vec![(source.clone(), false)];
    if let Ok(real) = source.canonicalize() {
        if real != source {
            binds.push((real, false));
        }
    }
    binds.extend(tiers.iter().map(|t| (t.path.clone(), false)));
    binds.push((runtime, false));
    binds.push((libdir, true));
    for (p, _) in &binds {
        let s = p
            .to_str()
            .with_context(|| format!("{} is not UTF-8", p.display()))?;
        if s.contains([':', ',', ' ', '\t', '\n']) {
            bail!(
                "{} contains ':', ',' or white space, which bind flags cannot carry; \
                 use a path without them",
                p.display()
            );
        }
    }
    let line = render(a.runtime, &binds);
    crate::output::out(&line);
    Ok(0)
}

fn render(runtime: Runtime, binds: &[(PathBuf, bool)]) -> String {
    let mut out: Vec<String> = Vec::new();
    match runtime {
        Runtime::Docker | Runtime::Podman => {
            let uid = granary_core::sys::uid();
            if runtime == Runtime::Podman && uid != 0 {
                // Rootless: the same uid inside, and the user's groups kept, so the catalog's
                // permission answers (made with the user's credentials) hold inside.
                out.push("--userns=keep-id".into());
                out.push("--group-add=keep-groups".into());
            } else {
                let (_, gid, _) = granary_core::sys::creds();
                out.push(format!("--user={uid}:{gid}"));
                let mut groups = granary_core::sys::groups();
                groups.sort_unstable();
                groups.dedup();
                for g in groups {
                    out.push(format!("--group-add={g}"));
                }
            }
            for (p, ro) in binds {
                let p = p.display();
                out.push(format!("--volume={p}:{p}{}", if *ro { ":ro" } else { "" }));
            }
            // Without a value: the value is taken from the environment `granary run` gives.
            for v in JOB_VARS.iter().filter(|v| **v != "GRANARY_TABLE_FD") {
                out.push(format!("--env={v}"));
            }
        }
        Runtime::Apptainer => {
            let list: Vec<String> = binds
                .iter()
                .map(|(p, ro)| {
                    let p = p.display();
                    format!("{p}:{p}{}", if *ro { ":ro" } else { "" })
                })
                .collect();
            out.push(format!("--bind={}", list.join(",")));
        }
    }
    out.join(" ")
}
