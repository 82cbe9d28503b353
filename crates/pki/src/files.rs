//! Writing certificates and keys to disk so that a crash or an error never leaves a
//! half-written file or a half-written set of files behind.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode for private keys.
pub const PRIVATE_KEY_MODE: u32 = 0o600;
/// Mode for certificates and bundles.
pub const CERTIFICATE_MODE: u32 = 0o644;

/// One file of a set written by [`write_all`].
#[derive(Clone, Copy)]
pub struct FileToWrite<'a> {
    pub name: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
}

impl std::fmt::Debug for FileToWrite<'_> {
    // Contents may be a private key: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileToWrite")
            .field("name", &self.name)
            .field("mode", &format_args!("{:o}", self.mode))
            .finish_non_exhaustive()
    }
}

/// Writes every file into `dir` (which must exist): all are staged as synced temporary files
/// first, and only when every one is on disk are they renamed into place. An error while
/// staging (a full disk, a file-size limit) removes the staged files and leaves `dir` as it
/// was. The renames cannot be undone as a whole: if one fails (only when `dir` is changed
/// under us), the files renamed before it stay in place and the rest are removed; callers
/// that created `dir` remove what they meant to write.
pub fn write_all(dir: &Path, files: &[FileToWrite<'_>]) -> io::Result<()> {
    let staged = stage_all(dir, files)?;
    let result = (|| {
        for file in &staged {
            fs::rename(&file.temp, &file.target)?;
        }
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        for file in &staged {
            let _ = fs::remove_file(&file.temp);
        }
    }
    result
}

/// A file staged by [`stage_all`]: synced under a temporary name beside its target.
#[derive(Debug)]
pub struct Staged {
    pub temp: PathBuf,
    pub target: PathBuf,
}

/// Stages every file of `files` in `dir` as a synced temporary file (named as
/// [`is_staged_leftover`] recognises), for a caller that renames them into place itself. A
/// failure removes the files staged so far.
pub fn stage_all(dir: &Path, files: &[FileToWrite<'_>]) -> io::Result<Vec<Staged>> {
    let mut staged: Vec<Staged> = Vec::with_capacity(files.len());
    for file in files {
        match write_temp(dir, file) {
            Ok(temp) => staged.push(Staged {
                temp,
                target: dir.join(file.name),
            }),
            Err(e) => {
                for file in &staged {
                    let _ = fs::remove_file(&file.temp);
                }
                return Err(e);
            }
        }
    }
    Ok(staged)
}

/// Whether `file_name` is a temporary file this module stages for `name` (`.NAME.tmp-HEX`):
/// what a write interrupted by a crash leaves behind.
pub fn is_staged_leftover(file_name: &str, name: &str) -> bool {
    file_name
        .strip_prefix('.')
        .and_then(|rest| rest.strip_prefix(name))
        .and_then(|rest| rest.strip_prefix(".tmp-"))
        .is_some_and(|suffix| {
            !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// Removes (as [`remove_file_securely`] does) the staged temporary files of `names` that an
/// interrupted write left in `dir`; returns the names of those removed.
pub fn remove_staged_leftovers(dir: &Path, names: &[&str]) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if names
            .iter()
            .any(|name| is_staged_leftover(&file_name, name))
        {
            remove_file_securely(&entry.path())?;
            removed.push(file_name);
        }
    }
    Ok(removed)
}

/// Removes the file at `path`. A private one (no permission for group or others, like a key)
/// is overwritten with zeros and synced first, so the removed file does not leave its contents
/// in blocks the filesystem hands out again.
pub fn remove_file_securely(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_file() && meta.permissions().mode() & 0o077 == 0 {
        let mut file = OpenOptions::new().write(true).open(path)?;
        io::copy(&mut io::repeat(0).take(meta.len()), &mut file)?;
        file.sync_all()?;
    }
    fs::remove_file(path)
}

/// Removes the directory tree at `dir`, every file as [`remove_file_securely`] does.
pub fn remove_dir_all_securely(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_dir_all_securely(&entry.path())?;
        } else {
            remove_file_securely(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}

/// Writes one file atomically (temp file, fsync, rename) with `mode`.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    write_all(
        dir,
        &[FileToWrite {
            name,
            contents,
            mode,
        }],
    )
}

/// Writes `file` to a new temporary file in `dir` and returns its path. The name is random, so
/// no leftover of an earlier run (whose PID, in a container, was the same) is ever in the way;
/// a failed write removes its temporary file.
fn write_temp(dir: &Path, file: &FileToWrite<'_>) -> io::Result<PathBuf> {
    loop {
        let temp = dir.join(format!(".{}.tmp-{}", file.name, random_suffix()?));
        match write_new(&temp, file.contents, file.mode) {
            Ok(()) => return Ok(temp),
            // Only a file this very write created is removed.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        }
    }
}

fn random_suffix() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| io::Error::other("no system randomness"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    // create_new with the final mode: the file is never readable by others, not even briefly.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_with_modes_and_replaces_existing_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("tls.crt"), "old").unwrap();
        write_all(
            dir.path(),
            &[
                FileToWrite {
                    name: "tls.crt",
                    contents: b"cert",
                    mode: CERTIFICATE_MODE,
                },
                FileToWrite {
                    name: "tls.key",
                    contents: b"key",
                    mode: PRIVATE_KEY_MODE,
                },
            ],
        )
        .unwrap();
        assert_eq!(fs::read(dir.path().join("tls.crt")).unwrap(), b"cert");
        let mode = fs::metadata(dir.path().join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temp files left"
        );
    }

    #[test]
    fn failure_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "old").unwrap();
        // A name with a slash into a missing directory fails after "a" was staged.
        let err = write_all(
            dir.path(),
            &[
                FileToWrite {
                    name: "a",
                    contents: b"new",
                    mode: 0o644,
                },
                FileToWrite {
                    name: "missing/b",
                    contents: b"x",
                    mode: 0o644,
                },
            ],
        );
        assert!(err.is_err());
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"old");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp files removed"
        );
    }

    #[test]
    fn leftover_temp_files_of_an_earlier_run_are_never_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        // A crash left temp files named the way they used to be: by PID, which is the same
        // (1) every time in a container.
        for pid in [1, std::process::id()] {
            fs::write(dir.path().join(format!(".tls.crt.tmp-{pid}")), "stale").unwrap();
        }
        write_atomic(&dir.path().join("tls.crt"), b"cert", CERTIFICATE_MODE).unwrap();
        write_atomic(&dir.path().join("tls.crt"), b"cert 2", CERTIFICATE_MODE).unwrap();
        assert_eq!(fs::read(dir.path().join("tls.crt")).unwrap(), b"cert 2");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            3,
            "only the leftovers and the file"
        );
    }

    #[test]
    fn private_files_are_overwritten_before_they_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("backup");
        fs::create_dir_all(tree.join("pki")).unwrap();
        write_atomic(&tree.join("pki/a.key"), b"SECRET KEY", PRIVATE_KEY_MODE).unwrap();
        write_atomic(&tree.join("pki/a.crt"), b"cert", CERTIFICATE_MODE).unwrap();
        // A second name for the key's inode shows what is left in its blocks after removal.
        fs::hard_link(tree.join("pki/a.key"), dir.path().join("key-inode")).unwrap();
        fs::hard_link(tree.join("pki/a.crt"), dir.path().join("crt-inode")).unwrap();
        remove_dir_all_securely(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(fs::read(dir.path().join("key-inode")).unwrap(), [0u8; 10]);
        assert_eq!(fs::read(dir.path().join("crt-inode")).unwrap(), b"cert");
    }
}
