//! Admission webhooks: MutatingWebhookConfigurations then ValidatingWebhookConfigurations,
//! called over HTTPS with `admission.k8s.io/v1` AdmissionReviews.
//!
//! Honoured: `clientConfig.url`, `clientConfig.service` (resolved through the service→address map
//! given to the server builder, since there is no cluster network), `caBundle` (the only roots
//! trusted; the server name checked is the URL host or `<service>.<namespace>.svc`; a serving
//! certificate that is itself in `caBundle` is accepted even with CA:TRUE, as Go's TLS does),
//! `rules`
//! (groups, versions, operations, resources incl. subresources, scope), `namespaceSelector`,
//! `objectSelector`, `failurePolicy` and `timeoutSeconds`. Mutations are JSON patches.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::selectors::LabelSelector;
use crate::store::registry::ResourceDef;
use crate::store::storage::{ObjectKey, Store};
use crate::user::UserInfo;
use crate::work::Deadline;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// What is being admitted. For DELETE, `object` is the object being deleted (used for its name
/// and for objectSelector) and is sent as `oldObject`, as Kubernetes does.
pub struct Request<'a> {
    def: &'a ResourceDef,
    operation: Operation,
    subresource: Option<&'a str>,
    object: &'a Value,
    old: Option<&'a Value>,
    dry_run: bool,
    user: Option<&'a UserInfo>,
}

impl<'a> Request<'a> {
    /// Writing `object`: a CREATE without `old`, else an UPDATE of it (of `subresource`, if any).
    pub fn write(
        def: &'a ResourceDef,
        subresource: Option<&'a str>,
        object: &'a Value,
        old: Option<&'a Value>,
        dry_run: bool,
    ) -> Self {
        Request {
            def,
            operation: if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            },
            subresource,
            object,
            old,
            dry_run,
            user: None,
        }
    }

    /// The request is `user`'s (`userInfo` in the review).
    pub fn by(mut self, user: Option<&'a UserInfo>) -> Self {
        self.user = user;
        self
    }

    /// The first DELETE of `old`.
    pub fn delete(def: &'a ResourceDef, old: &'a Value, dry_run: bool) -> Self {
        Request {
            def,
            operation: Operation::Delete,
            subresource: None,
            object: old,
            old: Some(old),
            dry_run,
            user: None,
        }
    }
}

/// Calls the configured admission webhooks.
#[derive(Debug, Default)]
pub struct Admission {
    /// `<service>.<namespace>.svc` → where to connect instead.
    services: HashMap<String, SocketAddr>,
    /// Webhook configurations by storage key, so that writes do not read them from storage every
    /// time. `generation` moves on every change, so a load racing with a change is not cached.
    cache: Mutex<HashMap<&'static str, Arc<Vec<Value>>>>,
    generation: AtomicU64,
}

const MUTATING_KEY: &str = "admissionregistration.k8s.io/mutatingwebhookconfigurations";
const VALIDATING_KEY: &str = "admissionregistration.k8s.io/validatingwebhookconfigurations";

/// Why a webhook call did not produce a usable answer.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Transport(String),
    #[error("context deadline exceeded")]
    Timeout,
}

impl Admission {
    pub fn with_services(services: HashMap<String, SocketAddr>) -> Self {
        Admission {
            services,
            ..Default::default()
        }
    }

