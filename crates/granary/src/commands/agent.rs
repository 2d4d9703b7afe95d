//! `granary agent`: the node agent in the foreground (`granary run` normally starts it on
//! demand, with its own flags).

use anyhow::Result;
use granary_core::runtime::Runtime;

use crate::flags::AgentArgs;

pub fn main(args: AgentArgs) -> Result<i32> {
    let rt = Runtime::open()?;
    let config = args.tiers.agent_config()?;
    granary_agent::logging::init(
        Some(config.cfg.log_level.as_deref().unwrap_or("info")),
        config.cfg.log_file.clone(),
    );
    granary_agent::daemon::run(rt, config)?;
    Ok(0)
}
