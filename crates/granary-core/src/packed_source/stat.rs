//! A pack's stat record as the table's: the one place that knows both formats.

use granary_pack::format::Stat;
use granary_shm::StatRec;

/// The table's record of what a pack records of a file (the pack holds every `statx` field the
/// catalog serves; its atime is the mtime, see `granary_pack::format::Stat::atime`). Here, on
/// the side that knows both formats: the pack's file format does not depend on the table's.
pub fn stat_rec(s: &Stat) -> StatRec {
    let ts = |t: granary_pack::format::Timestamp| granary_shm::Ts {
        sec: t.sec,
        nsec: t.nsec,
        _pad: 0,
    };
    StatRec {
        mask: s.mask,
        blksize: s.blksize,
        attributes: s.attributes,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        mode: s.mode,
        ino: s.ino,
        size: s.size,
        blocks: s.blocks,
        attributes_mask: s.attributes_mask,
        atime: ts(s.atime),
        btime: ts(s.btime),
        ctime: ts(s.ctime),
        mtime: ts(s.mtime),
        rdev_major: s.rdev_major,
        rdev_minor: s.rdev_minor,
        dev_major: s.dev_major,
        dev_minor: s.dev_minor,
        // A pack records no attributes: what a packed entry has is never answered.
        xattrs: 0,
    }
}
