//! An etcd cluster's certificates, as the OpenShift etcd operator keeps them: decisions from
//! observed state, the members' answers and the clock, no Kubernetes. The glue is
//! [`controller`].
//!
//! Two signers, each a CA as [`crate::authority::ca`] keeps a CertificateAuthority's (a Secret
//! holding the CA that signs now, a next one during a rotation and older ones still trusted,
//! and a bundle ConfigMap): `etcd-signer` (bundle `etcd-ca-bundle`) signs the members' peer and
//! serving certificates and the client certificate `etcd-client`; `etcd-metric-signer`
//! (`etcd-metric-ca-bundle`) signs the metrics serving certificates and `etcd-metric-client`.
//! Each certificate is a `kubernetes.io/tls` Secret planned as an IssuedCertificate's is
//! ([`crate::authority::leaf`]), and every member's certificates, with the two bundles the
//! members load as their trusted CAs, are copied into one Opaque Secret, [`ALL_CERTS`]. A
//! change of `etcd-all-certs` is a new revision: whoever installs etcd restarts the members
//! one at a time with it. Nothing else restarts a member.
//!
//! # Trust before sign, with members that load trust only when they start
//!
//! etcd reads its trusted CA files once, at start. So a new signer is trusted by a member only
//! once a revision holding it in the bundle has been installed and the member restarted:
//!
//! 1. A rotation stores the next signer and publishes it in the bundle ConfigMap (clients
//!    take it up) and in `etcd-all-certs`'s bundle (a revision that changes no certificate).
//! 2. The next signer is trusted by the members once every member accepts a client
//!    certificate it signed ([`MemberAnswer::accepts_next`], a probe the glue makes with a
//!    short-lived certificate it never stores). `trustPropagation` later it signs: every
//!    certificate is issued again, and a second revision carries them. Members restarted
//!    with it present certificates the others already trust.
//! 3. The old signer leaves the bundles once no certificate is signed by it (counting the
//!    certificates the members present, [`MemberAnswer::serving`]: a member that still runs
//!    the old revision keeps it in use) and `trustPropagation` has passed: a third revision.
//!
//! # The quorum gate
//!
//! A new `etcd-all-certs` restarts every member in turn, so it is written only while etcd
//! would keep quorum with one more member down ([`Quorum::open`]); the glue asks again right
//! before writing. Otherwise nothing that restarts a member changes: the bundle ConfigMaps
//! and the certificate Secrets may still change (they restart nothing), and the plan says
//! [`EtcdPlan::held`]. The first `etcd-all-certs` has no gate: no member runs before it exists.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use caretaker_pki::{KeyAlgorithm, LeafSpec, PkiError, Usage};
use time::OffsetDateTime;

use crate::authority::SecretContent;
use crate::authority::bundle::{Bundle, BundleState};
use crate::authority::ca::{
    self, AuthorityObserved, AuthorityStatus, AuthorityStep, CaPlan, CaSecretState, Untrusting,
};
use crate::authority::leaf::{self, CertificateStep, LeafObserved, LeafSecretState};
use crate::authority::verified::Verified;
use crate::authority::{CaKeyPair, Certificate, CertificatePolicy, Condition, Mint, ObjectName};
use crate::changes::Event;
use caretaker_api::names::{TLS_CRT, TLS_KEY};

mod all_certs;
pub mod controller;
pub mod members;
pub(crate) mod nodes;
pub mod policy;
mod quorum;
pub mod rollout;
#[cfg(test)]
mod tests;

pub use all_certs::revision_of;
use all_certs::{change_of, desired_all_certs};
pub use quorum::{EndpointHealth, MemberAnswer, Quorum};

pub use members::Membership;
use policy::{EtcdPolicy, MemberSpec};

