//! A packed file's stored bytes turned back into its bytes as they stream past, in pieces of
//! any size (docs/pack-format.md, "Stored bytes of a file"): codec none as it is; framed, the
//! frame table first, then each frame raw, a hole (nothing written: the copy keeps it), or lz4 /
//! zstd into a buffer of exactly the frame's size. Every byte is hashed, and `finish` says
//! whether the whole file matched the index's checksum — a copy is published only then.

use granary_pack::codec::{decode_frame, frame, frame_count, frame_raw_len, frame_table};
use granary_pack::format::entry::codec;

/// A streaming thread's buffers, reused from file to file: a decompressed frame, and the
/// memory of zstd's decompression context.
#[derive(Default)]
pub struct Scratch {
    frame: Vec<u8>,
    zstd: Vec<u8>,
}

/// Why a file's stored bytes cannot be its bytes: the pack is damaged (or hostile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged(pub String);

pub struct Decoder {
    codec: u8,
    size: u64,
    block: u32,
    stored_len: u64,
    /// Stored bytes consumed so far.
    seen: u64,
    /// Raw bytes produced so far (the output offset).
    raw: u64,
    /// Framed: the frame table while it is being collected, then its words.
    table: Vec<u8>,
    words: Vec<u32>,
    frame: usize,
    /// The current frame's stored bytes when they arrive in more than one piece.
    pending: Vec<u8>,
    hasher: xxhash_rust::xxh3::Xxh3,
}

impl Decoder {
    pub fn new(codec_id: u8, size: u64, stored_len: u64, block: u32) -> Decoder {
        Decoder {
            codec: codec_id,
            size,
            block,
            stored_len,
            seen: 0,
            raw: 0,
            table: Vec::new(),
            words: Vec::new(),
            frame: 0,
            pending: Vec::new(),
            hasher: xxhash_rust::xxh3::Xxh3::new(),
        }
    }

    fn table_len(&self) -> u64 {
        frame_count(self.size, self.block).saturating_mul(4)
    }

