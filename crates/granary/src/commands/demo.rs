//! `granary demo` and the reader it runs (`granary __demo-reader`): flags into the demo's
//! configuration (the `granary_demo` crate runs it).

use anyhow::{Context, Result};
use granary_core::size::parse_size;

use crate::flags::demo::{DemoArgs, DemoReaderArgs};
use crate::signals;

pub fn main(a: DemoArgs) -> Result<i32> {
    let size = parse_size(&a.size)
        .filter(|s| (1..=1 << 30).contains(s))
        .with_context(|| format!("bad --size `{}` (1 B to 1G, e.g. 640K)", a.size))?
        as usize;
    let config = granary_demo::DemoConfig {
        files: a.files,
        size,
        epochs: a.epochs,
        no_emulation: a.no_emulation,
        dir: a.dir,
        exe: std::env::current_exe().context("finding this program")?,
    };
    // From here on a Ctrl-C ends the current step and the demo cleans up before it exits.
    signals::catch_interrupts();
    granary_demo::run(
        &config,
        &granary_demo::Interrupts {
            interrupted: signals::interrupted,
            set_child: signals::set_child,
        },
    )
}

pub fn reader(a: DemoReaderArgs) -> Result<i32> {
    granary_demo::read(&granary_demo::ReaderConfig {
        dataset: a.dataset,
        epochs: a.epochs,
        seed: a.seed,
        out: a.out,
    })
}
