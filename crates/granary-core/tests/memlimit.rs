//! The copy buffers under a memory cgroup limit: parsing what the kernel reports, and `fit`
//! against its contract (property-tested).

use granary_core::memlimit::{
    fit, node_room, parse_limit, parse_proc_cgroup, room_from, v1_hierarchical_limit, Probe, Room,
    BUDGET_SHARE, MIN_BLOCK,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[test]
fn proc_cgroup_v1_and_v2() {
    let v1 = "12:pids:/user.slice\n7:memory:/slurm/uid_1000/job_42\n6:cpu,cpuacct:/x\n";
    assert_eq!(
        parse_proc_cgroup(v1),
        (Some("/slurm/uid_1000/job_42"), None)
    );
    let v2 = "0::/system.slice/slurmstepd.scope/job_42\n";
    assert_eq!(
        parse_proc_cgroup(v2),
        (None, Some("/system.slice/slurmstepd.scope/job_42"))
    );
    let hybrid = "5:memory,blkio:/bench\n0::/\n";
    assert_eq!(parse_proc_cgroup(hybrid), (Some("/bench"), Some("/")));
}

#[test]
fn limits_and_no_limits() {
    assert_eq!(parse_limit("max\n"), None);
    assert_eq!(parse_limit("67108864\n"), Some(64 * MIB));
    // cgroup v1's "unlimited".
    assert_eq!(parse_limit("9223372036854771712"), None);
    let stat = "cache 0\nrss 0\nhierarchical_memory_limit 268435456\nhierarchical_memsw_limit 1\n";
    assert_eq!(v1_hierarchical_limit(stat), Some(256 * MIB));
    assert_eq!(
        v1_hierarchical_limit("hierarchical_memory_limit 9223372036854771712\n"),
        None
    );
}

#[test]
fn page_cache_room_from_what_the_kernel_reports() {
    // cgroup v1 (usage includes kernel memory): 256 MiB limit, 240 MiB charged, 200 MiB of it
    // file pages on the two LRU lists.
    let v1 = "cache 209715200\nrss 20971520\ntotal_cache 209715200\ntotal_rss 20971520\n\
              total_inactive_file 146800640\ntotal_active_file 62914560\n";
    assert_eq!(
        room_from(
            256 * MIB,
            240 * MIB,
            v1,
            ["total_active_file", "total_inactive_file"]
        ),
        Some(Room {
            limit: 256 * MIB,
            non_file: 40 * MIB
        })
    );
    // cgroup v2 names them without the prefix; a missing key is no answer, not a zero.
    let v2 = "anon 1048576\nfile 4194304\nactive_file 1048576\ninactive_file 3145728\n";
    let r = room_from(64 * MIB, 6 * MIB, v2, ["active_file", "inactive_file"]).unwrap();
    assert_eq!((r.non_file, r.for_files()), (2 * MIB, 62 * MIB));
    assert_eq!(
        room_from(
            64 * MIB,
            6 * MIB,
            "anon 1\n",
            ["active_file", "inactive_file"]
        ),
        None
    );
    // The node: free memory and file pages are room, the rest is not.
    let meminfo = "MemTotal:       24684092 kB\nMemFree:        20000000 kB\n\
                   MemAvailable:   23000000 kB\nActive(file):     1000000 kB\n\
                   Inactive(file):   2000000 kB\nShmem:  35000 kB\n";
    let n = node_room(meminfo).unwrap();
    assert_eq!(n.limit, 24684092 * 1024);
    assert_eq!(n.for_files(), 23000000 * 1024);
    assert_eq!(node_room("MemTotal: 1 kB\n"), None);
}

#[test]
fn this_process_has_a_room() {
    // Wherever the tests run, the probe finds a limit (a cgroup's or the node's) and reads it.
    let room = Probe::find().sample().expect("room measured");
    assert!(room.limit > 0 && room.for_files() <= room.limit, "{room:?}");
}

#[test]
fn the_benchmark_caps() {
    // Quick preset: 64 MiB, 2 workers of 8 MiB → 2 x 2 MiB. Full preset: 256 MiB, unchanged.
    assert_eq!(fit(2, 8 * MIB, Some(64 * MIB)), (2, 2 * MIB));
    assert_eq!(fit(2, 8 * MIB, Some(256 * MIB)), (2, 8 * MIB));
    assert_eq!(fit(8, 8 * MIB, None), (8, 8 * MIB));
    // Too little for one MiB per worker: fewer workers, never none.
    assert_eq!(fit(8, 8 * MIB, Some(64 * MIB)), (4, MIB));
    assert_eq!(fit(4, 8 * MIB, Some(8 * MIB)), (1, MIB));
}

proptest! {
    #[test]
    fn fit_keeps_its_contract(workers in 1usize..64, block_mib in 1u64..64,
                              limit_mib in prop::option::of(1u64..65536)) {
        let block = block_mib * MIB;
        let limit = limit_mib.map(|l| l * MIB);
        let (w, b) = fit(workers, block, limit);
        prop_assert!(w >= 1 && w <= workers);
        prop_assert!(b <= block && b >= MIN_BLOCK.min(block));
        prop_assert_eq!(b % MIB, 0);
        match limit {
            None => prop_assert_eq!((w, b), (workers, block)),
            Some(l) => {
                let budget = l / BUDGET_SHARE;
                if workers as u64 * block <= budget {
                    prop_assert_eq!((w, b), (workers, block));
                } else if budget >= MIN_BLOCK {
                    // Over budget only when even one worker with the smallest block is.
                    prop_assert!(w as u64 * b <= budget);
                } else {
                    prop_assert_eq!((w, b), (1, MIN_BLOCK.min(block)));
                }
            }
        }
    }
}
