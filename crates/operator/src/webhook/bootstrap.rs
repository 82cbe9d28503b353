//! The webhook's own certificates, made by caretaker itself (`caretaker operator
//! --webhook-bootstrap NAMESPACE/SERVICE`): nothing to install by hand, no cert-manager.
//!
//! [`Bootstrap::objects`] decides, purely from the flags, what must exist:
//! - the Namespace `NAMESPACE`;
//! - the CertificateAuthority [`NAME`], its Secret [`CA_SECRET`] and its bundle ConfigMap
//!   [`CA_BUNDLE`] in `NAMESPACE`;
//! - the IssuedCertificate [`NAME`] in `NAMESPACE`, for `SERVICE.NAMESPACE.svc` and
//!   `SERVICE.NAMESPACE.svc.cluster.local` (and the host of `--webhook-url`, if given), usage
//!   `server`, written to the Secret [`SERVING_SECRET`];
//! - the ValidatingWebhookConfiguration [`NAME`] of [`super::configuration`], calling the
//!   Service (port 443) or the URL, annotated `caretaker.dev/inject-ca-from: caretaker-webhook`
//!   and without a caBundle of its own: CA-bundle injection fills it.
//!   Its CertificateAuthority and IssuedCertificate webhooks leave out the two objects above
//!   by name (and namespace), as `matchConditions` ([`Bootstrap::exempt`]): they are what gives
//!   the webhook its certificate. Never by a label, which anyone may put on their own object.
//!
//! The webhook serves from [`SERVING_SECRET`] ([`Bootstrap::certificate_source`]).
//!
//! [`ensure`] creates each object that is absent, in that order (the CertificateAuthority and
//! IssuedCertificate before the configuration that sends them to a webhook not yet serving),
//! and leaves every object that exists as it is: a user's changes are kept, and an object
//! deleted is made again at the operator's next start. Two exceptions, since it relies on
//! them: a CertificateAuthority [`NAME`] whose key, bundle or allowed namespaces are not the
//! bootstrap's (someone made that name first) stops it, with an error naming the object,
//! before anything trusts it ([`authority_mismatch`]); and its own Secrets and ConfigMap, at
//! the names it fixes in its namespace, that an earlier caretaker made without an owner mark
//! are handed over to their objects ([`unmarked_earlier_own`]). Until the caretaker.dev CRDs are
//! installed it says so once and tries again, never stopping the operator.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{CertificateSource, Endpoint, Served};
use caretaker_api::names::injection::INJECT_CA_FROM;
use caretaker_api::v1alpha1::{
    CertificateAuthority, CertificateAuthoritySpec, DEFAULT_CA_VALIDITY,
    DEFAULT_CERTIFICATE_VALIDITY, DEFAULT_KEY_ALGORITHM, DEFAULT_TRUST_PROPAGATION,
    IssuedCertificate, IssuedCertificateSpec, IssuerReference, NamespacedName,
};

/// The name of the CertificateAuthority, the IssuedCertificate and the
/// ValidatingWebhookConfiguration.
pub const NAME: &str = "caretaker-webhook";
/// The CertificateAuthority's Secret, in the operator's namespace.
pub const CA_SECRET: &str = "caretaker-webhook-ca";
/// The CertificateAuthority's trust bundle ConfigMap, in the operator's namespace.
pub const CA_BUNDLE: &str = "caretaker-webhook-ca-bundle";
/// The webhook's serving certificate (kubernetes.io/tls), in the operator's namespace.
pub const SERVING_SECRET: &str = "caretaker-webhook-tls";
/// The port of the Service's reference in the webhook configuration.
pub const SERVICE_PORT: i32 = 443;
/// The field manager of the objects created.
pub const FIELD_MANAGER: &str = "caretaker";
/// The label on every object created.
pub const MANAGED_BY: (&str, &str) = caretaker_api::names::MANAGED_BY;