/// The signer of peer, serving and client certificates.
pub const SIGNER_SECRET: &str = "etcd-signer";
/// The signer of metrics certificates.
pub const METRICS_SIGNER_SECRET: &str = "etcd-metric-signer";
/// `etcd-signer`'s bundle ConfigMap (key `ca-bundle.crt`).
pub const CA_BUNDLE: &str = "etcd-ca-bundle";
/// `etcd-metric-signer`'s bundle ConfigMap (key `ca-bundle.crt`).
pub const METRICS_CA_BUNDLE: &str = "etcd-metric-ca-bundle";
/// The client certificate `etcd-signer` signs (and the health checks present by default).
pub const CLIENT_SECRET: &str = "etcd-client";
/// The client certificate `etcd-metric-signer` signs.
pub const METRICS_CLIENT_SECRET: &str = "etcd-metric-client";
/// Every member's certificates and the trust they load, in one Secret (type Opaque).
pub const ALL_CERTS: &str = "etcd-all-certs";
/// `etcd-all-certs` key: the members' trusted CAs for peers and clients (`etcd-signer`'s bundle).
pub const ALL_CERTS_CA_BUNDLE: &str = "ca-bundle.crt";
/// `etcd-all-certs` key: the trusted CAs for metrics clients (`etcd-metric-signer`'s bundle).
pub const ALL_CERTS_METRICS_CA_BUNDLE: &str = "metrics-ca-bundle.crt";
/// Annotation on `etcd-all-certs`: its revision ([`revision_of`]).
pub const REVISION_ANNOTATION: &str = "caretaker.dev/revision";
/// Event reason: a new `etcd-all-certs` (the OpenShift operators' reason for a new revision).
pub const EVENT_REVISION_TRIGGERED: &str = "RevisionTriggered";
/// Condition type, reason and log phrase of the quorum gate, as the OpenShift etcd operator's.
pub const CONDITION_DEGRADED: &str = "EtcdCertSignerControllerDegraded";
pub const REASON_INSUFFICIENT_QUORUM: &str = "InsufficientQuorum";
pub const SKIPPING_FOR_QUORUM: &str =
    "skipping EtcdCertSignerController reconciliation due to insufficient quorum";
/// The CA ConfigMaps the OpenShift etcd operator keeps beside its bundles (what its static
/// pods and other components read), each a copy of a signer's bundle under `ca-bundle.crt`:
/// `etcd-serving-ca` and `etcd-peer-client-ca` of `etcd-signer`'s, the metrics proxy's two of
/// `etcd-metric-signer`'s. They restart nothing.
pub const OPENSHIFT_CA_CONFIG_MAPS: [(&str, Signer); 4] = [
    ("etcd-serving-ca", Signer::Etcd),
    ("etcd-peer-client-ca", Signer::Etcd),
    ("etcd-metrics-proxy-serving-ca", Signer::Metrics),
    ("etcd-metrics-proxy-client-ca", Signer::Metrics),
];
/// OpenShift's ConfigMap of the members' addresses, which its clients read.
pub const ENDPOINTS_CONFIG_MAP: &str = "etcd-endpoints";
/// Degraded reason of a pass that failed (an API or write error), as upstream's.
pub const REASON_ERROR: &str = "Error";
/// Warning reason: the status could not be written, as upstream's.
pub const EVENT_UPDATING_STATUS: &str = "EtcdCertSignerControllerUpdatingStatus";
/// Condition reasons of `Ready`.
pub const REASON_IN_PLACE: &str = "CertificatesInPlace";
pub const REASON_WAITING: &str = "Waiting";
/// Degraded (and Ready False) reason, and Warning reason: a would-be member is refused
/// ([`members::Refusal`]); the others are members all the same.
pub const REASON_MEMBER_REFUSED: &str = "MemberRefused";

/// One of the two signers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signer {
    Etcd,
    Metrics,
}

impl Signer {
    pub const ALL: [Signer; 2] = [Signer::Etcd, Signer::Metrics];

    pub fn secret(self) -> &'static str {
        match self {
            Signer::Etcd => SIGNER_SECRET,
            Signer::Metrics => METRICS_SIGNER_SECRET,
        }
    }

    pub fn bundle(self) -> &'static str {
        match self {
            Signer::Etcd => CA_BUNDLE,
            Signer::Metrics => METRICS_CA_BUNDLE,
        }
    }

    /// Its bundle's key in `etcd-all-certs`.
    fn all_certs_key(self) -> &'static str {
        match self {
            Signer::Etcd => ALL_CERTS_CA_BUNDLE,
            Signer::Metrics => ALL_CERTS_METRICS_CA_BUNDLE,
        }
    }

    /// The metric label (`openshift_etcd_operator_signer_expiration_days`'s values).
    pub fn label(self) -> &'static str {
        match self {
            Signer::Etcd => "signer-ca",
            Signer::Metrics => "metrics-signer-ca",
        }
    }
}

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Peer,
    Serving,
    ServingMetrics,
    Client,
    MetricsClient,
}

impl Role {
    /// A member's three, in `etcd-all-certs` order.
    pub const MEMBER: [Role; 3] = [Role::Peer, Role::Serving, Role::ServingMetrics];

