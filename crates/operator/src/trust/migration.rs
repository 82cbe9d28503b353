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
//! - The ClusterBundle records which Bundle generation it was applied from
//!   ([`MIGRATED_FROM_ANNOTATION`]); it is applied again only when the Bundle's spec changes.
//!   A ClusterBundle that exists without that record, or that carries upstream's
//!   `trust-manager.io/migrated`, is the user's: it is never applied over.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};

use super::api::{Bundle, FIELD_MANAGER};
use super::cluster_bundle::{ClusterBundle, MIGRATED_ANNOTATION, from_bundle};
use crate::changes::Event;

/// The field manager of the migration's own records, and of a ClusterBundle applied from a
/// Bundle that no manager of the user's owns the spec of.
pub const MIGRATION_MANAGER: &str = "caretaker-bundle-migration";
/// On a ClusterBundle applied from a Bundle: `<Bundle UID>/<Bundle generation>`.
pub const MIGRATED_FROM_ANNOTATION: &str = "caretaker.dev/migrated-from-bundle";

/// A ClusterBundle apply: the body, and the field manager to apply it as.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterBundleApply {
    pub manager: String,
    pub body: Value,
    /// The migration's own record of what was applied (applied as [`MIGRATION_MANAGER`], so a
    /// user's apply that drops it from their fields does not remove it).
    pub record: Value,
}

/// One migration pass over a Bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationPlan {
    pub apply: Option<ClusterBundleApply>,
    /// The Bundle's new `Synced` condition and default CA version, mirrored from the
    /// ClusterBundle's; `None` when they already match.
    pub mirror: Option<(Condition, Option<String>)>,
    pub event: Option<Event>,
}

/// What this Bundle generation is recorded as on its ClusterBundle.
pub fn record_of(bundle: &Bundle) -> String {
    let uid = bundle.metadata.uid.as_deref().unwrap_or_default();
    let generation = bundle.metadata.generation.unwrap_or_default();
    format!("{uid}/{generation}")
}

/// The field manager the user applied the Bundle's spec with: of the managers owning fields of
/// `spec`, one that applied them (server-side apply) first, else the latest other one; never
/// caretaker's or trust-manager's own.
pub fn user_manager(bundle: &Bundle) -> Option<String> {
    let entries = bundle.metadata.managed_fields.iter().flatten();
    let owners = entries.filter(|e| {
        let manager = e.manager.as_deref().unwrap_or_default();
        let owns_spec = e
            .fields_v1
            .as_ref()
            .is_some_and(|f| f.0.get("f:spec").is_some());
        owns_spec && !manager.is_empty() && manager != FIELD_MANAGER && manager != MIGRATION_MANAGER
    });
    let mut owners: Vec<_> = owners.collect();
    owners.sort_by_key(|e| (e.operation.as_deref() == Some("Apply"), e.time.clone()));
    owners.last().and_then(|e| e.manager.clone())
}

/// Decides a migration pass over `bundle`, whose ClusterBundle of the same name is
/// `cluster_bundle` (as last seen).
pub fn migrate(bundle: &Bundle, cluster_bundle: Option<&ClusterBundle>) -> MigrationPlan {
    let name = bundle.metadata.name.clone().unwrap_or_default();
    let record = record_of(bundle);
    let recorded = cluster_bundle.and_then(|cb| {
        let annotations = cb.metadata.annotations.as_ref()?;
        annotations
            .get(MIGRATED_FROM_ANNOTATION)
            .map(String::as_str)
    });
    let taken_over = cluster_bundle.is_some_and(|cb| {
        let annotations = cb.metadata.annotations.as_ref();
        let migrated = annotations.is_some_and(|a| a.contains_key(MIGRATED_ANNOTATION));
        migrated || recorded.is_none()
    });
    let due = !taken_over && recorded != Some(record.as_str());
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
        let mut nobody = bundle(1);
        nobody.metadata.managed_fields = None;
        let plan = migrate(&nobody, None);
        assert_eq!(plan.apply.unwrap().manager, MIGRATION_MANAGER);
    }

    #[test]
    fn a_bundle_is_applied_once_per_generation_without_an_owner_reference() {
        let first = migrate(&bundle(1), None);
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
            migrate(&bundle(1), Some(&cb)).apply.is_none(),
            "applied once"
        );
        assert!(
            migrate(&bundle(2), Some(&cb)).apply.is_some(),
            "a spec change applies again"
        );
    }

    #[test]
    fn a_clusterbundle_the_user_made_or_took_over_is_never_applied_over() {
        let mut users: ClusterBundle = applied(&migrate(&bundle(1), None), 1);
        users.metadata.annotations = None;
        assert!(migrate(&bundle(2), Some(&users)).apply.is_none());

        let mut taken = applied(&migrate(&bundle(1), None), 1);
        let annotations = taken.metadata.annotations.as_mut().unwrap();
        annotations.insert(MIGRATED_ANNOTATION.into(), "true".into());
        assert!(migrate(&bundle(2), Some(&taken)).apply.is_none());
    }

    #[test]
    fn the_bundle_mirrors_a_current_synced_condition_only() {
        let mut cb = applied(&migrate(&bundle(1), None), 3);
        cb.status = Some(BundleStatus {
            conditions: Some(vec![synced(2, "True")]),
            default_ca_version: Some("v1".into()),
        });
        assert!(
            migrate(&bundle(1), Some(&cb)).mirror.is_none(),
            "about an older spec"
        );

        cb.status.as_mut().unwrap().conditions = Some(vec![synced(3, "True")]);
        let (condition, version) = migrate(&bundle(1), Some(&cb)).mirror.expect("mirrored");
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
        assert!(migrate(&shown, Some(&cb)).mirror.is_none(), "already shown");
        assert!(
            migrate(&bundle(2), Some(&cb)).mirror.is_none(),
            "a new Bundle generation waits for its apply"
        );
    }
}
