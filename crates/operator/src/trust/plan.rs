//! One pass over a Bundle, decided from what was observed: trust-manager's reconcile as a pure
//! function ([`plan`]). The glue applies the plan's target writes in order, stops at the first
//! failure (and reports it with [`target_failed`]), then gives up unwanted targets, and writes the
//! status and event the plan carries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

use super::api::{Bundle, SYNCED};
use super::selector::Selector;
use super::sources::{self, SourceContext, SourceError};
use super::target::{self, ObservedTarget, Owner, TargetContent, TargetKind};
use crate::changes::Event;

/// A namespace as a Bundle's namespace selector sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceView {
    pub labels: BTreeMap<String, String>,
    pub terminating: bool,
}

/// The operator-wide settings a Bundle pass depends on (trust-manager's flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleSettings {
    pub secret_targets_enabled: bool,
    /// `--target-namespaces`: when set, the only namespaces targets are written to.
    pub target_namespaces: Option<BTreeSet<String>>,
}

/// What one pass observed.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub bundle: &'a Bundle,
    pub sources: SourceContext<'a>,
    pub namespaces: &'a BTreeMap<String, NamespaceView>,
    /// The existing targets labelled with this Bundle's name, by kind and namespace.
    pub targets: &'a BTreeMap<(TargetKind, String), ObservedTarget>,
    pub settings: &'a BundleSettings,
    pub now: Time,
}

/// One target write: a server-side apply of [`TargetWrite::body`] to `kind`
/// `namespace/<bundle name>`. The content is shared by every write of a kind, and each body is
/// made only when it is sent: a pass over ten thousand namespaces holds one copy of the bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetWrite {
    pub kind: TargetKind,
    pub namespace: String,
    content: Arc<TargetContent>,
}

impl TargetWrite {
    /// The server-side apply body.
    pub fn body(&self) -> Value {
        target::apply_body(self.kind, &self.namespace, &self.content)
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
    let bundle = observed.bundle;
    let built = match sources::build(&bundle.spec.sources, &observed.sources) {
        Ok(built) => built,
        Err(error) => {
            let retry = matches!(error, SourceError::Invalid(_));
            let change = failed(observed, error.reason(), error.message());
            let outcome = if retry { Outcome::Retry } else { Outcome::Done };
            return BundlePlan::stop(Some(change), None, outcome);
        }
    };
    let target = bundle.spec.target.clone().unwrap_or_default();
    if target.secret.is_some() && !observed.settings.secret_targets_enabled {
        let change = failed(
            observed,
            "SecretTargetsDisabled",
            "Bundle has Secret targets but the feature is disabled".into(),
        );
        return BundlePlan::stop(Some(change), None, Outcome::Done);
    }
    let selector = match Selector::parse(target.namespace_selector.as_ref()) {
        Ok(selector) => selector,
        Err(e) => {
            let note = format!("Failed to build namespace match labels selector: {e}");
            let event = Event::warning("NamespaceSelectorError", note).with_action("SyncFailed");
            return BundlePlan::stop(None, Some(event), Outcome::Retry);
        }
    };

    let name = bundle.metadata.name.as_deref().unwrap_or_default();
    let uid = bundle.metadata.uid.as_deref().unwrap_or_default();
    let owner = Owner { name, uid };
    let kinds: Vec<(TargetKind, &_)> = [
        (TargetKind::ConfigMap, target.config_map.as_ref()),
        (TargetKind::Secret, target.secret.as_ref()),
    ]
    .into_iter()
    .filter_map(|(kind, template)| template.map(|t| (kind, t)))
    .collect();
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
    let formats = target.additional_formats.as_ref();
    let mut writes = Vec::new();
    let mut wanted = BTreeSet::new();
    let mut binary: Option<Arc<BTreeMap<String, Vec<u8>>>> = None;
    for (kind, template) in &kinds {
        let hash = target::hash(&pem, formats, template);
        let keys = target::keys(template, formats);
        let mut content: Option<Arc<TargetContent>> = None;
        for namespace in &wanted_namespaces {
            let key = (*kind, (*namespace).clone());
            let existing = observed.targets.get(&key);
            wanted.insert(key);
            if existing.is_some_and(|t| !t.needs_update(&owner, &hash, &keys)) {
                continue;
            }
            // The binary stores are built once a pass, and only when something is written.
            if binary.is_none() {
                match target::binary_formats(&built.pool, formats) {
                    Ok(stores) => binary = Some(Arc::new(stores)),
                    Err(e) => {
                        let change = target_failed(observed, *kind, namespace, &e.to_string());
                        return BundlePlan::stop(Some(change), None, Outcome::Retry);
                    }
                }
            }
            let content = content.get_or_insert_with(|| {
                Arc::new(TargetContent {
                    owner_name: name.to_string(),
                    owner_uid: uid.to_string(),
                    template: (*template).clone(),
                    hash: hash.clone(),
                    pem: pem.clone(),
                    binary: binary.clone().expect("built above"),
                })
            });
            writes.push(TargetWrite {
                kind: *kind,
                namespace: (*namespace).clone(),
                content: content.clone(),
            });
        }
    }
    let cleanups = observed
        .targets
        .iter()
        .filter(|(key, existing)| {
            !wanted.contains(*key)
                && !existing.deleting
                && existing.controlled_by(&owner)
                && (key.0 == TargetKind::ConfigMap || observed.settings.secret_targets_enabled)
        })
        .map(|(key, _)| key.clone())
        .collect();

    let message = success_message(&selector, observed.settings.target_namespaces.is_some());
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

/// trust-manager's success message.
fn success_message(selector: &Selector, restricted: bool) -> String {
    let which = if restricted { "allowed " } else { "" };
    if selector.is_everything() {
        format!("Successfully synced Bundle to all {which}namespaces")
    } else {
        format!(
            "Successfully synced Bundle to {which}namespaces that match this label selector: {selector}"
        )
    }
}

/// The default CA version the Bundle's status records.
fn recorded_version<'a>(observed: &'a Observed<'_>) -> Option<&'a str> {
    let status = observed.bundle.status.as_ref()?;
    status.default_ca_version.as_deref()
}

fn existing_synced<'a>(observed: &'a Observed<'_>) -> Option<&'a Condition> {
    observed
        .bundle
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == SYNCED))
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
        observed_generation: observed.bundle.metadata.generation,
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