    fn prefix(self) -> &'static str {
        match self {
            Role::Peer => "etcd-peer",
            Role::Serving => "etcd-serving",
            Role::ServingMetrics => "etcd-serving-metrics",
            Role::Client => CLIENT_SECRET,
            Role::MetricsClient => METRICS_CLIENT_SECRET,
        }
    }

    pub fn signer(self) -> Signer {
        match self {
            Role::Peer | Role::Serving | Role::Client => Signer::Etcd,
            Role::ServingMetrics | Role::MetricsClient => Signer::Metrics,
        }
    }
}

/// One certificate: a role, and the member it is for (none for client certificates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub role: Role,
    pub member: Option<MemberSpec>,
}

impl Leaf {
    /// Its Secret's name: `etcd-peer-<member>`, ..., `etcd-client`.
    pub fn secret_name(&self) -> String {
        match &self.member {
            Some(member) => member_secret(self.role, &member.name),
            None => self.role.prefix().to_string(),
        }
    }

    /// What it must be: peer and serving certificates name the member's addresses,
    /// `localhost` and `127.0.0.1` and serve both ways (etcd peers authenticate each other
    /// with them, and etcd dials itself with its serving certificate).
    pub fn spec(&self, policy: &EtcdPolicy) -> LeafSpec {
        let (common_name, organization, usage) = match (&self.member, self.role) {
            (Some(m), Role::Peer) => (
                format!("system:etcd-peer:{}", m.name),
                "system:etcd-peers",
                Usage::Both,
            ),
            (Some(m), Role::Serving) => (
                format!("system:etcd-server:{}", m.name),
                "system:etcd-servers",
                Usage::Both,
            ),
            (Some(m), Role::ServingMetrics) => (
                format!("system:etcd-metric:{}", m.name),
                "system:etcd-metrics",
                Usage::Both,
            ),
            (_, Role::MetricsClient) => (
                METRICS_CLIENT_SECRET.to_string(),
                "system:etcd-metrics",
                Usage::Client,
            ),
            _ => (
                CLIENT_SECRET.to_string(),
                "system:etcd-clients",
                Usage::Client,
            ),
        };
        let (mut dns_names, mut ip_addresses) = (Vec::new(), Vec::new());
        if let Some(member) = &self.member {
            dns_names = member.dns_names.clone();
            ip_addresses = member.ip_addresses.clone();
            dns_names.push("localhost".into());
            ip_addresses.push(IpAddr::from([127, 0, 0, 1]));
            dns_names.sort();
            dns_names.dedup();
            ip_addresses.sort();
            ip_addresses.dedup();
        }
        LeafSpec {
            common_name,
            organizations: vec![organization.to_string()],
            dns_names,
            ip_addresses,
            usage,
            validity: policy.certificates.0,
            algorithm: KeyAlgorithm::EcdsaP256,
        }
    }
}

/// `etcd-peer-<member>` and so on.
pub fn member_secret(role: Role, member: &str) -> String {
    format!("{}-{member}", role.prefix())
}

/// Every certificate of `members`: each member's three, then the two client certificates.
pub fn leaves(members: &[MemberSpec]) -> Vec<Leaf> {
    let mut all: Vec<Leaf> = members
        .iter()
        .flat_map(|m| {
            Role::MEMBER.map(|role| Leaf {
                role,
                member: Some(m.clone()),
            })
        })
        .collect();
    for role in [Role::Client, Role::MetricsClient] {
        all.push(Leaf { role, member: None });
    }
    all
}

/// The role of an `etcd-all-certs` certificate key (`etcd-serving-<member>.crt` and so on).
/// The longest prefix wins: `etcd-serving-metrics-m0.crt` also starts with `etcd-serving-`.
fn role_of_certificate_key(key: &str) -> Option<Role> {
    let mut roles = Role::MEMBER;
    roles.sort_by_key(|r| std::cmp::Reverse(r.prefix().len()));
    roles
        .into_iter()
        .find(|r| key.starts_with(&format!("{}-", r.prefix())) && key.ends_with(".crt"))
}

/// The members `etcd-all-certs` holds certificates of, from its keys.
pub fn members_in_all_certs(data: &BTreeMap<String, String>) -> BTreeSet<String> {
    let prefix = format!("{}-", Role::Peer.prefix());
    data.keys()
        .filter_map(|k| k.strip_prefix(&prefix)?.strip_suffix(".crt"))
        .map(str::to_string)
        .collect()
}

