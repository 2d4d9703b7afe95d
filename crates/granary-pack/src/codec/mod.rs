//! How a regular file's bytes are stored: as they are (`codec::NONE`) or framed
//! (`codec::FRAMED`): one 32-bit word per `block_size` bytes of the file, then the frames. Each
//! frame is stored raw, as a hole (all zeros, nothing stored), or compressed with lz4 or zstd —
//! chosen per frame, so what does not compress costs nothing to read back, and each frame decodes
//! on its own (a reader can place a large file as its frames arrive).
//!
//! Encoding is here; decoding is `unframe`, the one decoder of the project: the agent's
//! placement, the pack reader and the preload library's extraction all call it, and it never
//! allocates (lz4 straight into the output, zstd with a context in memory the caller lends).

use std::fmt;
use std::str::FromStr;

use crate::format::entry::codec;

pub mod frame;
mod unframe;
mod zstd_dctx;

pub use frame::{frame_count, frame_raw_len};
pub use unframe::{decode_frame, frame_table, unframe, FrameError, Workspace};

/// What `granary pack --compress` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd(i32),
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(1)),
            _ => match s.strip_prefix("zstd:").map(str::parse::<i32>) {
                Some(Ok(l)) if (1..=22).contains(&l) => Ok(Compression::Zstd(l)),
                _ => Err(format!(
                    "unknown compression {s:?}: none, lz4, zstd or zstd:LEVEL (1-22)"
                )),
            },
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// One encoder per worker thread (it keeps a zstd context).
pub struct Encoder {
    comp: Compression,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

/// A file's stored form, for the writer.
pub struct Encoded {
    pub codec: u8,
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn new(comp: Compression) -> std::io::Result<Encoder> {
        let zstd = match comp {
            Compression::Zstd(level) => Some(zstd::bulk::Compressor::new(level)?),
            _ => None,
        };
        Ok(Encoder { comp, zstd })
    }

    /// Whether files must be framed at all (otherwise only sparse ones are).
    pub fn compresses(&self) -> bool {
        self.comp != Compression::None
    }

    /// Encodes one block: appends its stored bytes to `out`, returns its frame word.
    pub fn block(&mut self, raw: &[u8], holes: bool, out: &mut Vec<u8>) -> std::io::Result<u32> {
        if holes && raw.iter().all(|&b| b == 0) {
            return Ok(frame::word(frame::ZERO, 0));
        }
        let start = out.len();
        // A frame must save at least 1/16 of its bytes to be worth decoding.
        let worth = |n: usize| n < raw.len() - raw.len() / 16;
        match (self.comp, self.zstd.as_mut()) {
            (Compression::Zstd(_), Some(z)) => {
                let bound = zstd::zstd_safe::compress_bound(raw.len());
                out.resize(start + bound, 0);
                let n = z.compress_to_buffer(raw, &mut out[start..])?;
                out.truncate(start + n);
                if worth(n) {
                    return Ok(frame::word(frame::ZSTD, n));
                }
            }
            (Compression::Lz4, _) => {
                let bound = lz4_flex::block::get_maximum_output_size(raw.len());
                out.resize(start + bound, 0);
                let n = lz4_flex::block::compress_into(raw, &mut out[start..])
                    .map_err(std::io::Error::other)?;
                out.truncate(start + n);
                if worth(n) {
                    return Ok(frame::word(frame::LZ4, n));
                }
            }
            _ => {}
        }
        out.truncate(start);
        out.extend_from_slice(raw);
        Ok(frame::word(frame::RAW, raw.len()))
    }

    /// Encodes a whole file held in memory: framed when framing saves at least 1/32 of its size
    /// (compressible data, or holes when `holes`), otherwise stored as it is.
    pub fn file(&mut self, raw: &[u8], block: u32, holes: bool) -> std::io::Result<Encoded> {
        if raw.is_empty() || (!self.compresses() && !holes) {
            return Ok(Encoded {
                codec: codec::NONE,
                bytes: raw.to_vec(),
            });
        }
        let n = frame_count(raw.len() as u64, block) as usize;
        let mut bytes = vec![0u8; n * 4];
        for (i, chunk) in raw.chunks(block as usize).enumerate() {
            let word = self.block(chunk, holes, &mut bytes)?;
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        if bytes.len() >= raw.len() - raw.len() / 32 {
            return Ok(Encoded {
                codec: codec::NONE,
                bytes: raw.to_vec(),
            });
        }
        Ok(Encoded {
            codec: codec::FRAMED,
            bytes,
        })
    }
}

/// A file's whole stored form (`codec`, as the index says) decoded into a new buffer: for
/// tools and tests (`unframe` decodes in place, without allocating).
pub fn decode(codec_id: u8, stored: &[u8], size: u64, block: u32) -> Result<Vec<u8>, String> {
    match codec_id {
        codec::NONE => {
            if stored.len() as u64 != size {
                return Err("stored length differs from size".into());
            }
            Ok(stored.to_vec())
        }
        codec::FRAMED => {
            let mut out = vec![0u8; usize::try_from(size).map_err(|_| "file too large")?];
            unframe(stored, &mut out, block, &mut Vec::new()).map_err(|e| e.to_string())?;
            Ok(out)
        }
        other => Err(format!("unknown codec {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(comp: Compression, data: &[u8], holes: bool) -> u8 {
        let mut enc = Encoder::new(comp).unwrap();
        let e = enc.file(data, 4096, holes).unwrap();
        assert_eq!(
            decode(e.codec, &e.bytes, data.len() as u64, 4096).unwrap(),
            data
        );
        e.codec
    }

    #[test]
    fn every_codec_round_trips_and_incompressible_stays_raw() {
        let text: Vec<u8> = (0..50_000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let noise: Vec<u8> = (0..50_000u64)
            .map(|i| (xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()) >> 7) as u8)
            .collect();
        for comp in [
            Compression::Lz4,
            Compression::Zstd(1),
            Compression::Zstd(19),
        ] {
            assert_eq!(round_trip(comp, &text, false), codec::FRAMED);
            assert_eq!(round_trip(comp, &noise, false), codec::NONE);
            assert_eq!(round_trip(comp, b"", false), codec::NONE);
        }
        let mut sparse = vec![0u8; 40_000];
        sparse[20_000..20_100].copy_from_slice(&noise[..100]);
        assert_eq!(round_trip(Compression::None, &sparse, true), codec::FRAMED);
        assert_eq!(round_trip(Compression::None, &sparse, false), codec::NONE);
    }

    #[test]
    fn parses_compression() {
        assert_eq!("zstd:3".parse(), Ok(Compression::Zstd(3)));
        assert_eq!("zstd".parse(), Ok(Compression::Zstd(1)));
        assert!("zstd:0".parse::<Compression>().is_err());
        assert!("gzip".parse::<Compression>().is_err());
    }
}
