//! The temporary directory a pack is written into and the rename that publishes it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{PackError, Result};

pub struct Staging {
    /// Temporary directories of earlier packs to the same OUT that never finished (killed):
    /// reported, never removed (the pack may be running on another node of a shared FS).
    pub leftovers: Vec<PathBuf>,
    tmp: PathBuf,
    out: PathBuf,
    force: bool,
    done: bool,
}

impl Staging {
    /// Checks that `out` may be written and creates `.NAME.tmp-<pid>` beside it.
    pub fn create(src: &Path, out: &Path, force: bool) -> Result<Staging> {
        let name = out
            .file_name()
            .ok_or_else(|| PackError::Invalid(format!("{}: not a file name", out.display())))?;
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let parent_real = parent
            .canonicalize()
            .map_err(|e| PackError::io(&parent, e))?;
        let src_real = src.canonicalize().map_err(|e| PackError::io(src, e))?;
        if parent_real.join(name).starts_with(&src_real) {
            return Err(PackError::Invalid(format!(
                "{}: the pack cannot be inside its source {}",
                out.display(),
                src.display()
            )));
        }
        if out.symlink_metadata().is_ok() && !force {
            return Err(PackError::Invalid(format!(
                "{} exists (--force replaces it)",
                out.display()
            )));
        }
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = parent.join(&tmp_name);
        let prefix = {
            let mut p = std::ffi::OsString::from(".");
            p.push(name);
            p.push(".tmp-");
            p
        };
        let mut leftovers: Vec<PathBuf> = std::fs::read_dir(&parent)
            .map(|rd| {
                rd.filter_map(|de| de.ok())
                    .filter(|de| {
                        de.file_name()
                            .as_encoded_bytes()
                            .starts_with(prefix.as_encoded_bytes())
                    })
                    .map(|de| de.path())
                    .collect()
            })
            .unwrap_or_default();
        leftovers.sort();
        std::fs::create_dir(&tmp).map_err(|e| PackError::io(&tmp, e))?;
        Ok(Staging {
            leftovers,
            tmp,
            out: parent.join(name),
            force,
            done: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.tmp
    }

    pub fn write_file(&self, name: &str, bytes: &[u8], sync: bool) -> Result<()> {
        let path = self.tmp.join(name);
        let mut f = File::create_new(&path).map_err(|e| PackError::io(&path, e))?;
        f.write_all(bytes).map_err(|e| PackError::io(&path, e))?;
        if sync {
            f.sync_all().map_err(|e| PackError::io(&path, e))?;
        }
        Ok(())
    }

    /// Renames the complete pack into place (replacing an old one with `force`).
    pub fn commit(mut self, sync: bool) -> Result<PathBuf> {
        if sync {
            sync_dir(&self.tmp)?;
        }
        let mut old = None;
        if self.force && self.out.symlink_metadata().is_ok() {
            let mut aside = self.tmp.clone().into_os_string();
            aside.push(".old");
            let aside = PathBuf::from(aside);
            std::fs::rename(&self.out, &aside).map_err(|e| PackError::io(&self.out, e))?;
            old = Some(aside);
        }
        crate::sys::rename_noreplace(&self.tmp, &self.out)
            .map_err(|e| PackError::io(&self.out, e))?;
        self.done = true;
        if sync {
            if let Some(parent) = self.out.parent() {
                sync_dir(parent)?;
            }
        }
        if let Some(old) = old {
            let r = if old.is_dir() {
                std::fs::remove_dir_all(&old)
            } else {
                std::fs::remove_file(&old)
            };
            r.map_err(|e| PackError::io(&old, e))?;
        }
        Ok(self.out.clone())
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    let d = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(|e| PackError::io(d, e))
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            // An error stopped the pack: leave nothing behind.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}
