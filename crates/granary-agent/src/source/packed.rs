//! A source served from a pack (`granary run --pack`): the table is built from the pack's
//! index — checked against the original tree per directory when there is one — instead of a
//! walk, and placement streams the pack's partitions (`placement::pack_streamer`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use granary_core::packed_source::{self, PackIndex, Partitions};
use granary_core::placement::pack_streamer::Streamer;
use granary_core::Tiers;
use granary_shm::{lifecycle, PackSpec};

use super::pack_conf::{source_key, PackConf};
use super::{prev_of, spawn_sweep, write_table, Broadcast, Inner, Origin, SourceState, WalkOpts};

impl SourceState {
    /// A packed source. With `mount` the path may name nothing (only the pack exists), so
    /// nothing of it is read; otherwise it must be the original tree's directory — unless its
    /// resolved path is `known`: rank 0 of a serving job checked it for the job (cluster mode),
    /// and this rank makes no call on it.
    pub fn new_packed(
        source: PathBuf,
        pack: &Path,
        mount: bool,
        known: Option<PathBuf>,
    ) -> Result<SourceState> {
        let dir =
            std::fs::canonicalize(pack).with_context(|| format!("pack {}", pack.display()))?;
        let source_real = if let Some(real) = known {
            real
        } else if mount {
            // Where the program expects the tree; its parent resolved if it exists.
            match (source.parent(), source.file_name()) {
                (Some(parent), Some(name)) => std::fs::canonicalize(parent)
                    .map(|p| p.join(name))
                    .unwrap_or_else(|_| source.clone()),
                _ => source.clone(),
            }
        } else {
            let root = granary_core::sys::statx_nofollow(&source)
                .with_context(|| format!("source {}", source.display()))?;
            anyhow::ensure!(
                root.is_dir(),
                "source {} is not a directory",
                source.display()
            );
            std::fs::canonicalize(&source)
                .with_context(|| format!("source {}", source.display()))?
        };
        let id = granary_core::source::source_id(&source_key(&source_real, Some(&dir)));
        // The agent reads the partitions: their device's requests decide what is fetched whole.
        let dev = granary_core::sys::statx_nofollow(&dir)
            .map(|s| (s.dev_major, s.dev_minor))
            .unwrap_or((0, 0));
        let pack = Some(PackConf { dir, mount });
        Ok(SourceState::assemble(
            source,
            source_real,
            id,
            None,
            dev,
            pack,
        ))
    }

    /// The table of a packed source: the index as the catalog (the original tree checked per
    /// directory first), copies of the kept or saved table taken over, every entry validated
    /// for this attach, the partition streamer ready. In cluster mode every rank but 0 adopts
    /// rank 0's table instead (`adopt_pack`).
    pub(super) fn prepare_packed(
        &self,
        inner: &mut Inner,
        tiers: Arc<Tiers>,
        rt_dir: &granary_core::runtime::Runtime,
        generation: u64,
        opts: &WalkOpts<'_>,
        notes: &mut Vec<String>,
    ) -> Result<Origin> {
        let started = Instant::now();
        let conf = self.pack.clone().context("not a packed source")?;
        let dirs = self.open_tier_dirs(&tiers);
        let mut spec = self.spec(&tiers, &dirs, opts.params, 0);
        let table_path = rt_dir.table(&self.id, generation);
        // The last table records its copies for whichever table uses its tiers next, and is
        // withdrawn before this one takes anything over.
        let old = self.ctx();
        if old.is_some() {
            self.retire(inner, true);
        }
        let (made, origin) = match opts.image {
            Some(b) => {
                let m = self.adopt_pack(&conf, b, &mut spec, rt_dir, &table_path)?;
                (m, Origin::Adopted)
            }
            None => {
                let m =
                    self.build_pack(&conf, &tiers, &mut spec, rt_dir, &table_path, old.as_ref())?;
                (m, Origin::Walked)
            }
        };
        let Made {
            mapping,
            table,
            partitions,
            mut stats,
        } = made;
        if origin != Origin::Adopted {
            self.take_recorded_copies(&table, &tiers, &dirs, opts);
        }
        self.note_tiers_left(old.as_deref(), &tiers, notes);
        drop(old);
        let streamer = Arc::new(Streamer::new(&table, partitions, opts.params.block_size));
        let ctx = self.publish(inner, table, mapping, tiers, dirs, opts)?;
        // Before any job has the table, so every request finds it.
        let _ = ctx.pack.set(streamer);
        let (files, bytes) = granary_core::placement::adopt_charges(&ctx.table, &ctx.space);
        stats.reused_files = files;
        stats.reused_bytes = bytes;
        stats.walk_s = started.elapsed().as_secs_f64();
        inner.catalog = stats;
        inner.table_path = Some(table_path);
        spawn_sweep(&ctx, opts.verify);
        inner.spec = Some(spec);
        tracing::info!(
            "catalog of {} from pack {} ({origin:?}): {} files ({} from the pack), {} dirs ({} \
             checked, {} changed), {} bytes; {} copies reused ({:.2} s)",
            self.source.display(),
            conf.dir.display(),
            inner.catalog.files,
            inner.catalog.pack_files,
            inner.catalog.dirs,
            inner.catalog.pack_dirs_checked,
            inner.catalog.pack_dirs_changed,
            inner.catalog.bytes,
            inner.catalog.reused_files,
            started.elapsed().as_secs_f64()
        );
        granary_core::sys::trim_heap();
        Ok(origin)
    }