/// A Secret's or ConfigMap's `data` and annotations.
pub type SecretObject = (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>);
pub type ConfigMapObject = (BTreeMap<String, String>, BTreeMap<String, String>);

/// Everything a pass decides from.
#[derive(Debug, Clone, Default)]
pub struct EtcdObserved {
    pub namespace: String,
    /// The Secrets of the namespace this pass reads, by name (absent: none).
    pub secrets: BTreeMap<String, SecretObject>,
    /// The bundle ConfigMaps, by name.
    pub config_maps: BTreeMap<String, ConfigMapObject>,
    /// Each endpoint's answer, in `spec.quorum.endpoints` order.
    pub health: Vec<EndpointHealth>,
    /// The last valid signer this process saw, per signer (keeps signing while its Secret
    /// is unreadable).
    pub last_good: BTreeMap<Signer, CaKeyPair>,
    /// The Degraded message the status shows now, so a Warning is said once.
    pub reported_degraded: Option<String>,
}

impl EtcdObserved {
    fn secret(&self, name: &str) -> Option<SecretContent<'_>> {
        self.secrets.get(name).map(|(d, a)| (d, a))
    }

    /// `etcd-all-certs`'s data as text.
    pub fn all_certs(&self) -> Option<BTreeMap<String, String>> {
        self.secrets.get(ALL_CERTS).map(|(data, _)| {
            data.iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect()
        })
    }
}

/// `etcd-all-certs` as it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllCerts {
    pub data: BTreeMap<String, String>,
    pub revision: String,
}

/// A write of the plan, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdStep {
    /// A signer's Secret or bundle ConfigMap.
    Signer(Signer, AuthorityStep),
    /// A certificate's Secret (type `kubernetes.io/tls`).
    Certificate {
        secret: String,
        step: CertificateStep,
    },
    /// The members asked once more, right before a new `etcd-all-certs` replaces the stored
    /// one (a member may have gone since the pass began): the writes after it go ahead only
    /// if [`Quorum::open`] still holds.
    RecheckQuorum,
    /// `etcd-all-certs` replaced by this content (keys not in it removed).
    AllCerts(AllCerts),
    /// A removed member's certificate Secret.
    Delete(String),
    /// One of OpenShift's CA ConfigMaps ([`OPENSHIFT_CA_CONFIG_MAPS`]): its signer's bundle, as
    /// the bundle ConfigMap will hold it (key `ca-bundle.crt`).
    CaConfigMap { name: &'static str, bundle: String },
    /// `etcd-endpoints` replaced by this content ([`endpoints_of`]).
    Endpoints(BTreeMap<String, String>),
}

/// What the status says once the plan's writes are in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    pub ready: Condition,
    /// `EtcdCertSignerControllerDegraded`.
    pub degraded: Condition,
    pub signers: BTreeMap<Signer, AuthorityStatus>,
    /// The revision of `etcd-all-certs` once the writes are in place.
    pub revision: Option<String>,
}

/// A pass over an EtcdCertificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdPlan {
    pub steps: Vec<EtcdStep>,
    pub events: Vec<Event>,
    pub status: EtcdStatus,
    pub quorum: Quorum,
    /// A new `etcd-all-certs` is due but the gate is closed.
    pub held: bool,
    /// Something waits on the members (the gate, a revision being installed, a next signer
    /// being taken up): the glue asks again after a short, growing backoff. Nothing else polls.
    pub waits_on_members: bool,
    /// The next moment something is due without anything changing.
    pub wake_at: Option<OffsetDateTime>,
}

