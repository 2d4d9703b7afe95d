//! Files of a table that serves a pack (docs/pack-format.md, "Serving a pack").
//!
//! - An open of a packed file the agent has not placed yet waits for its copy (bounded and
//!   interruptible like every wait on the agent: its heartbeat fresh, the pack's stream moving):
//!   the agent streams the partition region the program waits on next, and the file is served
//!   as soon as its bytes are local — the program never reads the source's file for it.
//! - If the wait gives up (agent gone or stuck, no room for the file): with the original tree
//!   the caller opens the source file; with the pack alone (`--mount`) the file is extracted
//!   from its partition into memory (`extract`), its bytes handed out only if they match the
//!   index's checksum — else `EIO`, never wrong bytes.
//! - With the pack alone, directories are opened as the table's empty directory (`dir_fd`):
//!   the fd is a real directory fd, tracked, so listings, `fstat` and `*at` calls below it are
//!   answered from the catalog.
//!
//! Everything here uses raw system calls and the stack (or anonymous mappings) only.

use core::ffi::c_int;

use granary_shm::{job, request, EntryRec, Locator, State};

use crate::ops::detour::Guard;
use crate::sys::log;
use crate::sys::{self, sys, KeepErrno};
use crate::wait::now_ns;

/// A waiting open gives up when the pack's stream stood still this long…
const STALL_NS: u64 = 10_000_000_000;
/// …or, when the tree is at hand, when it waited this long in all.
const WAIT_MAX_NS: u64 = 60_000_000_000;
/// While the entry is still unplaced, the request is repeated this often (a full ring drops it).
const ASK_AGAIN_NS: u64 = 100_000_000;
const SLEEP_MIN_NS: i64 = 500_000;
const SLEEP_MAX_NS: i64 = 1_000_000;

/// Waits until packed entry `idx` is PLACED; false when it will not be soon (the caller then
/// uses the source, or extracts the file). Asks the agent for it first.
pub fn wait(g: &Guard, idx: u32) -> bool {
    let _keep = KeepErrno::new();
    let (mut start, mut moved, mut asked, mut last) = (0, 0, 0, 0);
    let mut sleep = SLEEP_MIN_NS;
    let gate = crate::wait::Gate::hold();
    loop {
        // Read before the state: a copy published after it ends the sleep below at once.
        let seen = g.table.placed_count();
        let st = g.table.state(idx).state();
        if st == State::Placed {
            return true;
        }
        if !matches!(st, State::Unplaced | State::Queued | State::Placing) {
            return false;
        }
        let now = now_ns();
        if !g.table.agent_alive(now) {
            return give_up(b"the agent does not answer");
        }
        let streamed = g.table.pack_streamed();
        if start == 0 {
            (start, moved, last) = (now, now, streamed);
        } else if streamed != last {
            (moved, last) = (now, streamed);
        }
        if st == State::Unplaced && (asked == 0 || now - asked > ASK_AGAIN_NS) {
            g.table
                .push_request_arg(request::OPEN_UNPLACED, idx, g.slot);
            asked = now;
        }
        // With the tree at hand a long wait is cut short (its file is as good); with the pack
        // alone, the alternative is extracting the file into memory: wait while it streams.
        let too_long = now - start > WAIT_MAX_NS && !g.table.pack_mount();
        if now - moved > STALL_NS || too_long {
            return give_up(b"the pack's stream does not progress");
        }
        if gate.sleep_until_placed(g, seen, &mut sleep, SLEEP_MAX_NS) {
            return give_up(b"a signal arrived");
        }
    }
}

fn give_up(why: &[u8]) -> bool {
    if log::enabled() {
        log::line(&[b"stopped waiting for the agent (", why, b")"]);
    }
    false
}

