//! `caretaker certs`: check and renew a node's certificates without the operator, like
//! `kubeadm certs check-expiration` and `kubeadm certs renew`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use caretaker_agent_api::inventory::Inventory;
use caretaker_agent_api::kubeadm::SigningCa;
use caretaker_agent_api::refresh::{ApplyOutcome, ApplyRequest, PlanRequest};
use caretaker_pki::{CertificateAuthority, Ttl};
use time::OffsetDateTime;

use crate::inventory;
use crate::layout::NodeLayout;
use crate::refresh::{RefreshError, Refresher};

/// The `check-expiration` report, as kubeadm lays it out.
pub fn expiration_report(
    inventory: &Inventory,
    layout: &NodeLayout,
    now: OffsetDateTime,
) -> String {
    let externally_managed = |ca: SigningCa| {
        if ca.key_path(&layout.pki_dir).exists() {
            "no"
        } else {
            "yes"
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<26} {:<25} {:<15} {:<23} EXTERNALLY MANAGED",
        "CERTIFICATE", "EXPIRES", "RESIDUAL TIME", "CERTIFICATE AUTHORITY"
    );
    for entry in &inventory.certificates {
        let _ = writeln!(
            out,
            "{:<26} {:<25} {:<15} {:<23} {}",
            entry.name,
            expires(entry.certificate.not_after),
            residual(entry.certificate.not_after, now),
            entry.ca.name(),
            externally_managed(entry.ca)
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<26} {:<25} {:<15} EXTERNALLY MANAGED",
        "CERTIFICATE AUTHORITY", "EXPIRES", "RESIDUAL TIME"
    );
    for ca in &inventory.authorities {
        let _ = writeln!(
            out,
            "{:<26} {:<25} {:<15} {}",
            ca.ca.name(),
            expires(ca.certificate.not_after),
            residual(ca.certificate.not_after, now),
            externally_managed(ca.ca)
        );
    }
    for problem in &inventory.problems {
        let _ = writeln!(out, "\n!{}: {}", problem.name, problem.problem);
    }
    out
}

fn expires(t: OffsetDateTime) -> String {
    let format =
        time::macros::format_description!("[month repr:short] [day], [year] [hour]:[minute] UTC");
    t.to_offset(time::UtcOffset::UTC)
        .format(&format)
        .unwrap_or_else(|_| t.to_string())
}

/// `364d`, `9y`, `5h`, or `<invalid>` once expired, like kubeadm.
pub fn residual(not_after: OffsetDateTime, now: OffsetDateTime) -> String {
    let left = not_after - now;
    if left.is_negative() {
        return "<invalid>".into();
    }
    let days = left.whole_days();
    if days >= 365 * 2 {
        format!("{}y", days / 365)
    } else if days >= 1 {
        format!("{days}d")
    } else if left.whole_hours() >= 1 {
        format!("{}h", left.whole_hours())
    } else {
        format!("{}m", left.whole_minutes())
    }
}

/// Why an offline renewal failed.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    #[error("cannot read the {ca} CA from {path}: {reason}")]
    Ca {
        ca: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("refused to sign {name}: {reason}")]
    Signing { name: String, reason: String },
    #[error(transparent)]
    Refresh(#[from] RefreshError),
}

/// Renews `names` (all when empty) with the CA files in `ca_dir` (kubeadm layout: `ca.crt`,
/// `ca.key`, `etcd/ca.*`, `front-proxy-ca.*`). New keys are made here; old files are backed up
/// under `state_dir`. Nothing changes unless every certificate was signed and checked.
pub fn renew(
    layout: &NodeLayout,
    state_dir: &Path,
    ca_dir: &Path,
    names: &[String],
    expires_in: &Ttl,
) -> Result<ApplyOutcome, RenewError> {
    let refresher = Refresher::new(layout.clone(), state_dir);
    let plan = refresher.plan(&PlanRequest {
        names: names.to_vec(),
    })?;
    let mut authorities: BTreeMap<SigningCa, CertificateAuthority> = BTreeMap::new();
    let mut certificates = BTreeMap::new();
    for request in &plan.requests {
        let ca = match authorities.entry(request.ca) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(load_ca(ca_dir, request.ca)?)
            }
        };
        // Offline, the node's own admin is the requester: sign exactly what the current
        // certificate has, which the CSR repeats.
        let policy = request.exact_policy();
        let signed = ca
            .sign_request(&request.csr_pem, &policy, expires_in)
            .map_err(|e| RenewError::Signing {
                name: request.name.clone(),
                reason: e.to_string(),
            })?;
        certificates.insert(request.name.clone(), signed.certificate_pem);
    }
    Ok(refresher.apply(&ApplyRequest {
        plan_id: plan.plan_id,
        certificates,
    })?)
}

fn load_ca(ca_dir: &Path, ca: SigningCa) -> Result<CertificateAuthority, RenewError> {
    let (cert_path, key_path) = (ca.certificate_path(ca_dir), ca.key_path(ca_dir));
    let error = |path: &Path, reason: String| RenewError::Ca {
        ca: ca.name(),
        path: path.to_path_buf(),
        reason,
    };
    let cert = std::fs::read_to_string(&cert_path).map_err(|e| error(&cert_path, e.to_string()))?;
    let key = std::fs::read_to_string(&key_path).map_err(|e| error(&key_path, e.to_string()))?;
    CertificateAuthority::from_pem(&cert, &key).map_err(|e| error(&cert_path, e.to_string()))
}

/// The inventory of `layout` (re-exported for the command line).
pub fn inventory(layout: &NodeLayout) -> Inventory {
    inventory::discover(layout)
}
