//! The frame decoder allocates nothing: the preload library calls it inside a program's
//! `open()`, where an allocation may deadlock (preload rule 5). Counted with a global
//! allocator, so this file holds this one test (another test's thread would allocate too).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use granary_pack::codec::{unframe, Compression, Encoder};
use granary_pack::format::entry::codec;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts the calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `GlobalAlloc::realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

#[test]
fn unframe_allocates_nothing() {
    let block = 4096u32;
    let mut data: Vec<u8> = (0..60_000u32)
        .flat_map(|i| (i % 11).to_le_bytes())
        .collect();
    // A hole and an incompressible stretch: hole and raw frames beside the compressed ones.
    data[8192..16384].fill(0);
    for (i, b) in data[20_480..24_576].iter_mut().enumerate() {
        *b = (xxhash_rust::xxh3::xxh3_64(&(i as u64).to_le_bytes()) >> 9) as u8;
    }
    for comp in [Compression::Lz4, Compression::Zstd(3)] {
        let e = Encoder::new(comp)
            .unwrap()
            .file(&data, block, true)
            .unwrap();
        assert_eq!(e.codec, codec::FRAMED);
        let mut out = vec![0u8; data.len()];
        // The workspace is lent, grown once (the agent keeps one per thread; the preload
        // library maps one).
        let mut ws = Vec::new();
        unframe(&e.bytes, &mut out, block, &mut ws).unwrap();
        out.fill(0);
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let r = unframe(&e.bytes, &mut out, block, &mut ws);
        let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
        r.unwrap();
        assert_eq!(allocated, 0, "{comp}: unframe allocated");
        assert!(out == data, "{comp}: wrong bytes");
    }
}
