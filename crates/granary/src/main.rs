//! `granary`: the command line. Each command turns its flags (`flags`) into the typed
//! configuration of the library that does the work (`granary_agent`, `granary_pack`) and calls
//! it (`commands`); what they share to talk to the user and start the program is beside them
//! (`output`, `signals`, `preload`, `jobenv`, `preflight`).

mod commands;
mod flags;
mod jobenv;
mod output;
mod preflight;
mod preload;
mod signals;

use clap::Parser;

use flags::{Cli, Command};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let hint = flags::hint_for(&e, std::env::args_os());
            // Help and version go to stdout with status 0, as clap prints them.
            let _ = e.print();
            if let Some(h) = hint {
                output::say(h);
            }
            std::process::exit(e.exit_code());
        }
    };
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            output::say(format!("granary: {e:#}"));
            2
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    if !matches!(cli.cmd, Command::DemoReader(_)) {
        preflight::check_env()?;
    }
    if !matches!(cli.cmd, Command::Agent(_) | Command::Serve(_)) {
        granary_agent::logging::init(None, None);
    }
    if matches!(
        cli.cmd,
        Command::Status(_)
            | Command::Stop
            | Command::Demo(_)
            | Command::ContainerFlags(_)
            | Command::Cache(_)
    ) {
        output::die_on_closed_pipe();
    }
    match cli.cmd {
        Command::Run(a) => commands::run::main(a),
        Command::Agent(a) => commands::agent::main(a),
        Command::Stop => commands::status::stop(),
        Command::Status(a) => commands::status::main(a),
        Command::Demo(a) => commands::demo::main(a),
        Command::DemoReader(a) => commands::demo::reader(a),
        Command::Pack(a) => commands::pack::main(a),
        Command::Cache(a) => commands::cache::main(a),
        Command::ContainerFlags(a) => commands::container_flags::main(a),
        Command::Serve(a) => commands::serve::main(a),
    }
}
