//! CA-bundle injection, in place of cert-manager's cainjector: which trust bundle a
//! ValidatingWebhookConfiguration, MutatingWebhookConfiguration, CustomResourceDefinition (its
//! conversion webhook) or APIService asks for, and the write that puts it into every one of
//! its `caBundle` fields, or nothing when they all hold it already. Pure: the glue in
//! [`controller`] reads the objects and carries the [`Decision`] out.
//!
//! A target asks with one of two annotations ([`caretaker_api::names::injection`]):
//! - `caretaker.dev/inject-ca-from: <name>`: the trust bundle of that CertificateAuthority, the
//!   `ca-bundle.crt` key of its `spec.bundle` ConfigMap, exactly as the CA's controller keeps
//!   it there (the current CA and every older one still trusted): injection never adds, drops
//!   or reorders a certificate of its own accord. Only while every certificate in it is one
//!   of the CA's own, held in its `spec.secret` (`tls.crt`, `next.crt`, `previous.crt`):
//!   whoever can write a ConfigMap must not get a CA of theirs trusted by the API server;
//! - `cert-manager.io/inject-ca-from-secret: <namespace>/<name>`: that Secret's `ca.crt`, only
//!   when the Secret itself allows it with `cert-manager.io/allow-direct-injection: "true"`
//!   (cainjector's rule: otherwise whoever may annotate a webhook configuration could make the
//!   API server trust the CA of any Secret in the cluster).
//!
//! The source's bytes are written as they are (base64, as the API serves `caBundle`). A source
//! that is missing, empty or not a bundle of PEM certificates is never written: the target
//! keeps what it holds and gets a Warning event saying what is missing or wrong.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use crate::changes::Event;
use crate::validation::is_rfc1123;
use caretaker_api::names::injection::{
    ALLOW_DIRECT_INJECTION, EVENT_INJECTED, EVENT_REFUSED, EVENT_SOURCE_MISSING, INJECT_CA_FROM,
    INJECT_CA_FROM_SECRET, SECRET_CA_KEY,
};
use caretaker_api::names::{NEXT_CRT, PREVIOUS_CRT, TLS_CRT};
use caretaker_api::v1alpha1::{BUNDLE_KEY, NamespacedName};

pub mod controller;
#[cfg(test)]
mod tests;

/// The kinds whose `caBundle` fields caretaker fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// `admissionregistration.k8s.io/v1`: every `webhooks[].clientConfig.caBundle`.
    ValidatingWebhookConfiguration,
    /// `admissionregistration.k8s.io/v1`: every `webhooks[].clientConfig.caBundle`.
    MutatingWebhookConfiguration,
    /// `apiextensions.k8s.io/v1`: `spec.conversion.webhook.clientConfig.caBundle`, when
    /// `spec.conversion.strategy` is `Webhook` (otherwise there is nothing to fill, and the CRD
    /// is left alone, as cainjector leaves it).
    CustomResourceDefinition,
    /// `apiregistration.k8s.io/v1`: `spec.caBundle`.
    ApiService,
}

impl TargetKind {
    pub const ALL: [TargetKind; 4] = [
        TargetKind::ValidatingWebhookConfiguration,
        TargetKind::MutatingWebhookConfiguration,
        TargetKind::CustomResourceDefinition,
        TargetKind::ApiService,
    ];

    /// The kind's resource (all four are cluster-scoped).
    pub fn api_resource(self) -> ApiResource {
        let (group, plural) = match self {
            Self::ValidatingWebhookConfiguration => (
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
            ),
            Self::MutatingWebhookConfiguration => (
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
            ),
            Self::CustomResourceDefinition => ("apiextensions.k8s.io", "customresourcedefinitions"),
            Self::ApiService => ("apiregistration.k8s.io", "apiservices"),
        };
        ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: format!("{group}/v1"),
            kind: self.kind().into(),
            plural: plural.into(),
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Self::ValidatingWebhookConfiguration => "ValidatingWebhookConfiguration",
            Self::MutatingWebhookConfiguration => "MutatingWebhookConfiguration",
            Self::CustomResourceDefinition => "CustomResourceDefinition",
            Self::ApiService => "APIService",
        }
    }

    fn has_webhooks(self) -> bool {
        matches!(
            self,
            Self::ValidatingWebhookConfiguration | Self::MutatingWebhookConfiguration
        )
    }
}

