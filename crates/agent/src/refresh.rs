//! Two-step certificate refresh. `plan` makes new keys on the node (staged, 0600) and returns a
//! CSR per certificate; `apply` checks the signed certificates against the staged keys and CSRs
//! and the CAs on disk, backs up the old files, writes the new ones atomically, rewrites the
//! kubeconfigs and runs the restart hook. CA keys are never needed on the node.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use caretaker_agent_api::inventory::InventoryEntry;
use caretaker_agent_api::kubeadm::{Slot, slot};
use caretaker_agent_api::refresh::{
    ApplyOutcome, ApplyRequest, HookOutcome, PlanRequest, PlanStatus, PlannedCertificate,
    RefreshPlan,
};
use caretaker_pki::files::{self, FileToWrite};
use caretaker_pki::{CertificateInfo, CertificateRequest, CsrSubject, PrivateKey};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::command::{CommandTemplate, run_blocking};
use crate::inventory::{self, key_algorithm_of, usage_of};
use crate::kubeconfig;
use crate::layout::{NodeLayout, SlotFiles};

/// How many backups and applied-plan records are kept.
pub const KEPT_HISTORY: usize = 3;

/// Staged plans older than this are removed when a new plan is made.
const STAGED_PLAN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How long the restart hook may run unless configured otherwise.
pub const DEFAULT_RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a refresh step failed. The category decides the HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("{0}")]
    BadRequest(String),
    #[error("no staged plan {0:?} (it was applied, expired, or never made)")]
    UnknownPlan(String),
    #[error("certificate for {name} rejected, nothing was changed: {reason}")]
    Rejected { name: String, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Node(String),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RefreshError {
    let context = context.into();
    move |source| RefreshError::Io { context, source }
}

/// What is staged for one plan, stored as `plan.json` beside the keys.
#[derive(Debug, Serialize, Deserialize)]
struct StagedPlan {
    requests: Vec<PlannedCertificate>,
}

/// Plans and applies refreshes on one node.
#[derive(Debug, Clone)]
pub struct Refresher {
    layout: NodeLayout,
    state_dir: PathBuf,
    restart: Option<CommandTemplate>,
    restart_timeout: Duration,
}

impl Refresher {
    pub fn new(layout: NodeLayout, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            layout,
            state_dir: state_dir.into(),
            restart: None,
            restart_timeout: DEFAULT_RESTART_TIMEOUT,
        }
    }

    pub fn with_restart_command(mut self, command: Option<CommandTemplate>) -> Self {
        self.restart = command;
        self
    }

    /// How long the restart hook may run before its process group is killed.
    pub fn with_restart_timeout(mut self, timeout: Duration) -> Self {
        self.restart_timeout = timeout;
        self
    }

    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    fn staged_dir(&self) -> PathBuf {
        self.state_dir.join("staged")
    }

    /// Makes a new key per certificate and returns their CSRs. The keys stay staged in the
    /// state directory until `apply`.
    pub fn plan(&self, request: &PlanRequest) -> Result<RefreshPlan, RefreshError> {
        let inventory = inventory::discover(&self.layout);
        let selected: Vec<&InventoryEntry> = if request.names.is_empty() {
            inventory.certificates.iter().collect()
        } else {
            request
                .names
                .iter()
                .map(|name| {
                    inventory.entry(name).ok_or_else(|| {
                        RefreshError::BadRequest(match slot(name) {
                            Some(_) => format!("this node has no {name} certificate"),
                            None => format!("unknown certificate name {name:?}"),
                        })
                    })
                })
                .collect::<Result<_, _>>()?
        };
        if selected.is_empty() {
            return Err(RefreshError::Node(
                "this node has no certificates to refresh".into(),
            ));
        }
        self.remove_stale_plans();

        let plan_id = random_id();
        let dir = self.staged_dir().join(&plan_id);
        fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(io("cannot restrict the staging directory"))?;
        let result = (|| {
            let mut requests = Vec::new();
            for (index, entry) in selected.iter().enumerate() {
                let current = &entry.certificate;
                let key = PrivateKey::generate(key_algorithm_of(current))
                    .map_err(|e| RefreshError::Node(e.to_string()))?;
                let subject = CsrSubject {
                    common_name: current.common_name.clone().unwrap_or_default(),
                    organizations: current.organizations.clone(),
                    dns_names: current.dns_names.clone(),
                    ip_addresses: current.ip_addresses.clone(),
                    usage: entry.usage,
                };
                let csr_pem = subject
                    .to_csr_pem(&key)
                    .map_err(|e| RefreshError::Node(format!("{}: {e}", entry.name)))?;
                files::write_atomic(
                    &dir.join(format!("{index}.key")),
                    key.to_pem().as_bytes(),
                    files::PRIVATE_KEY_MODE,
                )
                .map_err(io("cannot stage a new key"))?;
                requests.push(PlannedCertificate {
                    name: entry.name.clone(),
                    ca: entry.ca,
                    csr_pem,
                    common_name: subject.common_name,
                    organizations: subject.organizations,
                    dns_names: subject.dns_names,
                    ip_addresses: subject.ip_addresses,
                    usage: subject.usage,
                });
            }
            let staged = serde_json::to_vec_pretty(&StagedPlan {
                requests: requests.clone(),
            })
            .expect("plans serialize");
            files::write_atomic(&dir.join("plan.json"), &staged, 0o600)
                .map_err(io("cannot stage the plan"))?;
            Ok(RefreshPlan {
                plan_id: plan_id.clone(),
                requests,
            })
        })();
        if result.is_err() {
            let _ = files::remove_dir_all_securely(&dir);
        }
        result
    }

    /// Checks every certificate, then backs up and replaces the files, then runs the restart
    /// hook and records the outcome. All or nothing: if a check fails nothing on disk changes,
    /// and if anything fails later every file already replaced is restored from the backup
    /// before the error is returned.
    pub fn apply(&self, request: &ApplyRequest) -> Result<ApplyOutcome, RefreshError> {
        self.apply_with(request, |slot, certificate_pem, key_pem| {
            self.write(slot, certificate_pem, key_pem)
        })
    }

    /// [`Self::apply`], writing each slot with `write` (tests make it fail partway).
    fn apply_with(
        &self,
        request: &ApplyRequest,
        mut write: impl FnMut(&Slot, &str, &str) -> Result<(), RefreshError>,
    ) -> Result<ApplyOutcome, RefreshError> {
        if !is_plan_id(&request.plan_id) {
            return Err(RefreshError::BadRequest(format!(
                "invalid plan id {:?}: expected 32 lowercase hex digits",
                request.plan_id
            )));
        }
        let dir = self.staged_dir().join(&request.plan_id);
        let staged = self.read_staged(&request.plan_id)?;
        let planned: Vec<&str> = staged.requests.iter().map(|r| r.name.as_str()).collect();

        let given: Vec<&str> = request.certificates.keys().map(String::as_str).collect();
        if let Some(extra) = given.iter().find(|n| !planned.contains(n)) {
            return Err(RefreshError::BadRequest(format!(
                "{extra:?} is not part of plan {}",
                request.plan_id
            )));
        }
        if let Some(missing) = planned.iter().find(|n| !given.contains(n)) {
            return Err(RefreshError::BadRequest(format!(
                "no certificate given for {missing}"
            )));
        }

        // Check everything before touching anything.
        let mut verified = Vec::new();
        for (index, planned) in staged.requests.iter().enumerate() {
            let slot = slot(&planned.name).ok_or_else(|| {
                RefreshError::Node(format!("staged plan names {:?}", planned.name))
            })?;
            let key_pem = fs::read_to_string(dir.join(format!("{index}.key")))
                .map_err(io("cannot read a staged key"))?;
            let certificate_pem = &request.certificates[&planned.name];
            let info = self
                .verify(slot, planned, certificate_pem, &key_pem)
                .map_err(|reason| RefreshError::Rejected {
                    name: planned.name.clone(),
                    reason,
                })?;
            verified.push((slot, certificate_pem.clone(), key_pem, info));
        }

        let applied_dir = self.state_dir.join("applied");
        fs::create_dir_all(&applied_dir).map_err(io("cannot record the applied plan"))?;
        let slots: Vec<&Slot> = verified.iter().map(|(s, ..)| *s).collect();
        let backup_dir = self.back_up(&request.plan_id, slots.iter().copied())?;
        for (index, (slot, certificate_pem, key_pem, _)) in verified.iter().enumerate() {
            if let Err(e) = write(slot, certificate_pem, key_pem) {
                // This slot may be half written too (a certificate renamed, not its key).
                return Err(self.undo(&slots[..=index], &backup_dir, e));
            }
        }
        let restart = self.run_restart_hook();
        let earliest_not_after = verified
            .iter()
            .map(|(.., info)| info.not_after)
            .min()
            .expect("a plan has at least one certificate");
        let outcome = ApplyOutcome {
            applied: verified.iter().map(|(s, ..)| s.name.to_string()).collect(),
            earliest_not_after,
            backup_dir,
            restart,
        };
        // Remember the outcome before dropping the staged plan, so a caller that lost track
        // learns it was applied instead of refreshing again.
        let record = serde_json::to_vec_pretty(&outcome).expect("outcomes serialize");
        if let Err(e) = files::write_atomic(
            &applied_dir.join(format!("{}.json", request.plan_id)),
            &record,
            0o644,
        ) {
            // Unrecorded, the plan would look staged and be applied again: undo it, and
            // restart the services again so they run on the restored files.
            let error = self.undo(
                &slots,
                &outcome.backup_dir,
                io("cannot record the applied plan")(e),
            );
            self.run_restart_hook();
            return Err(error);
        }
        let _ = files::remove_dir_all_securely(&dir);
        self.prune_history();
        Ok(outcome)
    }

    /// Keeps the last [`KEPT_HISTORY`] backups (they hold old keys) and applied-plan records.
    fn prune_history(&self) {
        for dir in ["backups", "applied"] {
            if let Err(e) = prune(&self.state_dir.join(dir), KEPT_HISTORY) {
                tracing::warn!(dir, error = %e, "cannot remove old refresh history");
            }
        }
    }

    fn run_restart_hook(&self) -> Option<HookOutcome> {
        self.restart
            .as_ref()
            .map(|command| run_blocking(command, None, self.restart_timeout))
    }

    /// Puts the files of `slots` back from `backup_dir` after `error`, and returns `error`
    /// saying what was restored (or what could not be, and where the backup is).
    fn undo(&self, slots: &[&Slot], backup_dir: &Path, error: RefreshError) -> RefreshError {
        let mut failures = Vec::new();
        for slot in slots {
            for path in self.layout.files(slot).all() {
                if let Err(e) = self.restore(path, backup_dir) {
                    failures.push(format!("{}: {e}", path.display()));
                }
            }
        }
        let what = if failures.is_empty() {
            "every file already replaced was restored from the backup".to_string()
        } else {
            format!(
                "restoring from the backup {} FAILED for {}",
                backup_dir.display(),
                failures.join(", ")
            )
        };
        match error {
            RefreshError::Io { context, source } => RefreshError::Io {
                context: format!("{context} ({what})"),
                source,
            },
            other => RefreshError::Node(format!("{other} ({what})")),
        }
    }

    /// Writes `path` back from its copy in `backup_dir`, atomically and with the copy's mode.
    fn restore(&self, path: &Path, backup_dir: &Path) -> std::io::Result<()> {
        let copy = backup_dir.join(self.backup_path(path).map_err(std::io::Error::other)?);
        let mode = fs::metadata(&copy)?.permissions().mode() & 0o777;
        files::write_atomic(path, &fs::read(&copy)?, mode)
    }

    /// Whether `plan_id` is staged or applied.
    pub fn plan_status(&self, plan_id: &str) -> Result<PlanStatus, RefreshError> {
        if !is_plan_id(plan_id) {
            return Err(RefreshError::BadRequest(format!(
                "invalid plan id {plan_id:?}: expected 32 lowercase hex digits"
            )));
        }
        let applied = self
            .state_dir
            .join("applied")
            .join(format!("{plan_id}.json"));
        if let Ok(bytes) = fs::read(&applied) {
            let outcome = serde_json::from_slice(&bytes)
                .map_err(|e| RefreshError::Node(format!("applied plan record is corrupt: {e}")))?;
            return Ok(PlanStatus::Applied { outcome });
        }
        Ok(PlanStatus::Staged {
            requests: self.read_staged(plan_id)?.requests,
        })
    }

    fn read_staged(&self, plan_id: &str) -> Result<StagedPlan, RefreshError> {
        match fs::read(self.staged_dir().join(plan_id).join("plan.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| RefreshError::Node(format!("staged plan is corrupt: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(RefreshError::UnknownPlan(plan_id.to_string()))
            }
            Err(e) => Err(io("cannot read the staged plan")(e)),
        }
    }

    /// The checks `apply` makes on one certificate.
    fn verify(
        &self,
        slot: &Slot,
        planned: &PlannedCertificate,
        certificate_pem: &str,
        key_pem: &str,
    ) -> Result<CertificateInfo, String> {
        let certificates =
            caretaker_pki::bundle::parse(certificate_pem).map_err(|e| e.to_string())?;
        let [certificate] = certificates.as_slice() else {
            return Err(format!(
                "expected one certificate, got {}",
                certificates.len()
            ));
        };
        let info = certificate.info().clone();
        let key = PrivateKey::from_pem(key_pem).map_err(|e| e.to_string())?;
        if !caretaker_pki::key_matches_certificate(&key, certificate.der())
            .map_err(|e| e.to_string())?
        {
            return Err("it is not for the key staged by the plan".into());
        }
        let request = CertificateRequest::from_pem(&planned.csr_pem).map_err(|e| e.to_string())?;
        if info.common_name != request.common_name
            || sorted(&info.organizations) != sorted(&request.organizations)
            || sorted(&lowercase(&info.dns_names)) != sorted(&lowercase(&request.dns_names))
            || sorted(&info.ip_addresses) != sorted(&request.ip_addresses)
        {
            return Err(format!(
                "its subject or SANs ({}; DNS {:?}; IP {:?}) differ from the CSR's",
                info.subject, info.dns_names, info.ip_addresses
            ));
        }
        if usage_of(&info) != request.usage {
            return Err("its extended key usages differ from the CSR's".into());
        }
        if info.is_ca {
            return Err("it is a CA certificate".into());
        }
        let now = OffsetDateTime::now_utc();
        if !info.is_valid_at(now) {
            return Err(format!(
                "it is not valid now (valid {} to {})",
                info.not_before, info.not_after
            ));
        }
        let ca_path = slot.ca.certificate_path(&self.layout.pki_dir);
        let ca_pem = fs::read_to_string(&ca_path)
            .map_err(|e| format!("cannot read its CA {}: {e}", ca_path.display()))?;
        let ca_der = caretaker_pki::bundle::parse(&ca_pem)
            .map_err(|e| format!("{}: {e}", ca_path.display()))?
            .swap_remove(0);
        if !caretaker_pki::is_issued_by(certificate.der(), ca_der.der())
            .map_err(|e| e.to_string())?
        {
            return Err(format!(
                "it is not signed by the node's {} ({})",
                slot.ca.name(),
                ca_der.info().subject
            ));
        }
        Ok(info)
    }

    /// Copies the files of `slots` into a new backup directory and returns it.
    fn back_up<'a>(
        &self,
        plan_id: &str,
        slots: impl Iterator<Item = &'a Slot>,
    ) -> Result<PathBuf, RefreshError> {
        let stamp = OffsetDateTime::now_utc().unix_timestamp();
        let backup_dir = self
            .state_dir
            .join("backups")
            .join(format!("{stamp}-{}", &plan_id[..8]));
        for slot in slots {
            let files = self.layout.files(slot);
            for path in files.all() {
                let target = backup_dir.join(self.backup_path(path)?);
                let parent = target.parent().expect("backup paths have a parent");
                fs::create_dir_all(parent)
                    .map_err(io(format!("cannot create {}", parent.display())))?;
                fs::set_permissions(&backup_dir, fs::Permissions::from_mode(0o700))
                    .map_err(io("cannot restrict the backup directory"))?;
                fs::copy(path, &target)
                    .map_err(io(format!("cannot back up {}", path.display())))?;
            }
        }
        Ok(backup_dir)
    }

    /// Where the copy of `path` goes inside a backup directory.
    fn backup_path(&self, path: &Path) -> Result<PathBuf, RefreshError> {
        path.strip_prefix(&self.layout.pki_dir)
            .map(|r| Path::new("pki").join(r))
            .or_else(|_| {
                path.strip_prefix(&self.layout.kubeconfig_dir)
                    .map(|r| Path::new("kubeconfigs").join(r))
            })
            .map_err(|_| {
                RefreshError::Node(format!(
                    "{} is outside the node's directories",
                    path.display()
                ))
            })
    }

    fn write(&self, slot: &Slot, certificate_pem: &str, key_pem: &str) -> Result<(), RefreshError> {
        match self.layout.files(slot) {
            SlotFiles::PemPair { certificate, key } => {
                let dir = certificate.parent().expect("slot files have a parent");
                let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
                let (cert_name, key_name) = (name(&certificate), name(&key));
                let (Some(cert_name), Some(key_name)) = (cert_name, key_name) else {
                    return Err(RefreshError::Node("slot file names are not UTF-8".into()));
                };
                files::write_all(
                    dir,
                    &[
                        FileToWrite {
                            name: &cert_name,
                            contents: certificate_pem.as_bytes(),
                            mode: mode_of(&certificate, files::CERTIFICATE_MODE),
                        },
                        // Keys are 0600 whatever they were before.
                        FileToWrite {
                            name: &key_name,
                            contents: key_pem.as_bytes(),
                            mode: files::PRIVATE_KEY_MODE,
                        },
                    ],
                )
                .map_err(io(format!("cannot write {}", certificate.display())))
            }
            SlotFiles::Kubeconfig(path) => {
                let text = fs::read_to_string(&path)
                    .map_err(io(format!("cannot read {}", path.display())))?;
                let updated =
                    kubeconfig::replace_client_credentials(&text, certificate_pem, key_pem)
                        .map_err(|e| RefreshError::Node(format!("{} {e}", path.display())))?;
                // A kubeconfig holds a key: never wider than 0600.
                let mode = mode_of(&path, files::PRIVATE_KEY_MODE) & files::PRIVATE_KEY_MODE;
                files::write_atomic(&path, updated.as_bytes(), mode)
                    .map_err(io(format!("cannot write {}", path.display())))
            }
        }
    }

    fn remove_stale_plans(&self) {
        let Ok(entries) = fs::read_dir(self.staged_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STAGED_PLAN_LIFETIME);
            if stale {
                let _ = files::remove_dir_all_securely(&entry.path());
            }
        }
    }
}

