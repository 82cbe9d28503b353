//! Bundle → ClusterBundle, as the rename design migrates it (`--bundle-mode migrate`), decided
//! without Kubernetes ([`migrate`]).
//!
//! - Each Bundle is applied as the ClusterBundle of its name, converted as upstream converts it
//!   ([`super::cluster_bundle::from_bundle`]), with the field manager the user applied the Bundle
//!   with ([`user_manager`]), so the user's own later applies of the ClusterBundle do not
//!   conflict.
//! - There is no owner reference from the Bundle on the ClusterBundle, and a deleted Bundle
//!   changes nothing: deleting a Bundle, or the Bundle CRD, deletes no ClusterBundle and no
//!   target (upstream's controller reference would let the garbage collector delete both).
//! - The Bundle's status mirrors the ClusterBundle's `Synced`, so tools that watch the Bundle
//!   keep their signal.
//! - The ClusterBundle records which Bundle (UID) and generation it was applied from
//!   ([`MIGRATED_FROM_ANNOTATION`]); it is applied again only when the Bundle's spec changes.
//! - Only a ClusterBundle that does not exist, or that records this very Bundle's UID, is
//!   applied to ([`Standing`]). Anyone who may create a Bundle may name any ClusterBundle, so a
//!   ClusterBundle made by someone else, or recorded from another Bundle (an earlier Bundle of
//!   the name, since deleted), is refused: the Bundle reports `Synced=False` with a Warning event
//!   naming it, and nothing is written to it. One carrying upstream's `trust-manager.io/migrated`
//!   has been taken over by its user: it is never applied over.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::api::{Bundle, FIELD_MANAGER, SYNCED};
use super::cluster_bundle::{ClusterBundle, MIGRATED_ANNOTATION, from_bundle};
use crate::changes::Event;

/// The field manager of the migration's own records, and of a ClusterBundle applied from a
/// Bundle that no manager of the user's owns the spec of.
pub const MIGRATION_MANAGER: &str = "caretaker-bundle-migration";
/// On a ClusterBundle applied from a Bundle: `<Bundle UID>/<Bundle generation>`.
pub const MIGRATED_FROM_ANNOTATION: &str = "caretaker.dev/migrated-from-bundle";
/// The reason of a Bundle's `Synced=False` and Warning event when the ClusterBundle of its name
/// is not its own.
pub const MIGRATION_REFUSED: &str = "MigrationRefused";

/// A ClusterBundle apply: the body, and the field manager to apply it as.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterBundleApply {
    pub manager: String,
    pub body: Value,
    /// The migration's own record of what was applied (applied as [`MIGRATION_MANAGER`], so a
    /// user's apply that drops it from their fields does not remove it).
    pub record: Value,
    /// What the ClusterBundle must still be when written: the decision was taken on a cached
    /// view, and must not land on a ClusterBundle made or changed since.
    pub precondition: Precondition,
}

/// The state of the ClusterBundle a [`ClusterBundleApply`] was decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// There was none: it is created, and an existing one is never written.
    Absent,
    /// This Bundle's own, at this resourceVersion: written only while it is still there.
    At(String),
}

/// One migration pass over a Bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationPlan {
    pub apply: Option<ClusterBundleApply>,
    /// The Bundle's new `Synced` condition and default CA version: mirrored from the
    /// ClusterBundle's, or the refusal; `None` when they already match.
    pub mirror: Option<(Condition, Option<String>)>,
    pub event: Option<Event>,
}

