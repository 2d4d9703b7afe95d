//! Which files the agent fetches whole: the rule (fewer requests than the program's own
//! readahead-sized reads), and learning the source's readahead and largest request from a
//! sysfs-shaped tree (the live one is exercised through the binary in
//! `crates/granary/tests/whole_fetch.rs`).

use std::path::Path;

use granary_core::placement::SourceRequests;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn src(readahead: Option<u64>, max_request: Option<u64>) -> SourceRequests {
    SourceRequests {
        readahead,
        max_request,
    }
}

#[test]
fn files_beyond_one_readahead_window_are_fetched_whole_when_the_agent_reads_larger() {
    // The benchmark's emulated PFS: 128 KiB readahead, 1280 KiB requests, 8 MiB blocks.
    let pfs = src(Some(128 * KIB), Some(1280 * KIB));
    assert_eq!(pfs.whole_fetch_from(MIB, 8 * MIB), 128 * KIB + 1);
    // No queue (a network file system's bdi): the agent's block size is its request.
    assert_eq!(
        src(Some(128 * KIB), None).whole_fetch_from(MIB, 8 * MIB),
        128 * KIB + 1
    );
    // prefetch_min_size stays the upper bound.
    assert_eq!(pfs.whole_fetch_from(64 * KIB, 8 * MIB), 64 * KIB);
}

#[test]
fn nothing_changes_where_whole_fetches_save_no_request() {
    // This machine's virtio disk: 8 MiB readahead, 4 MiB requests.
    assert_eq!(
        src(Some(8 * MIB), Some(4 * MIB)).whole_fetch_from(MIB, 8 * MIB),
        MIB
    );
    // The agent's blocks no larger than the readahead.
    assert_eq!(
        src(Some(128 * KIB), Some(1280 * KIB)).whole_fetch_from(MIB, 128 * KIB),
        MIB
    );
    // A device whose largest request is the readahead.
    assert_eq!(
        src(Some(128 * KIB), Some(128 * KIB)).whole_fetch_from(MIB, 8 * MIB),
        MIB
    );
    // Unknown readahead, or readahead off (the program's reads are its own sizes).
    assert_eq!(src(None, None).whole_fetch_from(MIB, 8 * MIB), MIB);
    assert_eq!(
        src(Some(0), Some(1280 * KIB)).whole_fetch_from(MIB, 8 * MIB),
        MIB
    );
    // prefetch_min_size = 0 keeps meaning "never".
    assert_eq!(
        src(Some(128 * KIB), Some(1280 * KIB)).whole_fetch_from(0, 8 * MIB),
        0
    );
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

#[test]
fn learned_from_the_bdi_and_the_queue() {
    let d = tempfile::tempdir().unwrap();
    let sys = d.path();
    // A whole disk: /sys/dev/block/7:3 -> ../../devices/virtual/block/loop3
    write(&sys.join("class/bdi/7:3/read_ahead_kb"), "128\n");
    let disk = sys.join("devices/virtual/block/loop3");
    write(&disk.join("queue/max_sectors_kb"), "1280\n");
    write(&disk.join("queue/read_ahead_kb"), "999\n");
    std::fs::create_dir_all(sys.join("dev/block")).unwrap();
    std::os::unix::fs::symlink(&disk, sys.join("dev/block/7:3")).unwrap();
    assert_eq!(
        SourceRequests::from_sysfs(sys, 7, 3),
        src(Some(128 * KIB), Some(1280 * KIB)),
        "the bdi's readahead wins over the queue's"
    );

    // A partition: no bdi and no queue of its own, its disk's queue serves it.
    let part = sys.join("devices/pci/block/sda/sda1");
    write(&part.join("partition"), "1\n");
    write(
        &sys.join("devices/pci/block/sda/queue/read_ahead_kb"),
        "256\n",
    );
    write(
        &sys.join("devices/pci/block/sda/queue/max_sectors_kb"),
        "512\n",
    );
    std::os::unix::fs::symlink(&part, sys.join("dev/block/8:1")).unwrap();
    assert_eq!(
        SourceRequests::from_sysfs(sys, 8, 1),
        src(Some(256 * KIB), Some(512 * KIB))
    );

    // A network file system: a bdi, no block device.
    write(&sys.join("class/bdi/0:53/read_ahead_kb"), "15360\n");
    assert_eq!(
        SourceRequests::from_sysfs(sys, 0, 53),
        src(Some(15 * MIB), None)
    );
    // Nothing known (tmpfs, btrfs subvolumes): the configured size decides.
    assert_eq!(SourceRequests::from_sysfs(sys, 0, 99), src(None, None));
    assert_eq!(
        SourceRequests::from_sysfs(sys, 0, 99).whole_fetch_from(MIB, 8 * MIB),
        MIB
    );
}
