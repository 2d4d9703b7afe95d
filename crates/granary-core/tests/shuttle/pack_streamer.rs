//! The partition streamer (`placement::pack_streamer`) with its real threads, streaming a real
//! pack into a real tier while programs ask for files out of order.

use std::time::Duration;

use granary_core::packed_source::{self, PackIndex};
use granary_core::placement::pack_streamer::{self, Streamer};
use granary_core::placement::{Engine, FillHighestFirst, Params};
use granary_core::sync::atomic::Ordering;
use granary_core::sync::Arc;
use granary_shm::{PackSpec, State, TableSpec};
use shuttle::thread;

use super::fixture::{check_random, wait_until, Placing, Source};

const ITERATIONS: usize = 200;

/// Two programs ask for files in their own orders (a shuffled epoch) while two streamers sweep
/// the pack's two partitions: a file asked for while its segment is being streamed is streamed
/// again once that is done, a segment already done is not. Every file ends placed exactly once
/// with its bytes, and the streamers hold no placement work (`Work::held`) once done; retiring
/// the table stops them (a streamer that missed the retirement would wait forever here:
/// Shuttle reports it as a deadlock).
#[test]
fn the_streamer_places_every_packed_file_once() {
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    let sizes = [3000, 9000, 100, 0, 5000, 4096, 12000, 700];
    let files: Vec<(&str, usize)> = names.iter().map(String::as_str).zip(sizes).collect();
    let source = Source::new(&files);
    let out = source.dir.path().join("pack");
    let opts = granary_pack::Options {
        partitions: Some(2),
        compression: granary_pack::Compression::Zstd(1),
        block_size: 4096,
        threads: 2,
        sync: false,
        ..Default::default()
    };
    granary_pack::pack(&source.src(), &out, &opts, &Default::default()).unwrap();
    let pack = PackIndex::open(&out).unwrap();
    let built = packed_source::build(
        &pack.index,
        &packed_source::catalog::Options {
            source: Some(&source.src()),
            prev: None,
            root_parent_ino: 0,
        },
    )
    .unwrap();
    let h = *pack.index.header();
    let spec = TableSpec {
        pack: Some(PackSpec {
            dir: out.as_os_str().as_encoded_bytes().to_vec(),
            empty_dir: source.dir.path().as_os_str().as_encoded_bytes().to_vec(),
            block_size: h.block_size,
            partitions: h.partition_count,
            id: h.pack_id,
            mount: false,
        }),
        ..Default::default()
    };
    let partitions = pack.partitions();
    drop(pack);
    assert_eq!(partitions.records.len(), 2);

    check_random(
        move || {
            let p = Placing::new(&source.src(), &built.catalog, spec.clone(), 1 << 20);
            let ctx = p.ctx.clone();
            let st = Arc::new(Streamer::new(&ctx.table, partitions.clone(), 4096));
            let _ = ctx.pack.set(st.clone());
            let params = Params {
                block_size: 4096,
                max_source_streams: 2,
                small_copy_delay: Duration::ZERO,
                ..Default::default()
            };
            let engine = Arc::new(Engine::new(Arc::new(FillHighestFirst), params));
            pack_streamer::spawn(ctx.clone(), engine).unwrap();
            let idx: Vec<u32> = names.iter().map(|n| p.idx(n)).collect();
            let programs: Vec<_> = [[6, 1, 3, 0], [2, 6, 7, 4]]
                .into_iter()
                .map(|order| {
                    let (ctx, st) = (ctx.clone(), st.clone());
                    let idx = idx.clone();
                    thread::spawn(move || {
                        for k in order {
                            st.request(&ctx, idx[k]);
                        }
                    })
                })
                .collect();
            for t in programs {
                t.join().unwrap();
            }
            wait_until("every file decided", || {
                names.iter().all(|n| {
                    !matches!(p.state(n), State::Unplaced | State::Queued | State::Placing)
                })
            });
            wait_until("the streamers hold no work", || ctx.work.held() == 0);
            p.check_placed(&source.files, &[]);
            assert_eq!(
                ctx.counters.files_placed.load(Ordering::Acquire),
                names.len() as u64,
                "a file placed twice"
            );
            ctx.retire();
        },
        ITERATIONS,
    );
}
