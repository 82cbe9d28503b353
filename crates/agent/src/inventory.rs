//! What certificates a node holds right now, read from its files.

use std::fs;

use caretaker_agent_api::inventory::{CaEntry, Inventory, InventoryEntry, SlotProblem};
use caretaker_agent_api::kubeadm::{SLOTS, SigningCa, Slot};
use caretaker_pki::{CertificateInfo, KeyAlgorithm, Usage};

use crate::kubeconfig;
use crate::layout::{NodeLayout, SlotFiles};

/// Reads every slot present on the node. Missing slots are skipped (workers have only
/// `kubelet.conf` and `kubelet`); unreadable ones are reported as problems.
pub fn discover(layout: &NodeLayout) -> Inventory {
    let mut inventory = Inventory::default();
    for slot in &SLOTS {
        let files = layout.files(slot);
        if !files.primary().exists() {
            continue;
        }
        match read_slot(slot, &files) {
            Ok(certificate) => inventory.certificates.push(InventoryEntry {
                name: slot.name.to_string(),
                ca: slot.ca,
                usage: usage_of(&certificate).unwrap_or(slot.default_usage),
                certificate,
            }),
            Err(problem) => inventory.problems.push(SlotProblem {
                name: slot.name.to_string(),
                problem,
            }),
        }
    }
    for ca in SigningCa::ALL {
        let path = ca.certificate_path(&layout.pki_dir);
        if let Ok(text) = fs::read_to_string(&path) {
            match CertificateInfo::from_pem(&text) {
                Ok(certificate) => inventory.authorities.push(CaEntry { ca, certificate }),
                Err(e) => inventory.problems.push(SlotProblem {
                    name: ca.name().to_string(),
                    problem: e.to_string(),
                }),
            }
        }
    }
    inventory
}

/// The certificate PEM of a slot.
pub(crate) fn read_certificate_pem(slot: &Slot, files: &SlotFiles) -> Result<String, String> {
    match files {
        SlotFiles::PemPair { certificate, .. } => fs::read_to_string(certificate)
            .map_err(|e| format!("cannot read {}: {e}", certificate.display())),
        SlotFiles::Kubeconfig(path) => {
            let text = fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            kubeconfig::client_certificate_pem(&text).map_err(|e| format!("{} {e}", slot.name))
        }
    }
}

fn read_slot(slot: &Slot, files: &SlotFiles) -> Result<CertificateInfo, String> {
    let pem = read_certificate_pem(slot, files)?;
    CertificateInfo::from_pem(&pem).map_err(|e| e.to_string())
}

/// The usage a certificate's extended key usages state, if any.
pub fn usage_of(info: &CertificateInfo) -> Option<Usage> {
    let has = |name: &str| info.extended_key_usages.iter().any(|u| u == name);
    match (has("serverAuth"), has("clientAuth")) {
        (true, true) => Some(Usage::Both),
        (true, false) => Some(Usage::Server),
        (false, true) => Some(Usage::Client),
        (false, false) => None,
    }
}

/// The key algorithm to use for a replacement: the current one when caretaker can make it.
pub fn key_algorithm_of(info: &CertificateInfo) -> KeyAlgorithm {
    match info.key_algorithm.as_str() {
        "ECDSA P-384" => KeyAlgorithm::EcdsaP384,
        "Ed25519" => KeyAlgorithm::Ed25519,
        "RSA 2048" => KeyAlgorithm::Rsa2048,
        "RSA 3072" => KeyAlgorithm::Rsa3072,
        "RSA 4096" => KeyAlgorithm::Rsa4096,
        _ => KeyAlgorithm::EcdsaP256,
    }
}
