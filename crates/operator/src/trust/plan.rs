//! One pass over a Bundle or a ClusterBundle, decided from what was observed: trust-manager's
//! reconcile as a pure function ([`plan`]). The glue applies the plan's target writes in order, stops at the first
//! failure (and reports it with [`target_failed`]), then gives up unwanted targets, and writes the
//! status and event the plan carries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta, Time};
use serde_json::{Value, json};

use super::api::{Bundle, BundleStatus, SYNCED};
use super::cluster_bundle::{ClusterBundle, JKS_KEY_ANNOTATION};
use super::selector::Selector;
use super::sources::{self, BuiltBundle, SourceContext, SourceError};
use super::target::{self, ObservedTarget, Owner, OwnerApi, TargetContent, TargetKind, TargetSpec};
use crate::changes::Event;

/// What a pass is over: a Bundle or a ClusterBundle. Both are decided by the same rules; they
/// differ in their sources' and targets' shapes and in the names targets carry.
#[derive(Debug, Clone, Copy)]
pub enum TrustObject<'a> {
    Bundle(&'a Bundle),
    ClusterBundle(&'a ClusterBundle),
}

impl<'a> From<&'a Bundle> for TrustObject<'a> {
    fn from(bundle: &'a Bundle) -> Self {
        Self::Bundle(bundle)
    }
}

impl<'a> From<&'a ClusterBundle> for TrustObject<'a> {
    fn from(bundle: &'a ClusterBundle) -> Self {
        Self::ClusterBundle(bundle)
    }
}

impl<'a> TrustObject<'a> {
    pub fn api(self) -> OwnerApi {
        match self {
            Self::Bundle(_) => OwnerApi::Bundle,
            Self::ClusterBundle(_) => OwnerApi::ClusterBundle,
        }
    }

    pub fn metadata(self) -> &'a ObjectMeta {
        match self {
            Self::Bundle(b) => &b.metadata,
            Self::ClusterBundle(b) => &b.metadata,
        }
    }

    pub fn status(self) -> Option<&'a BundleStatus> {
        match self {
            Self::Bundle(b) => b.status.as_ref(),
            Self::ClusterBundle(b) => b.status.as_ref(),
        }
    }

    pub fn owner(self) -> Owner<'a> {
        let metadata = self.metadata();
        Owner {
            api: self.api(),
            name: metadata.name.as_deref().unwrap_or_default(),
            uid: metadata.uid.as_deref().unwrap_or_default(),
        }
    }

    /// Whether it reads the source object `name` (with `labels`) of `kind`, by name or selector.
    pub fn reads_source(
        self,
        kind: TargetKind,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let names = |wanted: Option<&String>, selector: Option<&LabelSelector>| match wanted
            .filter(|n| !n.is_empty())
        {
            Some(wanted) => wanted == name,
            None => Selector::parse(selector).is_ok_and(|s| s.matches(labels)),
        };
        match self {
            Self::Bundle(b) => b.spec.sources.iter().any(|source| {
                let reference = match kind {
                    TargetKind::ConfigMap => source.config_map.as_ref(),
                    TargetKind::Secret => source.secret.as_ref(),
                };
                reference.is_some_and(|r| names(r.name.as_ref(), r.selector.as_ref()))
            }),
            Self::ClusterBundle(b) => {
                let refs = b.spec.source_refs.iter().flatten();
                refs.filter(|r| r.kind == kind.as_str())
                    .any(|r| names(r.name.as_ref(), r.selector.as_ref()))
            }
        }
    }

    fn build(self, from: &SourceContext<'_>) -> Result<BuiltBundle, SourceError> {
        match self {
            Self::Bundle(b) => sources::build(&b.spec.sources, from),
            Self::ClusterBundle(b) => sources::build_cluster(&b.spec, from),
        }
    }

    /// The target kinds and the namespace selector (`None`: every namespace).
    fn targets(self) -> (Vec<(TargetKind, TargetSpec)>, Option<&'a LabelSelector>) {
        match self {
            Self::Bundle(b) => match &b.spec.target {
                Some(t) => (target::bundle_specs(t), t.namespace_selector.as_ref()),
                None => (Vec::new(), None),
            },
            Self::ClusterBundle(b) => match &b.spec.target {
                Some(t) => {
                    let annotations = b.metadata.annotations.as_ref();
                    let jks_key = annotations.and_then(|a| a.get(JKS_KEY_ANNOTATION));
                    let specs = target::cluster_bundle_specs(t, jks_key.map(String::as_str));
                    (specs, Some(&t.namespace_selector))
                }
                None => (Vec::new(), None),
            },
        }
    }
}