/// What `--webhook-bootstrap` and `--webhook-url` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// The operator's namespace.
    pub namespace: String,
    /// The Service in front of the webhook.
    pub service: String,
    /// `https://HOST:PORT`: where the API server calls the webhook instead of the Service
    /// (an API server without the cluster's network, such as the embedded one).
    pub url: Option<WebhookUrl>,
}

/// `--webhook-url`: `https://HOST:PORT`, without a path (the webhook's paths are appended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    base: String,
    host: Host,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    Dns(String),
}

impl std::str::FromStr for WebhookUrl {
    type Err = String;

    fn from_str(value: &str) -> Result<WebhookUrl, String> {
        let rest = value
            .strip_prefix("https://")
            .ok_or("expected https://HOST:PORT")?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(
                "expected https://HOST:PORT without a path: the webhook's paths are appended"
                    .into(),
            );
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (host, port) = bracketed.split_once("]:").ok_or("expected [IPv6]:PORT")?;
                let ip: std::net::Ipv6Addr = host
                    .parse()
                    .map_err(|_| format!("{host:?} is not an IPv6 address"))?;
                (Host::Ip(IpAddr::V6(ip)), port)
            }
            None => {
                let (host, port) = authority
                    .rsplit_once(':')
                    .ok_or("expected https://HOST:PORT (no port)")?;
                if host.is_empty() || host.contains(':') {
                    return Err(
                        "expected https://HOST:PORT (an IPv6 address takes brackets)".into(),
                    );
                }
                match host.parse::<IpAddr>() {
                    Ok(ip) => (Host::Ip(ip), port),
                    Err(_) => (Host::Dns(host.to_ascii_lowercase()), port),
                }
            }
        };
        match port.parse::<u16>() {
            Ok(port) if port > 0 => {}
            _ => return Err(format!("{port:?} is not a port")),
        }
        Ok(WebhookUrl {
            base: format!("https://{authority}"),
            host,
        })
    }
}

impl std::fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.base)
    }
}

/// The objects [`ensure`] makes exist, in the order it creates them.
#[derive(Debug, Clone, PartialEq)]
pub struct Objects {
    pub namespace: Namespace,
    pub authority: CertificateAuthority,
    pub certificate: IssuedCertificate,
    pub configuration: ValidatingWebhookConfiguration,
}

fn metadata(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(BTreeMap::from([(
            MANAGED_BY.0.to_string(),
            MANAGED_BY.1.to_string(),
        )])),
        ..Default::default()
    }
}

impl Bootstrap {
    /// `SERVICE.NAMESPACE.svc`.
    pub fn service_host(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }

    /// Where the webhook's serving certificate is read from: [`SERVING_SECRET`].
    pub fn certificate_source(&self) -> CertificateSource {
        CertificateSource::Secret {
            namespace: self.namespace.clone(),
            name: SERVING_SECRET.into(),
        }
    }

    /// Where the API server calls the webhook.
    pub fn endpoint(&self) -> Endpoint {
        match &self.url {
            Some(url) => Endpoint::Url(url.base.clone()),
            None => Endpoint::Service {
                namespace: self.namespace.clone(),
                name: self.service.clone(),
                port: SERVICE_PORT,
            },
        }
    }

    /// The `matchConditions` of `served`'s webhook: for the CertificateAuthority and
    /// IssuedCertificate webhooks, every object but the bootstrap's own of that kind, named
    /// by name (and namespace), which only whoever may create that very object can match.
    ///
    /// They matter when the configuration exists while the webhook cannot serve (its serving
    /// Secret gone) and these objects must be made again: a webhook that had to admit them
    /// first could never start. kube-apiserver evaluates `matchConditions` from 1.28; a
    /// server that does not (the embedded one) validates these objects like any other, which
    /// a fresh bootstrap allows, since it makes them before the configuration.
    pub fn exempt(&self, served: Served) -> Option<Vec<MatchCondition>> {
        let expression = match served {
            Served::CertificateAuthority => format!("request.name != '{NAME}'"),
            Served::IssuedCertificate => format!(
                "request.namespace != '{}' || request.name != '{NAME}'",
                self.namespace
            ),
            Served::EtcdCertificates | Served::Bundle | Served::ClusterBundle => return None,
        };
        Some(vec![MatchCondition {
            name: "not-the-webhook-bootstraps-own".into(),
            expression,
        }])
    }