/// Decides a pass at `now`. `membership` holds the members (the spec's and the selected
/// Nodes', by name, no two sharing a Secret: [`members::choose`]) and those refused, which
/// change nothing but the conditions and events.
pub fn plan(
    seen: &EtcdObserved,
    policy: &EtcdPolicy,
    membership: &Membership,
    now: OffsetDateTime,
    mint: &dyn Mint,
) -> Result<EtcdPlan, PkiError> {
    let members = &membership.members[..];
    let leaves = leaves(members);
    let stored_all = seen.all_certs();
    let quorum = Quorum::of(&seen.health, members);
    let SignersPlan {
        mut steps,
        mut events,
        signers,
        final_leaf,
        bundles,
        wake_at,
        mut waits_on_members,
        degraded,
    } = plan_signers(seen, policy, &leaves, stored_all.as_ref(), now, mint)?;
    steps.extend(ca_config_maps(seen, &bundles));
    let endpoints = endpoints_of(members);
    let stored_endpoints = seen
        .config_maps
        .get(ENDPOINTS_CONFIG_MAP)
        .map(|(data, _)| data);
    if stored_endpoints != Some(&endpoints) {
        steps.push(EtcdStep::Endpoints(endpoints));
    }

    // etcd-all-certs: every member's certificates and the members' trust, once all are there.
    let desired = desired_all_certs(members, &final_leaf, &bundles);
    let stored_revision = stored_all.as_ref().map(revision_of);
    let mut held = false;
    let mut revision = stored_revision.clone();
    let mut all_certs_in_place = false;
    match desired {
        Some(desired) if stored_all.as_ref() == Some(&desired.data) => all_certs_in_place = true,
        Some(desired) => {
            let first = stored_all.is_none();
            if first || quorum.open() {
                events.push(Event::normal(
                    EVENT_REVISION_TRIGGERED,
                    format!(
                        "new revision {} of {ALL_CERTS:?} in {:?}: {}",
                        desired.revision,
                        seen.namespace,
                        change_of(stored_all.as_ref(), &desired.data)
                    ),
                ));
                revision = Some(desired.revision.clone());
                if seen.secrets.contains_key(ALL_CERTS) {
                    steps.push(EtcdStep::RecheckQuorum);
                }
                steps.push(EtcdStep::AllCerts(desired));
                all_certs_in_place = true;
            } else {
                held = true;
            }
        }
        None => {}
    }
    // A removed member's Secrets go once etcd-all-certs no longer holds its certificates:
    // those read (the glue deletes the version read, whose mark was checked), never a name
    // that was absent then, and never one a member has (a removed `metrics-m0`'s serving
    // Secret is `m0`'s).
    if !held {
        let current: BTreeSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
        let kept: BTreeSet<String> = leaves.iter().map(Leaf::secret_name).collect();
        let gone = stored_all
            .iter()
            .flat_map(members_in_all_certs)
            .filter(|m| !current.contains(m.as_str()));
        for member in gone {
            for secret in members::member_secrets(&member) {
                if !kept.contains(&secret) && seen.secrets.contains_key(&secret) {
                    steps.push(EtcdStep::Delete(secret));
                }
            }
        }
    }

    // Members still presenting certificates other than the stored revision's: a revision is
    // being installed.
    if let Some(all) = stored_all.as_ref().filter(|_| !held) {
        waits_on_members |= !serving_in_place(&seen.health, all);
    }
    waits_on_members |= held || seen.health.iter().any(|h| h.answer.is_err());

    // Each Warning once: while the status already says it, it is not said again.
    let reported = seen.reported_degraded.as_deref().unwrap_or_default();
    let degraded = if held {
        let message = quorum.closed_message();
        if !reported.contains(&message) {
            events.push(Event::warning(REASON_INSUFFICIENT_QUORUM, message.clone()));
        }
        Condition::new(true, REASON_INSUFFICIENT_QUORUM, message)
    } else {
        degraded.unwrap_or_else(Condition::as_expected)
    };
    // The refused are named beside whatever else is wrong, never hidden by it.
    let refused = membership.refused_message();
    for refusal in &membership.refused {
        let message = refusal.to_string();
        if !reported.contains(&message) {
            events.push(Event::warning(REASON_MEMBER_REFUSED, message));
        }
    }
    let degraded = match &refused {
        Some(refused) if degraded.status => Condition::new(
            true,
            degraded.reason,
            format!("{}; {refused}", degraded.message),
        ),
        Some(refused) => Condition::new(true, REASON_MEMBER_REFUSED, refused.clone()),
        None => degraded,
    };
    let signing = signers.values().all(|s| s.ready.status);
    let in_place = all_certs_in_place && signing;
    let ready = ready_condition(
        (in_place, held, signing),
        &degraded,
        revision.as_deref(),
        membership,
    );
    Ok(EtcdPlan {
        steps,
        events,
        status: EtcdStatus {
            ready,
            degraded,
            signers,
            revision,
        },
        quorum,
        held,
        waits_on_members,
        wake_at: wake_at.into_iter().filter(|t| *t > now).min(),
    })
}

