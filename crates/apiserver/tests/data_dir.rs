//! The data directory holds Secrets with CA keys, the serving key and the kubeconfig: only its
//! owner may read it, whatever the umask and whatever modes an earlier version left.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use caretaker_apiserver::{ApiServer, DATABASE_FILE};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every directory and file under `dir`, `dir` included.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut paths = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            paths.extend(tree(&path));
        } else {
            paths.push(path);
        }
    }
    paths
}

/// Paths under `dir` that others than the owner may access, with their modes in octal.
fn readable_by_others(dir: &Path) -> Vec<(PathBuf, String)> {
    tree(dir)
        .into_iter()
        .filter(|p| mode(p) & 0o077 != 0)
        .map(|p| {
            let m = format!("{:o}", mode(&p));
            (p, m)
        })
        .collect()
}

async fn start(dir: &Path) -> ApiServer {
    let server = ApiServer::builder()
        .data_dir(dir)
        .tls(true)
        .start()
        .await
        .unwrap();
    server.write_kubeconfig(dir.join("kubeconfig")).unwrap();
    server
}

#[tokio::test]
async fn the_data_directory_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let db = dir.join(DATABASE_FILE);
    let wal = dir.join(format!("{DATABASE_FILE}-wal"));
    let shm = dir.join(format!("{DATABASE_FILE}-shm"));

    let server = start(&dir).await;
    let secrets: Api<Secret> = Api::namespaced(server.client(), "default");
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "ca"}, "stringData": {"tls.key": "PRIVATE KEY"}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert!(wal.exists() && shm.exists(), "SQLite runs in WAL mode");
    assert_eq!(readable_by_others(&dir), vec![]);
    assert_eq!((mode(&dir), mode(&db), mode(&wal)), (0o700, 0o600, 0o600));
    server.shutdown().await;

    // What earlier versions left (0755 directories, 0644 files), with WAL files a crash left.
    for (path, m) in [(&wal, 0o644), (&shm, 0o644)] {
        std::fs::write(path, b"").unwrap();
        set_mode(path, m);
    }
    for path in tree(&dir) {
        set_mode(&path, if path.is_dir() { 0o755 } else { 0o644 });
    }
    assert_ne!(readable_by_others(&dir), vec![]);

    let server = start(&dir).await;
    assert_eq!(readable_by_others(&dir), vec![]);
    assert_eq!(mode(&dir.join("pki/server.key")), 0o600);
    let secrets: Api<Secret> = Api::namespaced(server.client(), "default");
    assert_eq!(
        secrets.get("ca").await.unwrap().data.unwrap()["tls.key"].0,
        b"PRIVATE KEY"
    );
}