/// Whose the ClusterBundle of a Bundle's name is, as the migration sees it.
#[derive(Debug, Clone, Copy)]
pub enum Standing<'a> {
    /// There is none: the migration creates it.
    Absent,
    /// It records this Bundle's UID: the migration applied it.
    ThisBundles(&'a ClusterBundle),
    /// Anyone else's (made by hand, or recorded from another Bundle): never written.
    Others(&'a ClusterBundle),
}

/// What this Bundle generation is recorded as on its ClusterBundle.
pub fn record_of(bundle: &Bundle) -> String {
    let uid = bundle.metadata.uid.as_deref().unwrap_or_default();
    let generation = bundle.metadata.generation.unwrap_or_default();
    format!("{uid}/{generation}")
}

/// The record [`MIGRATED_FROM_ANNOTATION`] on `cluster_bundle`, if any.
fn recorded(cluster_bundle: &ClusterBundle) -> Option<&str> {
    let annotations = cluster_bundle.metadata.annotations.as_ref()?;
    annotations
        .get(MIGRATED_FROM_ANNOTATION)
        .map(String::as_str)
}

/// Whose `cluster_bundle` is, for `bundle`: this Bundle's only when it records the Bundle's
/// UID, which the API server assigned (a Bundle's writer cannot choose it, and UIDs are never
/// reused), so a Bundle that merely shares a name with an earlier one is not its heir.
pub fn standing<'a>(bundle: &Bundle, cluster_bundle: Option<&'a ClusterBundle>) -> Standing<'a> {
    let Some(cb) = cluster_bundle else {
        return Standing::Absent;
    };
    let uid = bundle.metadata.uid.as_deref().filter(|uid| !uid.is_empty());
    let recorded_uid = recorded(cb)
        .and_then(|r| r.rsplit_once('/'))
        .map(|(uid, _)| uid);
    match uid {
        Some(uid) if recorded_uid == Some(uid) => Standing::ThisBundles(cb),
        _ => Standing::Others(cb),
    }
}

/// The field manager the user applied the Bundle's spec with: of the managers owning fields of
/// `spec` through the Bundle itself (not a subresource), one that applied them (server-side
/// apply) first, else the latest other one; never caretaker's or trust-manager's own.
///
/// Read from the Bundle's `managedFields`, which the API server keeps for every write of the
/// Bundle. A manager name proves nothing about who wrote (any writer may pick one), which is why
/// the apply it is used for lands only on a ClusterBundle that is absent or this Bundle's own
/// ([`standing`]): naming another team's manager gains nothing over that team's ClusterBundle.
pub fn user_manager(bundle: &Bundle) -> Option<String> {
    let entries = bundle.metadata.managed_fields.iter().flatten();
    let owners = entries.filter(|e| {
        let manager = e.manager.as_deref().unwrap_or_default();
        let operation = e.operation.as_deref();
        let owns_spec = e
            .fields_v1
            .as_ref()
            .is_some_and(|f| f.0.get("f:spec").is_some());
        owns_spec
            && matches!(operation, Some("Apply" | "Update"))
            && e.subresource.as_deref().unwrap_or_default().is_empty()
            && !manager.is_empty()
            && manager != FIELD_MANAGER
            && manager != MIGRATION_MANAGER
    });
    let mut owners: Vec<_> = owners.collect();
    owners.sort_by_key(|e| (e.operation.as_deref() == Some("Apply"), e.time.clone()));
    owners.last().and_then(|e| e.manager.clone())
}

/// Decides a migration pass over `bundle`, whose ClusterBundle of the same name is
/// `cluster_bundle` (as last seen), at `now`.
pub fn migrate(
    bundle: &Bundle,
    cluster_bundle: Option<&ClusterBundle>,
    now: &Time,
) -> MigrationPlan {
    let name = bundle.metadata.name.clone().unwrap_or_default();
    let record = record_of(bundle);
    let (precondition, due) = match standing(bundle, cluster_bundle) {
        Standing::Absent => (Precondition::Absent, true),
        Standing::Others(cb) => return refused(bundle, &name, cb, now),
        Standing::ThisBundles(cb) => {
            let annotations = cb.metadata.annotations.as_ref();
            let taken_over = annotations.is_some_and(|a| a.contains_key(MIGRATED_ANNOTATION));
            let version = cb.metadata.resource_version.clone().unwrap_or_default();
            let due = !taken_over && recorded(cb) != Some(record.as_str());
            (Precondition::At(version), due)
        }
    };
    let apply = due.then(|| {
        let manager = user_manager(bundle).unwrap_or_else(|| MIGRATION_MANAGER.into());
        let (spec, mut annotations) = from_bundle(&bundle.spec);
        annotations.insert(MIGRATED_FROM_ANNOTATION.into(), record.clone());
        let metadata = |annotations| json!({"name": name, "annotations": annotations});
        ClusterBundleApply {
            body: json!({
                "apiVersion": "trust-manager.io/v1alpha2",
                "kind": "ClusterBundle",
                "metadata": metadata(json!(annotations)),
                "spec": spec,
            }),
            record: json!({
                "apiVersion": "trust-manager.io/v1alpha2",
                "kind": "ClusterBundle",
                "metadata": metadata(json!({MIGRATED_FROM_ANNOTATION: record})),
            }),
            manager,
            precondition,
        }
    });
    let event = apply.as_ref().map(|apply| {
        let note = format!(
            "Bundle is deprecated; please migrate to ClusterBundle. Applied its spec to ClusterBundle {name:?} as field manager {:?}",
            apply.manager
        );
        Event::normal("MigrationRequired", note).with_action("Migrate")
    });
    // While an apply for this generation is due, the ClusterBundle's status is about an older
    // spec: nothing is mirrored until it has synced the new one.
    let mirror = match (due, cluster_bundle) {
        (false, Some(cb)) => mirrored(bundle, cb),
        _ => None,
    };
    MigrationPlan {
        apply,
        mirror,
        event,
    }
}