/// What a target injects from, as its annotation names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceRef {
    /// `caretaker.dev/inject-ca-from`: a CertificateAuthority (cluster-scoped).
    Authority { name: String },
    /// `cert-manager.io/inject-ca-from-secret`: a Secret.
    Secret { namespace: String, name: String },
}

impl SourceRef {
    /// The source named by `annotations`, if any: strictly parsed, and only one of the two.
    pub fn of<'a>(
        annotations: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Option<SourceRef>, AnnotationError> {
        match (
            annotations(INJECT_CA_FROM),
            annotations(INJECT_CA_FROM_SECRET),
        ) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(AnnotationError::BothSources),
            (Some(value), None) => Self::authority(value).map(Some),
            (None, Some(value)) => Self::secret(value).map(Some),
        }
    }

    /// The source a target's annotations name.
    pub fn of_object(target: &DynamicObject) -> Result<Option<SourceRef>, AnnotationError> {
        let annotations = target.metadata.annotations.as_ref();
        Self::of(|key| annotations.and_then(|a| a.get(key)).map(String::as_str))
    }

    fn authority(value: &str) -> Result<Self, AnnotationError> {
        let problem = if value.is_empty() {
            Some("it is empty; expected the name of a CertificateAuthority")
        } else if value.contains('/') {
            Some(
                "a CertificateAuthority is cluster-scoped: give its name alone, without a namespace",
            )
        } else if !is_rfc1123(value, 253, true) {
            Some(
                "expected the name of a CertificateAuthority: lowercase letters, digits, '-' and \
                 '.', starting and ending with a letter or digit, at most 253 characters",
            )
        } else {
            None
        };
        match problem {
            None => Ok(Self::Authority {
                name: value.to_string(),
            }),
            Some(problem) => Err(AnnotationError::malformed(INJECT_CA_FROM, value, problem)),
        }
    }

    fn secret(value: &str) -> Result<Self, AnnotationError> {
        const FORM: &str = "expected <namespace>/<name> of a Secret";
        let malformed = |problem| AnnotationError::malformed(INJECT_CA_FROM_SECRET, value, problem);
        let mut parts = value.split('/');
        let (Some(namespace), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(malformed(FORM));
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(malformed(FORM));
        }
        if !is_rfc1123(namespace, 63, false) {
            return Err(malformed(
                "the part before '/' is not a namespace name: lowercase letters, digits and \
                 '-', starting and ending with a letter or digit, at most 63 characters",
            ));
        }
        if !is_rfc1123(name, 253, true) {
            return Err(malformed(
                "the part after '/' is not a Secret name: lowercase letters, digits, '-' and \
                 '.', starting and ending with a letter or digit, at most 253 characters",
            ));
        }
        Ok(Self::Secret {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Authority { name } => write!(f, "CertificateAuthority {name}"),
            Self::Secret { namespace, name } => write!(f, "Secret {namespace}/{name}"),
        }
    }
}

/// An injection annotation caretaker cannot act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The value, escaped and cut short when long, is in `shown`.
    #[error("{annotation}: {shown} is not accepted: {problem}")]
    Malformed {
        annotation: &'static str,
        shown: String,
        problem: &'static str,
    },
    #[error(
        "both {INJECT_CA_FROM} and {INJECT_CA_FROM_SECRET} are set; caretaker injects from one \
         source only: remove one of them"
    )]
    BothSources,
}

impl AnnotationError {
    fn malformed(annotation: &'static str, value: &str, problem: &'static str) -> Self {
        Self::Malformed {
            annotation,
            shown: shown(value),
            problem,
        }
    }
}

/// How much of a refused value a message repeats: enough to recognise it, never a wall of
/// text (an annotation value may be 256 KiB).
const SHOWN_VALUE_CHARS: usize = 80;

/// `value` quoted with every control, format and non-ASCII character escaped, cut short (with
/// its length in bytes) when long.
fn shown(value: &str) -> String {
    let cut: String = value.chars().take(SHOWN_VALUE_CHARS).collect();
    let mut escaped = String::new();
    for c in format!("{cut:?}").chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            escaped.extend(c.escape_unicode());
        }
    }
    if cut.len() < value.len() {
        escaped.push_str(&format!("... ({} bytes)", value.len()));
    }
    escaped
}

