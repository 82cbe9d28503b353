//! Body of `GET /v1/certificates`: what certificates a node holds right now.

use caretaker_pki::{CertificateInfo, Usage};
use serde::{Deserialize, Serialize};

use crate::kubeadm::SigningCa;

/// One certificate found on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryEntry {
    /// The kubeadm name (`apiserver`, `etcd/peer`, `admin.conf`, …).
    pub name: String,
    /// The CA that must sign its replacement.
    pub ca: SigningCa,
    pub usage: Usage,
    pub certificate: CertificateInfo,
}

/// A slot whose files exist but cannot be read as a certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotProblem {
    pub name: String,
    pub problem: String,
}

/// A CA certificate found on the node (its key may or may not be there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaEntry {
    pub ca: SigningCa,
    pub certificate: CertificateInfo,
}

/// Everything the agent found on its node (`caretaker_agent::inventory::discover`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub certificates: Vec<InventoryEntry>,
    pub authorities: Vec<CaEntry>,
    pub problems: Vec<SlotProblem>,
}

impl Inventory {
    pub fn entry(&self, name: &str) -> Option<&InventoryEntry> {
        self.certificates.iter().find(|e| e.name == name)
    }

    /// The earliest notAfter of all leaf certificates.
    pub fn earliest_expiry(&self) -> Option<time::OffsetDateTime> {
        self.certificates
            .iter()
            .map(|e| e.certificate.not_after)
            .min()
    }
}