    /// Must be called after every write of a webhook configuration.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, AtomicOrdering::SeqCst);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn configurations(
        &self,
        store: &Store,
        storage_key: &'static str,
    ) -> Result<Arc<Vec<Value>>, ApiError> {
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(storage_key)
        {
            return Ok(c.clone());
        }
        let generation = self.generation.load(AtomicOrdering::SeqCst);
        let (configs, _) = store.list(storage_key, None, None)?;
        let configs = Arc::new(configs);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(AtomicOrdering::SeqCst) == generation {
            cache.insert(storage_key, configs.clone());
        }
        Ok(configs)
    }

    /// Runs mutating webhooks in order; returns the (possibly patched) object, and the warnings
    /// the webhooks gave (kube-apiserver passes them to the client as `Warning` headers).
    pub async fn mutate(
        &self,
        store: &Store,
        req: &Request<'_>,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let mut object = req.object.clone();
        let mut warnings = Vec::new();
        for (config, hook) in self.matching_hooks(store, MUTATING_KEY, req)? {
            let current = Request {
                object: &object,
                ..*req
            };
            let Some(response) = self.call(&hook, &current).await? else {
                continue;
            };
            warnings.extend(response_warnings(&response));
            if let Some(patch) = response.get("patch").and_then(Value::as_str) {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(patch)
                    .map_err(|e| {
                        ApiError::internal(format!(
                            "webhook {:?} (in {config}) returned a patch that is not base64: {e}",
                            hook_name(&hook)
                        ))
                    })?;
                let ops: json_patch::Patch = serde_json::from_slice(&raw).map_err(|e| {
                    ApiError::internal(format!(
                        "webhook {:?} returned an invalid JSON patch: {e}",
                        hook_name(&hook)
                    ))
                })?;
                // Within the limits a client's JSON patch has: a webhook's copies cannot fill
                // memory either.
                object = crate::patch::bodies::apply_json_patch(object, &ops, Deadline::from_now())
                    .map_err(|e| {
                        ApiError::internal(format!(
                            "webhook {:?} returned a patch that does not apply: {e}",
                            hook_name(&hook)
                        ))
                    })?;
            }
        }
        Ok((object, warnings))
    }

    /// Runs validating webhooks; the first denial wins. Returns the warnings of those that
    /// allowed.
    pub async fn validate(
        &self,
        store: &Store,
        req: &Request<'_>,
    ) -> Result<Vec<String>, ApiError> {
        let mut warnings = Vec::new();
        for (_, hook) in self.matching_hooks(store, VALIDATING_KEY, req)? {
            if let Some(response) = self.call(&hook, req).await? {
                warnings.extend(response_warnings(&response));
            }
        }
        Ok(warnings)
    }

    fn matching_hooks(
        &self,
        store: &Store,
        storage_key: &'static str,
        req: &Request<'_>,
    ) -> Result<Vec<(String, Value)>, ApiError> {
        // Webhook configurations are never subject to webhooks (as in Kubernetes): no lock-out.
        if req.def.group == "admissionregistration.k8s.io" {
            return Ok(vec![]);
        }
        let configs = self.configurations(store, storage_key)?;
        let mut out = Vec::new();
        for config in configs.iter() {
            let name = crate::meta::name_of(config).to_string();
            for hook in config
                .get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if rules_match(hook, req) && selectors_match(store, hook, req)? {
                    out.push((name.clone(), hook.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Calls one webhook: its response when it allowed, Ok(None) when it failed and its
    /// failurePolicy is Ignore.
    async fn call(&self, hook: &Value, req: &Request<'_>) -> Result<Option<Value>, ApiError> {
        let name = hook_name(hook);
        let timeout = Duration::from_secs(
            hook.get("timeoutSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(10)
                .clamp(1, 30),
        );
        let review = review(req);
        let result = match tokio::time::timeout(timeout, self.post(hook, &review)).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        };
        let response = match result {
            Ok(body) => body,
            Err(e) => {
                if hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore") {
                    tracing::warn!(webhook = name, error = %e, "webhook failed, ignored (failurePolicy Ignore)");
                    return Ok(None);
                }
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook \"{name}\": {e}"
                )));
            }
        };
        if response.get("allowed").and_then(Value::as_bool) == Some(true) {
            return Ok(Some(response));
        }
        Err(denial(name, response.get("status")))
    }

    async fn post(&self, hook: &Value, review: &Value) -> Result<Value, CallError> {
        let cc = hook.get("clientConfig").cloned().unwrap_or(json!({}));
        let (host, port, path) = match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
            (Some(url), _) => parse_https_url(url)
                .ok_or_else(|| CallError::Config(format!("invalid webhook URL {url:?}")))?,
            (None, Some(svc)) => (
                format!(
                    "{}.{}.svc",
                    svc["name"].as_str().unwrap_or(""),
                    svc["namespace"].as_str().unwrap_or("")
                ),
                svc.get("port").and_then(Value::as_u64).unwrap_or(443) as u16,
                svc.get("path")
                    .and_then(Value::as_str)
                    .unwrap_or("/")
                    .to_string(),
            ),
            (None, None) => {
                return Err(CallError::Config(
                    "webhook has neither clientConfig.url nor clientConfig.service".into(),
                ));
            }
        };
        let url = format!("https://{host}:{port}{path}");
        let connect_to = match self.services.get(&host) {
            Some(addr) => addr.to_string(),
            None if host.ends_with(".svc") => {
                return Err(CallError::Config(format!(
                    "Post \"{url}\": service {host} is not in this server's service address map"
                )));
            }
            None => format!("{host}:{port}"),
        };
        let tls =
            tls_config(cc.get("caBundle").and_then(Value::as_str)).map_err(CallError::Config)?;
        let server_name = ServerName::try_from(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
        .map_err(|e| CallError::Config(format!("invalid webhook host {host:?}: {e}")))?;
        let fail = |e: String| {
            CallError::Transport(format!("failed to call webhook: Post \"{url}\": {e}"))
        };
        let tcp = tokio::net::TcpStream::connect(&connect_to)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(connection);
        let request = hyper::Request::post(format!("{path}?timeout=10s"))
            .header(hyper::header::HOST, format!("{host}:{port}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .map_err(|e| fail(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(fail(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let review: Value = serde_json::from_slice(&body)
            .map_err(|e| fail(format!("response is not an AdmissionReview: {e}")))?;
        review
            .get("response")
            .cloned()
            .ok_or_else(|| fail("the AdmissionReview has no response".into()))
    }
}

fn hook_name(hook: &Value) -> &str {
    hook.get("name").and_then(Value::as_str).unwrap_or("")
}

/// kube-apiserver's ToStatusErr: the webhook's status, with the denial named in the message.
fn denial(name: &str, status: Option<&Value>) -> ApiError {
    let denied_by = format!("admission webhook \"{name}\" denied the request");
    let status = status.cloned().unwrap_or(json!({}));
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .filter(|c| *c >= 400 && *c < 600)
        .unwrap_or(400) as u16;
    let message = status
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty());
    let reason = status.get("reason").and_then(Value::as_str).unwrap_or("");
    let message = match (message, reason) {
        (Some(m), _) => format!("{denied_by}: {m}"),
        (None, r) if !r.is_empty() => format!("{denied_by}: {r}"),
        _ => format!("{denied_by} without explanation"),
    };
    ApiError::new(code, crate::error::known_reason(reason), message)
}

fn parse_https_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => match p.parse() {
            Ok(port) => (h.to_string(), port),
            Err(_) => (authority.to_string(), 443),
        },
        _ => (authority.to_string(), 443),
    };
    Some((host, port, path))
}