    /// What must exist for the webhook to serve with a certificate of caretaker's own.
    pub fn objects(&self) -> Objects {
        let namespace = Namespace {
            metadata: metadata(&self.namespace, None),
            ..Default::default()
        };
        let in_namespace = |name: &str| NamespacedName {
            name: name.into(),
            namespace: self.namespace.clone(),
        };
        let mut authority = CertificateAuthority::new(
            NAME,
            CertificateAuthoritySpec {
                common_name: NAME.into(),
                secret: in_namespace(CA_SECRET),
                bundle: in_namespace(CA_BUNDLE),
                key_algorithm: DEFAULT_KEY_ALGORITHM.into(),
                validity: DEFAULT_CA_VALIDITY.into(),
                renew_at_percent: None,
                renew_before: None,
                trust_propagation: DEFAULT_TRUST_PROPAGATION.into(),
                // It signs caretaker's own serving certificate, nothing for other namespaces.
                allowed_namespaces: vec![self.namespace.clone()],
            },
        );
        authority.metadata = metadata(NAME, None);

        let host = self.service_host();
        let mut dns_names = vec![host.clone(), format!("{host}.cluster.local")];
        let mut ip_addresses = Vec::new();
        match self.url.as_ref().map(|url| &url.host) {
            Some(Host::Ip(ip)) => ip_addresses.push(ip.to_string()),
            Some(Host::Dns(name)) if !dns_names.contains(name) => dns_names.push(name.clone()),
            _ => {}
        }
        let mut certificate = IssuedCertificate::new(
            NAME,
            IssuedCertificateSpec {
                issuer_ref: IssuerReference { name: NAME.into() },
                secret_name: SERVING_SECRET.into(),
                common_name: host,
                dns_names,
                ip_addresses,
                usages: vec!["server".into()],
                key_algorithm: DEFAULT_KEY_ALGORITHM.into(),
                validity: DEFAULT_CERTIFICATE_VALIDITY.into(),
                renew_at_percent: None,
                renew_before: None,
            },
        );
        certificate.metadata = metadata(NAME, Some(&self.namespace));

        let mut configuration = super::configuration(NAME, &self.endpoint(), "");
        let mut meta = metadata(NAME, None);
        meta.annotations = Some(BTreeMap::from([(INJECT_CA_FROM.into(), NAME.into())]));
        configuration.metadata = meta;
        for hook in configuration.webhooks.iter_mut().flatten() {
            hook.client_config.ca_bundle = None;
            let served = Served::ALL
                .into_iter()
                .find(|s| s.webhook_name() == hook.name);
            hook.match_conditions = served.and_then(|served| self.exempt(served));
        }
        Objects {
            namespace,
            authority,
            certificate,
            configuration,
        }
    }
}

/// Why the bootstrap could not make what it relies on.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The API server does not serve the kind: its CRD is not installed.
    #[error("the caretaker.dev CRDs are not installed")]
    NotServed,
    /// An object of the bootstrap's name exists and is not what the bootstrap would make, in
    /// what decides whom it trusts: it is not relied on, and nothing after it is made.
    #[error("{0}")]
    NotTheBootstraps(String),
    #[error(transparent)]
    Other(kube::Error),
}

