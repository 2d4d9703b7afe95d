//! Writing like a Unix tool. `granary status | head -1`: a reader that went away ends the
//! command quietly (SIGPIPE, as for `cat`), never with a panic. `granary run` is different: it
//! must end with the program's status even when nobody reads its messages, so its writes to
//! stderr ignore errors.

use std::io::Write;

/// Gives SIGPIPE its default action back (Rust ignores it): for commands whose only output is
/// what they print (`status`, `stop`, `demo`), a closed pipe ends them silently.
pub fn die_on_closed_pipe() {
    // SAFETY: restores the default disposition of one signal; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A line on stdout. An error other than a closed pipe (a full disk) ends the command with 1.
pub fn out(line: &str) {
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{line}").and_then(|()| o.flush()).is_err() {
        std::process::exit(1);
    }
}

/// A message on stderr that cannot fail the command.
pub fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Text on stderr as is (no newline added), errors ignored.
pub fn say_raw(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(text.as_bytes()).and_then(|()| e.flush());
}

/// How often long work (a walk, a pack) says where it is when stderr is not a terminal:
/// `$GRANARY_PROGRESS_EVERY` (a duration), else 10 s.
pub fn batch_every() -> std::time::Duration {
    std::env::var("GRANARY_PROGRESS_EVERY")
        .ok()
        .and_then(|v| granary_core::size::parse_duration(&v))
        .filter(|d| !d.is_zero())
        .unwrap_or(std::time::Duration::from_secs(10))
}

/// Progress lines for a batch job's log (stderr not a terminal, where a redrawn bar would be
/// noise): `due` says when the next one is, every `batch_every()`.
pub struct Ticker {
    every: std::time::Duration,
    next: std::time::Instant,
}

impl Ticker {
    pub fn new() -> Ticker {
        let every = batch_every();
        Ticker {
            every,
            next: std::time::Instant::now() + every,
        }
    }

    /// True once every `batch_every()`.
    pub fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }
}

/// Whether stderr is a terminal (a bar is drawn) or a log (`Ticker` lines are written).
pub fn stderr_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}