fn tls_config(ca_bundle: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    crate::tls::install_crypto_provider();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca_bundle.unwrap_or(""))
        .map_err(|e| format!("clientConfig.caBundle is not base64: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    let mut bundle = Vec::new();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("clientConfig.caBundle: {e}"))?;
        bundle.push(cert.clone());
        roots
            .add(cert)
            .map_err(|e| format!("clientConfig.caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err(
            "clientConfig.caBundle holds no certificate (this server has no system trust store)"
                .into(),
        );
    }
    let inner = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| format!("clientConfig.caBundle: {e}"))?;
    Ok(Arc::new(
        rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(BundleVerifier { inner, bundle }))
            .with_no_client_auth(),
    ))
}

/// WebPKI verification against `caBundle`, and what Go's TLS (so kube-apiserver) also accepts:
/// a serving certificate that is itself one of the `caBundle` certificates, CA or not (some
/// operator frameworks serve a self-signed certificate with CA:TRUE, which WebPKI refuses as
/// `CaUsedAsEndEntity`). That certificate must still be valid now, name the server, and, if it
/// lists extended key usages, allow serverAuth; the handshake's signature is checked as always.
#[derive(Debug)]
struct BundleVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    bundle: Vec<CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for BundleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let refused =
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Ok(verified) => return Ok(verified),
                Err(e) => e,
            };
        if !self
            .bundle
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref())
        {
            return Err(refused);
        }
        let info = caretaker_pki::CertificateInfo::from_der(end_entity.as_ref())
            .map_err(|_| refused.clone())?;
        let seconds = now.as_secs() as i64;
        let valid_now = info.not_before.unix_timestamp() <= seconds
            && seconds <= info.not_after.unix_timestamp();
        let names_server = match server_name {
            ServerName::DnsName(name) => {
                let name = name.as_ref().to_ascii_lowercase();
                info.dns_names
                    .iter()
                    .any(|d| d.to_ascii_lowercase() == name)
            }
            ServerName::IpAddress(ip) => {
                let ip = std::net::IpAddr::from(*ip);
                info.ip_addresses.contains(&ip)
            }
            _ => false,
        };
        let for_servers = info.extended_key_usages.is_empty()
            || info.extended_key_usages.iter().any(|u| u == "serverAuth");
        if valid_now && names_server && for_servers {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(refused)
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn matches_list(list: Option<&Value>, value: &str) -> bool {
    list.and_then(Value::as_array).is_some_and(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .any(|x| x == "*" || x == value)
    })
}