/// An fd standing for a directory of a tree that exists only in the pack: the table's empty
/// directory, opened with the caller's flags (read-only, a directory). Negative on failure.
pub fn dir_fd(g: &Guard, flags: c_int) -> c_int {
    let keep = libc::O_CLOEXEC | libc::O_NOATIME | libc::O_NONBLOCK;
    with_empty_dir(g, |p| {
        sys::raw_openat(
            libc::AT_FDCWD,
            p,
            (flags & keep) | libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
    })
    .unwrap_or(-1)
}

/// Calls `f` with the table's empty directory as a C string.
pub fn with_empty_dir<R>(g: &Guard, f: impl FnOnce(*const core::ffi::c_char) -> R) -> Option<R> {
    let dir = g.table.pack_empty_dir()?;
    let mut p = [0u8; 4200];
    if dir.len() >= p.len() {
        return None;
    }
    p[..dir.len()].copy_from_slice(dir);
    Some(f(p.as_ptr().cast()))
}

/// Writes `<pack dir>/part-NNNNN` NUL-terminated into `buf`.
fn partition_path(g: &Guard, n: u32, buf: &mut [u8; 4200]) -> Option<()> {
    let dir = g.table.pack_dir()?;
    let mut name = *b"/part-00000\0";
    let mut v = n;
    for k in (6..11).rev() {
        name[k] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    if v != 0 || dir.len() + name.len() > buf.len() {
        return None;
    }
    buf[..dir.len()].copy_from_slice(dir);
    buf[dir.len()..dir.len() + name.len()].copy_from_slice(&name);
    Some(())
}

/// An anonymous or file mapping, unmapped when dropped.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize, prot: c_int, flags: c_int, fd: c_int) -> Option<Map> {
        if len == 0 {
            return Some(Map {
                ptr: core::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        let p = sys!(libc::SYS_mmap, 0usize, len, prot, flags, fd, 0usize);
        if p < 0 {
            return None;
        }
        Some(Map {
            ptr: p as *mut u8,
            len,
        })
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live mapping of `len` readable and writable bytes owned by this value (or
        // an empty slice at a dangling, aligned pointer).
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if self.len > 0 {
            sys!(libc::SYS_munmap, self.ptr, self.len);
        }
    }
}

/// Closes an fd when dropped.
struct Fd(c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            sys::raw_close(self.0);
        }
    }
}

/// `pread` of exactly `buf.len()` bytes at `off`; false on error or a short file.
fn pread_full(fd: c_int, buf: &mut [u8], off: u64) -> bool {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = &mut buf[done..];
        let n = sys!(
            libc::SYS_pread64,
            fd,
            rest.as_mut_ptr(),
            rest.len(),
            off + done as u64
        );
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        if n == 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The partition's header is this pack's partition `n` (magic, kind, checksum, number, pack
/// id) and the file is as long as it says: another pack's partition, or a cut one, is refused.
fn partition_ok(g: &Guard, fd: c_int, n: u32) -> bool {
    let mut h = [0u8; 128];
    if !pread_full(fd, &mut h, 0) {
        return false;
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&h[..120]);
    let mut st = sys::empty_stat();
    let ok = &h[..8] == b"GRANPACK"
        && &h[8..12] == b"PART"
        && le32(&h, 16) == 128
        && le64(&h, 120) == sum
        && le32(&h, 24) == n
        && g.table.pack_id() == Some(&h[32..48])
        && sys::raw_fstat(fd, &mut st) == 0
        && st.st_size as u64 == 128 + le64(&h, 48);
    ok
}

/// Memory for zstd's decompression context, mapped at the first zstd frame: the pack's decoder
/// (`granary_pack::codec::unframe`) never allocates.
#[derive(Default)]
struct ZstdSpace(Option<Map>);

impl granary_pack::codec::Workspace for ZstdSpace {
    fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.0.is_none() {
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            self.0 = Map::new(len, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        }
        self.0.as_mut().map(Map::bytes)
    }
}

/// The packed file extracted from its partition into an anonymous memory file, checked against
/// the index's checksum, and reopened read-only with the caller's close-on-exec flag. `Err`
/// is the errno the open fails with (`EIO`: the pack is damaged or unreadable — never wrong
/// bytes).
pub fn extract(g: &Guard, e: &EntryRec, loc: &Locator, flags: c_int) -> Result<c_int, c_int> {
    let _keep = KeepErrno::new();
    let size = usize::try_from(e.stat.size).map_err(|_| libc::EFBIG)?;
    let stored_len = usize::try_from(loc.stored_len).map_err(|_| libc::EFBIG)?;
    let mut path = [0u8; 4200];
    partition_path(g, loc.partition, &mut path).ok_or(libc::EIO)?;
    let part = Fd(sys::raw_openat(
        libc::AT_FDCWD,
        path.as_ptr().cast(),
        libc::O_RDONLY | libc::O_CLOEXEC,
        0,
    ));
    if part.0 < 0 || !partition_ok(g, part.0, loc.partition) {
        g.count(job::PACK_REFUSED, 1);
        return Err(libc::EIO);
    }
    let mem = Fd(sys!(
        libc::SYS_memfd_create,
        c"granary-pack".as_ptr(),
        libc::MFD_CLOEXEC
    ) as c_int);
    if mem.0 < 0 || sys!(libc::SYS_ftruncate, mem.0, size) < 0 {
        return Err(libc::ENOMEM);
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let mut out = Map::new(size, rw, libc::MAP_SHARED, mem.0).ok_or(libc::ENOMEM)?;
    let ok = if loc.codec == 0 {
        stored_len == size && pread_full(part.0, out.bytes(), loc.offset)
    } else {
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let mut stored = Map::new(stored_len, rw, anon, -1).ok_or(libc::ENOMEM)?;
        pread_full(part.0, stored.bytes(), loc.offset)
            && granary_pack::codec::unframe(
                stored.bytes(),
                out.bytes(),
                g.table.pack_block_size(),
                &mut ZstdSpace::default(),
            )
            .is_ok()
    };
    g.count(job::SOURCE_READS, 1);
    g.count(job::SOURCE_BYTES, loc.stored_len);
    if !ok || xxhash_rust::xxh3::xxh3_64(out.bytes()) != loc.checksum {
        if log::enabled() {
            log::line(&[
                b"packed file damaged or unreadable, refused: ",
                g.table.name(e).unwrap_or(b"?"),
            ]);
        }
        g.count(job::PACK_REFUSED, 1);
        return Err(libc::EIO);
    }
    drop(out);
    // The program asked for a read-only file: the same memory file through a read-only fd.
    let mut proc = *b"/proc/self/fd/0000000000\0";
    let mut v = mem.0 as u32;
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for k in 0..n {
        proc[14 + k] = digits[n - 1 - k];
    }
    proc[14 + n] = 0;
    let cloexec = flags & libc::O_CLOEXEC;
    let ro = sys::raw_openat(
        libc::AT_FDCWD,
        proc.as_ptr().cast(),
        libc::O_RDONLY | cloexec,
        0,
    );
    if ro >= 0 {
        return Ok(ro);
    }
    // No /proc: the memory file itself, with the caller's close-on-exec flag.
    let fd = mem.0;
    core::mem::forget(mem);
    if cloexec == 0 {
        sys!(libc::SYS_fcntl, fd, libc::F_SETFD, 0);
    }
    if log::enabled() {
        log::line(&[
            b"extracted from the pack: ",
            g.table.name(e).unwrap_or(b"?"),
        ]);
    }
    Ok(fd)
}

/// `st` (the kernel's answer for a tracked `FdKind::Pack` fd) is still our memory file of `e`:
/// an unlinked regular file of its size.
pub fn is_extracted(st_nlink: u64, st_mode: u32, st_size: i64, e: &EntryRec) -> bool {
    st_nlink == 0 && st_mode & libc::S_IFMT == libc::S_IFREG && st_size as u64 == e.stat.size
}

/// `access(mode)` (R_OK / X_OK) of a file that exists only in the pack, from its mode bits for
/// this process's effective ids (root reads anything, executes what anyone may).
pub fn may(st: &granary_shm::StatRec, mode: c_int) -> bool {
    let uid = sys!(libc::SYS_geteuid) as u32;
    let gid = sys!(libc::SYS_getegid) as u32;
    let bits = if uid == 0 {
        let any_x = st.mode & 0o111 != 0;
        0o4 | if any_x { 0o1 } else { 0 }
    } else if st.uid == uid {
        (st.mode >> 6) & 7
    } else if st.gid == gid {
        (st.mode >> 3) & 7
    } else {
        st.mode & 7
    };
    let want = (if mode & libc::R_OK != 0 { 0o4 } else { 0 })
        | (if mode & libc::X_OK != 0 { 0o1 } else { 0 });
    bits & want == want
}