/// What the signers and their members' certificates decide, before `etcd-all-certs`.
struct SignersPlan {
    steps: Vec<EtcdStep>,
    events: Vec<Event>,
    signers: BTreeMap<Signer, AuthorityStatus>,
    /// Each member certificate Secret's certificate and key once the steps are in place.
    final_leaf: BTreeMap<String, (String, String)>,
    /// Each signer's bundle (PEM).
    bundles: BTreeMap<Signer, String>,
    wake_at: Vec<OffsetDateTime>,
    waits_on_members: bool,
    /// The first signer's Degraded condition, when one is degraded.
    degraded: Option<Condition>,
}

/// Plans each signer ([`ca::plan`]) and the certificates it issues to `leaves` ([`leaf::plan`]).
fn plan_signers(
    seen: &EtcdObserved,
    policy: &EtcdPolicy,
    leaves: &[Leaf],
    stored_all: Option<&BTreeMap<String, String>>,
    now: OffsetDateTime,
    mint: &dyn Mint,
) -> Result<SignersPlan, PkiError> {
    let mut steps = Vec::new();
    let mut events = Vec::new();
    let mut signers = BTreeMap::new();
    let mut final_leaf: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut wake_at: Vec<OffsetDateTime> = Vec::new();
    let mut waits_on_members = false;
    let mut degraded: Option<Condition> = None;
    let mut bundles = BTreeMap::new();

    for signer in Signer::ALL {
        let (observed, next_waits) = observe_signer(seen, signer, leaves, stored_all, now);
        waits_on_members |= next_waits;
        let policy_of = match signer {
            Signer::Etcd => &policy.signer,
            Signer::Metrics => &policy.metrics_signer,
        };
        let ca_plan: CaPlan = ca::plan(&observed, policy_of, now, mint)?;
        steps.extend(
            ca_plan
                .steps
                .iter()
                .map(|s| EtcdStep::Signer(signer, s.clone())),
        );
        events.extend(ca_plan.events.iter().cloned());
        wake_at.extend(ca_plan.wake_at);
        if ca_plan.status.degraded.status && degraded.is_none() {
            degraded = Some(ca_plan.status.degraded.clone());
        }
        if let Some(bundle) = &ca_plan.issuer.bundle {
            bundles.insert(signer, bundle.text());
        }
        // A plan's own: etcd has a few dozen certificates, checked once per pass.
        let verified = Verified::default();
        for leaf in leaves.iter().filter(|l| l.role.signer() == signer) {
            let name = leaf.secret_name();
            let spec = leaf.spec(policy);
            let serving = matches!(spec.usage, Usage::Server | Usage::Both);
            let candidates = ca_plan.issuer.candidates();
            let state =
                LeafSecretState::observe(seen.secret(&name), serving, candidates, &verified);
            let observed = LeafObserved {
                secret_name: ObjectName::new(&seen.namespace, &name),
                secret: state.clone(),
            };
            let certificate_policy = CertificatePolicy {
                leaf: spec,
                rotation: policy.certificates.1,
            };
            let leaf_plan = leaf::plan(&observed, &certificate_policy, &ca_plan.issuer, now, mint)?;
            wake_at.extend(leaf_plan.wake_at);
            events.extend(leaf_plan.events.iter().cloned());
            let content = match leaf_plan.steps.first() {
                Some(CertificateStep::Issue(issued)) => Some((
                    issued.leaf.certificate.pem().to_string(),
                    issued.leaf.key.expose().to_string(),
                )),
                _ => stored_pair(seen.secret(&name)),
            };
            if let Some(content) = content {
                final_leaf.insert(name.clone(), content);
            }
            steps.extend(
                leaf_plan
                    .steps
                    .into_iter()
                    .map(|step| EtcdStep::Certificate {
                        secret: name.clone(),
                        step,
                    }),
            );
        }
        signers.insert(signer, ca_plan.status);
    }

    Ok(SignersPlan {
        steps,
        events,
        signers,
        final_leaf,
        bundles,
        wake_at,
        waits_on_members,
        degraded,
    })
}

