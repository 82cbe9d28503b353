//! The decision: an AdmissionReview in, the response out. Nothing here does I/O but ask
//! [`Issuers`] whether a CertificateAuthority exists.
//!
//! - CREATE and UPDATE of a CertificateAuthority, an IssuedCertificate or an EtcdCertificates:
//!   the spec is
//!   validated by its `policy()`, and every bad field is named with its value in one message
//!   (422 `Invalid`). An IssuedCertificate must also name an existing CertificateAuthority in
//!   `spec.issuerRef.name`, one that signs for its namespace (`spec.allowedNamespaces`).
//! - An UPDATE that leaves `spec` as it was is allowed without validating it: an object stored
//!   before the webhook was installed (or before a rule was added) can still get its
//!   finalizers removed, its labels changed and its status written. So is an UPDATE that keeps
//!   `spec.issuerRef.name` from having its issuer checked again: deleting a CertificateAuthority
//!   does not lock the IssuedCertificates that name it (their controller reports it instead).
//! - DELETE is allowed: there is no spec to validate, and refusing would only keep an object
//!   that the user no longer wants.
//! - Dry-run reviews are validated exactly like the others (the webhook has no side effects).
//! - Anything that is not its own (another kind or version, a kind sent to the other kind's
//!   path, CONNECT) is refused (400 `BadRequest`), naming what was sent: a webhook
//!   configuration whose rules send it other objects is a mistake that should fail loudly
//!   rather than let them through unchecked.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::review::{
    API_VERSION, AdmissionRequest, AdmissionResponse, AdmissionReview, GroupVersionKind, KIND,
    Operation, Status,
};
use crate::authority::{AuthorityPolicy, CertificatePolicy};
use crate::etcd::policy::EtcdPolicy;
use crate::trust::api::Bundle;
use crate::trust::cluster_bundle::ClusterBundle;
use crate::trust::validation;
use crate::validation::SpecError;
use caretaker_api::v1alpha1::{
    self, CertificateAuthority, CertificateAuthoritySpec, EtcdCertificates, IssuedCertificate,
};

/// A kind this webhook validates, each at its own path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    CertificateAuthority,
    IssuedCertificate,
    EtcdCertificates,
    /// trust-manager's Bundle, with trust-manager's rules and messages.
    Bundle,
    /// trust-manager's ClusterBundle, likewise.
    ClusterBundle,
}

impl Served {
    pub const ALL: [Served; 5] = [
        Served::CertificateAuthority,
        Served::IssuedCertificate,
        Served::EtcdCertificates,
        Served::Bundle,
        Served::ClusterBundle,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            Served::CertificateAuthority => "CertificateAuthority",
            Served::IssuedCertificate => "IssuedCertificate",
            Served::EtcdCertificates => "EtcdCertificates",
            Served::Bundle => "Bundle",
            Served::ClusterBundle => "ClusterBundle",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Served::CertificateAuthority | Served::IssuedCertificate | Served::EtcdCertificates => {
                v1alpha1::GROUP
            }
            Served::Bundle => "trust.cert-manager.io",
            Served::ClusterBundle => "trust-manager.io",
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            Served::CertificateAuthority | Served::IssuedCertificate | Served::EtcdCertificates => {
                v1alpha1::VERSION
            }
            Served::Bundle => "v1alpha1",
            Served::ClusterBundle => "v1alpha2",
        }
    }

    /// Whether objects of the kind live in namespaces.
    pub fn namespaced(self) -> bool {
        matches!(self, Served::IssuedCertificate | Served::EtcdCertificates)
    }

    /// The kind's resource (plural), as webhook rules name it.
    pub fn resource(self) -> &'static str {
        match self {
            Served::CertificateAuthority => "certificateauthorities",
            Served::IssuedCertificate => "issuedcertificates",
            Served::EtcdCertificates => "etcdcertificates",
            Served::Bundle => "bundles",
            Served::ClusterBundle => "clusterbundles",
        }
    }

    /// The name of this kind's webhook in a configuration: `<resource>.<group>`.
    pub fn webhook_name(self) -> String {
        format!("{}.{}", self.resource(), self.group())
    }

    /// Where the webhook serves this kind, in controller-runtime's naming:
    /// `/validate-<group with dashes>-<version>-<lowercase kind>`.
    pub fn path(self) -> &'static str {
        match self {
            Served::CertificateAuthority => "/validate-caretaker-dev-v1alpha1-certificateauthority",
            Served::IssuedCertificate => "/validate-caretaker-dev-v1alpha1-issuedcertificate",
            Served::EtcdCertificates => "/validate-caretaker-dev-v1alpha1-etcdcertificates",
            Served::Bundle => "/validate-trust-cert-manager-io-v1alpha1-bundle",
            Served::ClusterBundle => "/validate-trust-manager-io-v1alpha2-clusterbundle",
        }
    }

    /// The kind served at `path`, if any.
    pub fn at(path: &str) -> Option<Served> {
        Served::ALL.into_iter().find(|served| served.path() == path)
    }

    fn is(self, kind: &GroupVersionKind) -> bool {
        kind.group == self.group() && kind.version == self.version() && kind.kind == self.kind()
    }
}

