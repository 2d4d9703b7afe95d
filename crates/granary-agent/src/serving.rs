//! A serving rank's part of the agent (cluster mode, `crate::cluster`), as the rest of the
//! agent sees it: which source it serves, and its node of the job once the catalog arrived. The
//! agent never calls into cluster mode but through `ServingNode`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Result};

use crate::protocol::ClusterStatus;

/// A serving rank's part of the agent (cluster mode, `crate::cluster`), as the rest of the
/// agent sees it: the agent never calls into cluster mode but through `ServingNode`.
pub struct Serving {
    /// The served source (normalized): jobs may attach to it only, once `node` is set. With
    /// `mount`, where the programs expect the tree that exists only in the pack.
    pub source: PathBuf,
    /// The pack it is served from (`--pack`, absolute), and whether only the pack exists
    /// (`--mount`): a job attaching to the source is served from it.
    pub pack: Option<PathBuf>,
    pub mount: bool,
    pub rank: u32,
    pub ranks: u32,
    pub node: OnceLock<Arc<dyn ServingNode>>,
    /// Why this rank serves nothing (the catalog never arrived): attaching jobs are told.
    pub failed: OnceLock<String>,
}

/// This rank's node of the serving job, once the catalog arrived (`crate::cluster::Node`).
pub trait ServingNode: Send + Sync {
    /// `granary status`'s `cluster`.
    fn status(&self, serving: &Serving) -> ClusterStatus;
    /// `granary stop` on this node: every rank stops.
    fn stop_all(&self);
}

impl Serving {
    pub fn new(source: PathBuf, pack: Option<(PathBuf, bool)>, rank: u32, ranks: u32) -> Serving {
        let mount = pack.as_ref().is_some_and(|p| p.1);
        Serving {
            source,
            pack: pack.map(|p| p.0),
            mount,
            rank,
            ranks,
            node: OnceLock::new(),
            failed: OnceLock::new(),
        }
    }

    /// A job attaching to a serving agent: only to the served source, and only once the
    /// catalog is there (it waits, the client's keepalive running).
    pub fn admit(&self, stopping: &AtomicBool, key: &std::path::Path, pid: u32) -> Result<()> {
        if pid == std::process::id() {
            return Ok(()); // the serve's own attach
        }
        if key != self.source {
            bail!(
                "this node's granary agent serves {} only (granary serve, rank {} of {})",
                self.source.display(),
                self.rank,
                self.ranks
            );
        }
        loop {
            if self.node.get().is_some() {
                return Ok(());
            }
            if let Some(why) = self.failed.get() {
                bail!("the serving job has no catalog: {why}");
            }
            if stopping.load(Ordering::Acquire) {
                bail!("the serving agent is stopping");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `granary status`'s `cluster`.
    pub fn status(&self) -> ClusterStatus {
        match self.node.get() {
            Some(n) => n.status(self),
            None => ClusterStatus {
                rank: self.rank,
                ranks: self.ranks,
                source: self.source.clone(),
                pack: self.pack.clone(),
                mount: self.mount,
                ..Default::default()
            },
        }
    }
}