/// A namespace as a Bundle's namespace selector sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceView {
    pub labels: BTreeMap<String, String>,
    pub terminating: bool,
}

/// How Bundles are served (`--bundle-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BundleMode {
    /// As trust-manager serves them: each Bundle writes its targets.
    #[default]
    Serve,
    /// As the rename design migrates them: each Bundle is applied as the ClusterBundle of its
    /// name, which takes its targets over; the Bundle's status mirrors the ClusterBundle's.
    Migrate,
}

/// The operator-wide settings a pass depends on (trust-manager's flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleSettings {
    pub mode: BundleMode,
    pub secret_targets_enabled: bool,
    /// `--target-namespaces`: when set, the only namespaces targets are written to.
    pub target_namespaces: Option<BTreeSet<String>>,
}

/// What one pass observed.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub object: TrustObject<'a>,
    pub sources: SourceContext<'a>,
    pub namespaces: &'a BTreeMap<String, NamespaceView>,
    /// The existing targets of this object's name (with either API's label), by kind and
    /// namespace.
    pub targets: TargetsView<'a>,
    pub settings: &'a BundleSettings,
    pub now: Time,
}

/// Existing targets by kind and namespace, as the watches that see them keep them (one per
/// target kind and label), read in place: where two hold the same target, the later one's view
/// counts (a ClusterBundle's label over a Bundle's, once a target is taken over).
#[derive(Debug, Clone, Default)]
pub struct TargetsView<'a> {
    maps: Vec<&'a BTreeMap<(TargetKind, String), ObservedTarget>>,
}

impl<'a> TargetsView<'a> {
    pub fn new(maps: Vec<&'a BTreeMap<(TargetKind, String), ObservedTarget>>) -> Self {
        Self { maps }
    }

    pub fn get(&self, key: &(TargetKind, String)) -> Option<&'a ObservedTarget> {
        self.maps.iter().rev().find_map(|map| map.get(key))
    }

    /// Every target, each once.
    pub fn all(&self) -> BTreeMap<&'a (TargetKind, String), &'a ObservedTarget> {
        self.maps.iter().flat_map(|map| map.iter()).collect()
    }
}

/// One target write: a server-side apply of [`TargetWrite::body`] to `kind`
/// `namespace/<bundle name>`. The content is shared by every write of a kind, and each body is
/// made only when it is sent: a pass over ten thousand namespaces holds one copy of the bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetWrite {
    pub kind: TargetKind,
    pub namespace: String,
    content: Arc<TargetContent>,
    /// The Bundle (its UID) a ClusterBundle keeps as a non-controller owner of this target.
    kept_bundle: Option<String>,
}

impl TargetWrite {
    /// The server-side apply body.
    pub fn body(&self) -> Value {
        let kept = self.kept_bundle.as_deref();
        target::apply_body(self.kind, &self.namespace, &self.content, kept)
    }
}

/// A Bundle's new `Synced` condition and default CA version, and the event that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusChange {
    pub condition: Condition,
    pub default_ca_version: Option<String>,
    pub event: Event,
}

/// How the pass ends once its actions are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Wait for the next change.
    Done,
    /// Try again with backoff (trust-manager returns an error here).
    Retry,
}

/// Everything one pass does.
#[derive(Debug, Clone, PartialEq)]
pub struct BundlePlan {
    pub writes: Vec<TargetWrite>,
    /// Targets this Bundle controls but no longer wants, given up after the writes.
    pub cleanups: Vec<(TargetKind, String)>,
    /// The status to apply after the writes succeed; `None` when nothing changed.
    pub status: Option<StatusChange>,
    /// An event that is not part of a status change (namespace selector errors).
    pub event: Option<Event>,
    pub outcome: Outcome,
}

