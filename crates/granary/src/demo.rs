use anyhow::Result;

use crate::cli::{DemoArgs, DemoReaderArgs};

pub fn demo(_a: DemoArgs) -> Result<i32> {
    anyhow::bail!("not yet")
}

pub fn reader(_a: DemoReaderArgs) -> Result<i32> {
    anyhow::bail!("not yet")
}