fn rules_match(hook: &Value, req: &Request<'_>) -> bool {
    let def = req.def;
    let resource = match req.subresource {
        Some(sub) => format!("{}/{sub}", def.plural),
        None => def.plural.clone(),
    };
    hook.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|rule| {
            let resources = rule
                .get("resources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            let resource_ok = resources.into_iter().any(|r| {
                r == resource
                    || (r == "*" && req.subresource.is_none())
                    || r == "*/*"
                    || req.subresource.is_some_and(|sub| {
                        r == format!("*/{sub}") || r == format!("{}/*", def.plural)
                    })
            });
            let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
                "Cluster" => !def.namespaced,
                "Namespaced" => def.namespaced,
                _ => true,
            };
            matches_list(rule.get("apiGroups"), &def.group)
                && matches_list(rule.get("apiVersions"), &def.version)
                && matches_list(rule.get("operations"), req.operation.as_str())
                && resource_ok
                && scope_ok
        })
}

/// A metav1.LabelSelector (matchLabels, matchExpressions) as a selector.
fn selector(v: Option<&Value>) -> Option<LabelSelector> {
    LabelSelector::parse(&crate::selectors::label_selector_text(v?)).ok()
}

fn selectors_match(store: &Store, hook: &Value, req: &Request<'_>) -> Result<bool, ApiError> {
    if let Some(sel) = selector(hook.get("objectSelector"))
        && !sel.matches(req.object)
        && !req.old.is_some_and(|o| sel.matches(o))
    {
        return Ok(false);
    }
    if let Some(sel) = selector(hook.get("namespaceSelector")) {
        let namespace = if req.def.namespaced {
            crate::meta::namespace_of(req.object).to_string()
        } else if req.def.plural == "namespaces" {
            crate::meta::name_of(req.object).to_string()
        } else {
            return Ok(true);
        };
        let key = ObjectKey {
            resource: "/namespaces".into(),
            namespace: String::new(),
            name: namespace,
        };
        let ns = store.get(&key)?.unwrap_or_else(|| req.object.clone());
        return Ok(sel.matches(&ns));
    }
    Ok(true)
}

fn review(req: &Request<'_>) -> Value {
    let def = req.def;
    let gvk = json!({ "group": def.group, "version": def.version, "kind": def.kind });
    let gvr = json!({ "group": def.group, "version": def.version, "resource": def.plural });
    let mut request = json!({
        "uid": crate::meta::new_uid(),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": crate::meta::name_of(req.object),
        "operation": req.operation.as_str(),
        "userInfo": match req.user {
            Some(user) => json!({ "username": user.name, "groups": user.groups }),
            None => json!({ "username": "system:anonymous", "groups": ["system:unauthenticated"] }),
        },
        "object": if req.operation == Operation::Delete { Value::Null } else { def.served(req.object) },
        "oldObject": req.old.map(|o| def.served(o)),
        "dryRun": req.dry_run,
        "options": { "kind": match req.operation {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }, "apiVersion": "meta.k8s.io/v1" },
    });
    if def.namespaced {
        request["namespace"] = json!(crate::meta::namespace_of(req.object));
    }
    if let Some(sub) = req.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request })
}

/// The `warnings` of an admission response.
fn response_warnings(response: &Value) -> Vec<String> {
    let warnings = response.get("warnings").and_then(Value::as_array);
    let texts = warnings.into_iter().flatten().filter_map(Value::as_str);
    texts.map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_https_url("https://127.0.0.1:8443/validate"),
            Some(("127.0.0.1".into(), 8443, "/validate".into()))
        );
        assert_eq!(
            parse_https_url("https://hook.example.com"),
            Some(("hook.example.com".into(), 443, "/".into()))
        );
        assert_eq!(parse_https_url("http://plain"), None);
    }

    #[test]
    fn denials_read_like_kube_apiserver() {
        let e = denial(
            "v.example.com",
            Some(&json!({"code": 403, "reason": "Forbidden", "message": "no"})),
        );
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (
                403,
                "Forbidden",
                "admission webhook \"v.example.com\" denied the request: no"
            )
        );
        let e = denial("v.example.com", None);
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "admission webhook \"v.example.com\" denied the request without explanation"
            )
        );
    }
}
