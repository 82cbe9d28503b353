//! Writing certificates and keys to disk so that a crash or an error never leaves a
//! half-written file or a half-written set of files behind.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
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
/// first, and only when every one is on disk are they renamed into place. On error the
/// staged files are removed and nothing in `dir` has changed.
pub fn write_all(dir: &Path, files: &[FileToWrite<'_>]) -> io::Result<()> {
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
    let result = (|| {
        for file in files {
            let target = dir.join(file.name);
            let temp = dir.join(format!(".{}.tmp-{}", file.name, std::process::id()));
            // Pushed before writing so a failed write still cleans up its temp file.
            staged.push((temp.clone(), target));
            write_new(&temp, file.contents, file.mode)?;
        }
        for (temp, target) in &staged {
            fs::rename(temp, target)?;
        }
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        for (temp, _) in &staged {
            let _ = fs::remove_file(temp);
        }
    }
    result
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
    use std::os::unix::fs::PermissionsExt;

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
}
