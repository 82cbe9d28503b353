//! Where a kubeadm-style node keeps its certificates: the directories of one node and the
//! files of each slot in them. The slots themselves, and the CAs that sign them, are
//! [`caretaker_agent_api::kubeadm`].

use std::path::{Path, PathBuf};

use caretaker_agent_api::kubeadm::{Slot, Storage};

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