impl BundlePlan {
    fn stop(status: Option<StatusChange>, event: Option<Event>, outcome: Outcome) -> Self {
        Self {
            writes: Vec::new(),
            cleanups: Vec::new(),
            status,
            event,
            outcome,
        }
    }
}

/// trust-manager's `reconcileBundle`, decided.
pub fn plan(observed: &Observed<'_>) -> BundlePlan {
    let object = observed.object;
    let noun = object.api().kind();
    let built = match object.build(&observed.sources) {
        Ok(built) => built,
        Err(error) => {
            let retry = matches!(error, SourceError::Invalid(_));
            let change = failed(observed, error.reason(), error.message());
            let outcome = if retry { Outcome::Retry } else { Outcome::Done };
            return BundlePlan::stop(Some(change), None, outcome);
        }
    };
    let (kinds, selector) = object.targets();
    let has_secrets = kinds.iter().any(|(kind, _)| *kind == TargetKind::Secret);
    if has_secrets && !observed.settings.secret_targets_enabled {
        let change = failed(
            observed,
            "SecretTargetsDisabled",
            format!("{noun} has Secret targets but the feature is disabled"),
        );
        return BundlePlan::stop(Some(change), None, Outcome::Done);
    }
    let selector = match Selector::parse(selector) {
        Ok(selector) => selector,
        Err(e) => {
            let note = format!("Failed to build namespace match labels selector: {e}");
            let event = Event::warning("NamespaceSelectorError", note).with_action("SyncFailed");
            return BundlePlan::stop(None, Some(event), Outcome::Retry);
        }
    };

    let owner = object.owner();
    let adopt_bundle = observed.settings.mode == BundleMode::Migrate;
    let wanted_namespaces: Vec<&String> = observed
        .namespaces
        .iter()
        .filter(|(namespace, view)| {
            !view.terminating
                && selector.matches(&view.labels)
                && observed
                    .settings
                    .target_namespaces
                    .as_ref()
                    .is_none_or(|allowed| allowed.contains(*namespace))
        })
        .map(|(namespace, _)| namespace)
        .collect();

    let pem: Arc<str> = built.pool.to_pem().into();
    let mut writes = Vec::new();
    let mut wanted = BTreeSet::new();
    for (kind, spec) in &kinds {
        let hash = spec.hash(&pem);
        let keys = spec.keys();
        let mut content: Option<Arc<TargetContent>> = None;
        for namespace in &wanted_namespaces {
            let key = (*kind, (*namespace).clone());
            let existing = observed.targets.get(&key);
            wanted.insert(key);
            if let Some(why) = existing.and_then(|t| t.refusal(&owner, adopt_bundle)) {
                let change = target_failed(observed, *kind, namespace, &why);
                return BundlePlan::stop(Some(change), None, Outcome::Retry);
            }
            if existing.is_some_and(|t| !t.needs_update(&owner, &hash, &keys)) {
                continue;
            }
            // The binary stores are built once a pass and kind, and only when something is
            // written.
            let content = match &content {
                Some(content) => content,
                None => match spec.encode_stores(&built.pool) {
                    Ok(stores) => content.insert(Arc::new(TargetContent {
                        owner_api: owner.api,
                        owner_name: owner.name.to_string(),
                        owner_uid: owner.uid.to_string(),
                        spec: spec.clone(),
                        hash: hash.clone(),
                        pem: pem.clone(),
                        binary: Arc::new(stores),
                    })),
                    Err(e) => {
                        let change = target_failed(observed, *kind, namespace, &e.to_string());
                        return BundlePlan::stop(Some(change), None, Outcome::Retry);
                    }
                },
            };
            let kept_bundle = match owner.api {
                OwnerApi::ClusterBundle => existing.and_then(|t| t.bundle_owner(owner.name)),
                OwnerApi::Bundle => None,
            };
            writes.push(TargetWrite {
                kind: *kind,
                namespace: (*namespace).clone(),
                content: content.clone(),
                kept_bundle: kept_bundle.map(String::from),
            });
        }
    }
    let cleanups = observed
        .targets
        .all()
        .into_iter()
        .filter(|(key, existing)| {
            !wanted.contains(*key)
                && !existing.deleting
                && existing.controlled_by(&owner)
                && (key.0 == TargetKind::ConfigMap || observed.settings.secret_targets_enabled)
        })
        .map(|(key, _)| key.clone())
        .collect();

    let restricted = observed.settings.target_namespaces.is_some();
    let message = success_message(noun, &selector, restricted);
    let condition = condition(observed, "True", "Synced", message.clone());
    let unchanged = writes.is_empty()
        && recorded_version(observed) == built.default_ca_version.as_deref()
        && same_condition(observed, &condition);
    let status = (!unchanged).then(|| StatusChange {
        condition,
        default_ca_version: built.default_ca_version,
        event: Event::normal("Synced", message).with_action("Synced"),
    });
    BundlePlan {
        writes,
        cleanups,
        status,
        event: None,
        outcome: Outcome::Done,
    }
}

