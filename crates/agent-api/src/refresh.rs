//! The bodies of the two-step certificate refresh: `plan` makes new keys on the node and
//! answers a CSR per certificate; `apply` takes the signed certificates.

use std::collections::BTreeMap;
use std::path::PathBuf;

use caretaker_pki::{SigningPolicy, Usage};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::kubeadm::SigningCa;

/// Which certificates to refresh.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// kubeadm names; empty means every certificate the node has.
    #[serde(default)]
    pub names: Vec<String>,
}

/// New keys are staged on the node; these CSRs go out to be signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefreshPlan {
    pub plan_id: String,
    pub requests: Vec<PlannedCertificate>,
}

/// One CSR of a plan, with what it asks for spelled out so the signer can check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedCertificate {
    pub name: String,
    pub ca: SigningCa,
    pub csr_pem: String,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<std::net::IpAddr>,
    pub usage: Usage,
}

impl PlannedCertificate {
    /// A policy that allows exactly what this request spells out, so its CSR is still checked
    /// against it. For signers whose requester is trusted to ask for what the node already has
    /// (offline renewal by the node's admin, benchmarks); the operator has its own policy.
    pub fn exact_policy(&self) -> SigningPolicy {
        SigningPolicy {
            common_names: vec![self.common_name.clone()],
            organizations: self.organizations.clone(),
            dns_names: self.dns_names.clone(),
            ip_addresses: self.ip_addresses.clone(),
            usage: Some(self.usage),
        }
    }
}

/// Signed certificates for a plan, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyRequest {
    pub plan_id: String,
    pub certificates: BTreeMap<String, String>,
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyOutcome {
    pub applied: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub earliest_not_after: OffsetDateTime,
    /// Where the replaced files were copied.
    pub backup_dir: PathBuf,
    /// The restart hook's result, when one is configured. A failed hook does not undo the new
    /// certificates: they are valid, and the backup is at `backup_dir`.
    pub restart: Option<HookOutcome>,
}

/// Where a plan stands, for a caller that lost track of it (a restarted operator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum PlanStatus {
    /// Keys are staged; these CSRs await signed certificates.
    Staged { requests: Vec<PlannedCertificate> },
    /// The plan is being applied right now (its restart hook may take minutes): ask again
    /// later instead of applying it, or anything else, again.
    Applying,
    /// The plan was applied; applying it again is not possible and not needed.
    Applied { outcome: ApplyOutcome },
}

/// How a finished hook (the restart command after an apply) ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookOutcome {
    pub success: bool,
    /// `None` when killed by a signal or on timeout.
    pub exit_code: Option<i32>,
    /// It outlived its timeout, or left something behind that held its output that long, and
    /// its whole process group was killed.
    #[serde(default)]
    pub timed_out: bool,
    /// The last bytes of stdout and stderr together.
    pub output_tail: String,
}
