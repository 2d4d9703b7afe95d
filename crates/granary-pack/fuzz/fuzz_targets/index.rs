//! Arbitrary bytes as a pack index, with their checksums recomputed so the structural checks
//! (not just the checksums) see them: parsing must never panic, and whatever parses must be
//! usable in full.
#![no_main]

use std::path::Path;

use granary_pack::format::header::reseal_index;
use granary_pack::Index;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut b = data.to_vec();
    reseal_index(&mut b);
    if let Ok(h) = granary_pack::format::IndexHeader::decode(&b, Path::new("i")) {
        let mut h = h;
        h.pack_id = granary_pack::index::pack_id(&h);
        if b.len() >= 256 {
            b[..256].copy_from_slice(&h.encode());
        }
    }
    if let Ok(ix) = Index::parse(b, Path::new("index")) {
        for i in 0..ix.len().min(100_000) {
            let Some(e) = ix.entry(i) else { continue };
            let p = ix.path_of(i);
            assert_eq!(ix.lookup(&p).ok(), Some(i));
            let _ = (ix.name(&e), ix.link_target(&e), ix.children(&e));
        }
    }
});
