//! zstd's decompression context in memory the caller lends (`ZSTD_initStaticDCtx`): zstd never
//! allocates with it, so a zstd frame decodes inside the preload library's hooks. Made afresh for
//! each frame (a few field stores), so the memory may move between frames. The only FFI of the
//! crate besides `sys`.

/// Bytes a context needs, with slack for aligning it to 8 bytes.
pub fn workspace_len() -> usize {
    // SAFETY: a pure size computation.
    unsafe { zstd_sys::ZSTD_estimateDCtxSize() + 8 }
}

/// Decompresses the one zstd frame `src` into `dst`; true if it is exactly `dst.len()` bytes.
pub fn decompress(ws: &mut [u8], src: &[u8], dst: &mut [u8]) -> bool {
    let at = ws.as_ptr().align_offset(8);
    let Some(ws) = ws.get_mut(at..) else {
        return false;
    };
    if ws.len() < workspace_len() - 8 {
        return false;
    }
    // SAFETY: `ws` is writable, 8-aligned and at least `ZSTD_estimateDCtxSize()` bytes; the
    // context lives in it for this call only.
    let dctx = unsafe { zstd_sys::ZSTD_initStaticDCtx(ws.as_mut_ptr().cast(), ws.len()) };
    if dctx.is_null() {
        return false;
    }
    // SAFETY: `dctx` is the context just made in `ws`; `dst` and `src` are valid slices of the
    // lengths given, and zstd writes at most `dst.len()` bytes.
    let n = unsafe {
        zstd_sys::ZSTD_decompressDCtx(
            dctx,
            dst.as_mut_ptr().cast(),
            dst.len(),
            src.as_ptr().cast(),
            src.len(),
        )
    };
    // SAFETY: a pure check of a return code.
    unsafe { zstd_sys::ZSTD_isError(n) == 0 && n == dst.len() }
}
