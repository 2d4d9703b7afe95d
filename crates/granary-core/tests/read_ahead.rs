//! Name-order read-ahead (`placement::ahead`) on real tables: which opens start it, what it
//! claims, and what it leaves alone.

use std::os::fd::AsRawFd;

use granary_core::placement::ahead::{NameOrder, WINDOW};
use granary_shm::{build, CatalogEntry, Mapping, StatRec, State, Table, TableSpec};

const WHOLE_FROM: u64 = 131_073;
const NPZ: u64 = 716_214;

struct Fixture {
    _m: Mapping,
    t: Table,
    _f: tempfile::NamedTempFile,
    /// Entry index of `img_{i}` by i (name order).
    files: Vec<u32>,
}

fn stat(mode: u32, ino: u64, size: u64) -> StatRec {
    StatRec {
        mode,
        ino,
        size,
        nlink: 1,
        mask: 0x7ff,
        ..Default::default()
    }
}

/// A table of `sizes.len()` files `train/img_{i:04}.npz` listed in a scrambled order (the
/// source's readdir order is not name order), plus `other/` with a few more.
fn table(sizes: &[u64]) -> Fixture {
    let n = sizes.len();
    let mut entries = vec![CatalogEntry {
        stat: stat(libc::S_IFDIR | 0o755, 1, 4096),
        ..Default::default()
    }];
    let mut add = |parent: usize, name: String, st: StatRec| {
        let mut rel = entries[parent].rel_path.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.as_bytes());
        entries.push(CatalogEntry {
            rel_path: rel,
            stat: st,
            ..Default::default()
        });
        let i = entries.len() - 1;
        entries[parent].children.push(i);
        i
    };
    let train = add(0, "train".into(), stat(libc::S_IFDIR | 0o755, 2, 4096));
    let other = add(0, "other".into(), stat(libc::S_IFDIR | 0o755, 3, 4096));
    // Listing order: a fixed scramble of the names.
    let listing: Vec<usize> = (0..n).map(|k| (k * 7919 + 13) % n).collect();
    let mut sorted = listing.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "n must be coprime to 7919"
    );
    for &i in &listing {
        add(
            train,
            format!("img_{i:04}.npz"),
            stat(libc::S_IFREG | 0o644, 100 + i as u64, sizes[i]),
        );
    }
    for i in 0..4 {
        add(
            other,
            format!("o{i}"),
            stat(libc::S_IFREG | 0o644, 10_000 + i, NPZ),
        );
    }
    let spec = TableSpec {
        source: b"/pfs/data".to_vec(),
        source_real: b"/pfs/data".to_vec(),
        tier_dirs: vec![b"/tmp/g/objects".to_vec()],
        tier_dir_ids: vec![(8, 80)],
        creds: (1000, 100, 0xfeed),
        ring_cap: 64,
        job_slots: 4,
        prefetch_min_size: WHOLE_FROM,
        ..Default::default()
    };
    let img = build(&spec, &entries).unwrap();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &img).unwrap();
    let (m, t) = Mapping::map(f.as_file().as_raw_fd(), img.len()).unwrap();
    let files = (0..n)
        .map(|i| {
            t.lookup(format!("train/img_{i:04}.npz").as_bytes())
                .unwrap()
        })
        .collect();
    Fixture {
        _m: m,
        t,
        _f: f,
        files,
    }
}

fn queued(t: &Table, e: u32) -> bool {
    t.state(e).state() == State::Queued
}

/// Opens `order` (indices into `files`) one by one; returns every file claimed, in order.
fn open_all(fx: &Fixture, ra: &NameOrder, order: &[usize], room: &dyn Fn(u64) -> bool) -> Vec<u32> {
    let mut claimed = Vec::new();
    for &i in order {
        claimed.extend(ra.observe(&fx.t, fx.files[i], room).claimed);
    }
    claimed
}

