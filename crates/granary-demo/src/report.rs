//! What `granary demo` prints at the end: the epochs side by side, the source's traffic, and
//! the gain, with a plain statement of what the source was.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use granary_core::size::format_size;

use crate::emulation;
use crate::reader::Run;

pub enum Mode {
    /// An emulated slow source, described.
    Emulated(String),
    /// A local directory, and why no slow source was emulated.
    Local(String),
}

pub struct Shape {
    pub files: usize,
    pub size: u64,
    pub total: u64,
    /// Bytes per `read`.
    pub piece: u64,
}

pub fn print(
    shape: &Shape,
    mode: &Mode,
    direct: &Run,
    gran: &Run,
    job: &granary_core::stats::JobReport,
    tier: &Path,
) -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "\n{} files x {} ({} per epoch), read in {} pieces, shuffled, every byte verified \
         against the manifest",
        shape.files,
        format_size(shape.size),
        format_size(shape.total),
        format_size(shape.piece)
    )?;
    match mode {
        Mode::Emulated(how) => writeln!(o, "mode: emulated slow source; the source is {how}")?,
        Mode::Local(why) => writeln!(
            o,
            "mode: local disk, no slow-source emulation ({why}); both runs read a local \
             directory"
        )?,
    }
    writeln!(
        o,
        "{:>5}  {:>10}  {:>11}  {:>18}  {:>18}  {:>16}",
        "epoch",
        "direct s",
        "granary s",
        "source opens (gr)",
        "source bytes (gr)",
        "tier files (gr)"
    )?;
    for (i, (d, g)) in direct.out.epochs.iter().zip(&gran.out.epochs).enumerate() {
        writeln!(
            o,
            "{:>5}  {:>10.3}  {:>11.3}  {:>18}  {:>18}  {:>16}",
            i + 1,
            d.secs,
            g.secs,
            g.source_opens,
            format_size(g.source_bytes),
            g.tier_files
        )?;
    }
    if let (Some(d), Some(g)) = (direct.device, gran.device) {
        writeln!(
            o,
            "source device, counted by the kernel: direct {} in {} requests; under granary {} in \
             {} requests (the agent's copies included)",
            format_size(d.1),
            d.0,
            format_size(g.1),
            g.0
        )?;
    }
    writeln!(
        o,
        "bytes verified: {} direct, {} under granary; agent placed {} files ({}) on {}",
        format_size(direct.out.verified_bytes),
        format_size(gran.out.verified_bytes),
        job.placement.files_placed,
        format_size(job.placement.bytes_placed),
        tier.display()
    )?;
    let g = &gran.out.epochs;
    if !g.is_empty() && g.iter().all(|e| e.tier_files == 0) {
        writeln!(
            o,
            "note: the preload library served nothing from the tier (is libgranary_preload.so \
             built?)"
        )?;
    }
    gain(&mut o, mode, shape, direct, gran)?;
    Ok(())
}

fn mean(secs: &[f64]) -> Option<f64> {
    (!secs.is_empty()).then(|| secs.iter().sum::<f64>() / secs.len() as f64)
}

fn gain(o: &mut impl Write, mode: &Mode, shape: &Shape, direct: &Run, gran: &Run) -> Result<()> {
    let secs = |r: &Run| r.out.epochs.iter().map(|e| e.secs).collect::<Vec<_>>();
    let (d, g) = (secs(direct), secs(gran));
    let (Some(d1), Some(g1)) = (d.first(), g.first()) else {
        return Ok(());
    };
    match mode {
        Mode::Emulated(_) => {
            if let (Some(dl), Some(gl)) = (mean(&d[1..]), mean(&g[1..])) {
                writeln!(
                    o,
                    "gain: epochs 2-{}: {:.2} s per epoch under granary, {:.2} s direct ({:.1}x \
                     faster: they read the tier, not the source)",
                    d.len(),
                    gl,
                    dl,
                    dl / gl.max(1e-6)
                )?;
            }
            writeln!(
                o,
                "      epoch 1: {g1:.2} s under granary, {d1:.2} s direct ({:.1}x){}",
                d1 / g1.max(1e-6),
                if shape.size > emulation::READAHEAD_KB << 10 {
                    format!(
                        "; files larger than the source's {} KiB readahead are fetched whole by \
                         the agent, one large request each instead of the program's \
                         readahead-sized ones",
                        emulation::READAHEAD_KB
                    )
                } else {
                    String::new()
                }
            )?;
        }
        Mode::Local(_) => writeln!(
            o,
            "what this measured: granary's overhead on a source whose reads cost next to nothing \
             (epoch 1 {g1:.2} s vs {d1:.2} s direct), not its gain; on a parallel file system the \
             later epochs' savings are the source opens and bytes above. As root, with cgroup v1 \
             blkio and memory controllers and loop devices, `granary demo` emulates a slow source \
             and shows them."
        )?,
    }
    Ok(())
}