    /// Consumes the next stored bytes; `out(raw offset, bytes)` writes decoded bytes (holes are
    /// skipped: the output file has the file's length already). `scratch` is reused for
    /// decompressed frames.
    pub fn feed<E>(
        &mut self,
        mut data: &[u8],
        scratch: &mut Scratch,
        out: &mut impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, Damaged> {
        if self.seen + data.len() as u64 > self.stored_len {
            return Err(Damaged("more stored bytes than the index says".into()));
        }
        self.seen += data.len() as u64;
        match self.codec {
            codec::NONE => {
                self.hasher.update(data);
                let at = self.raw;
                self.raw += data.len() as u64;
                return Ok(out(at, data));
            }
            codec::FRAMED => {}
            c => return Err(Damaged(format!("unknown codec {c}"))),
        }
        while !data.is_empty() {
            if self.words.is_empty() {
                let want = (self.table_len() as usize).saturating_sub(self.table.len());
                let n = want.min(data.len());
                self.table.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.table.len() as u64 == self.table_len() {
                    self.words = frame_table(&self.table, self.stored_len, self.size, self.block)
                        .map_err(|e| Damaged(e.to_string()))?;
                }
                continue;
            }
            let Some(&w) = self.words.get(self.frame) else {
                return Err(Damaged("bytes after the last frame".into()));
            };
            let len = frame::len(w);
            let taken;
            let whole: &[u8] = if self.pending.is_empty() && data.len() >= len {
                let (f, rest) = data.split_at(len);
                data = rest;
                f
            } else {
                let n = (len - self.pending.len()).min(data.len());
                self.pending.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.pending.len() < len {
                    continue;
                }
                taken = std::mem::take(&mut self.pending);
                &taken
            };
            if let Err(e) = self.frame_out(w, whole, scratch, out)? {
                return Ok(Err(e));
            }
        }
        // A file whose only frames are empty holes has nothing stored after its table.
        while self
            .words
            .get(self.frame)
            .is_some_and(|&w| frame::len(w) == 0)
        {
            let w = self.words[self.frame];
            if let Err(e) = self.frame_out(w, &[], scratch, out)? {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    fn frame_out<E>(
        &mut self,
        w: u32,
        stored: &[u8],
        scratch: &mut Scratch,
        out: &mut impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, Damaged> {
        let k = self.frame as u64;
        let raw_len = frame_raw_len(k, self.size, self.block);
        self.frame += 1;
        let at = self.raw;
        self.raw += raw_len as u64;
        match frame::kind(w) {
            frame::ZERO => {
                if !stored.is_empty() {
                    return Err(Damaged(format!("frame {k}: hole with stored bytes")));
                }
                super::copy::hash_zeros(&mut self.hasher, raw_len as u64);
                Ok(Ok(()))
            }
            frame::RAW if stored.len() == raw_len => {
                self.hasher.update(stored);
                Ok(out(at, stored))
            }
            _ => {
                let buf = &mut scratch.frame;
                buf.clear();
                buf.resize(raw_len, 0);
                decode_frame(w, stored, buf, &mut scratch.zstd)
                    .map_err(|m| Damaged(format!("frame {k}: {m}")))?;
                self.hasher.update(buf);
                Ok(out(at, buf))
            }
        }
    }

    /// The file is complete: every stored byte seen, every frame decoded, and the bytes match
    /// `checksum`.
    pub fn finish(&self, checksum: u64) -> Result<u64, Damaged> {
        let framed_done = self.codec != codec::FRAMED || self.frame == self.words.len();
        if self.seen != self.stored_len || self.raw != self.size || !framed_done {
            return Err(Damaged(format!(
                "cut short: {} of {} stored bytes, {} of {} bytes",
                self.seen, self.stored_len, self.raw, self.size
            )));
        }
        let sum = self.hasher.digest();
        if sum != checksum {
            return Err(Damaged(
                "checksum mismatch: the stored bytes are damaged".into(),
            ));
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_pack::codec::{Compression, Encoder};

    fn decode_in_pieces(data: &[u8], comp: Compression, holes: bool, piece: usize) {
        let block = 4096;
        let e = Encoder::new(comp)
            .unwrap()
            .file(data, block, holes)
            .unwrap();
        let sum = xxhash_rust::xxh3::xxh3_64(data);
        let mut d = Decoder::new(e.codec, data.len() as u64, e.bytes.len() as u64, block);
        let mut got = vec![0u8; data.len()];
        let mut scratch = Scratch::default();
        for chunk in e.bytes.chunks(piece.max(1)) {
            d.feed(chunk, &mut scratch, &mut |at, b: &[u8]| {
                got[at as usize..at as usize + b.len()].copy_from_slice(b);
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap();
        }
        if e.bytes.is_empty() {
            d.feed(&[], &mut scratch, &mut |_, _: &[u8]| Ok::<(), ()>(()))
                .unwrap()
                .unwrap();
        }
        assert_eq!(d.finish(sum), Ok(sum));
        assert_eq!(got, data);
    }

    #[test]
    fn every_codec_decodes_in_any_pieces() {
        let text: Vec<u8> = (0..40_000u32).flat_map(|i| (i % 5).to_le_bytes()).collect();
        let mut sparse = vec![0u8; 50_000];
        sparse[30_000..30_010].copy_from_slice(b"0123456789");
        for comp in [Compression::None, Compression::Lz4, Compression::Zstd(1)] {
            for piece in [1, 7, 4096, 5000, 1 << 20] {
                decode_in_pieces(&text, comp, false, piece);
                decode_in_pieces(&sparse, comp, true, piece);
                decode_in_pieces(b"", comp, false, piece);
                decode_in_pieces(b"x", comp, false, piece);
            }
        }
        // All holes: nothing stored after the table.
        decode_in_pieces(&[0u8; 9000], Compression::None, true, 3);
    }

    #[test]
    fn damage_is_noticed() {
        let text: Vec<u8> = (0..40_000u32).flat_map(|i| (i % 5).to_le_bytes()).collect();
        let e = Encoder::new(Compression::Zstd(1))
            .unwrap()
            .file(&text, 4096, false)
            .unwrap();
        let sum = xxhash_rust::xxh3::xxh3_64(&text);
        for flip in [0, 3, e.bytes.len() / 2, e.bytes.len() - 1] {
            let mut bad = e.bytes.clone();
            bad[flip] ^= 0x40;
            let mut d = Decoder::new(e.codec, text.len() as u64, bad.len() as u64, 4096);
            let r = d.feed(&bad, &mut Scratch::default(), &mut |_, _: &[u8]| {
                Ok::<(), ()>(())
            });
            assert!(r.is_err() || d.finish(sum).is_err(), "flip at {flip}");
        }
        let mut d = Decoder::new(e.codec, text.len() as u64, e.bytes.len() as u64, 4096);
        let half = &e.bytes[..e.bytes.len() / 2];
        d.feed(half, &mut Scratch::default(), &mut |_, _: &[u8]| {
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        assert!(d.finish(sum).is_err(), "a cut file is never complete");
    }
}
