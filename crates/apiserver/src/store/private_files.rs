//! Files and directories only their owner may read: the data directory holds the database,
//! whose Secrets include CA keys, the serving key and the kubeconfig.
//!
//! Modes are narrowed also when the paths exist already, since earlier versions (and a umask of
//! 022) left them world-readable. Elsewhere than on Unix there are no modes to set.

use std::io::Write;
use std::path::Path;

/// Creates `dir` (and missing parents) and makes it owner-only (0700 when created here).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)?;
    restrict(dir)
}

/// Takes the group and other permissions off `path`, if it exists.
pub fn restrict(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = match std::fs::metadata(path) {
            Ok(m) => m.permissions().mode(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o700))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Creates `path` empty and owner-only (0600) unless it exists; narrows it if it does.
pub fn create_file(path: &Path) -> std::io::Result<()> {
    open_private(path, false)?;
    restrict(path)
}

/// Writes a file readable by its owner only (it may hold a private key).
pub fn write(path: &Path, content: &str) -> std::io::Result<()> {
    let mut f = open_private(path, true)?;
    restrict(path)?;
    f.write_all(content.as_bytes())?;
    f.sync_all()
}

fn open_private(path: &Path, truncate: bool) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(truncate);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn narrows_what_exists_and_creates_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        create_dir(&dir.join("pki")).unwrap();
        assert_eq!((mode(&dir), mode(&dir.join("pki"))), (0o700, 0o700));
        set_mode(&dir, 0o755);
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);

        let file = dir.join("kubeconfig");
        write(&file, "old").unwrap();
        assert_eq!(mode(&file), 0o600);
        set_mode(&file, 0o644);
        write(&file, "new").unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");

        set_mode(&file, 0o640);
        create_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "new",
            "create_file keeps what exists"
        );
        // Owner bits are left as they are: a read-only file stays read-only.
        set_mode(&file, 0o444);
        restrict(&file).unwrap();
        assert_eq!(mode(&file), 0o400);
        restrict(&dir.join("absent")).unwrap();
    }
}
