//! Which files the agent fetches whole, from what a request costs on the source.
//!
//! One party reads each file from the source (docs/placement.md). A program that reads a file
//! itself reaches the source in readahead-sized requests: at least ⌈size / readahead⌉ of them
//! (more while the kernel's window ramps up; a single `read` of the whole file can be issued as
//! one larger request, never as fewer). The agent's fetch reads it in requests of
//! min(`block_size`, the device's largest request): ⌈size / that⌉. A source that charges per
//! request (a PFS: an RPC, a lock, a seek each; the benchmark's emulation: 150 requests/s) is
//! read fastest in the fewest requests, so a file larger than one readahead window is fetched
//! whole by the agent whenever the agent's requests are larger than the readahead; a file within
//! one window is read by the program as before (one request already, and it never waits).
//!
//! The source's readahead and largest request are learned from sysfs for the device that holds
//! the source (`/sys/class/bdi/<maj:min>/read_ahead_kb`, `/sys/dev/block/<maj:min>/queue/
//! max_sectors_kb`, or the whole disk's queue for a partition); network file systems have a bdi
//! too (no queue: the agent's `block_size` counts). Where nothing is known (btrfs subvolumes,
//! overlayfs, tmpfs), only `prefetch_min_size` decides, as before.

use std::path::Path;

/// What a request looks like on the device holding a source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceRequests {
    /// The device's readahead in bytes (`read_ahead_kb`); 0: readahead off.
    pub readahead: Option<u64>,
    /// The largest request the device takes, in bytes (`max_sectors_kb`).
    pub max_request: Option<u64>,
}

impl SourceRequests {
    /// Learned from a sysfs tree rooted at `sys` for device `major:minor`.
    pub fn from_sysfs(sys: &Path, major: u32, minor: u32) -> SourceRequests {
        let id = format!("{major}:{minor}");
        let block = sys.join("dev/block").join(&id);
        // A partition has no queue of its own: its disk's (the parent directory) serves it.
        let queue = [block.join("queue"), block.join("../queue")]
            .into_iter()
            .find(|q| q.is_dir());
        let kib = |p: &Path| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(|k| k << 10)
        };
        let readahead = kib(&sys.join("class/bdi").join(&id).join("read_ahead_kb"))
            .or_else(|| queue.as_ref().and_then(|q| kib(&q.join("read_ahead_kb"))));
        let max_request = queue.and_then(|q| kib(&q.join("max_sectors_kb")));
        SourceRequests {
            readahead,
            max_request: max_request.filter(|&m| m > 0),
        }
    }

    /// The smallest file size the agent fetches whole on this source (0: never, as with
    /// `prefetch_min_size` = 0): `prefetch_min_size` at most, and one byte past the readahead
    /// when the agent's requests (`block_size`, capped by the device's largest request) are
    /// larger than the readahead. Then a file fetched whole never takes more requests than the
    /// program's own reads would, and a file beyond one window takes fewer.
    pub fn whole_fetch_from(&self, prefetch_min_size: u64, block_size: u64) -> u64 {
        if prefetch_min_size == 0 {
            return 0;
        }
        let agent = self.max_request.map_or(block_size, |m| m.min(block_size));
        match self.readahead {
            Some(ra) if ra > 0 && agent > ra => prefetch_min_size.min(ra + 1),
            _ => prefetch_min_size,
        }
    }

    /// One line for the agent's log: what was learned and what it decided.
    pub fn describe(&self, from: u64) -> String {
        let kib = |v: Option<u64>| v.map_or("unknown".to_string(), |b| format!("{} KiB", b >> 10));
        let rule = match from {
            0 => "no file fetched whole".to_string(),
            f => format!("files of {f} bytes and more fetched whole"),
        };
        format!(
            "readahead {}, largest request {}: {rule}",
            kib(self.readahead),
            kib(self.max_request)
        )
    }
}