/// Whether CertificateAuthorities exist: a GET in the operator
/// ([`super::ApiIssuers`]), a set in tests.
pub trait Issuers: Send + Sync {
    /// The spec of CertificateAuthority `name` (`None`: there is none), or why it could not
    /// be read.
    fn spec(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<CertificateAuthoritySpec>, String>> + Send;
}

/// A body that is not an `admission.k8s.io/v1` AdmissionReview with a request: answered with
/// HTTP 400, as there is no request uid to answer a review with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an {API_VERSION} {KIND} request: {0}")]
pub struct BadReview(pub String);

/// The answer to the review in `body`, sent to `served`'s path.
pub async fn review(
    body: &[u8],
    served: Served,
    issuers: &impl Issuers,
    deprecations: Deprecations,
) -> Result<AdmissionReview, BadReview> {
    let review: AdmissionReview =
        serde_json::from_slice(body).map_err(|e| BadReview(e.to_string()))?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(BadReview(format!(
            "it is apiVersion {:?}, kind {:?} (set admissionReviewVersions to [v1])",
            review.api_version, review.kind
        )));
    }
    let request = review
        .request
        .ok_or_else(|| BadReview("it has no request".into()))?;
    Ok(AdmissionReview::answer(
        admit(&request, served, issuers, deprecations).await,
    ))
}

/// What the webhook tells clients is deprecated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deprecations {
    /// Bundles (`--bundle-mode migrate`): every allowed create or update of one is answered
    /// with [`BUNDLE_DEPRECATED`].
    pub bundles: bool,
}

/// The warning on a Bundle write while Bundles are migrated.
pub const BUNDLE_DEPRECATED: &str = "trust.cert-manager.io/v1alpha1 Bundle is deprecated: caretaker applies it as the trust-manager.io/v1alpha2 ClusterBundle of the same name; switch to ClusterBundle";

/// The verdict on `request`, sent to `served`'s path.
pub async fn admit(
    request: &AdmissionRequest,
    served: Served,
    issuers: &impl Issuers,
    deprecations: Deprecations,
) -> AdmissionResponse {
    let verdict = verdict(request, served, issuers).await.err();
    let writes = matches!(request.operation, Operation::Create | Operation::Update);
    let deprecated = served == Served::Bundle && deprecations.bundles && writes;
    let warnings = if deprecated && verdict.is_none() {
        vec![BUNDLE_DEPRECATED.to_string()]
    } else {
        Vec::new()
    };
    AdmissionResponse {
        uid: request.uid.clone(),
        allowed: verdict.is_none(),
        status: verdict,
        warnings,
    }
}

/// trust-manager's answer: its field errors aggregated as Kubernetes aggregates them (repeats
/// dropped; one alone, or all in brackets).
fn trust_managers_answer(problems: Vec<String>) -> Result<(), Status> {
    let mut unique: Vec<String> = Vec::new();
    for problem in problems {
        if !unique.contains(&problem) {
            unique.push(problem);
        }
    }
    match unique.as_slice() {
        [] => Ok(()),
        [one] => Err(status(403, "Forbidden", one.clone())),
        many => Err(status(403, "Forbidden", format!("[{}]", many.join(", ")))),
    }
}

fn status(code: u16, reason: &str, message: String) -> Status {
    Status {
        code,
        message,
        reason: reason.into(),
    }
}

