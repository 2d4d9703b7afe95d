//! Random bits from the kernel, for the table's secret seed (`layout`): its own module, so that
//! the layout (which every module reads) takes nothing from the mapping code.

/// 8 bytes from the kernel's random source (`getrandom(2)`, waiting for it to be seeded at
/// boot, retried when interrupted); `None` if the kernel has no such call or refuses it.
pub(crate) fn getrandom_u64() -> Option<u64> {
    let mut b = [0u8; 8];
    let mut got = 0usize;
    for _ in 0..100 {
        // SAFETY: the kernel writes at most `b.len() - got` bytes into `b[got..]`, which is
        // ours and that long.
        let r = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                b.as_mut_ptr().add(got) as libc::c_long,
                (b.len() - got) as libc::c_long,
                0 as libc::c_long,
            )
        };
        if r > 0 {
            got += r as usize;
            if got == b.len() {
                return Some(u64::from_ne_bytes(b));
            }
        } else if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
    None
}
