//! `granary serve`: this process is one rank of the serving job (cluster mode,
//! `granary_agent::cluster`), until the job is stopped.

use anyhow::Result;

use crate::flags::serve::ServeArgs;

pub fn main(args: ServeArgs) -> Result<i32> {
    granary_agent::cluster::serve(args.serve_config()?)?;
    Ok(0)
}