/// The Ready condition: in place (`etcd-all-certs` holds every member's certificates and
/// every signer signs) and nothing degraded; or in place but for the refused members; or why
/// not yet (`held`: a revision waits for quorum; not `signing`).
fn ready_condition(
    (in_place, held, signing): (bool, bool, bool),
    degraded: &Condition,
    revision: Option<&str>,
    membership: &Membership,
) -> Condition {
    let members = &membership.members;
    if in_place && !degraded.status {
        Condition::new(
            true,
            REASON_IN_PLACE,
            format!(
                "{ALL_CERTS} revision {} holds the certificates of {} members",
                revision.unwrap_or("?"),
                members.len()
            ),
        )
    } else if in_place && degraded.reason == REASON_MEMBER_REFUSED {
        let names: Vec<&str> = membership.refused.iter().map(|r| r.name()).collect();
        Condition::new(
            false,
            REASON_MEMBER_REFUSED,
            format!(
                "{ALL_CERTS} revision {} holds the certificates of {} members, not of {} \
                 (see {CONDITION_DEGRADED})",
                revision.unwrap_or("?"),
                members.len(),
                names.join(", ")
            ),
        )
    } else {
        let why = if held {
            "a new revision of etcd-all-certs waits for quorum".to_string()
        } else if !signing {
            "a signer does not sign yet".to_string()
        } else {
            "etcd-all-certs is not complete yet".to_string()
        };
        Condition::new(false, REASON_WAITING, why)
    }
}

/// `etcd-endpoints`' data: each member's address (its first IP address, else its first DNS
/// name) under its name. OpenShift keys it by etcd's member ID (hex), which caretaker does not
/// know: clients that read the values, not the keys, read it alike.
pub fn endpoints_of(members: &[MemberSpec]) -> BTreeMap<String, String> {
    (members.iter())
        .filter_map(|member| {
            let address = (member.ip_addresses.first().map(IpAddr::to_string))
                .or_else(|| member.dns_names.first().cloned())?;
            Some((member.name.clone(), address))
        })
        .collect()
}

/// OpenShift's CA ConfigMaps whose `ca-bundle.crt` is not yet their signer's bundle as this
/// pass leaves it.
fn ca_config_maps(seen: &EtcdObserved, bundles: &BTreeMap<Signer, String>) -> Vec<EtcdStep> {
    OPENSHIFT_CA_CONFIG_MAPS
        .iter()
        .filter_map(|(name, signer)| {
            let bundle = bundles.get(signer)?;
            let stored = (seen.config_maps.get(*name))
                .and_then(|(data, _)| data.get(caretaker_api::names::CA_BUNDLE_CRT));
            (stored != Some(bundle)).then(|| EtcdStep::CaConfigMap {
                name,
                bundle: bundle.clone(),
            })
        })
        .collect()
}

/// A signer's observation: its Secret and bundle, which of its CAs sign a certificate in use
/// (in the certificate Secrets, in `etcd-all-certs`, and presented by the members), and which
/// the members trust. Also whether a next signer waits on the members.
fn observe_signer(
    seen: &EtcdObserved,
    signer: Signer,
    leaves: &[Leaf],
    stored_all: Option<&BTreeMap<String, String>>,
    now: OffsetDateTime,
) -> (AuthorityObserved, bool) {
    let bundle_state =
        BundleState::observe(seen.config_maps.get(signer.bundle()).map(|(d, a)| (d, a)));
    let mut observed = AuthorityObserved {
        secret_name: ObjectName::new(&seen.namespace, signer.secret()),
        bundle_name: ObjectName::new(&seen.namespace, signer.bundle()),
        secret: CaSecretState::observe(seen.secret(signer.secret())),
        bundle: bundle_state,
        injected: None,
        in_use: BTreeSet::new(),
        certificates_missing: false,
        distributed: None,
        untrusting: Untrusting::default(),
        last_good: seen.last_good.get(&signer).cloned(),
        // Nothing remembered: its bundles are in its own namespace, with its Secrets, so the
        // rule for a bundle beside its CA Secret takes every CA they hold (whoever may write
        // them may write the signer Secrets too), and a signer Secret deleted while no
        // operator ran keeps the CAs its members' certificates need.
        remembered: Some(BTreeSet::new()),
        reported_degraded: seen.reported_degraded.clone(),
    };
    let candidates = ca::in_use_candidates(&observed, now);
    let cas: Vec<&Certificate> = candidates.candidates();
    let signed_by = |pem: &str| -> Option<String> {
        let leaf = Certificate::parse_pem(pem).ok()?.into_iter().next()?;
        issuer_of(&leaf, &cas)
    };
    let mut missing = false;
    for leaf in leaves.iter().filter(|l| l.role.signer() == signer) {
        match stored_pair(seen.secret(&leaf.secret_name())).and_then(|(crt, _)| signed_by(&crt)) {
            Some(fp) => {
                observed.in_use.insert(fp);
            }
            None => missing = true,
        }
    }
    for (key, pem) in stored_all.into_iter().flatten() {
        if role_of_certificate_key(key).is_some_and(|role| role.signer() == signer)
            && let Some(fp) = signed_by(pem)
        {
            observed.in_use.insert(fp);
        }
    }
    let mut next_waits = false;
    if signer == Signer::Etcd {
        for health in &seen.health {
            match &health.answer {
                Ok(MemberAnswer {
                    serving: Some(serving),
                    ..
                }) => match issuer_of(serving, &cas) {
                    Some(fp) => {
                        observed.in_use.insert(fp);
                    }
                    None => missing = true,
                },
                _ => missing = true,
            }
        }
    }
    observed.certificates_missing = missing;

    // The members' trust: what etcd-all-certs gives them, and for the next etcd-signer only
    // once every member accepted it.
    let next = match &observed.secret {
        CaSecretState::Valid(secret) => secret.next.as_ref().map(|n| n.fingerprint().to_string()),
        _ => None,
    };
    observed.injected = stored_all
        .and_then(|all| all.get(signer.all_certs_key()))
        .map(|pem| {
            let mut trusted: BTreeSet<String> = Certificate::parse_pem(pem)
                .unwrap_or_default()
                .iter()
                .map(|c| c.fingerprint().to_string())
                .collect();
            if signer == Signer::Etcd
                && let Some(next) = &next
                && trusted.contains(next)
            {
                let accepted = !seen.health.is_empty()
                    && seen
                        .health
                        .iter()
                        .all(|h| matches!(&h.answer, Ok(a) if a.accepts_next == Some(true)));
                if !accepted {
                    trusted.remove(next);
                    next_waits = true;
                }
            }
            trusted
        });
    if let (Some(next), Some(trusted)) = (&next, &observed.injected)
        && !trusted.contains(next)
    {
        observed
            .untrusting
            .add(|| format!("the members of {ALL_CERTS}"));
    }
    (observed, next_waits)
}

