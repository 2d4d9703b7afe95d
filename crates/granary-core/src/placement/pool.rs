use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::{place, Policy, SourceCtx};

pub struct Job {
    pub ctx: Arc<SourceCtx>,
    pub entry: u32,
}

/// A fixed pool of placement workers fed by one unbounded queue, shared by every source (each
/// job's `SourceCtx` carries the tiers it places on). Requests are deduplicated by the
/// entry's state word (only UNPLACED → QUEUED enqueues), so the queue holds each file once.
pub struct Pool {
    tx: Option<Sender<Job>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// Workers when the configuration does not say: the copies are I/O-bound, so a few per core,
/// capped so the source is not flooded with streams.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

impl Pool {
    pub fn new(workers: usize, policy: Arc<dyn Policy>) -> std::io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let workers = (0..workers.max(1))
            .map(|i| {
                let rx: Receiver<Job> = rx.clone();
                let policy = policy.clone();
                std::thread::Builder::new()
                    .name(format!("place-{i}"))
                    .spawn(move || {
                        let mut buf = vec![0u8; 1 << 20];
                        for job in rx {
                            let out = place(&job.ctx, job.entry, policy.as_ref(), &mut buf);
                            tracing::trace!("placement of entry {}: {out:?}", job.entry);
                            job.ctx.inflight.fetch_sub(1, Ordering::AcqRel);
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Pool {
            tx: Some(tx),
            workers,
        })
    }

    pub fn submit(&self, job: Job) {
        job.ctx.inflight.fetch_add(1, Ordering::AcqRel);
        if let Some(tx) = &self.tx {
            if let Err(e) = tx.send(job) {
                e.0.ctx.inflight.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Lets queued jobs finish (retired tables drop theirs quickly) and joins the workers.
    pub fn shutdown(mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