/// Why `existing`, the CertificateAuthority of the bootstrap's name, is not the bootstrap's
/// `desired` one; `None` when it is. Whoever creates that name first chooses its spec: where
/// its key is kept (`secret`), where its bundle goes (`bundle`) and whom it signs for
/// (`allowedNamespaces`) decide who could hold a certificate the webhook's clients trust, so
/// they must be the bootstrap's. The rest (common name, key algorithm, validity, renewal,
/// trust propagation) stays an administrator's to tune.
pub fn authority_mismatch(
    existing: &CertificateAuthority,
    desired: &CertificateAuthority,
) -> Option<String> {
    let (have, want) = (&existing.spec, &desired.spec);
    let mut differ = Vec::new();
    if have.secret != want.secret {
        differ.push(format!(
            "spec.secret is {}/{}, not {}/{}",
            have.secret.namespace, have.secret.name, want.secret.namespace, want.secret.name
        ));
    }
    if have.bundle != want.bundle {
        differ.push(format!(
            "spec.bundle is {}/{}, not {}/{}",
            have.bundle.namespace, have.bundle.name, want.bundle.namespace, want.bundle.name
        ));
    }
    if have.allowed_namespaces != want.allowed_namespaces {
        differ.push(format!(
            "spec.allowedNamespaces is {:?}, not {:?}",
            have.allowed_namespaces, want.allowed_namespaces
        ));
    }
    if differ.is_empty() {
        return None;
    }
    Some(format!(
        "CertificateAuthority {NAME} exists and is not the webhook bootstrap's ({}): the webhook's \
         certificate is not made from it; delete it (kubectl delete certificateauthority {NAME}) \
         to have the bootstrap make its own",
        differ.join("; ")
    ))
}

/// The bootstrap's own Secrets and ConfigMap in its namespace, at the names it fixes, and the
/// object each is written for: as [`crate::ownership::Owner::reference`] names it.
fn own_objects(namespace: &str) -> [(&'static str, &'static str, String); 3] {
    [
        ("Secret", CA_SECRET, format!("CertificateAuthority/{NAME}")),
        (
            "ConfigMap",
            CA_BUNDLE,
            format!("CertificateAuthority/{NAME}"),
        ),
        (
            "Secret",
            SERVING_SECRET,
            format!("IssuedCertificate/{namespace}/{NAME}"),
        ),
    ]
}

/// Whether an existing object of [`own_objects`] is one an earlier caretaker made before
/// objects carried their owner's mark, and so is handed over ([`caretaker_api::names::ADOPT`]) to
/// the object it was made for: it carries caretaker's label, no mark, no adoption request
/// and no owner reference. Only these names in the bootstrap's namespace are handed over:
/// whoever could have made them there may write them anyway.
pub fn unmarked_earlier_own(meta: &ObjectMeta) -> bool {
    let annotations = meta.annotations.clone().unwrap_or_default();
    let labelled =
        meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)) == Some(&MANAGED_BY.1.to_string());
    labelled
        && !annotations.contains_key(caretaker_api::names::OWNER)
        && !annotations.contains_key(caretaker_api::names::ADOPT)
        && meta.owner_references.as_ref().is_none_or(Vec::is_empty)
}

/// Hands over each of [`own_objects`] that [`unmarked_earlier_own`] says is an earlier
/// caretaker's, on the resourceVersion read; what it handed over.
async fn hand_over_earlier_own(client: &Client, namespace: &str) -> Result<Vec<String>, Failure> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let mut handed = Vec::new();
    for (kind, name, owner) in own_objects(namespace) {
        let meta = match kind {
            "Secret" => Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map(|o| o.map(|o| o.metadata)),
            _ => Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map(|o| o.map(|o| o.metadata)),
        }
        .map_err(Failure::Other)?;
        let Some(meta) = meta.filter(unmarked_earlier_own) else {
            continue;
        };
        let patch = json!({"metadata": {
            "resourceVersion": meta.resource_version,
            "annotations": {caretaker_api::names::ADOPT: owner},
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match kind {
            "Secret" => Api::<Secret>::namespaced(client.clone(), namespace)
                .patch(name, &params, &Patch::Merge(&patch))
                .await
                .map(|_| ()),
            _ => Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .patch(name, &params, &Patch::Merge(&patch))
                .await
                .map(|_| ()),
        }
        .map_err(Failure::Other)?;
        handed.push(format!("{kind} {namespace}/{name} handed over to {owner}"));
    }
    Ok(handed)
}

/// Creates `object` unless an object of its name exists; `true` when created.
async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<bool, Failure>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let not_served = |e: kube::Error| match e {
        kube::Error::Api(status) if status.code == 404 => Failure::NotServed,
        e => Failure::Other(e),
    };
    if api.get_opt(&name).await.map_err(not_served)?.is_some() {
        return Ok(false);
    }
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(not_served(e)),
    }
}

