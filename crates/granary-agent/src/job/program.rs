//! Why the program `granary run` started may not load the preload library, as far as its file
//! and command line tell: statically linked, setuid, started by `env -i`, by a daemon's client.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How the dynamic loader treats a program file.
#[derive(Debug, PartialEq, Eq)]
pub enum Loading {
    Dynamic,
    /// No `PT_INTERP`: no dynamic loader, no `LD_PRELOAD`.
    Static,
    /// setuid or setgid to someone else: secure mode ignores `LD_PRELOAD`.
    Secure,
}

/// The file `exec` would run for `program` (a `PATH` search when it has no slash).
pub fn resolve(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 || program.as_encoded_bytes().contains(&b'/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).map(|d| d.join(p)).find(|c| {
        std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// How `file` will be loaded; a script is judged by its interpreter.
pub fn loading(file: &Path) -> Loading {
    loading_at(file, 0)
}

fn loading_at(file: &Path, depth: u32) -> Loading {
    let Ok(md) = std::fs::metadata(file) else {
        return Loading::Dynamic;
    };
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mode = md.mode();
    if (mode & libc::S_ISUID != 0 && md.uid() != euid)
        || (mode & libc::S_ISGID != 0 && md.gid() != egid)
    {
        return Loading::Secure;
    }
    let Ok(head) = read_head(file, 4096) else {
        return Loading::Dynamic;
    };
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or(b"");
        let interp = line
            .split(|b| b.is_ascii_whitespace())
            .find(|w| !w.is_empty());
        return match interp {
            Some(i) if depth < 4 => loading_at(Path::new(OsStr::from_bytes(i)), depth + 1),
            _ => Loading::Dynamic,
        };
    }
    match has_interp(file, &head) {
        Some(false) => Loading::Static,
        _ => Loading::Dynamic,
    }
}

fn read_head(file: &Path, n: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(n);
    std::fs::File::open(file)?
        .take(n as u64)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// `Some(true)` for a 64-bit ELF file with a `PT_INTERP` program header, `Some(false)`
/// without one, `None` when it is not a 64-bit ELF file.
fn has_interp(file: &Path, head: &[u8]) -> Option<bool> {
    if head.get(..4)? != b"\x7fELF" || *head.get(4)? != 2 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_ne_bytes(head.get(o..o + 2)?.try_into().ok()?));
    let phoff = u64::from_ne_bytes(head.get(0x20..0x28)?.try_into().ok()?) as usize;
    let (size, count) = (u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    let end = phoff.checked_add(size.checked_mul(count)?)?;
    let table = if end <= head.len() {
        head.get(phoff..end)?.to_vec()
    } else {
        read_head(file, end).ok()?.get(phoff..end)?.to_vec()
    };
    if size < 4 {
        return None;
    }
    Some(
        table
            .chunks_exact(size)
            .any(|ph| ph.get(..4) == Some(&libc::PT_INTERP.to_ne_bytes()[..])),
    )
}

/// `env` with `-i`, `--ignore-environment` or `-` before the command: it starts the command
/// with an empty environment.
pub fn env_clears(program: &OsStr, args: &[OsString]) -> bool {
    if launcher(program) != Some(Launcher::Env) {
        return false;
    }
    let mut it = args.iter().map(|a| a.as_encoded_bytes());
    while let Some(a) = it.next() {
        match a {
            b"-i" | b"--ignore-environment" | b"-" => return true,
            b"--" => return false,
            // Options that take the next argument.
            b"-u" | b"-C" | b"-S" => {
                it.next();
            }
            _ if a.starts_with(b"--") => {}
            // A cluster of short options: `i` counts until one that takes an argument.
            _ if a.starts_with(b"-") => {
                for &c in &a[1..] {
                    match c {
                        b'i' => return true,
                        b'u' | b'C' | b'S' => break,
                        _ => {}
                    }
                }
            }
            _ if a.contains(&b'=') => {}
            _ => return false,
        }
    }
    false
}

/// Why the program itself did not load the preload library, with the fix, when its file or
/// command line tells; `None` when they do not.
pub fn why_not_loaded(program: &OsStr, args: &[OsString], source: &Path) -> Option<String> {
    let name = Path::new(program).display();
    if env_clears(program, args) {
        return Some(format!(
            "`{name} -i` started the program with an empty environment, without LD_PRELOAD and \
             GRANARY_TABLE; keep them (`env -i LD_PRELOAD=\"$LD_PRELOAD\" \
             GRANARY_TABLE=\"$GRANARY_TABLE\" GRANARY_TABLE_FD=\"$GRANARY_TABLE_FD\" \
             GRANARY_TABLE_ID=\"$GRANARY_TABLE_ID\" GRANARY_JOB_SLOT=\"$GRANARY_JOB_SLOT\" …`)"
        ));
    }
    if launcher(program) == Some(Launcher::Docker) {
        return Some(format!(
            "{name} asks a daemon to start the container, which gets neither this command's \
             environment nor its files; add what `granary container-flags --runtime docker \
             --source {}` prints to `{name} run`",
            source.display()
        ));
    }
    let file = resolve(program)?;
    match loading(&file) {
        Loading::Static => Some(format!(
            "{} is statically linked: there is no dynamic loader to load granary's library \
             (granary serves dynamically linked programs only)",
            file.display()
        )),
        Loading::Secure => Some(format!(
            "{} is setuid or setgid: the dynamic loader ignores LD_PRELOAD for it; run it \
             without that bit",
            file.display()
        )),
        Loading::Dynamic => None,
    }
}

/// Container launchers `granary run` may start, by their program name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Apptainer,
    Docker,
    Podman,
    Bwrap,
    Enroot,
    Env,
}

pub fn launcher(program: &OsStr) -> Option<Launcher> {
    let name = Path::new(program).file_name()?.to_str()?;
    Some(match name {
        "apptainer" | "singularity" => Launcher::Apptainer,
        "docker" | "nerdctl" => Launcher::Docker,
        "podman" => Launcher::Podman,
        "bwrap" => Launcher::Bwrap,
        "enroot" => Launcher::Enroot,
        "env" => Launcher::Env,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clears(cmd: &[&str]) -> bool {
        let args: Vec<OsString> = cmd[1..].iter().map(OsString::from).collect();
        env_clears(OsStr::new(cmd[0]), &args)
    }

    #[test]
    fn env_clearing_is_read_from_the_options_before_the_command() {
        assert!(clears(&["env", "-i", "python3"]));
        assert!(clears(&["/usr/bin/env", "--ignore-environment", "python3"]));
        assert!(clears(&["env", "-", "python3"]));
        assert!(clears(&["env", "-vi", "python3"]));
        assert!(clears(&["env", "-u", "HOME", "-i", "python3"]));
        assert!(clears(&["env", "A=1", "-i", "python3"]));
        assert!(!clears(&["env", "A=1", "python3", "-i"]));
        assert!(!clears(&["env", "-u", "-i", "python3"]));
        assert!(!clears(&["env", "--", "-i"]));
        assert!(!clears(&["envoy", "-i"]));
    }

    #[test]
    fn the_running_test_binary_is_dynamic_and_a_script_is_judged_by_its_interpreter() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(loading(&me), Loading::Dynamic);
        let head = read_head(&me, 4096).unwrap();
        assert_eq!(has_interp(&me, &head), Some(true));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        std::fs::write(&script, format!("#!{}\n", me.display())).unwrap();
        assert_eq!(loading(&script), Loading::Dynamic);
        // Not an ELF file: nothing to say.
        assert_eq!(has_interp(&script, b"#!/bin/sh\n"), None);
    }
}