/// What the target asks to inject from, when it has a `caBundle` field to fill: `None` without
/// an injection annotation, and for a CRD without a conversion webhook or a webhook
/// configuration without webhooks (a malformed annotation is reported even then).
pub fn request(
    kind: TargetKind,
    target: &DynamicObject,
) -> Result<Option<SourceRef>, AnnotationError> {
    let source = SourceRef::of_object(target)?;
    Ok(source.filter(|_| !points(kind, &target.data).is_empty()))
}

/// Whether an object in `namespace` may be read by an operator that watches only `scope`
/// (every namespace when `None`).
pub fn in_scope(namespace: &str, scope: Option<&str>) -> bool {
    scope.is_none_or(|scope| scope == namespace)
}

/// The bundle ConfigMap a CertificateAuthority publishes to (its `spec.bundle`), if it names one.
pub fn bundle_of(authority: &DynamicObject) -> Option<NamespacedName> {
    serde_json::from_value(authority.data.get("spec")?.get("bundle")?.clone()).ok()
}

/// The Secret a CertificateAuthority keeps its CAs in (its `spec.secret`), if it names one.
pub fn secret_of(authority: &DynamicObject) -> Option<NamespacedName> {
    serde_json::from_value(authority.data.get("spec")?.get("secret")?.clone()).ok()
}

/// What the glue read for a target's source. Only what the source needs is looked at: the
/// CertificateAuthority, its bundle ConfigMap and its CA Secret, or the Secret.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sources<'a> {
    /// Whether the CertificateAuthority CRD is installed (to say so when a CA is not found).
    pub authority_crd_installed: bool,
    pub authority: Option<&'a DynamicObject>,
    /// The ConfigMap the authority's `spec.bundle` names.
    pub config_map: Option<&'a ConfigMap>,
    /// The Secret the authority's `spec.secret` names, read after the ConfigMap (its
    /// controller stores a CA there before it publishes it).
    pub authority_secret: Option<&'a Secret>,
    pub secret: Option<&'a Secret>,
    /// Why the authority's Secret or bundle ConfigMap, read above, is not the authority's
    /// own (see [`crate::ownership`]: it carries another object's mark, or none, or the
    /// Secret is where `--authority-secret-namespaces` allows no CA Secret): then nothing of
    /// it is injected, as nothing is signed from it.
    pub authority_refused: Option<&'a str>,
}

/// Why a source gives nothing to inject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceProblem {
    #[error("CertificateAuthority {name} not found{}", if *.crd_installed { "" } else {
        " (its CRD, certificateauthorities.caretaker.dev, is not installed)"
    })]
    NoAuthority { name: String, crd_installed: bool },
    /// `what`: "bundle ConfigMap in spec.bundle", "Secret in spec.secret".
    #[error("CertificateAuthority {authority} names no {what}")]
    AuthorityWithout {
        authority: String,
        what: &'static str,
    },
    #[error(
        "ConfigMap {namespace}/{name}, the trust bundle of CertificateAuthority {authority}, not found"
    )]
    NoBundleConfigMap {
        authority: String,
        namespace: String,
        name: String,
    },
    #[error(
        "ConfigMap {namespace}/{name}, the trust bundle of CertificateAuthority {authority}, \
         has no {BUNDLE_KEY} or an empty one"
    )]
    NoBundleKey {
        authority: String,
        namespace: String,
        name: String,
    },
    #[error("Secret {namespace}/{name} not found")]
    NoSecret { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no {SECRET_CA_KEY} or an empty one")]
    NoSecretKey { namespace: String, name: String },
    #[error(
        "Secret {namespace}/{name} does not allow direct injection: it needs the annotation \
         {ALLOW_DIRECT_INJECTION}: \"true\""
    )]
    NotAllowed { namespace: String, name: String },
    /// The authority's Secret or bundle ConfigMap is not its own.
    #[error("CertificateAuthority {authority}: {reason}")]
    NotTheAuthoritysObject { authority: String, reason: String },
    #[error(
        "{what} is in namespace {namespace}, outside namespace {scope}, the only one the operator watches"
    )]
    OutOfScope {
        what: String,
        namespace: String,
        scope: String,
    },
    /// `reason` never repeats the content (a private key pasted by mistake, say).
    #[error("{origin} is not a bundle of PEM certificates: {reason}")]
    NotABundle { origin: String, reason: String },
    #[error(
        "Secret {namespace}/{name}, where CertificateAuthority {authority} keeps its CAs, not found"
    )]
    NoAuthoritySecret {
        authority: String,
        namespace: String,
        name: String,
    },
    /// Someone else's certificate in a CA's bundle (or a CA of its own it no longer keeps).
    #[error(
        "{origin} holds {count} certificate(s) that are none of the CAs its Secret \
         {secret} keeps (the first: serial {serial}, subject {subject})"
    )]
    NotTheAuthoritys {
        origin: String,
        secret: String,
        count: usize,
        serial: String,
        subject: String,
    },
}