/// The label with which earlier versions left objects out of the webhook (an `objectSelector`
/// `DoesNotExist` on every webhook): anyone could set it on their own object to skip the checks.
pub const LEGACY_BOOTSTRAP_LABEL: &str = "caretaker.dev/webhook-bootstrap";

/// The strategic merge patch that takes the legacy `objectSelector` out of each webhook of
/// `existing` (the bootstrap's configuration as an earlier version made it), giving it the
/// `matchConditions` of the webhook of that name in `desired`; `None` when no webhook has it.
/// The bootstrap otherwise leaves an existing configuration as it is: this change alone closes
/// a hole, so it is made, on the resourceVersion read (409 Conflict once it has changed: the
/// bootstrap tries again).
pub fn legacy_selector_removal(
    existing: &ValidatingWebhookConfiguration,
    desired: &ValidatingWebhookConfiguration,
) -> Option<serde_json::Value> {
    let legacy = LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: LEGACY_BOOTSTRAP_LABEL.into(),
            operator: "DoesNotExist".into(),
            values: None,
        }]),
        match_labels: None,
    };
    let hooks: Vec<_> = existing
        .webhooks
        .iter()
        .flatten()
        .filter(|hook| hook.object_selector.as_ref() == Some(&legacy))
        .map(|hook| {
            let mut change = json!({"name": hook.name, "objectSelector": null});
            let wanted = desired
                .webhooks
                .iter()
                .flatten()
                .find(|d| d.name == hook.name);
            if let Some(conditions) = wanted.and_then(|d| d.match_conditions.as_ref())
                && hook.match_conditions.is_none()
            {
                change["matchConditions"] = json!(conditions);
            }
            change
        })
        .collect();
    if hooks.is_empty() {
        return None;
    }
    let version = existing.metadata.resource_version.clone();
    Some(json!({"metadata": {"resourceVersion": version}, "webhooks": hooks}))
}

