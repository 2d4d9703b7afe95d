//! `granary`: the CLI and the node agent.

mod agent;
mod cli;
mod client;
mod cluster;
mod container;
mod demo;
mod logging;
mod output;
mod pack_cmd;
mod preload;
mod report;
mod run;
mod run_pack;
mod signals;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let code = match cli::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            output::say(format!("granary: {e:#}"));
            2
        }
    };
    std::process::exit(code);
}
