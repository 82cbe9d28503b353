//! The `admission.k8s.io/v1` AdmissionReview, as it travels: the part of its request the
//! webhook reads and the response it writes. k8s-openapi has no admission types (they are not
//! served by the API, only sent to webhooks), so these follow the wire format of
//! `k8s.io/api/admission/v1` field by field; what a review carries beyond them (userInfo,
//! options, requestKind, …) is ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of every review this webhook reads and writes.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of every review.
pub const KIND: &str = "AdmissionReview";

/// An AdmissionReview: the API server sends one with a `request`, the webhook answers with
/// one holding only a `response`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

impl AdmissionReview {
    /// The review that answers a request with `response`.
    pub fn answer(response: AdmissionResponse) -> Self {
        AdmissionReview {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            request: None,
            response: Some(response),
        }
    }
}

/// What is being admitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Copied into the response: the API server matches the two by it.
    pub uid: String,
    /// The kind of `object` (after conversion to the version the webhook asked for).
    pub kind: GroupVersionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    /// The object's name; empty on a CREATE whose name is generated.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The object's namespace; empty for a cluster-scoped object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub operation: Operation,
    /// The object as it would be stored: absent (null) on DELETE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// The stored object: on UPDATE and DELETE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
    /// Nothing will be stored: the webhook must have no side effects (it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// A group, version and kind, as `metav1.GroupVersionKind` (the core group is `""`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl std::fmt::Display for GroupVersionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.group.as_str() {
            "" => write!(f, "{} {}", self.version, self.kind),
            group => write!(f, "{group}/{} {}", self.version, self.kind),
        }
    }
}

/// The operation being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
    /// Anything else (none exists today).
    #[serde(other)]
    Unknown,
}

/// The webhook's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    /// Why not, when not allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Warnings the API server passes to the client (kubectl prints them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The part of a `metav1.Status` an admission response carries: the API server passes the
/// code and reason to the client and puts the message after "admission webhook … denied the
/// request: ".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// An HTTP status code, 400 to 599.
    pub code: u16,
    pub message: String,
    /// A `metav1.StatusReason`: `Invalid`, `BadRequest`, `InternalError`.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A review as kube-apiserver sends it, every field it has.
    #[test]
    fn reads_a_review_as_kube_apiserver_sends_it() {
        let review: AdmissionReview = serde_json::from_value(json!({
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "caretaker.dev", "version": "v1alpha1",
                         "kind": "IssuedCertificate"},
                "resource": {"group": "caretaker.dev", "version": "v1alpha1",
                             "resource": "issuedcertificates"},
                "requestKind": {"group": "caretaker.dev", "version": "v1alpha1",
                                "kind": "IssuedCertificate"},
                "requestResource": {"group": "caretaker.dev", "version": "v1alpha1",
                                    "resource": "issuedcertificates"},
                "name": "web",
                "namespace": "demo",
                "operation": "UPDATE",
                "userInfo": {"username": "admin", "uid": "014fbff9a07c",
                             "groups": ["system:authenticated"]},
                "object": {"apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate"},
                "oldObject": {"apiVersion": "caretaker.dev/v1alpha1",
                              "kind": "IssuedCertificate"},
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
                "dryRun": true
            }
        }))
        .unwrap();
        assert_eq!(
            (review.api_version.as_str(), review.kind.as_str()),
            (API_VERSION, KIND)
        );
        let request = review.request.unwrap();
        assert_eq!(request.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(
            request.kind.to_string(),
            "caretaker.dev/v1alpha1 IssuedCertificate"
        );
        assert_eq!(
            (request.name.as_str(), request.namespace.as_str()),
            ("web", "demo")
        );
        assert_eq!(request.operation, Operation::Update);
        assert!(request.object.is_some() && request.old_object.is_some());
        assert_eq!(request.dry_run, Some(true));
        assert_eq!(request.sub_resource, None);
    }

    #[test]
    fn delete_has_no_object_and_core_kinds_no_group() {
        let request: AdmissionRequest = serde_json::from_value(json!({
            "uid": "1", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "operation": "DELETE", "object": null, "oldObject": {"kind": "ConfigMap"},
        }))
        .unwrap();
        assert_eq!(request.object, None);
        assert_eq!(request.kind.to_string(), "v1 ConfigMap");
        let unknown: Operation = serde_json::from_value(json!("PATCH")).unwrap();
        assert_eq!(unknown, Operation::Unknown);
    }

    #[test]
    fn writes_a_response_as_kube_apiserver_reads_it() {
        let allowed = AdmissionReview::answer(AdmissionResponse {
            uid: "1".into(),
            allowed: true,
            status: None,
            warnings: Vec::new(),
        });
        assert_eq!(
            serde_json::to_value(&allowed).unwrap(),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "1", "allowed": true}})
        );
        let denied = AdmissionReview::answer(AdmissionResponse {
            uid: "2".into(),
            allowed: false,
            status: Some(Status {
                code: 422,
                message: "no".into(),
                reason: "Invalid".into(),
            }),
            warnings: vec!["careful".into()],
        });
        assert_eq!(
            serde_json::to_value(&denied).unwrap(),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "2", "allowed": false, "warnings": ["careful"],
                                "status": {"code": 422, "message": "no", "reason": "Invalid"}}})
        );
    }
}
