//! What a kubeadm cluster is made of, as far as operator and agent must agree: its CAs, the
//! certificates a node may hold and which CA signs each, node roles, and the names every
//! kube-apiserver certificate carries.
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

/// What a node is in its cluster. A control-plane node holds every slot and all three CAs'
/// certificates; a worker holds `kubelet.conf`, `kubelet` and the cluster CA's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    ControlPlane,
    Worker,
}

/// The in-cluster names every kube-apiserver certificate carries.
pub const APISERVER_DNS_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The first address of kubeadm's default service CIDR.
pub const APISERVER_SERVICE_IP: &str = "10.96.0.1";
