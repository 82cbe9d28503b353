//! The fields each kind can be selected by (`fieldSelector`), as kube-apiserver's field label
//! conversion functions name them: a label another kind has, or none at all, is 400 with that
//! function's message. Custom resources add their CRD version's `selectableFields`.

use crate::error::ApiError;
use crate::selectors::FieldSelector;
use crate::store::registry::{Flavor, ResourceDef};

/// How a kind's conversion function words a label it does not know.
#[derive(Clone, Copy)]
enum Refusal {
    /// `field label not supported: LABEL` (the core kinds with a function of their own, and
    /// custom resources).
    NotSupported,
    /// `field label "LABEL" not supported for batchv1.Job`.
    Job,
    /// `"LABEL" is not a known field selector: only "metadata.name", "metadata.namespace"`:
    /// `DefaultMetaV1FieldSelectorConversion`, for every kind without a function.
    Default,
}

/// A label, the path of the served object it selects on, and what it reads as when the object
/// lacks the field (Go's zero value where kube-apiserver's field set formats a bool or number).
type Label = (&'static str, &'static str, &'static str);

const NAME: Label = ("metadata.name", "metadata.name", "");
const NAMESPACE: Label = ("metadata.namespace", "metadata.namespace", "");

/// The kinds with a conversion function of their own: group, kind, labels.
#[rustfmt::skip]
const KINDS: &[(&str, &str, &[Label], Refusal)] = &[
    ("", "Pod", &[NAME, NAMESPACE, ("spec.nodeName", "spec.nodeName", ""),
        ("spec.restartPolicy", "spec.restartPolicy", ""),
        ("spec.schedulerName", "spec.schedulerName", ""),
        ("spec.serviceAccountName", "spec.serviceAccountName", ""),
        ("spec.hostNetwork", "spec.hostNetwork", "false"), ("status.phase", "status.phase", ""),
        ("status.podIP", "status.podIP", ""), ("status.podIPs", "status.podIP", ""),
        ("status.nominatedNodeName", "status.nominatedNodeName", ""),
        // Old v1 clients' name of spec.nodeName.
        ("spec.host", "spec.nodeName", "")], Refusal::NotSupported),
    ("", "Node", &[NAME, ("spec.unschedulable", "spec.unschedulable", "false")],
        Refusal::NotSupported),
    ("", "ReplicationController", &[NAME, NAMESPACE, ("status.replicas", "status.replicas", "0")],
        Refusal::NotSupported),
    ("", "Event", &[("involvedObject.kind", "involvedObject.kind", ""),
        ("involvedObject.namespace", "involvedObject.namespace", ""),
        ("involvedObject.name", "involvedObject.name", ""),
        ("involvedObject.uid", "involvedObject.uid", ""),
        ("involvedObject.apiVersion", "involvedObject.apiVersion", ""),
        ("involvedObject.resourceVersion", "involvedObject.resourceVersion", ""),
        ("involvedObject.fieldPath", "involvedObject.fieldPath", ""), ("reason", "reason", ""),
        ("reportingComponent", "reportingComponent", ""), ("source", "source.component", ""),
        ("type", "type", ""), NAMESPACE, NAME], Refusal::NotSupported),
    ("", "Namespace", &[("status.phase", "status.phase", ""), NAME], Refusal::NotSupported),
    ("", "Secret", &[("type", "type", ""), NAMESPACE, NAME], Refusal::NotSupported),
    ("", "Service", &[NAMESPACE, NAME, ("spec.clusterIP", "spec.clusterIP", ""),
        ("spec.type", "spec.type", "")], Refusal::NotSupported),
    ("batch", "Job", &[NAME, NAMESPACE, ("status.successful", "status.succeeded", "0")], Refusal::Job),
    ("certificates.k8s.io", "ClusterTrustBundle", &[NAME, ("spec.signerName", "spec.signerName", "")],
        Refusal::NotSupported),
];

/// `selector` with each label replaced by the path it selects on in `def`'s objects; 400 with
/// kube-apiserver's message for a label `def` cannot be selected by.
pub fn convert(def: &ResourceDef, selector: FieldSelector) -> Result<FieldSelector, ApiError> {
    if def.flavor == Flavor::CustomResource {
        return selector.convert_labels(|label| {
            let meta =
                label == "metadata.name" || (def.namespaced && label == "metadata.namespace");
            let declared = def.selectable_fields.iter().any(|f| f == label);
            (meta || declared)
                .then(|| (label.to_string(), ""))
                .ok_or_else(|| refused(Refusal::NotSupported, label))
        });
    }
    let own = KINDS
        .iter()
        .find(|(group, kind, _, _)| *group == def.group && *kind == def.kind);
    let (labels, refusal) = match own {
        Some((_, _, labels, refusal)) => (*labels, *refusal),
        None => (&[NAME, NAMESPACE][..], Refusal::Default),
    };
    selector.convert_labels(|label| {
        labels
            .iter()
            .find(|(l, _, _)| *l == label)
            .map(|(_, path, missing)| (path.to_string(), *missing))
            .ok_or_else(|| refused(refusal, label))
    })
}

fn refused(refusal: Refusal, label: &str) -> ApiError {
    ApiError::bad_request(match refusal {
        Refusal::NotSupported => format!("field label not supported: {label}"),
        Refusal::Job => format!("field label {label:?} not supported for batchv1.Job"),
        Refusal::Default => format!(
            "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ),
    })
}