impl SourceProblem {
    /// The event reason: something missing, or something caretaker refuses.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoAuthority { .. }
            | Self::NoBundleConfigMap { .. }
            | Self::NoBundleKey { .. }
            | Self::NoSecret { .. }
            | Self::NoSecretKey { .. }
            | Self::NoAuthoritySecret { .. } => EVENT_SOURCE_MISSING,
            Self::AuthorityWithout { .. }
            | Self::NotAllowed { .. }
            | Self::OutOfScope { .. }
            | Self::NotABundle { .. }
            | Self::NotTheAuthoritys { .. }
            | Self::NotTheAuthoritysObject { .. } => EVENT_REFUSED,
        }
    }
}

/// The bytes to inject, where they come from and how many certificates they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle<'a> {
    pub bytes: &'a [u8],
    pub origin: String,
    pub certificates: usize,
}

/// The bundle `source` gives, read from `sources`; never an empty one.
pub fn source_bundle<'a>(
    source: &SourceRef,
    sources: &Sources<'a>,
    scope: Option<&str>,
) -> Result<Bundle<'a>, SourceProblem> {
    let (bytes, origin) = match source {
        SourceRef::Authority { name } => {
            let found = authority_bundle(name, sources, scope)?;
            if let Some(reason) = sources.authority_refused {
                return Err(SourceProblem::NotTheAuthoritysObject {
                    authority: name.clone(),
                    reason: reason.to_string(),
                });
            }
            found
        }
        SourceRef::Secret { namespace, name } => secret_bundle(namespace, name, sources, scope)?,
    };
    let not_a_bundle = |reason: String| SourceProblem::NotABundle {
        origin: origin.clone(),
        reason,
    };
    let text = std::str::from_utf8(bytes).map_err(|_| not_a_bundle("it is not text".into()))?;
    let certificates =
        caretaker_pki::bundle::parse(text).map_err(|e| not_a_bundle(e.to_string()))?;
    if let SourceRef::Authority { name } = source {
        let (secret, kept) = authority_cas(name, sources, scope)?;
        let foreign: Vec<_> = certificates
            .iter()
            .filter(|c| !kept.contains(c.der()))
            .collect();
        if let Some(first) = foreign.first() {
            return Err(SourceProblem::NotTheAuthoritys {
                origin,
                secret,
                count: foreign.len(),
                serial: first.info().serial.clone(),
                subject: first.info().subject.clone(),
            });
        }
    }
    Ok(Bundle {
        bytes,
        origin,
        certificates: certificates.len(),
    })
}

/// The CAs (DER) CertificateAuthority `authority` keeps in its Secret, and that Secret's name.
/// A key that does not parse holds none: the CA's controller says what is wrong with it.
fn authority_cas(
    authority: &str,
    sources: &Sources<'_>,
    scope: Option<&str>,
) -> Result<(String, BTreeSet<Vec<u8>>), SourceProblem> {
    // Checked by authority_bundle already.
    let Some(ca) = sources.authority else {
        return Err(SourceProblem::NoAuthority {
            name: authority.to_string(),
            crd_installed: sources.authority_crd_installed,
        });
    };
    let Some(NamespacedName { name, namespace }) = secret_of(ca) else {
        return Err(SourceProblem::AuthorityWithout {
            authority: authority.to_string(),
            what: "Secret in spec.secret",
        });
    };
    if let Some(scope) = scope.filter(|_| !in_scope(&namespace, scope)) {
        return Err(SourceProblem::OutOfScope {
            what: format!(
                "Secret {namespace}/{name}, where CertificateAuthority {authority} keeps its CAs,"
            ),
            namespace,
            scope: scope.to_string(),
        });
    }
    let Some(secret) = sources
        .authority_secret
        .filter(|s| named(&s.metadata, &namespace, &name))
    else {
        return Err(SourceProblem::NoAuthoritySecret {
            authority: authority.to_string(),
            namespace,
            name,
        });
    };
    let data = secret.data.as_ref();
    let kept = [TLS_CRT, NEXT_CRT, PREVIOUS_CRT]
        .into_iter()
        .filter_map(|key| data?.get(key))
        .filter_map(|value| std::str::from_utf8(&value.0).ok())
        .filter_map(|pem| caretaker_pki::bundle::parse(pem).ok())
        .flatten()
        .map(|ca| ca.der().to_vec())
        .collect();
    Ok((format!("{namespace}/{name}"), kept))
}