/// The pass over a Bundle whose ClusterBundle is someone else's: nothing applied, the Bundle
/// `Synced=False` naming it, and a Warning event when that condition is new.
fn refused(
    bundle: &Bundle,
    name: &str,
    cluster_bundle: &ClusterBundle,
    now: &Time,
) -> MigrationPlan {
    let from = match recorded(cluster_bundle).and_then(|r| r.rsplit_once('/')) {
        Some((uid, _)) => format!("it was applied from another Bundle (UID {uid:?})"),
        None => "it was not applied from a Bundle".to_string(),
    };
    let uid = bundle.metadata.uid.as_deref().unwrap_or_default();
    let message = format!(
        "ClusterBundle {name:?} exists and {from}: nothing was applied to it. To migrate this Bundle over it, set the ClusterBundle's annotation {MIGRATED_FROM_ANNOTATION} to \"{uid}/0\""
    );
    let shown = bundle.status.as_ref();
    let shown_condition = shown.and_then(|s| s.synced());
    let same = shown_condition.is_some_and(|c| {
        c.status == "False"
            && c.reason == MIGRATION_REFUSED
            && c.message == message
            && c.observed_generation == bundle.metadata.generation
    });
    if same {
        return MigrationPlan {
            apply: None,
            mirror: None,
            event: None,
        };
    }
    let last_transition_time = shown_condition
        .filter(|c| c.status == "False")
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    let condition = Condition {
        type_: SYNCED.into(),
        status: "False".into(),
        reason: MIGRATION_REFUSED.into(),
        message: message.clone(),
        last_transition_time,
        observed_generation: bundle.metadata.generation,
    };
    let version = shown.and_then(|s| s.default_ca_version.clone());
    MigrationPlan {
        apply: None,
        mirror: Some((condition, version)),
        event: Some(Event::warning(MIGRATION_REFUSED, message).with_action("Migrate")),
    }
}