async fn verdict(
    request: &AdmissionRequest,
    served: Served,
    issuers: &impl Issuers,
) -> Result<(), Status> {
    if !served.is(&request.kind) {
        return Err(status(
            400,
            "BadRequest",
            format!(
                "caretaker's webhook validates only {group}/{version} CertificateAuthority, \
                 IssuedCertificate and EtcdCertificates, trust.cert-manager.io/v1alpha1 Bundle and \
                 trust-manager.io/v1alpha2 ClusterBundle, each at its own \
                 path ({path} is {kind}'s); it was sent {sent}: the rules of the webhook \
                 configuration that called it are wrong",
                group = v1alpha1::GROUP,
                version = v1alpha1::VERSION,
                path = served.path(),
                kind = served.kind(),
                sent = request.kind,
            ),
        ));
    }
    match request.operation {
        Operation::Create | Operation::Update => {}
        Operation::Delete => return Ok(()),
        Operation::Connect | Operation::Unknown => {
            return Err(status(
                400,
                "BadRequest",
                format!(
                    "caretaker's webhook validates CREATE and UPDATE (and allows DELETE); it was \
                     sent another operation ({:?}): the rules of the webhook configuration that \
                     called it are wrong",
                    request.operation
                ),
            ));
        }
    }
    let Some(object) = &request.object else {
        return Err(status(
            400,
            "BadRequest",
            format!("the {:?} review has no object", request.operation),
        ));
    };
    let old = request.old_object.as_ref();
    if old.is_some_and(|old| old.get("spec") == object.get("spec")) {
        return Ok(());
    }
    let name = display_name(request, object);
    let mut problems = Vec::new();
    let mut unchecked = None;
    match served {
        Served::Bundle => {
            let bundle: Bundle = parse(served, &name, object)?;
            return trust_managers_answer(validation::problems(&bundle));
        }
        Served::ClusterBundle => {
            let bundle: ClusterBundle = parse(served, &name, object)?;
            return trust_managers_answer(validation::cluster_bundle_problems(&bundle));
        }
        Served::CertificateAuthority => {
            let ca: CertificateAuthority = parse(served, &name, object)?;
            problems.extend(field_problems(AuthorityPolicy::from_spec(&ca.spec).err()));
        }
        Served::EtcdCertificates => {
            let etcd: EtcdCertificates = parse(served, &name, object)?;
            problems.extend(field_problems(EtcdPolicy::from_spec(&etcd.spec).err()));
        }
        Served::IssuedCertificate => {
            let certificate: IssuedCertificate = parse(served, &name, object)?;
            let spec_problems = CertificatePolicy::from_spec(&certificate.spec).err();
            let issuer = &certificate.spec.issuer_ref.name;
            let issuer_name_ok = !spec_problems.iter().any(|e| {
                e.errors
                    .iter()
                    .any(|field| field.field == "spec.issuerRef.name")
            });
            let old_issuer = old.and_then(|old| old.pointer("/spec/issuerRef/name"));
            let issuer_is_new = old_issuer.and_then(Value::as_str) != Some(issuer.as_str());
            problems.extend(field_problems(spec_problems));
            if issuer_name_ok && issuer_is_new {
                let namespace = &request.namespace;
                match issuers.spec(issuer).await {
                    Ok(Some(ca)) if ca.issues_to(namespace) => {}
                    Ok(Some(ca)) => problems.push(format!(
                        "spec.issuerRef.name: CertificateAuthority {issuer:?} signs only for \
                         namespaces {:?} (its spec.allowedNamespaces), not {namespace:?}",
                        ca.allowed_namespaces
                    )),
                    Ok(None) => problems.push(format!(
                        "spec.issuerRef.name: no CertificateAuthority is named {issuer:?}"
                    )),
                    Err(e) => {
                        unchecked = Some(format!(
                            "spec.issuerRef.name: could not check that CertificateAuthority \
                             {issuer:?} exists: {e}"
                        ))
                    }
                }
            }
        }
    }
    match (problems.is_empty(), unchecked) {
        (true, None) => Ok(()),
        // Nothing is known to be wrong: a server error, so that the user tries again.
        (true, Some(unchecked)) => Err(status(
            500,
            "InternalError",
            format!("{} {name:?}: {unchecked}", served.kind()),
        )),
        (false, unchecked) => {
            problems.extend(unchecked);
            Err(status(
                422,
                "Invalid",
                format!(
                    "{} {name:?} is invalid: {}",
                    served.kind(),
                    problems.join("; ")
                ),
            ))
        }
    }
}

/// The object's name, or what stands for it when the API server is to generate it.
fn display_name(request: &AdmissionRequest, object: &Value) -> String {
    let metadata = |field: &str| {
        object
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if !request.name.is_empty() {
        request.name.clone()
    } else if let Some(name) = metadata("name") {
        name.to_string()
    } else if let Some(prefix) = metadata("generateName") {
        format!("{prefix}…")
    } else {
        String::new()
    }
}

/// `object` as the served kind's type: the API server has checked it against the CRD's
/// schema, so this fails only when the CRD installed is not the one this operator was built
/// with.
fn parse<T: DeserializeOwned>(served: Served, name: &str, object: &Value) -> Result<T, Status> {
    serde_json::from_value(object.clone()).map_err(|e| {
        status(
            422,
            "Invalid",
            format!(
                "{kind} {name:?} is invalid: it does not read as this operator's {kind} ({e}); \
                 is the installed CRD the one `caretaker crds` prints?",
                kind = served.kind(),
            ),
        )
    })
}

fn field_problems(error: Option<SpecError>) -> impl Iterator<Item = String> {
    error
        .into_iter()
        .flat_map(|e| e.errors)
        .map(|field| field.to_string())
}

#[cfg(test)]
mod tests;
