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
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    /// The CertificateAuthorities of a test (each with the namespaces it signs for), and the
    /// names looked up.
    #[derive(Default)]
    struct Known {
        names: BTreeMap<String, Vec<String>>,
        asked: Mutex<Vec<String>>,
        broken: bool,
    }

    impl Known {
        fn with(names: &[&str]) -> Self {
            Known {
                names: names.iter().map(|n| (n.to_string(), Vec::new())).collect(),
                ..Default::default()
            }
        }

        fn asked(&self) -> Vec<String> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl Issuers for Known {
        async fn spec(&self, name: &str) -> Result<Option<CertificateAuthoritySpec>, String> {
            self.asked.lock().unwrap().push(name.to_string());
            if self.broken {
                return Err("the API server did not answer".into());
            }
            Ok(self.names.get(name).map(|allowed| {
                let ca: CertificateAuthority = serde_json::from_value(ca(json!({
                    "allowedNamespaces": allowed,
                })))
                .unwrap();
                ca.spec
            }))
        }
    }

    fn ca(spec: Value) -> Value {
        let mut base = json!({
            "commonName": "webhooks-ca",
            "secret": {"name": "webhooks-ca", "namespace": "caretaker-system"},
            "bundle": {"name": "webhooks-ca-bundle", "namespace": "caretaker-system"},
        });
        merge(&mut base, spec);
        json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
               "metadata": {"name": "webhooks"}, "spec": base})
    }

    fn issued(spec: Value) -> Value {
        let mut base = json!({
            "issuerRef": {"name": "webhooks"},
            "secretName": "web-tls",
            "commonName": "web.demo.svc",
            "usages": ["server"],
        });
        merge(&mut base, spec);
        json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
               "metadata": {"name": "web", "namespace": "demo"}, "spec": base})
    }

    fn merge(base: &mut Value, changes: Value) {
        for (key, value) in changes.as_object().unwrap() {
            base[key] = value.clone();
        }
    }

    fn gvk(served: Served) -> Value {
        json!({"group": served.group(), "version": served.version(), "kind": served.kind()})
    }

    /// A request as the API server sends it.
    fn request(
        served: Served,
        operation: &str,
        object: Option<Value>,
        old: Option<Value>,
    ) -> AdmissionRequest {
        // As the API server sends it: the namespace of a namespaced object.
        let namespace = object
            .as_ref()
            .and_then(|o| o.pointer("/metadata/namespace"))
            .cloned()
            .unwrap_or(json!(""));
        serde_json::from_value(json!({
            "uid": "b6f1b2c4-0000-4000-8000-000000000001",
            "kind": gvk(served),
            "name": "web",
            "namespace": namespace,
            "operation": operation,
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }))
        .unwrap()
    }

    async fn answer(
        request: &AdmissionRequest,
        served: Served,
        known: &Known,
    ) -> AdmissionResponse {
        let response = admit(request, served, known, Deprecations::default()).await;
        assert_eq!(response.uid, request.uid);
        assert_eq!(response.allowed, response.status.is_none());
        assert!(response.warnings.is_empty(), "nothing is deprecated");
        response
    }

    async fn create(served: Served, object: Value, known: &Known) -> AdmissionResponse {
        answer(
            &request(served, "CREATE", Some(object), None),
            served,
            known,
        )
        .await
    }

    /// The denial's code, reason and message.
    fn denial(response: &AdmissionResponse) -> (u16, &str, &str) {
        let status = response.status.as_ref().expect("a denial");
        (status.code, status.reason.as_str(), status.message.as_str())
    }

    const CA: Served = Served::CertificateAuthority;
    const IC: Served = Served::IssuedCertificate;

    #[tokio::test]
    async fn etcd_certificates_are_judged_by_their_policy() {
        let known = Known::with(&[]);
        let etcd = |spec: Value| {
            json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
                   "metadata": {"name": "etcd", "namespace": "etcd-system"}, "spec": spec})
        };
        let good = etcd(
            json!({"members": [{"name": "m0", "addresses": ["10.0.0.1"]}],
                               "quorum": {"endpoints": ["https://10.0.0.1:2379"]}}),
        );
        assert!(create(Served::EtcdCertificates, good, &known).await.allowed);
        let bad = etcd(
            json!({"members": [{"name": "M0", "addresses": ["10.0.0.1"]}],
                              "signer": {"validity": "5x"},
                              "quorum": {"endpoints": ["http://10.0.0.1:2379"]}}),
        );
        let response = create(Served::EtcdCertificates, bad, &known).await;
        let (code, reason, message) = denial(&response);
        assert_eq!((code, reason), (422, "Invalid"));
        for field in [
            "spec.members[0].name: \"M0\"",
            "spec.signer.validity",
            "spec.quorum.endpoints[0]: \"http://10.0.0.1:2379\"",
        ] {
            assert!(message.contains(field), "{field} in {message}");
        }
    }

    fn bundle(spec: Value) -> Value {
        json!({"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
               "metadata": {"name": "trust"}, "spec": spec})
    }

    #[tokio::test]
    async fn bundles_are_judged_by_trust_managers_rules_in_its_words() {
        let known = Known::with(&[]);
        let good = bundle(
            json!({"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "ca.crt"}}}),
        );
        assert!(create(Served::Bundle, good, &known).await.allowed);

        let one = bundle(json!({"sources": [], "target": {"configMap": {"key": "ca.crt"}}}));
        let response = create(Served::Bundle, one, &known).await;
        assert_eq!(
            denial(&response),
            (
                403,
                "Forbidden",
                "spec.sources: Forbidden: must define at least one source"
            )
        );

        let two = bundle(json!({"sources": [{"inLine": "x"}], "target": {
            "configMap": {"key": "a"}, "additionalFormats": {"jks": {"key": "a"}, "pkcs12": {"key": "a"}}}}));
        let response = create(Served::Bundle, two, &known).await;
        let (_, _, message) = denial(&response);
        assert!(
            message.starts_with("[spec.target.additionalFormats.jks.key: Invalid value: \"a\""),
            "{message}"
        );
        assert!(
            message.ends_with("key must be unique across all target output keys]"),
            "{message}"
        );

        let deleted = request(Served::Bundle, "DELETE", None, None);
        assert!(answer(&deleted, Served::Bundle, &known).await.allowed);
        // A Bundle sent to a caretaker kind's path is refused: the configuration is wrong.
        let misrouted = request(
            Served::Bundle,
            "CREATE",
            Some(bundle(json!({"sources": []}))),
            None,
        );
        assert_eq!(denial(&answer(&misrouted, CA, &known).await).0, 400);
    }

    #[tokio::test]
    async fn a_good_certificate_authority_is_allowed() {
        let response = create(
            CA,
            ca(json!({"validity": "1y", "renewBefore": "30d"})),
            &Known::default(),
        )
        .await;
        assert!(response.allowed, "{response:?}");
    }

    #[tokio::test]
    async fn a_bad_certificate_authority_is_refused_naming_every_field_and_value() {
        let object = ca(json!({
            "validity": "10x",
            "keyAlgorithm": "RSA-1024",
            "trustPropagation": "soon",
        }));
        let response = create(CA, object, &Known::default()).await;
        let (code, reason, message) = denial(&response);
        assert_eq!((code, reason), (422, "Invalid"));
        assert!(
            message.starts_with("CertificateAuthority \"web\" is invalid: "),
            "{message}"
        );
        for part in [
            "spec.keyAlgorithm: \"RSA-1024\" is not a key algorithm",
            "spec.validity: invalid TTL \"10x\"",
            "spec.trustPropagation: invalid TTL \"soon\"",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
    }

    #[tokio::test]
    async fn renew_before_longer_than_the_validity_is_refused() {
        let object = ca(json!({"validity": "1y", "renewBefore": "2y"}));
        let response = create(CA, object, &Known::default()).await;
        assert_eq!(
            denial(&response).2,
            "CertificateAuthority \"web\" is invalid: spec.renewBefore: \"2y\" is not shorter \
             than spec.validity \"1y\""
        );
    }

    #[tokio::test]
    async fn a_good_issued_certificate_naming_an_existing_issuer_is_allowed() {
        let known = Known::with(&["webhooks"]);
        let object = issued(json!({"ipAddresses": ["127.0.0.1", "::1"], "validity": "90d"}));
        let response = create(IC, object, &known).await;
        assert!(response.allowed, "{response:?}");
        assert_eq!(known.asked(), ["webhooks"]);
    }

    #[tokio::test]
    async fn a_bad_ip_address_and_dns_name_are_refused_by_index_and_value() {
        let known = Known::with(&["webhooks"]);
        let object = issued(json!({
            "ipAddresses": ["10.0.0.1", "10.0.0.300"],
            "dnsNames": ["ok.example", "not_ok.example"],
        }));
        let response = create(IC, object, &known).await;
        let (code, _, message) = denial(&response);
        assert_eq!(code, 422);
        assert!(
            message.contains("spec.ipAddresses[1]: \"10.0.0.300\" is not an IP address"),
            "{message}"
        );
        assert!(
            message.contains("spec.dnsNames[1]: \"not_ok.example\" is not a DNS name"),
            "{message}"
        );
    }

    /// A CertificateAuthority that signs only for some namespaces (`spec.allowedNamespaces`):
    /// an IssuedCertificate elsewhere naming it is refused, naming both.
    #[tokio::test]
    async fn an_issuer_that_does_not_sign_for_the_namespace_is_refused() {
        let known = Known {
            names: BTreeMap::from([("webhooks".to_string(), vec!["team-a".to_string()])]),
            ..Default::default()
        };
        let response = create(IC, issued(json!({})), &known).await;
        let (code, reason, message) = denial(&response);
        assert_eq!((code, reason), (422, "Invalid"));
        assert_eq!(
            message,
            "IssuedCertificate \"web\" is invalid: spec.issuerRef.name: CertificateAuthority \
             \"webhooks\" signs only for namespaces [\"team-a\"] (its spec.allowedNamespaces), \
             not \"demo\""
        );
        let mut in_team_a = issued(json!({}));
        in_team_a["metadata"]["namespace"] = json!("team-a");
        assert!(create(IC, in_team_a, &known).await.allowed);
    }

    #[tokio::test]
    async fn an_issuer_that_does_not_exist_is_refused_with_the_other_problems() {
        let known = Known::with(&["other"]);
        let response = create(IC, issued(json!({"validity": "1yr"})), &known).await;
        let (code, reason, message) = denial(&response);
        assert_eq!((code, reason), (422, "Invalid"));
        assert!(
            message.starts_with(
                "IssuedCertificate \"web\" is invalid: spec.validity: invalid TTL \"1yr\": \
                 unknown unit \"yr\""
            ),
            "{message}"
        );
        assert!(
            message
                .ends_with("; spec.issuerRef.name: no CertificateAuthority is named \"webhooks\""),
            "{message}"
        );
        assert_eq!(known.asked(), ["webhooks"]);
    }

    #[tokio::test]
    async fn an_issuer_name_that_cannot_be_one_is_not_looked_up() {
        let known = Known::default();
        let response = create(
            IC,
            issued(json!({"issuerRef": {"name": "Not_A_Name"}})),
            &known,
        )
        .await;
        let message = denial(&response).2;
        assert!(
            message.contains("spec.issuerRef.name: \"Not_A_Name\" is not a valid"),
            "{message}"
        );
        assert!(!message.contains("no CertificateAuthority"), "{message}");
        assert!(known.asked().is_empty());
    }

    #[tokio::test]
    async fn an_issuer_that_cannot_be_looked_up_is_a_server_error() {
        let known = Known {
            broken: true,
            ..Default::default()
        };
        let response = create(IC, issued(json!({})), &known).await;
        assert_eq!(
            denial(&response),
            (
                500,
                "InternalError",
                "IssuedCertificate \"web\": spec.issuerRef.name: could not check that \
                 CertificateAuthority \"webhooks\" exists: the API server did not answer"
            )
        );
        // With known problems, those decide: the object is invalid whatever the issuer.
        let response = create(IC, issued(json!({"usages": ["both"]})), &known).await;
        let (code, _, message) = denial(&response);
        assert_eq!(code, 422);
        assert!(message.contains("spec.usages[0]"), "{message}");
        assert!(message.contains("could not check"), "{message}");
    }

    #[tokio::test]
    async fn updates_are_validated_like_creates() {
        let known = Known::with(&["webhooks"]);
        let old = issued(json!({}));
        let new = issued(json!({"ipAddresses": ["nope"]}));
        let response = answer(
            &request(IC, "UPDATE", Some(new), Some(old.clone())),
            IC,
            &known,
        )
        .await;
        assert!(
            denial(&response)
                .2
                .contains("spec.ipAddresses[0]: \"nope\"")
        );
        let good = issued(json!({"dnsNames": ["web.demo.svc"]}));
        let response = answer(&request(IC, "UPDATE", Some(good), Some(old)), IC, &known).await;
        assert!(response.allowed);
        // The issuer kept its name: it is not looked up again.
        assert!(known.asked().is_empty());
    }

    #[tokio::test]
    async fn an_update_that_changes_the_issuer_has_it_checked() {
        let known = Known::with(&["webhooks"]);
        let old = issued(json!({}));
        let new = issued(json!({"issuerRef": {"name": "gone"}}));
        let response = answer(&request(IC, "UPDATE", Some(new), Some(old)), IC, &known).await;
        assert!(
            denial(&response)
                .2
                .contains("no CertificateAuthority is named \"gone\"")
        );
        assert_eq!(known.asked(), ["gone"]);
    }

    #[tokio::test]
    async fn an_update_that_keeps_the_spec_is_allowed_even_if_the_spec_is_bad() {
        // Stored before the webhook existed; its finalizer must still be removable.
        let known = Known::default();
        let old = issued(json!({"validity": "forever"}));
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!([]);
        new["status"] = json!({"conditions": []});
        let response = answer(&request(IC, "UPDATE", Some(new), Some(old)), IC, &known).await;
        assert!(response.allowed, "{response:?}");
        assert!(known.asked().is_empty());
        let old = ca(json!({"validity": "forever"}));
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"team": "a"});
        let response = answer(&request(CA, "UPDATE", Some(new), Some(old)), CA, &known).await;
        assert!(response.allowed, "{response:?}");
    }

    #[tokio::test]
    async fn dry_run_reviews_are_validated_the_same() {
        let known = Known::with(&["webhooks"]);
        for dry_run in [false, true] {
            let mut bad = request(CA, "CREATE", Some(ca(json!({"validity": "10x"}))), None);
            bad.dry_run = Some(dry_run);
            let response = answer(&bad, CA, &known).await;
            assert!(
                denial(&response).2.contains("spec.validity"),
                "dryRun {dry_run}"
            );
            let mut good = request(IC, "CREATE", Some(issued(json!({}))), None);
            good.dry_run = Some(dry_run);
            assert!(answer(&good, IC, &known).await.allowed, "dryRun {dry_run}");
        }
    }

    #[tokio::test]
    async fn delete_is_allowed_without_validating() {
        let known = Known::default();
        let old = issued(json!({"validity": "forever"}));
        let response = answer(&request(IC, "DELETE", None, Some(old)), IC, &known).await;
        assert!(response.allowed);
        assert!(known.asked().is_empty());
    }

    #[tokio::test]
    async fn connect_is_refused() {
        let response = answer(&request(CA, "CONNECT", None, None), CA, &Known::default()).await;
        let (code, reason, message) = denial(&response);
        assert_eq!((code, reason), (400, "BadRequest"));
        assert!(message.contains("(Connect)"), "{message}");
    }

    #[tokio::test]
    async fn other_kinds_are_refused_not_let_through() {
        let known = Known::default();
        let sent = |group: &str, version: &str, kind: &str| {
            let mut request = request(CA, "CREATE", Some(json!({"kind": kind})), None);
            request.kind =
                serde_json::from_value(json!({"group": group, "version": version, "kind": kind}))
                    .unwrap();
            request
        };
        for (request, what) in [
            (sent("", "v1", "ConfigMap"), "it was sent v1 ConfigMap"),
            (
                sent("apps", "v1", "Deployment"),
                "it was sent apps/v1 Deployment",
            ),
            (
                sent("caretaker.dev", "v1", "CertificateAuthority"),
                "it was sent caretaker.dev/v1 CertificateAuthority",
            ),
            (
                sent("cert-manager.io", "v1alpha1", "CertificateAuthority"),
                "it was sent cert-manager.io/v1alpha1 CertificateAuthority",
            ),
        ] {
            for operation in ["CREATE", "DELETE"] {
                let mut request = request.clone();
                request.operation = serde_json::from_value(json!(operation)).unwrap();
                let response = answer(&request, CA, &known).await;
                let (code, reason, message) = denial(&response);
                assert_eq!((code, reason), (400, "BadRequest"));
                assert!(
                    message.starts_with(
                        "caretaker's webhook validates only caretaker.dev/v1alpha1 \
                         CertificateAuthority, IssuedCertificate and EtcdCertificates"
                    ),
                    "{message}"
                );
                assert!(message.contains(what), "{message}");
            }
        }
        // Each kind only at its own path.
        let misrouted = request(IC, "CREATE", Some(issued(json!({}))), None);
        let response = answer(&misrouted, CA, &known).await;
        let message = denial(&response).2;
        assert!(
            message.contains(
                "/validate-caretaker-dev-v1alpha1-certificateauthority is CertificateAuthority's"
            ) && message.contains("it was sent caretaker.dev/v1alpha1 IssuedCertificate"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_object_that_is_not_the_kind_is_invalid() {
        let response = create(
            CA,
            json!({"metadata": {"name": "x"}, "spec": {"commonName": 3}}),
            &Known::default(),
        )
        .await;
        let (code, _, message) = denial(&response);
        assert_eq!(code, 422);
        assert!(
            message.starts_with("CertificateAuthority \"web\" is invalid: it does not read"),
            "{message}"
        );
        let mut no_object = request(CA, "CREATE", None, None);
        no_object.object = None;
        assert_eq!(
            denial(&answer(&no_object, CA, &Known::default()).await).0,
            400
        );
    }

    #[tokio::test]
    async fn generated_names_are_shown_by_their_prefix() {
        let mut object = ca(json!({"validity": "10x"}));
        object["metadata"] = json!({"generateName": "team-a-"});
        let mut request = request(CA, "CREATE", Some(object), None);
        request.name = String::new();
        let response = answer(&request, CA, &Known::default()).await;
        assert!(
            denial(&response)
                .2
                .starts_with("CertificateAuthority \"team-a-…\" is invalid"),
            "{response:?}"
        );
    }

    #[tokio::test]
    async fn whole_reviews_in_and_out() {
        let known = Known::with(&["webhooks"]);
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": gvk(IC), "operation": "CREATE",
                        "object": issued(json!({})), "dryRun": true},
        });
        let answer = review(
            body.to_string().as_bytes(),
            IC,
            &known,
            Deprecations::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            serde_json::to_value(answer).unwrap(),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u-1", "allowed": true}})
        );
    }

    #[tokio::test]
    async fn what_is_not_a_review_is_a_bad_request() {
        let known = Known::default();
        let bad = |body: &str| {
            let body = body.to_string();
            let known = &known;
            async move {
                review(body.as_bytes(), CA, known, Deprecations::default())
                    .await
                    .unwrap_err()
                    .to_string()
            }
        };
        assert!(
            bad("{")
                .await
                .starts_with("not an admission.k8s.io/v1 AdmissionReview request: ")
        );
        assert!(bad("1").await.contains("invalid type: integer"));
        assert!(bad("").await.contains("EOF"));
        assert!(
            bad("{\"apiVersion\": \"admission.k8s.io/v1beta1\", \"kind\": \"AdmissionReview\"}")
                .await
                .contains("admission.k8s.io/v1beta1")
        );
        assert!(
            bad("{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\"}")
                .await
                .ends_with("it has no request")
        );
        assert!(bad("{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\", \
                      \"request\": {\"kind\": {\"version\": \"v1\", \"kind\": \"X\"}, \"operation\": \"CREATE\"}}")
            .await
            .contains("missing field `uid`"));
    }

    #[tokio::test]
    async fn while_bundles_are_migrated_their_writes_are_warned_about() {
        let known = Known::default();
        let bundle = json!({"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "trust"},
            "spec": {"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "ca.crt"}}}});
        let deprecated = Deprecations { bundles: true };
        for operation in ["CREATE", "UPDATE"] {
            let write = request(Served::Bundle, operation, Some(bundle.clone()), None);
            let response = admit(&write, Served::Bundle, &known, deprecated).await;
            assert!(response.allowed);
            assert_eq!(response.warnings, [BUNDLE_DEPRECATED]);
        }
        // A refusal says why, and a DELETE is not warned about.
        let bad = json!({"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "trust"}, "spec": {"sources": []}});
        let refused = request(Served::Bundle, "CREATE", Some(bad), None);
        let response = admit(&refused, Served::Bundle, &known, deprecated).await;
        assert!(!response.allowed && response.warnings.is_empty());
        let deleted = request(Served::Bundle, "DELETE", None, None);
        let response = admit(&deleted, Served::Bundle, &known, deprecated).await;
        assert!(response.allowed && response.warnings.is_empty());
    }
}