fn named(meta: &kube::api::ObjectMeta, namespace: &str, name: &str) -> bool {
    meta.namespace.as_deref() == Some(namespace) && meta.name.as_deref() == Some(name)
}

fn authority_bundle<'a>(
    authority: &str,
    sources: &Sources<'a>,
    scope: Option<&str>,
) -> Result<(&'a [u8], String), SourceProblem> {
    let Some(ca) = sources
        .authority
        .filter(|ca| ca.metadata.name.as_deref() == Some(authority))
    else {
        return Err(SourceProblem::NoAuthority {
            name: authority.to_string(),
            crd_installed: sources.authority_crd_installed,
        });
    };
    let Some(NamespacedName { name, namespace }) = bundle_of(ca) else {
        return Err(SourceProblem::AuthorityWithout {
            authority: authority.to_string(),
            what: "bundle ConfigMap in spec.bundle",
        });
    };
    if let Some(scope) = scope.filter(|_| !in_scope(&namespace, scope)) {
        return Err(SourceProblem::OutOfScope {
            what: format!(
                "ConfigMap {namespace}/{name}, the trust bundle of CertificateAuthority {authority},"
            ),
            namespace,
            scope: scope.to_string(),
        });
    }
    let Some(config_map) = sources
        .config_map
        .filter(|cm| named(&cm.metadata, &namespace, &name))
    else {
        return Err(SourceProblem::NoBundleConfigMap {
            authority: authority.to_string(),
            namespace,
            name,
        });
    };
    let text = config_map.data.as_ref().and_then(|d| d.get(BUNDLE_KEY));
    match text.filter(|text| !text.is_empty()) {
        Some(text) => Ok((
            text.as_bytes(),
            format!(
                "the trust bundle of CertificateAuthority {authority} (ConfigMap \
                 {namespace}/{name}, {BUNDLE_KEY})"
            ),
        )),
        None => Err(SourceProblem::NoBundleKey {
            authority: authority.to_string(),
            namespace,
            name,
        }),
    }
}

fn secret_bundle<'a>(
    namespace: &str,
    name: &str,
    sources: &Sources<'a>,
    scope: Option<&str>,
) -> Result<(&'a [u8], String), SourceProblem> {
    let (namespace, name) = (namespace.to_string(), name.to_string());
    if let Some(scope) = scope.filter(|_| !in_scope(&namespace, scope)) {
        return Err(SourceProblem::OutOfScope {
            what: format!("Secret {namespace}/{name}"),
            namespace,
            scope: scope.to_string(),
        });
    }
    let Some(secret) = sources
        .secret
        .filter(|s| named(&s.metadata, &namespace, &name))
    else {
        return Err(SourceProblem::NoSecret { namespace, name });
    };
    // cainjector's order: the Secret's consent first, then its content.
    let allowed = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_DIRECT_INJECTION))
        .is_some_and(|v| v == "true");
    if !allowed {
        return Err(SourceProblem::NotAllowed { namespace, name });
    }
    let bytes = secret.data.as_ref().and_then(|d| d.get(SECRET_CA_KEY));
    match bytes.filter(|b| !b.0.is_empty()) {
        Some(bytes) => {
            let origin = format!("{SECRET_CA_KEY} of Secret {namespace}/{name}");
            Ok((&bytes.0, origin))
        }
        None => Err(SourceProblem::NoSecretKey { namespace, name }),
    }
}