/// The fingerprint of the CA among `cas` that signed `leaf`.
fn issuer_of(leaf: &Certificate, cas: &[&Certificate]) -> Option<String> {
    cas.iter()
        .find(|ca| caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap_or(false))
        .map(|ca| ca.fingerprint().to_string())
}

/// A certificate Secret's `tls.crt` and `tls.key`, when both are there.
fn stored_pair(secret: Option<SecretContent<'_>>) -> Option<(String, String)> {
    let (data, _) = secret?;
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .filter(|s| !s.trim().is_empty())
    };
    Some((text(TLS_CRT)?, text(TLS_KEY)?))
}

/// Whether every member that answered presents the serving certificate `all` holds for it.
fn serving_in_place(health: &[EndpointHealth], all: &BTreeMap<String, String>) -> bool {
    let serving: BTreeSet<String> = all
        .iter()
        .filter(|(k, _)| role_of_certificate_key(k) == Some(Role::Serving))
        .filter_map(|(_, pem)| Certificate::parse_pem(pem).ok()?.into_iter().next())
        .map(|c| c.fingerprint().to_string())
        .collect();
    health.iter().all(|h| match &h.answer {
        Ok(MemberAnswer {
            serving: Some(presented),
            ..
        }) => serving.contains(presented.fingerprint()),
        _ => true,
    })
}

/// The next CA of a signer's bundle that the members must accept, for the glue's probe.
pub fn next_signer(seen: &EtcdObserved) -> Option<CaKeyPair> {
    match CaSecretState::observe(seen.secret(SIGNER_SECRET)) {
        CaSecretState::Valid(secret) => secret.next,
        _ => None,
    }
}

/// The trust the health checks verify servers with: every CA of `etcd-ca-bundle` and the
/// signer's Secret.
pub fn server_trust(seen: &EtcdObserved, now: OffsetDateTime) -> Option<Bundle> {
    let mut cas: Vec<Certificate> = Vec::new();
    if let CaSecretState::Valid(secret) = CaSecretState::observe(seen.secret(SIGNER_SECRET)) {
        cas.extend(secret.bundle(now).certificates().iter().cloned());
    }
    let bundle = BundleState::observe(seen.config_maps.get(CA_BUNDLE).map(|(d, a)| (d, a)));
    cas.extend(bundle.cas().cloned());
    let bundle = Bundle::of(cas, now);
    (!bundle.is_empty()).then_some(bundle)
}