#[test]
fn a_reader_in_name_order_gets_the_next_files_claimed() {
    let fx = table(&[NPZ; 240]);
    let ra = NameOrder::default();
    let room = |_: u64| true;
    // Five opens: not yet a run.
    assert!(open_all(&fx, &ra, &[0, 1, 2, 3, 4], &room).is_empty());
    let a = ra.observe(&fx.t, fx.files[5], &room);
    let window = (WINDOW / NPZ + 1) as usize;
    assert_eq!(
        a.claimed,
        fx.files[6..6 + window].to_vec(),
        "the next files in name order, not in listing order, one window of them"
    );
    assert!(
        a.want_opens,
        "opens of the claimed files must reach the agent"
    );
    assert!(a.claimed.iter().all(|&e| queued(&fx.t, e)));
    // The next open moves the window by one file.
    let b = ra.observe(&fx.t, fx.files[6], &room);
    assert_eq!(b.claimed, vec![fx.files[6 + window]]);
}

#[test]
fn interleaved_workers_still_read_in_name_order() {
    // Two DataLoader workers, batches of 4 handed out in turn: 0 4 1 5 2 6 3 7 8 12 9 13 ...
    let fx = table(&[NPZ; 240]);
    let ra = NameOrder::default();
    let mut order = Vec::new();
    for b in (0..240).step_by(8) {
        for k in 0..4 {
            order.push(b + k);
            order.push(b + 4 + k);
        }
    }
    let claimed = open_all(&fx, &ra, &order[..16], &|_| true);
    assert!(
        claimed.contains(&fx.files[16]) && claimed.contains(&fx.files[20]),
        "read ahead of both workers"
    );
}

#[test]
fn a_shuffled_order_is_not_read_ahead() {
    let fx = table(&[NPZ; 240]);
    for seed in 1..=20u64 {
        let ra = NameOrder::default();
        let mut order: Vec<usize> = (0..240).collect();
        let mut x = seed;
        for i in (1..order.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        let claimed = open_all(&fx, &ra, &order, &|_| true);
        // Reset the claims for the next seed.
        for &e in &claimed {
            granary_shm::lifecycle::unclaim(&granary_shm::lifecycle::EntryCell {
                table: &fx.t,
                idx: e,
            });
        }
        assert!(
            claimed.is_empty(),
            "seed {seed}: {} of 240 files read ahead of a shuffled order",
            claimed.len()
        );
    }
}

#[test]
fn only_mid_size_files_are_read_ahead() {
    // Small files the program reads itself; files above a MiB the agent reads in blocks.
    let mut sizes = vec![NPZ; 40];
    for i in (4..40).step_by(3) {
        sizes[i] = 60_000;
    }
    sizes[5] = 8 << 20;
    let fx = table(&sizes);
    let ra = NameOrder::default();
    let claimed = open_all(&fx, &ra, &[0, 1, 2, 3, 4, 5, 6], &|_| true);
    assert!(!claimed.is_empty());
    for e in &claimed {
        let size = fx.t.entry(*e).unwrap().stat.size;
        assert!(
            (WHOLE_FROM..=granary_shm::DIRECT_FETCH_MAX).contains(&size),
            "{size}"
        );
    }
}

#[test]
fn nothing_is_claimed_without_room() {
    let fx = table(&[NPZ; 60]);
    let ra = NameOrder::default();
    assert!(open_all(&fx, &ra, &[0, 1, 2, 3, 4, 5, 6, 7], &|_| false).is_empty());
    assert!(fx
        .files
        .iter()
        .all(|&e| fx.t.state(e).state() == State::Unplaced));
}

#[test]
fn placed_files_ask_for_no_opens() {
    // A later epoch over files all placed: nothing to claim, clients need not report opens.
    let fx = table(&[NPZ; 60]);
    for &e in &fx.files {
        let c = granary_shm::lifecycle::EntryCell {
            table: &fx.t,
            idx: e,
        };
        assert!(granary_shm::lifecycle::claim(&c));
        assert!(granary_shm::lifecycle::begin(&c, fx.t.state(e), 0));
        assert!(granary_shm::lifecycle::complete(&c, 0));
    }
    let ra = NameOrder::default();
    let mut last = None;
    for i in 0..10 {
        last = Some(ra.observe(&fx.t, fx.files[i], &|_| true));
    }
    let last = last.unwrap();
    assert!(last.claimed.is_empty());
    assert!(!last.want_opens);
}