/// One `caBundle` field of a target and what it holds.
struct Point<'a> {
    /// Where it is, for people.
    field: String,
    current: Option<&'a Value>,
}

/// The `caBundle` fields of a target (its data: everything but apiVersion, kind, metadata).
fn points(kind: TargetKind, data: &Value) -> Vec<Point<'_>> {
    match kind {
        TargetKind::ValidatingWebhookConfiguration | TargetKind::MutatingWebhookConfiguration => {
            let webhooks = data.get("webhooks").and_then(Value::as_array);
            webhooks
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, webhook)| Point {
                    field: match webhook.get("name").and_then(Value::as_str) {
                        Some(name) => format!("webhooks[{i}] ({name})"),
                        None => format!("webhooks[{i}]"),
                    },
                    current: webhook.get("clientConfig").and_then(|c| c.get("caBundle")),
                })
                .collect()
        }
        TargetKind::CustomResourceDefinition => {
            let conversion = &data["spec"]["conversion"];
            if conversion["strategy"] != "Webhook" {
                return Vec::new();
            }
            vec![Point {
                field: "spec.conversion.webhook.clientConfig.caBundle".into(),
                current: conversion
                    .get("webhook")
                    .and_then(|w| w.get("clientConfig"))
                    .and_then(|c| c.get("caBundle")),
            }]
        }
        TargetKind::ApiService => vec![Point {
            field: "spec.caBundle".into(),
            current: data.get("spec").and_then(|s| s.get("caBundle")),
        }],
    }
}

/// Whether a `caBundle` value (base64, as the API serves it) holds exactly `bundle`.
fn holds(current: Option<&Value>, bundle: &[u8]) -> bool {
    current
        .and_then(Value::as_str)
        .and_then(|text| STANDARD.decode(text).ok())
        .is_some_and(|held| held == bundle)
}

/// Whether every `caBundle` field of the target holds exactly `bundle` (and it has at least
/// one): what a caller that must know the bundle is in place everywhere asks.
pub fn holds_bundle(kind: TargetKind, target: &DynamicObject, bundle: &[u8]) -> bool {
    let points = points(kind, &target.data);
    !points.is_empty() && points.iter().all(|p| holds(p.current, bundle))
}

/// What to do about a target.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing to write: every `caBundle` field holds the bundle, or the target asks for no
    /// injection, or it has no field to fill.
    Idle,
    /// Write `patch`, a JSON merge patch carrying the target's observed `resourceVersion` (the
    /// API server refuses it with 409 Conflict if the target has changed since), then publish
    /// `event`.
    Write { patch: Value, event: Event },
    /// Leave the target untouched and publish this Warning event.
    Refuse(Event),
}

/// The decision for a target whose annotations could not be read.
pub fn refuse_annotation(error: &AnnotationError) -> Decision {
    Decision::Refuse(Event::warning(
        EVENT_REFUSED,
        format!("{error}; nothing injected, caBundle left as it is"),
    ))
}

/// What to do about `target`, which asks for `source` (see [`request`]), given what was read
/// of it; `scope` is the one namespace the operator watches, if it watches only one.
pub fn decide(
    kind: TargetKind,
    target: &DynamicObject,
    source: &SourceRef,
    sources: &Sources<'_>,
    scope: Option<&str>,
) -> Decision {
    let points = points(kind, &target.data);
    if points.is_empty() {
        return Decision::Idle;
    }
    if kind == TargetKind::ApiService && target.data["spec"]["insecureSkipTLSVerify"] == true {
        return Decision::Refuse(Event::warning(
            EVENT_REFUSED,
            format!(
                "spec.insecureSkipTLSVerify is true, and the API server accepts no caBundle \
                 beside it: set it to false to have the bundle of {source} injected; caBundle \
                 left as it is"
            ),
        ));
    }
    let bundle = match source_bundle(source, sources, scope) {
        Ok(bundle) => bundle,
        Err(problem) => {
            return Decision::Refuse(Event::warning(
                problem.reason(),
                format!("{problem}; nothing injected, caBundle left as it is"),
            ));
        }
    };
    let stale: Vec<&str> = points
        .iter()
        .filter(|p| !holds(p.current, bundle.bytes))
        .map(|p| p.field.as_str())
        .collect();
    if stale.is_empty() {
        return Decision::Idle;
    }
    let patch = merge_patch(
        kind,
        target,
        &STANDARD.encode(bundle.bytes),
        target.metadata.resource_version.as_deref(),
    );
    let fields = if kind.has_webhooks() {
        format!("the caBundle of {}", stale.join(", "))
    } else {
        stale.join(", ")
    };
    let certificates = match bundle.certificates {
        1 => "1 certificate".to_string(),
        n => format!("{n} certificates"),
    };
    Decision::Write {
        patch,
        event: Event::normal(
            EVENT_INJECTED,
            format!("{fields} set to {} ({certificates})", bundle.origin),
        ),
    }
}