/// The ClusterBundle's `Synced` as the Bundle's, when it is about the ClusterBundle's current
/// generation and differs from what the Bundle shows.
fn mirrored(
    bundle: &Bundle,
    cluster_bundle: &ClusterBundle,
) -> Option<(Condition, Option<String>)> {
    let status = cluster_bundle.status.as_ref()?;
    let synced = status.synced()?;
    if synced.observed_generation != cluster_bundle.metadata.generation {
        return None;
    }
    let condition = Condition {
        observed_generation: bundle.metadata.generation,
        ..synced.clone()
    };
    let version = status.default_ca_version.clone();
    let shown = bundle.status.as_ref();
    let shown_condition = shown.and_then(|s| s.synced());
    let shown_version = shown.and_then(|s| s.default_ca_version.clone());
    let same = shown_condition == Some(&condition) && shown_version == version;
    (!same).then_some((condition, version))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    use super::*;
    use crate::trust::api::{BundleStatus, SYNCED};

    fn bundle(generation: i64) -> Bundle {
        let mut bundle: Bundle = serde_json::from_value(json!({
            "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "trust", "uid": "b-uid", "generation": generation},
            "spec": {"sources": [{"inLine": "PEM"}], "target": {"configMap": {"key": "ca.crt"}}},
        }))
        .unwrap();
        let entry =
            |manager: &str, operation: &str, second: i64, fields: Value| ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some(operation.into()),
                time: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
                )),
                fields_v1: Some(FieldsV1(fields)),
                ..Default::default()
            };
        bundle.metadata.managed_fields = Some(vec![
            entry("kubectl-edit", "Update", 3, json!({"f:spec": {}})),
            entry("platform-team", "Apply", 1, json!({"f:spec": {}})),
            entry(FIELD_MANAGER, "Apply", 4, json!({"f:status": {}})),
        ]);
        bundle
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(20).unwrap())
    }

    fn synced(generation: i64, status: &str) -> Condition {
        Condition {
            type_: SYNCED.into(),
            status: status.into(),
            reason: "Synced".into(),
            message: "Successfully synced ClusterBundle to all namespaces".into(),
            observed_generation: Some(generation),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::from_second(10).unwrap()),
        }
    }

    /// The ClusterBundle as the apply of `plan` leaves it, at `generation`.
    fn applied(plan: &MigrationPlan, generation: i64) -> ClusterBundle {
        let mut cb: ClusterBundle =
            serde_json::from_value(plan.apply.as_ref().unwrap().body.clone()).unwrap();
        cb.metadata.generation = Some(generation);
        cb
    }

    #[test]
    fn the_users_applying_manager_is_reused_never_trust_managers() {
        assert_eq!(user_manager(&bundle(1)).as_deref(), Some("platform-team"));
        let mut updated_only = bundle(1);
        updated_only
            .metadata
            .managed_fields
            .as_mut()
            .unwrap()
            .remove(1);
        assert_eq!(user_manager(&updated_only).as_deref(), Some("kubectl-edit"));
        // Entries through a subresource, or of no write operation, name no manager of the spec.
        let mut through_status = updated_only.clone();
        let entries = through_status.metadata.managed_fields.as_mut().unwrap();
        entries[0].subresource = Some("status".into());
        entries.push(ManagedFieldsEntry {
            manager: Some("someone".into()),
            operation: Some("Forged".into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {}}))),
            ..Default::default()
        });
        assert_eq!(user_manager(&through_status), None);
        let mut nobody = bundle(1);
        nobody.metadata.managed_fields = None;
        let plan = migrate(&nobody, None, &now());
        assert_eq!(plan.apply.unwrap().manager, MIGRATION_MANAGER);
    }

    #[test]
    fn a_bundle_is_applied_once_per_generation_without_an_owner_reference() {
        let first = migrate(&bundle(1), None, &now());
        let apply = first.apply.as_ref().expect("a first apply");
        assert_eq!(apply.body["metadata"]["ownerReferences"], Value::Null);
        assert_eq!(apply.body["spec"]["inLineCAs"], "PEM");
        assert_eq!(
            apply.body["metadata"]["annotations"][MIGRATED_FROM_ANNOTATION],
            "b-uid/1"
        );
        assert_eq!(
            apply.record["metadata"]["annotations"][MIGRATED_FROM_ANNOTATION],
            "b-uid/1"
        );
        assert_eq!(first.event.as_ref().unwrap().reason, "MigrationRequired");
        assert!(first.mirror.is_none(), "nothing to mirror yet");

        let cb = applied(&first, 1);
        assert!(
            migrate(&bundle(1), Some(&cb), &now()).apply.is_none(),
            "applied once"
        );
        assert!(
            migrate(&bundle(2), Some(&cb), &now()).apply.is_some(),
            "a spec change applies again"
        );
    }

    #[test]
    fn a_clusterbundle_the_user_took_over_is_never_applied_over() {
        let mut taken = applied(&migrate(&bundle(1), None, &now()), 1);
        let annotations = taken.metadata.annotations.as_mut().unwrap();
        annotations.insert(MIGRATED_ANNOTATION.into(), "true".into());
        assert!(migrate(&bundle(2), Some(&taken), &now()).apply.is_none());
    }

    /// The attack: a ClusterBundle left with the record of an earlier Bundle of the name, and a
    /// new Bundle of that name (another UID) from someone who may only create Bundles.
    #[test]
    fn a_clusterbundle_not_recorded_from_this_bundle_is_refused_with_a_warning() {
        let mut leftover = applied(&migrate(&bundle(1), None, &now()), 1);
        let annotations = leftover.metadata.annotations.as_mut().unwrap();
        annotations.insert(MIGRATED_FROM_ANNOTATION.into(), "earlier-uid/4".into());
        let mut hand_made = leftover.clone();
        hand_made.metadata.annotations = None;
        for (cb, from) in [
            (&leftover, "another Bundle (UID \"earlier-uid\")"),
            (&hand_made, "was not applied from a Bundle"),
        ] {
            let plan = migrate(&bundle(1), Some(cb), &now());
            assert!(plan.apply.is_none(), "nothing is written to it");
            let (condition, _) = plan.mirror.clone().expect("the refusal is shown");
            assert_eq!(
                (condition.status.as_str(), condition.reason.as_str()),
                ("False", MIGRATION_REFUSED)
            );
            assert!(condition.message.contains("ClusterBundle \"trust\""));
            assert!(condition.message.contains(from), "{}", condition.message);
            let event = plan.event.expect("a Warning event");
            assert_eq!(
                (event.type_, event.reason),
                (crate::changes::EventType::Warning, MIGRATION_REFUSED)
            );

            // Shown already: no new write, no new event.
            let mut shown = bundle(1);
            shown.status = Some(BundleStatus {
                conditions: Some(vec![condition]),
                default_ca_version: None,
            });
            let again = migrate(&shown, Some(cb), &now());
            assert_eq!((again.apply, again.mirror, again.event), (None, None, None));
        }

        // A Bundle with no UID (never stored) matches no record, even an empty one.
        let mut no_uid = bundle(1);
        no_uid.metadata.uid = None;
        let mut empty_record = leftover.clone();
        let annotations = empty_record.metadata.annotations.as_mut().unwrap();
        annotations.insert(MIGRATED_FROM_ANNOTATION.into(), "/1".into());
        assert!(matches!(
            standing(&no_uid, Some(&empty_record)),
            Standing::Others(_)
        ));
    }

    #[test]
    fn only_this_bundles_own_clusterbundle_is_applied_over_on_the_version_seen() {
        let first = migrate(&bundle(1), None, &now());
        assert_eq!(first.apply.unwrap().precondition, Precondition::Absent);
        let mut own = applied(&migrate(&bundle(1), None, &now()), 1);
        own.metadata.resource_version = Some("42".into());
        let again = migrate(&bundle(2), Some(&own), &now())
            .apply
            .expect("applied again");
        assert_eq!(again.precondition, Precondition::At("42".into()));
    }

    #[test]
    fn the_bundle_mirrors_a_current_synced_condition_only() {
        let mut cb = applied(&migrate(&bundle(1), None, &now()), 3);
        cb.status = Some(BundleStatus {
            conditions: Some(vec![synced(2, "True")]),
            default_ca_version: Some("v1".into()),
        });
        assert!(
            migrate(&bundle(1), Some(&cb), &now()).mirror.is_none(),
            "about an older spec"
        );

        cb.status.as_mut().unwrap().conditions = Some(vec![synced(3, "True")]);
        let (condition, version) = migrate(&bundle(1), Some(&cb), &now())
            .mirror
            .expect("mirrored");
        assert_eq!(
            condition.observed_generation,
            Some(1),
            "the Bundle's generation"
        );
        assert_eq!(
            (condition.status.as_str(), version.as_deref()),
            ("True", Some("v1"))
        );

        let mut shown = bundle(1);
        shown.status = Some(BundleStatus {
            conditions: Some(vec![condition]),
            default_ca_version: version,
        });
        assert!(
            migrate(&shown, Some(&cb), &now()).mirror.is_none(),
            "already shown"
        );
        assert!(
            migrate(&bundle(2), Some(&cb), &now()).mirror.is_none(),
            "a new Bundle generation waits for its apply"
        );
    }
}