/// Applies [`legacy_selector_removal`] to the configuration, if it needs it; `true` when it
/// did.
async fn drop_legacy_selector(
    api: &Api<ValidatingWebhookConfiguration>,
    desired: &ValidatingWebhookConfiguration,
) -> Result<bool, Failure> {
    let Some(existing) = api.get_opt(NAME).await.map_err(Failure::Other)? else {
        return Ok(false);
    };
    let Some(patch) = legacy_selector_removal(&existing, desired) else {
        return Ok(false);
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(NAME, &params, &Patch::Strategic(&patch))
        .await
        .map_err(Failure::Other)?;
    Ok(true)
}

/// One pass of [`ensure`]: makes each absent object of `objects`, in order, and hands over
/// the bootstrap's earlier unmarked Secrets and ConfigMap; what it did. It stops, making
/// nothing after it, at a CertificateAuthority of its name that is not its own
/// ([`authority_mismatch`]): the certificate and configuration would trust whoever made it.
pub async fn ensure_once(client: &Client, objects: &Objects) -> Result<Vec<String>, Failure> {
    let mut done = Vec::new();
    attempt(client, objects, &mut done).await?;
    Ok(done)
}

/// [`ensure_once`], adding what it did to `done` as it goes (an attempt that fails may have
/// made the Namespace).
async fn attempt(
    client: &Client,
    objects: &Objects,
    done: &mut Vec<String>,
) -> Result<(), Failure> {
    let namespace = objects.namespace.metadata.name.clone().unwrap_or_default();
    // The operator runs in its namespace: one it may not read or create is there.
    match create_if_absent(&Api::all(client.clone()), &objects.namespace).await {
        Ok(true) => done.push(format!("Namespace {namespace}")),
        Ok(false) => {}
        Err(Failure::Other(kube::Error::Api(status))) if status.code == 403 => {}
        Err(e) => return Err(e),
    }
    let authorities = Api::<CertificateAuthority>::all(client.clone());
    if create_if_absent(&authorities, &objects.authority).await? {
        done.push(format!("CertificateAuthority {NAME}"));
    } else if let Some(existing) = authorities.get_opt(NAME).await.map_err(Failure::Other)?
        && let Some(mismatch) = authority_mismatch(&existing, &objects.authority)
    {
        return Err(Failure::NotTheBootstraps(mismatch));
    }
    let certificates = Api::namespaced(client.clone(), &namespace);
    if create_if_absent(&certificates, &objects.certificate).await? {
        done.push(format!("IssuedCertificate {namespace}/{NAME}"));
    }
    done.extend(hand_over_earlier_own(client, &namespace).await?);
    let configurations = Api::all(client.clone());
    if create_if_absent(&configurations, &objects.configuration).await? {
        done.push(format!("ValidatingWebhookConfiguration {NAME}"));
    } else if drop_legacy_selector(&configurations, &objects.configuration).await? {
        done.push(format!(
            "(ValidatingWebhookConfiguration {NAME}: the {LEGACY_BOOTSTRAP_LABEL} objectSelector removed)"
        ));
    }
    Ok(())
}

/// Makes every object of `objects` exist, retrying until all do (every `retry`); never fails.
pub async fn ensure(client: Client, objects: &Objects, retry: Duration) {
    let mut said_crds_missing = false;
    let mut last_error = None::<String>;
    // Across attempts: the Namespace may be made by one that then finds no CRDs.
    let mut created = Vec::new();
    loop {
        match attempt(&client, objects, &mut created).await {
            Ok(()) => {
                let created = if created.is_empty() {
                    "nothing: every object exists".to_string()
                } else {
                    created.join(", ")
                };
                tracing::info!(%created, "webhook bootstrap done");
                return;
            }
            Err(Failure::NotServed) => {
                if !said_crds_missing {
                    tracing::warn!(
                        "webhook bootstrap waits for the caretaker.dev CRDs \
                         (CertificateAuthority, IssuedCertificate), which are not installed: \
                         `caretaker crds | kubectl apply -f -`"
                    );
                    said_crds_missing = true;
                }
            }
            Err(Failure::NotTheBootstraps(message)) => {
                if last_error.as_ref() != Some(&message) {
                    tracing::error!(%message, "webhook bootstrap refuses; trying again");
                    last_error = Some(message);
                }
            }
            Err(Failure::Other(e)) => {
                let error = e.to_string();
                if last_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "webhook bootstrap failed; trying again");
                    last_error = Some(error);
                }
            }
        }
        tokio::time::sleep(retry).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn bootstrap(url: Option<&str>) -> Bootstrap {
        Bootstrap {
            namespace: "caretaker-system".into(),
            service: "caretaker-webhook".into(),
            url: url.map(|u| u.parse().unwrap()),
        }
    }

    #[test]
    fn the_bootstrap_makes_a_ca_a_certificate_for_the_service_and_a_configuration() {
        let objects = bootstrap(None).objects();
        assert_eq!(
            serde_json::to_value(&objects.namespace).unwrap()["metadata"]["name"],
            "caretaker-system"
        );
        let authority = serde_json::to_value(&objects.authority).unwrap();
        assert_eq!(authority["metadata"]["name"], "caretaker-webhook");
        // No label of theirs keeps them out of the webhook: a label is anyone's to set.
        let labels = json!({"app.kubernetes.io/managed-by": "caretaker"});
        assert_eq!(authority["metadata"]["labels"], labels);
        assert_eq!(
            authority["spec"],
            json!({"commonName": "caretaker-webhook",
                   "secret": {"name": "caretaker-webhook-ca", "namespace": "caretaker-system"},
                   "bundle": {"name": "caretaker-webhook-ca-bundle",
                              "namespace": "caretaker-system"},
                   "keyAlgorithm": "ECDSA-P256", "validity": "10y", "trustPropagation": "5m",
                   "allowedNamespaces": ["caretaker-system"]})
        );
        crate::authority::AuthorityPolicy::from_spec(&objects.authority.spec).unwrap();

        let certificate = serde_json::to_value(&objects.certificate).unwrap();
        assert_eq!(certificate["metadata"]["name"], "caretaker-webhook");
        assert_eq!(certificate["metadata"]["namespace"], "caretaker-system");
        assert_eq!(certificate["metadata"]["labels"], labels);
        assert_eq!(
            certificate["spec"],
            json!({"issuerRef": {"name": "caretaker-webhook"},
                   "secretName": "caretaker-webhook-tls",
                   "commonName": "caretaker-webhook.caretaker-system.svc",
                   "dnsNames": ["caretaker-webhook.caretaker-system.svc",
                                "caretaker-webhook.caretaker-system.svc.cluster.local"],
                   "usages": ["server"], "keyAlgorithm": "ECDSA-P256", "validity": "1y"})
        );
        crate::authority::CertificatePolicy::from_spec(&objects.certificate.spec).unwrap();

        let configuration = serde_json::to_value(&objects.configuration).unwrap();
        assert_eq!(configuration["metadata"]["name"], "caretaker-webhook");
        assert_eq!(
            configuration["metadata"]["annotations"],
            json!({"caretaker.dev/inject-ca-from": "caretaker-webhook"})
        );
        let hooks = configuration["webhooks"].as_array().unwrap();
        // Only the bootstrap's own two objects are left out, by name (and namespace).
        let conditions: Vec<&Value> = hooks.iter().map(|h| &h["matchConditions"]).collect();
        assert_eq!(
            conditions,
            [
                &json!([{"name": "not-the-webhook-bootstraps-own",
                         "expression": "request.name != 'caretaker-webhook'"}]),
                &json!([{"name": "not-the-webhook-bootstraps-own",
                         "expression": "request.namespace != 'caretaker-system' || request.name != 'caretaker-webhook'"}]),
                &Value::Null,
                &Value::Null,
                &Value::Null,
            ]
        );
        assert!(hooks.iter().all(|h| h.get("objectSelector").is_none()));
        assert_eq!(
            hooks.len(),
            5,
            "CertificateAuthority, IssuedCertificate, EtcdCertificates, Bundle and ClusterBundle"
        );
        for hook in hooks {
            assert_eq!(
                hook["clientConfig"],
                json!({"service": {"namespace": "caretaker-system", "name": "caretaker-webhook",
                       "port": 443, "path": hook["clientConfig"]["service"]["path"]}}),
                "no caBundle: injection fills it"
            );
        }
        assert_eq!(
            hooks[0]["clientConfig"]["service"]["path"],
            "/validate-caretaker-dev-v1alpha1-certificateauthority"
        );
        assert_eq!(hooks[2]["name"], "etcdcertificates.caretaker.dev");
        assert_eq!(hooks[2]["rules"][0]["scope"], "Namespaced");
        assert_eq!(hooks[3]["name"], "bundles.trust.cert-manager.io");
        assert_eq!(
            hooks[3]["rules"],
            json!([{"apiGroups": ["trust.cert-manager.io"], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["bundles"], "scope": "Cluster"}])
        );
        assert_eq!(
            bootstrap(None).certificate_source(),
            CertificateSource::Secret {
                namespace: "caretaker-system".into(),
                name: "caretaker-webhook-tls".into()
            }
        );
    }

    #[test]
    fn a_ca_of_the_bootstraps_name_is_its_own_only_with_its_key_bundle_and_namespaces() {
        let desired = bootstrap(None).objects().authority;
        let mut tuned = desired.clone();
        tuned.spec.validity = "1y".into();
        tuned.spec.common_name = "renamed".into();
        assert_eq!(authority_mismatch(&tuned, &desired), None);
        let mut everywhere = desired.clone();
        everywhere.spec.allowed_namespaces.clear();
        let mismatch = authority_mismatch(&everywhere, &desired).unwrap();
        assert!(
            mismatch.starts_with("CertificateAuthority caretaker-webhook exists and is not the webhook bootstrap's (spec.allowedNamespaces is [], not [\"caretaker-system\"])"),
            "{mismatch}"
        );
        let mut elsewhere = desired.clone();
        elsewhere.spec.secret.namespace = "team".into();
        assert!(authority_mismatch(&elsewhere, &desired).is_some());
    }

    #[test]
    fn only_a_configuration_with_the_label_selector_is_patched() {
        let desired = bootstrap(None).objects().configuration;
        assert_eq!(legacy_selector_removal(&desired, &desired), None);
        let mut earlier = desired.clone();
        earlier.metadata.resource_version = Some("7".into());
        for hook in earlier.webhooks.iter_mut().flatten() {
            hook.match_conditions = None;
            hook.object_selector = Some(
                serde_json::from_value(json!({"matchExpressions": [
                    {"key": LEGACY_BOOTSTRAP_LABEL, "operator": "DoesNotExist"}]}))
                .unwrap(),
            );
        }
        let patch = legacy_selector_removal(&earlier, &desired).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let hooks = patch["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 5);
        assert!(hooks.iter().all(|h| h["objectSelector"].is_null()));
        assert_eq!(
            hooks[0]["matchConditions"][0]["expression"],
            "request.name != 'caretaker-webhook'"
        );
        assert!(hooks[4].get("matchConditions").is_none(), "ClusterBundles");
    }

    #[test]
    fn with_a_url_the_configuration_calls_it_and_the_certificate_names_its_host() {
        let objects = bootstrap(Some("https://127.0.0.1:9443/")).objects();
        assert_eq!(
            objects.certificate.spec.ip_addresses,
            vec!["127.0.0.1".to_string()]
        );
        assert_eq!(objects.certificate.spec.dns_names.len(), 2);
        let hooks = serde_json::to_value(&objects.configuration).unwrap()["webhooks"].clone();
        assert_eq!(
            hooks[1]["clientConfig"],
            json!({"url": "https://127.0.0.1:9443/validate-caretaker-dev-v1alpha1-issuedcertificate"})
        );

        let objects = bootstrap(Some("https://[::1]:9443")).objects();
        assert_eq!(
            objects.certificate.spec.ip_addresses,
            vec!["::1".to_string()]
        );

        let objects = bootstrap(Some("https://Webhook.Example.com:8443")).objects();
        assert_eq!(
            objects.certificate.spec.dns_names,
            [
                "caretaker-webhook.caretaker-system.svc",
                "caretaker-webhook.caretaker-system.svc.cluster.local",
                "webhook.example.com"
            ]
        );
        assert!(objects.certificate.spec.ip_addresses.is_empty());
        crate::authority::CertificatePolicy::from_spec(&objects.certificate.spec).unwrap();
        // A URL naming the Service itself adds nothing.
        let objects =
            bootstrap(Some("https://caretaker-webhook.caretaker-system.svc:443")).objects();
        assert_eq!(objects.certificate.spec.dns_names.len(), 2);
    }

    #[test]
    fn a_webhook_url_is_https_host_and_port_without_a_path() {
        for (url, says) in [
            ("http://127.0.0.1:9443", "expected https://HOST:PORT"),
            ("https://127.0.0.1", "no port"),
            ("https://127.0.0.1:9443/validate", "without a path"),
            ("https://::1:9443", "takes brackets"),
            ("https://[::1]:x", "\"x\" is not a port"),
            ("https://[nope]:9443", "is not an IPv6 address"),
            ("https://:9443", "expected https://HOST:PORT"),
            ("https://h:0", "\"0\" is not a port"),
        ] {
            let error = url.parse::<WebhookUrl>().unwrap_err();
            assert!(error.contains(says), "{url}: {error}");
        }
        assert_eq!(
            "https://h:1/".parse::<WebhookUrl>().unwrap().to_string(),
            "https://h:1"
        );
    }
}