/// The merge patch that sets every `caBundle` field of the target to `encoded`. Webhooks are a
/// list, which a merge patch replaces whole: the patch carries the observed list with only
/// each `clientConfig.caBundle` changed, and the observed `resourceVersion`, so that it can
/// only replace the very list it was made from.
fn merge_patch(
    kind: TargetKind,
    target: &DynamicObject,
    encoded: &str,
    resource_version: Option<&str>,
) -> Value {
    let mut patch = match kind {
        TargetKind::ValidatingWebhookConfiguration | TargetKind::MutatingWebhookConfiguration => {
            let mut webhooks = target.data["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for webhook in webhooks.iter_mut().filter_map(Value::as_object_mut) {
                let client_config = webhook.entry("clientConfig").or_insert_with(|| json!({}));
                if !client_config.is_object() {
                    *client_config = json!({});
                }
                client_config["caBundle"] = json!(encoded);
            }
            json!({ "webhooks": webhooks })
        }
        TargetKind::CustomResourceDefinition => json!({ "spec": { "conversion": { "webhook": {
            "clientConfig": { "caBundle": encoded } } } } }),
        TargetKind::ApiService => json!({ "spec": { "caBundle": encoded } }),
    };
    if let Some(version) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": version });
    }
    patch
}

/// A change of something targets inject from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceChange {
    Authority { name: String },
    ConfigMap { namespace: String, name: String },
    Secret { namespace: String, name: String },
}

/// The targets a change may concern: those that inject from the changed CertificateAuthority
/// or Secret, or from a CertificateAuthority (of `authorities`) whose bundle is the changed
/// ConfigMap.
pub fn concerned<'t>(
    change: &SourceChange,
    authorities: &[Arc<DynamicObject>],
    targets: &'t [Arc<DynamicObject>],
) -> Vec<&'t Arc<DynamicObject>> {
    let wanted: Vec<SourceRef> = match change {
        SourceChange::Authority { name } => vec![SourceRef::Authority { name: name.clone() }],
        SourceChange::Secret { namespace, name } => vec![SourceRef::Secret {
            namespace: namespace.clone(),
            name: name.clone(),
        }],
        SourceChange::ConfigMap { namespace, name } => authorities
            .iter()
            .filter(|ca| {
                bundle_of(ca).is_some_and(|b| &b.namespace == namespace && &b.name == name)
            })
            .filter_map(|ca| ca.metadata.name.clone())
            .map(|name| SourceRef::Authority { name })
            .collect(),
    };
    if wanted.is_empty() {
        return Vec::new();
    }
    targets
        .iter()
        .filter(|target| {
            SourceRef::of_object(target)
                .ok()
                .flatten()
                .is_some_and(|source| wanted.contains(&source))
        })
        .collect()
}

/// Drops from cached targets what no pass reads: `managedFields`, kubectl's copy of the last
/// applied object, statuses, and a CRD's spec but its conversion (its schemas can be
/// hundreds of kilobytes). Nothing is written from the dropped parts: the merge patch of a CRD
/// or APIService touches only `caBundle`, and webhook lists are kept whole.
pub fn trim(kind: TargetKind) -> impl Fn(&mut DynamicObject) {
    move |target| {
        target.metadata.managed_fields = None;
        if let Some(annotations) = &mut target.metadata.annotations {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
        if let Some(data) = target.data.as_object_mut() {
            data.remove("status");
            if kind == TargetKind::CustomResourceDefinition
                && let Some(spec) = data.get_mut("spec").and_then(|s| s.as_object_mut())
            {
                spec.retain(|key, _| key == "conversion");
            }
        }
    }
}