/// Removes all but the newest `keep` entries of `dir` (by modification time, then name), keys
/// securely.
fn prune(dir: &Path, keep: usize) -> std::io::Result<()> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        entries.push((meta.modified()?, entry.file_name(), meta.is_dir()));
    }
    entries.sort();
    let excess = entries.len().saturating_sub(keep);
    for (_, name, is_dir) in entries.into_iter().take(excess) {
        let path = dir.join(name);
        if is_dir {
            files::remove_dir_all_securely(&path)?;
        } else {
            files::remove_file_securely(&path)?;
        }
    }
    Ok(())
}

fn mode_of(path: &Path, default: u32) -> u32 {
    fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(default)
}

fn sorted<T: Ord + Clone>(items: &[T]) -> Vec<T> {
    let mut items = items.to_vec();
    items.sort();
    items
}

fn lowercase(names: &[String]) -> Vec<String> {
    names.iter().map(|n| n.to_ascii_lowercase()).collect()
}

/// 128 random bits as 32 hex digits.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the system random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn is_plan_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use caretaker_agent_api::kubeadm::SigningCa;
    use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

    use super::*;

    /// A worker as `kubeadm join` leaves it: the cluster CA's certificate, the kubelet's
    /// serving pair and `kubelet.conf`.
    fn worker(dir: &Path) -> (CertificateAuthority, Refresher) {
        let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
        let layout = NodeLayout::new(dir.join("pki"), dir.join("kubeconfigs"));
        fs::create_dir_all(&layout.pki_dir).unwrap();
        fs::create_dir_all(&layout.kubeconfig_dir).unwrap();
        let ca_path = SigningCa::Cluster.certificate_path(&layout.pki_dir);
        fs::write(ca_path, ca.certificate_pem()).unwrap();
        let serving = ca
            .issue(&LeafSpec::new("node-1", Usage::Server).with_dns_names(["node-1"]))
            .unwrap();
        let key = |issued: &caretaker_pki::IssuedCertificate| {
            issued.key.as_ref().expect("issue() returns a key").to_pem()
        };
        fs::write(layout.pki_dir.join("kubelet.crt"), &serving.certificate_pem).unwrap();
        files::write_atomic(
            &layout.pki_dir.join("kubelet.key"),
            key(&serving).as_bytes(),
            files::PRIVATE_KEY_MODE,
        )
        .unwrap();
        let client_name = "system:node:node-1";
        let client = ca
            .issue(&LeafSpec::new(client_name, Usage::Client).with_organizations(["system:nodes"]))
            .unwrap();
        let kubelet_conf = kubeconfig::render(
            "kubernetes",
            "https://cp.example:6443",
            &ca.certificate_pem(),
            client_name,
            &client.certificate_pem,
            &key(&client),
        );
        files::write_atomic(
            &layout.kubeconfig_dir.join("kubelet.conf"),
            kubelet_conf.as_bytes(),
            files::PRIVATE_KEY_MODE,
        )
        .unwrap();
        (ca, Refresher::new(layout, dir.join("state")))
    }

    fn signed(ca: &CertificateAuthority, plan: &RefreshPlan) -> ApplyRequest {
        let ttl = "1y".parse().unwrap();
        ApplyRequest {
            plan_id: plan.plan_id.clone(),
            certificates: plan
                .requests
                .iter()
                .map(|r| {
                    assert_eq!(r.ca, SigningCa::Cluster);
                    let signed = ca
                        .sign_request(&r.csr_pem, &r.exact_policy(), &ttl)
                        .unwrap();
                    (r.name.clone(), signed.certificate_pem)
                })
                .collect(),
        }
    }

    fn node_files(layout: &NodeLayout) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
        let mut found = BTreeMap::new();
        for dir in [&layout.pki_dir, &layout.kubeconfig_dir] {
            for entry in fs::read_dir(dir).unwrap().flatten() {
                let meta = entry.metadata().unwrap();
                if meta.is_file() {
                    let mode = meta.permissions().mode() & 0o777;
                    found.insert(entry.path(), (fs::read(entry.path()).unwrap(), mode));
                }
            }
        }
        found
    }

    #[test]
    fn a_write_failing_partway_restores_every_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, refresher) = worker(dir.path());
        let before = node_files(refresher.layout());
        let plan = refresher.plan(&PlanRequest::default()).unwrap();
        assert_eq!(plan.requests.len(), 2, "kubelet.conf and kubelet");
        let request = signed(&ca, &plan);

        // The first slot is written for real, the second fails.
        let mut written = 0;
        let err = refresher
            .apply_with(&request, |slot, certificate_pem, key_pem| {
                written += 1;
                if written == 1 {
                    refresher.write(slot, certificate_pem, key_pem)
                } else {
                    Err(io("cannot write the second slot")(std::io::Error::other(
                        "disk full",
                    )))
                }
            })
            .unwrap_err();
        assert_eq!(written, 2);
        let message = err.to_string();
        assert!(
            message.contains("disk full") && message.contains("restored from the backup"),
            "{message}"
        );
        assert_eq!(
            node_files(refresher.layout()),
            before,
            "every file is back, contents and modes"
        );
        // Nothing recorded as applied: the plan is still staged and applies normally later.
        assert!(matches!(
            refresher.plan_status(&plan.plan_id).unwrap(),
            PlanStatus::Staged { .. }
        ));
        let outcome = refresher.apply(&request).unwrap();
        assert_eq!(outcome.applied.len(), 2);
        assert_ne!(node_files(refresher.layout()), before);
    }
}