    /// The table built from the pack's index (read and checked whole), written to `path`.
    fn build_pack(
        &self,
        conf: &PackConf,
        tiers: &Tiers,
        spec: &mut granary_shm::TableSpec,
        rt_dir: &granary_core::runtime::Runtime,
        path: &Path,
        old: Option<&Arc<granary_core::placement::SourceCtx>>,
    ) -> Result<Made> {
        let pack = PackIndex::open(&conf.dir).map_err(|e| {
            let damaged = e.is_damage();
            let e = anyhow::Error::new(e);
            if damaged {
                e.context(format!(
                    "pack {} is damaged (`granary pack verify {}` says what is wrong)",
                    conf.dir.display(),
                    conf.dir.display()
                ))
            } else {
                e
            }
        })?;
        // Copies of an earlier table: the agent's own, else the catalog saved beside the cache.
        let current = old;
        let saved = current
            .is_none()
            .then(|| self.saved_catalog(tiers, spec, None))
            .flatten();
        let prev_table = current
            .as_ref()
            .map(|c| c.table)
            .or(saved.as_ref().map(|s| s.1));
        let prev = prev_table.as_ref().map(|t| prev_of(t, spec));
        let root_parent_ino = self
            .source_real
            .parent()
            .and_then(|p| granary_core::sys::statx_nofollow(p).ok())
            .map_or(0, |s| s.ino);
        let built = packed_source::build(
            &pack.index,
            &packed_source::catalog::Options {
                source: (!conf.mount).then_some(self.source_real.as_path()),
                prev: prev.as_ref(),
                root_parent_ino,
            },
        )?;
        drop(saved);
        spec.root_parent_ino = built.root_parent_ino;
        spec.pack = Some(pack_spec(conf, rt_dir, pack.index.header()));
        let partitions = pack.partitions();
        // The index is no longer needed (a mapping of a file on the shared file system).
        drop(pack);
        let (mapping, table) = write_table(path, spec, &built.catalog)?;
        // Every entry was read from the index and, with the original tree, checked against it
        // per directory just now: nothing is checked again after the program starts.
        let words = granary_shm::layout::bitmap_words(table.entry_count() as usize);
        lifecycle::validated_by_walk(&table, &vec![u64::MAX; words]);
        table.bump_epoch();
        Ok(Made {
            mapping,
            table,
            partitions,
            stats: built.stats,
        })
    }

    /// Cluster mode, every rank but 0: rank 0's table of the pack (its index read and the tree
    /// checked there, once for the job) made this rank's at `path`, with the pack's partition
    /// table rank 0 sent: this rank reads neither the index nor the tree.
    fn adopt_pack(
        &self,
        conf: &PackConf,
        b: &Broadcast,
        spec: &mut granary_shm::TableSpec,
        rt_dir: &granary_core::runtime::Runtime,
        path: &Path,
    ) -> Result<Made> {
        let partitions = Partitions::decode(&conf.dir, &b.layout)
            .context("rank 0's partition table of the pack is damaged")?;
        spec.pack = Some(pack_spec(conf, rt_dir, &partitions.header));
        let loaded = {
            let mut img = b.image.lock().unwrap_or_else(|e| e.into_inner());
            granary_core::catalog::adopt(&mut img, spec, path, None)
                .context("adopting rank 0's catalog")?
        };
        let t = &loaded.table;
        let mut stats = super::catalog_stats(t);
        stats.pack_files = (0..t.entry_count())
            .filter(|&i| t.locator(i).is_some())
            .count() as u64;
        stats.pack_source_files = stats.files - stats.pack_files;
        Ok(Made {
            mapping: loaded.mapping,
            table: loaded.table,
            partitions,
            stats,
        })
    }

    /// A job joins the packed table other jobs hold: the original tree checked again per
    /// directory before it starts (`packed_source::recheck`); only the pack exists: nothing to check.
    pub(super) fn recheck_packed(&self) {
        let (Some(conf), Some(ctx)) = (&self.pack, self.ctx()) else {
            return;
        };
        if conf.mount {
            return;
        }
        let r = packed_source::recheck(&ctx.table, &self.source_real);
        tracing::info!(
            "{}: a joining job checked {} directories against the pack: {} changed, {} entries \
             voided",
            self.source.display(),
            r.dirs_checked,
            r.dirs_changed,
            r.voided
        );
    }
}

/// A packed source's new table, before it is published.
struct Made {
    mapping: granary_shm::Mapping,
    table: granary_shm::Table,
    partitions: Partitions,
    stats: granary_core::stats::CatalogStats,
}

/// The table's pack section for the pack of `conf` whose index header is `h`.
fn pack_spec(
    conf: &PackConf,
    rt_dir: &granary_core::runtime::Runtime,
    h: &granary_pack::format::IndexHeader,
) -> PackSpec {
    PackSpec {
        dir: conf.dir.as_os_str().as_bytes().to_vec(),
        empty_dir: rt_dir.shadow_dir().as_os_str().as_bytes().to_vec(),
        block_size: h.block_size,
        partitions: h.partition_count,
        id: h.pack_id,
        mount: conf.mount,
    }
}
