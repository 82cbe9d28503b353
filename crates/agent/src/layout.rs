//! Where a kubeadm-style node keeps its certificates, and which CA signs each.
//!
//! The set of slots is fixed: a name in a request is only ever looked up here, so nothing a
//! client sends becomes a path.

use std::path::{Path, PathBuf};

use caretaker_pki::Usage;
use serde::{Deserialize, Serialize};

/// The CAs of a kubeadm cluster, by their file stem under the PKI directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum SigningCa {
    /// `ca.crt`: the cluster CA (Cluster API Secret `<cluster>-ca`).
    #[serde(rename = "ca")]
    Cluster,
    /// `etcd/ca.crt` (Cluster API Secret `<cluster>-etcd`).
    #[serde(rename = "etcd/ca")]
    Etcd,
    /// `front-proxy-ca.crt` (Cluster API Secret `<cluster>-proxy`).
    #[serde(rename = "front-proxy-ca")]
    FrontProxy,
}

impl SigningCa {
    pub const ALL: [SigningCa; 3] = [SigningCa::Cluster, SigningCa::Etcd, SigningCa::FrontProxy];

    /// The name kubeadm prints, which is also the file stem under the PKI directory.
    pub fn name(self) -> &'static str {
        match self {
            SigningCa::Cluster => "ca",
            SigningCa::Etcd => "etcd/ca",
            SigningCa::FrontProxy => "front-proxy-ca",
        }
    }

    pub fn certificate_path(self, pki_dir: &Path) -> PathBuf {
        pki_dir.join(format!("{}.crt", self.name()))
    }

    pub fn key_path(self, pki_dir: &Path) -> PathBuf {
        pki_dir.join(format!("{}.key", self.name()))
    }
}

/// How a certificate and its key are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `<stem>.crt` and `<stem>.key` under the PKI directory.
    PemPair { stem: &'static str },
    /// `client-certificate-data` and `client-key-data` inside a kubeconfig.
    Kubeconfig { file: &'static str },
}

/// One certificate a kubeadm node may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The name kubeadm uses (`apiserver`, `etcd/server`, `admin.conf`, …).
    pub name: &'static str,
    pub storage: Storage,
    pub ca: SigningCa,
    /// The usage assumed when the current certificate states none.
    pub default_usage: Usage,
}

const fn pair(name: &'static str, ca: SigningCa, usage: Usage) -> Slot {
    Slot {
        name,
        storage: Storage::PemPair { stem: name },
        ca,
        default_usage: usage,
    }
}

const fn kubeconfig(file: &'static str) -> Slot {
    Slot {
        name: file,
        storage: Storage::Kubeconfig { file },
        ca: SigningCa::Cluster,
        default_usage: Usage::Client,
    }
}

/// Every slot, in the order `kubeadm certs check-expiration` lists them. The kubelet's
/// serving certificate is expected at `<pki-dir>/kubelet.crt` signed by the cluster CA.
pub const SLOTS: [Slot; 13] = [
    kubeconfig("admin.conf"),
    pair("apiserver", SigningCa::Cluster, Usage::Server),
    pair("apiserver-etcd-client", SigningCa::Etcd, Usage::Client),
    pair(
        "apiserver-kubelet-client",
        SigningCa::Cluster,
        Usage::Client,
    ),
    kubeconfig("controller-manager.conf"),
    pair("etcd/healthcheck-client", SigningCa::Etcd, Usage::Client),
    pair("etcd/peer", SigningCa::Etcd, Usage::Both),
    pair("etcd/server", SigningCa::Etcd, Usage::Both),
    pair("front-proxy-client", SigningCa::FrontProxy, Usage::Client),
    kubeconfig("scheduler.conf"),
    kubeconfig("super-admin.conf"),
    kubeconfig("kubelet.conf"),
    pair("kubelet", SigningCa::Cluster, Usage::Server),
];

/// Looks a slot up by name.
pub fn slot(name: &str) -> Option<&'static Slot> {
    SLOTS.iter().find(|s| s.name == name)
}

/// The directories of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// kubeadm's `/etc/kubernetes/pki`.
    pub pki_dir: PathBuf,
    /// kubeadm's `/etc/kubernetes`, where the kubeconfigs live.
    pub kubeconfig_dir: PathBuf,
}

impl NodeLayout {
    pub fn new(pki_dir: impl Into<PathBuf>, kubeconfig_dir: impl Into<PathBuf>) -> Self {
        Self {
            pki_dir: pki_dir.into(),
            kubeconfig_dir: kubeconfig_dir.into(),
        }
    }

    /// The files that hold a slot: (certificate, key) for a pair, (kubeconfig, same) for a
    /// kubeconfig.
    pub fn files(&self, slot: &Slot) -> SlotFiles {
        match slot.storage {
            Storage::PemPair { stem } => SlotFiles::PemPair {
                certificate: self.pki_dir.join(format!("{stem}.crt")),
                key: self.pki_dir.join(format!("{stem}.key")),
            },
            Storage::Kubeconfig { file } => SlotFiles::Kubeconfig(self.kubeconfig_dir.join(file)),
        }
    }
}

/// The concrete files of a slot on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotFiles {
    PemPair { certificate: PathBuf, key: PathBuf },
    Kubeconfig(PathBuf),
}

impl SlotFiles {
    /// The file whose presence means the node has this slot.
    pub fn primary(&self) -> &Path {
        match self {
            SlotFiles::PemPair { certificate, .. } => certificate,
            SlotFiles::Kubeconfig(path) => path,
        }
    }

    pub fn all(&self) -> Vec<&Path> {
        match self {
            SlotFiles::PemPair { certificate, key } => vec![certificate, key],
            SlotFiles::Kubeconfig(path) => vec![path],
        }
    }
}