/// The server-side apply of a status change: only `Synced`, and the default CA version when
/// there is one.
pub fn status_body(
    api: OwnerApi,
    name: &str,
    synced: &Condition,
    default_ca_version: Option<&str>,
) -> Value {
    let mut status = json!({"conditions": [synced]});
    if let Some(version) = default_ca_version {
        status["defaultCAVersion"] = json!(version);
    }
    json!({
        "apiVersion": api.api_version(),
        "kind": api.kind(),
        "metadata": {"name": name},
        "status": status,
    })
}

/// The status and event after writing `kind` to `namespace` failed with `error`.
pub fn target_failed(
    observed: &Observed<'_>,
    kind: TargetKind,
    namespace: &str,
    error: &str,
) -> StatusChange {
    let reason = match kind {
        TargetKind::ConfigMap => "SyncConfigMapTargetFailed",
        TargetKind::Secret => "SyncSecretTargetFailed",
    };
    let kind = kind.as_str();
    let message = format!("Failed to sync bundle {kind} to namespace {namespace:?}: {error}");
    let mut change = failed(observed, reason, message);
    change.event.note = format!("Failed to sync target {kind} in Namespace {namespace:?}: {error}");
    change
}

/// A failed pass: `Synced` False, and the default CA version recorded before kept.
fn failed(observed: &Observed<'_>, reason: &'static str, message: String) -> StatusChange {
    StatusChange {
        condition: condition(observed, "False", reason, message.clone()),
        default_ca_version: recorded_version(observed).map(String::from),
        event: Event::warning(reason, message).with_action("SyncFailed"),
    }
}

/// trust-manager's success message (`noun`: Bundle or ClusterBundle).
fn success_message(noun: &str, selector: &Selector, restricted: bool) -> String {
    let which = if restricted { "allowed " } else { "" };
    if selector.is_everything() {
        format!("Successfully synced {noun} to all {which}namespaces")
    } else {
        format!(
            "Successfully synced {noun} to {which}namespaces that match this label selector: {selector}"
        )
    }
}

/// The default CA version the status records.
fn recorded_version<'a>(observed: &Observed<'a>) -> Option<&'a str> {
    let status = observed.object.status()?;
    status.default_ca_version.as_deref()
}

fn existing_synced<'a>(observed: &Observed<'a>) -> Option<&'a Condition> {
    observed.object.status()?.synced()
}

/// A `Synced` condition; the transition time stays when the status does not change.
fn condition(observed: &Observed<'_>, status: &str, reason: &str, message: String) -> Condition {
    let last_transition_time = existing_synced(observed)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| observed.now.clone());
    Condition {
        type_: SYNCED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: observed.object.metadata().generation,
    }
}

/// trust-manager's `bundleHasCondition`: status, reason, message and generation all equal.
fn same_condition(observed: &Observed<'_>, condition: &Condition) -> bool {
    existing_synced(observed).is_some_and(|c| {
        c.status == condition.status
            && c.reason == condition.reason
            && c.message == condition.message
            && c.observed_generation == condition.observed_generation
    })
}
