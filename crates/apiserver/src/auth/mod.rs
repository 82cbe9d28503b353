//! Who sends a request, and whether they may: authentication by client certificate or
//! ServiceAccount token, and RBAC authorization, as kube-apiserver does them. Off unless the
//! server is built with [`Authorization::Rbac`]: then every request is authenticated and
//! authorized before anything else reads it.
//!
//! - [`attributes`]: what a request asks to do (kube-apiserver's `RequestInfo`).
//! - [`rbac`]: the decision, a pure function of the stored RBAC objects.
//! - [`escalation`]: what a writer of RBAC objects may grant (checked where they are stored).
//! - [`tokens`]: ServiceAccount bearer tokens, and [`token_request`], which issues them.
//! - [`bootstrap`]: the ClusterRoles and bindings every cluster starts with.
//! - [`reviews`]: SelfSubjectAccessReview and SelfSubjectRulesReview (`kubectl auth can-i`),
//!   SelfSubjectReview (`kubectl auth whoami`).
//! - [`impersonation`]: acting as another user (`kubectl --as`).

pub mod attributes;
pub mod bootstrap;
pub mod escalation;
pub mod impersonation;
pub mod rbac;
pub mod reviews;
pub mod token_request;
pub mod tokens;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{ApiState, WriteAuthorizer};
use crate::error::ApiError;
use crate::store::registry::ResourceDef;
pub use crate::user::{MASTERS, UserInfo, service_account_user};
use attributes::{Attributes, ResourceAttributes};
use escalation::Grant;
use rbac::{Decision, Policy};
use tokens::{TokenError, TokenKey};

/// What the TLS handshake of a connection proved: the user of its client certificate, if it
/// presented one (a certificate that does not chain to the client CA fails the handshake).
#[derive(Debug, Clone, Default)]
pub struct PeerIdentity(pub Option<Arc<UserInfo>>);

/// The authenticated user of a request, for the handlers that answer about the requester.
#[derive(Debug, Clone)]
pub struct Requester(pub Arc<UserInfo>);

/// How requests are authorized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Authorization {
    /// Every request may do everything (the default: a server on loopback for one user).
    #[default]
    AlwaysAllow,
    /// Client certificates and ServiceAccount tokens identify users; RBAC decides.
    Rbac,
}

/// One kind of request a user made: what the least-privilege test compares with the grants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub allowed: bool,
}

/// RBAC's stored objects, by storage key.
const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";
const RBAC_KINDS: [&str; 4] = [CLUSTER_ROLES, ROLES, CLUSTER_ROLE_BINDINGS, ROLE_BINDINGS];

/// Authentication and authorization for one server.
pub struct Auth {
    pub mode: Authorization,
    tokens: TokenKey,
    /// The policy, with the last write to each RBAC kind it has seen.
    policy: Mutex<Option<([u64; 4], Arc<Policy>)>>,
    access: Mutex<BTreeSet<Access>>,
    /// Who a request without credentials is: `system:anonymous`, or, with everything allowed,
    /// an admin. Made once, shared by every such request.
    nobody: Arc<UserInfo>,
}

impl Auth {
    pub fn new(mode: Authorization, tokens: TokenKey) -> Auth {
        let nobody = match mode {
            Authorization::AlwaysAllow => UserInfo::new("system:admin", [MASTERS.to_string()]),
            Authorization::Rbac => UserInfo::anonymous(),
        };
        Auth {
            mode,
            tokens,
            policy: Mutex::new(None),
            access: Mutex::new(BTreeSet::new()),
            nobody: Arc::new(nobody),
        }
    }

    /// The key ServiceAccount tokens are made with.
    pub fn tokens(&self) -> &TokenKey {
        &self.tokens
    }

    /// Every kind of request made so far (with [`Authorization::Rbac`] only).
    pub fn access_log(&self) -> Vec<Access> {
        let log = self.access.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect()
    }

    /// The request's user; 401 for a bearer token that does not authenticate (see
    /// [`tokens`]).
    fn authenticate(
        &self,
        api: &ApiState,
        peer: Option<Arc<UserInfo>>,
        authorization: Option<&str>,
    ) -> Result<Arc<UserInfo>, ApiError> {
        if let Some(user) = peer {
            return Ok(user);
        }
        let Some(value) = authorization else {
            return Ok(self.nobody.clone());
        };
        let token = value
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        match self.service_account_of(api, token)? {
            Ok(user) => Ok(Arc::new(user)),
            Err(reason) => {
                tracing::debug!(%reason, "refused a bearer token");
                Err(unauthorized())
            }
        }
    }

    /// The ServiceAccount a bearer token authenticates, checked against the objects its
    /// claims name as they are stored now; why not, if it does not.
    fn service_account_of(
        &self,
        api: &ApiState,
        token: &str,
    ) -> Result<Result<UserInfo, TokenError>, ApiError> {
        let claims = match self.tokens.read(token).and_then(|claims| {
            claims
                .check(unix_now(), tokens::API_AUDIENCE)
                .map(|()| claims)
        }) {
            Ok(claims) => claims,
            Err(e) => return Ok(Err(e)),
        };
        let namespace = &claims.kubernetes.namespace;
        let stored = |plural: &str, name: &str| stored_core(api, plural, namespace, name);
        let account = &claims.kubernetes.serviceaccount;
        let mut checks = vec![(
            "ServiceAccount",
            account,
            stored("serviceaccounts", &account.name)?,
        )];
        if let Some(secret) = &claims.kubernetes.secret {
            checks.push(("Secret", secret, stored("secrets", &secret.name)?));
        }
        if let Some(pod) = &claims.kubernetes.pod {
            checks.push(("Pod", pod, stored("pods", &pod.name)?));
        }
        for (kind, named, object) in &checks {
            if let Err(e) = named.check(kind, object.as_ref()) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(UserInfo::service_account(namespace, &account.name)))
    }

    /// Whether `user` may make `request`; the reason either way.
    pub fn authorize(&self, api: &ApiState, user: &UserInfo, request: &Attributes) -> Decision {
        if self.mode == Authorization::AlwaysAllow || user.is_master() {
            return Decision::Allow(String::new());
        }
        match self.policy(api) {
            Ok(policy) => policy.authorize(user, request),
            Err(e) => Decision::Deny(format!("RBAC: {}", e.message)),
        }
    }

    /// The rules `user` has in `namespace`, and whether some could not be read.
    pub fn rules_for(
        &self,
        api: &ApiState,
        user: &UserInfo,
        namespace: &str,
    ) -> Result<(Vec<k8s_openapi::api::rbac::v1::PolicyRule>, bool), ApiError> {
        let (rules, errors) = self.policy(api)?.rules_for(user, namespace);
        Ok((rules, !errors.is_empty()))
    }

    /// The policy as stored now: read again only after an RBAC object was written.
    fn policy(&self, api: &ApiState) -> Result<Arc<Policy>, ApiError> {
        let stamp = RBAC_KINDS.map(|kind| api.store.latest_write(kind));
        let mut cached = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, policy)) = cached.as_ref()
            && *seen == stamp
        {
            return Ok(policy.clone());
        }
        let policy = Arc::new(Policy::new(
            load(api, CLUSTER_ROLES)?,
            load(api, ROLES)?,
            load(api, CLUSTER_ROLE_BINDINGS)?,
            load(api, ROLE_BINDINGS)?,
        ));
        *cached = Some((stamp, policy.clone()));
        Ok(policy)
    }

    /// [`Self::authorize`], recorded in the access log; kube-apiserver's 403 when denied.
    fn check(&self, api: &ApiState, user: &UserInfo, request: &Attributes) -> Result<(), ApiError> {
        let decision = self.authorize(api, user, request);
        self.record(user, request, matches!(decision, Decision::Allow(_)));
        match decision {
            Decision::Allow(_) => Ok(()),
            Decision::Deny(reason) => {
                tracing::debug!(user = %user.name, %request, "forbidden");
                Err(forbidden(user, request, &reason))
            }
        }
    }

    /// The user a request acts as: the one its `Impersonate-*` headers name, once `user` may
    /// impersonate each thing named (kube-apiserver's 403 when not), else `user`.
    fn impersonate(
        &self,
        api: &ApiState,
        user: Arc<UserInfo>,
        headers: &axum::http::HeaderMap,
    ) -> Result<Arc<UserInfo>, ApiError> {
        let Some(asked) = impersonation::Impersonation::of(headers)? else {
            return Ok(user);
        };
        if self.mode == Authorization::Rbac {
            for check in asked.checks() {
                self.check(api, &user, &check)?;
            }
        }
        let acting_as = asked.user();
        // kube-apiserver's request log line, so that what the impersonated user did can be
        // traced back to who asked.
        tracing::debug!(user = %user.name, impersonated = %acting_as.name, "impersonating");
        Ok(Arc::new(acting_as))
    }

    fn record(&self, user: &UserInfo, request: &Attributes, allowed: bool) {
        if let Attributes::Resource(r) = request {
            let mut log = self.access.lock().unwrap_or_else(|p| p.into_inner());
            log.insert(Access {
                user: user.name.clone(),
                verb: r.verb.clone(),
                group: r.group.clone(),
                resource: r.resource.clone(),
                subresource: r.subresource.clone(),
                namespace: r.namespace.clone(),
                allowed,
            });
        }
    }
}

impl WriteAuthorizer for Auth {
    fn may_create(
        &self,
        api: &ApiState,
        user: &UserInfo,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let create = Attributes::Resource(ResourceAttributes {
            verb: "create".into(),
            group: def.group.clone(),
            version: def.version.clone(),
            resource: def.plural.clone(),
            subresource: String::new(),
            namespace: if def.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        });
        self.check(api, user, &create)
    }

    fn may_store(
        &self,
        api: &ApiState,
        user: &UserInfo,
        def: &ResourceDef,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        // `EscalationAllowed`: system:masters, and everyone with authorization off, grant
        // anything.
        if def.group != escalation::GROUP
            || self.mode == Authorization::AlwaysAllow
            || user.is_master()
        {
            return Ok(());
        }
        let Some(grant) = Grant::of(&def.plural, new, old)? else {
            return Ok(());
        };
        if old.is_some_and(|old| escalation::only_garbage_collection_fields_change(old, new)) {
            return Ok(());
        }
        escalation::check(&*self.policy(api)?, user, &grant)
    }
}

/// Every stored object of an RBAC kind; one that does not parse grants nothing.
fn load<T: DeserializeOwned>(api: &ApiState, storage_key: &str) -> Result<Vec<T>, ApiError> {
    let (objects, _) = api.store.list(storage_key, None, None)?;
    Ok(objects
        .into_iter()
        .filter_map(|o| match serde_json::from_value(o) {
            Ok(parsed) => Some(parsed),
            Err(e) => {
                tracing::warn!(kind = storage_key, error = %e, "an RBAC object that does not parse grants nothing");
                None
            }
        })
        .collect())
}

/// The core (`v1`) object `plural` `namespace`/`name` as stored now.
pub(crate) fn stored_core(
    api: &ApiState,
    plural: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<serde_json::Value>, ApiError> {
    let def = api
        .registry
        .lookup("", "v1", plural)
        .ok_or_else(ApiError::unknown_resource)?;
    Ok(api.store.get(&ApiState::key(&def, namespace, name))?)
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// kube-apiserver's 403: `secrets "s" is forbidden: User "u" cannot get resource "secrets" in
/// API group "" in the namespace "n"`, with the RBAC reason appended when there is one.
fn forbidden(user: &UserInfo, request: &Attributes, reason: &str) -> ApiError {
    let mut because = format!("User {:?} cannot {request}", user.name);
    if !reason.is_empty() {
        because = format!("{because}: {reason}");
    }
    match request {
        Attributes::NonResource { .. } => {
            ApiError::new(403, "Forbidden", format!("forbidden: {because}"))
        }
        Attributes::Resource(r) => {
            let resource = crate::error::qualified(&r.group, &r.resource);
            let message = if r.name.is_empty() {
                format!("{resource} is forbidden: {because}")
            } else {
                format!("{resource} {:?} is forbidden: {because}", r.name)
            };
            let mut details = serde_json::json!({"kind": r.resource});
            if !r.name.is_empty() {
                details["name"] = r.name.clone().into();
            }
            if !r.group.is_empty() {
                details["group"] = r.group.clone().into();
            }
            ApiError {
                details: Some(details),
                ..ApiError::new(403, "Forbidden", message)
            }
        }
    }
}

/// The state the middleware needs.
pub struct AuthLayer {
    pub auth: Arc<Auth>,
    pub api: Arc<ApiState>,
}

/// Authenticates and authorizes every request before the handlers see it, and hands the
/// handlers its [`Requester`].
pub async fn middleware(
    State(layer): State<Arc<AuthLayer>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.0.clone());
    let auth = &layer.auth;
    let user = if auth.mode == Authorization::AlwaysAllow {
        peer.unwrap_or_else(|| auth.nobody.clone())
    } else {
        let header = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or_default());
        match auth.authenticate(&layer.api, peer, header) {
            Ok(user) => user,
            Err(e) => return e.into_response(),
        }
    };
    let user = match auth.impersonate(&layer.api, user, request.headers()) {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    if auth.mode == Authorization::Rbac {
        let params: Vec<(String, String)> = axum::extract::Query::try_from_uri(request.uri())
            .map(|q| q.0)
            .unwrap_or_default();
        let attributes = Attributes::of(request.method().as_str(), request.uri().path(), &params);
        // A server-side apply that creates also needs `create`: decided where it creates
        // (`WriteAuthorizer::may_create`), not here, before the handler has looked.
        if let Err(e) = auth.check(&layer.api, &user, &attributes) {
            return e.into_response();
        }
    }
    request.extensions_mut().insert(Requester(user));
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_messages_are_kube_apiservers() {
        let alice = UserInfo::new("alice", []);
        let named = Attributes::Resource(ResourceAttributes {
            verb: "get".into(),
            resource: "secrets".into(),
            namespace: "team".into(),
            name: "db".into(),
            ..Default::default()
        });
        let e = forbidden(&alice, &named, "");
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "secrets \"db\" is forbidden: User \"alice\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team\""
        );
        assert_eq!(
            e.details,
            Some(serde_json::json!({"kind": "secrets", "name": "db"}))
        );
        let list = Attributes::Resource(ResourceAttributes {
            verb: "list".into(),
            group: "cluster.x-k8s.io".into(),
            resource: "machines".into(),
            ..Default::default()
        });
        assert_eq!(
            forbidden(
                &alice,
                &list,
                "RBAC: [role.rbac.authorization.k8s.io \"x\" not found]"
            )
            .message,
            "machines.cluster.x-k8s.io is forbidden: User \"alice\" cannot list resource \"machines\" in API group \"cluster.x-k8s.io\" at the cluster scope: RBAC: [role.rbac.authorization.k8s.io \"x\" not found]"
        );
        let path = Attributes::NonResource {
            verb: "get".into(),
            path: "/openapi/v2".into(),
        };
        assert_eq!(
            forbidden(&alice, &path, "").message,
            "forbidden: User \"alice\" cannot get path \"/openapi/v2\""
        );
    }

    #[test]
    fn users_carry_the_groups_kube_apiserver_gives_them() {
        let sa = UserInfo::service_account("caretaker-system", "caretaker");
        assert_eq!(sa.name, "system:serviceaccount:caretaker-system:caretaker");
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:caretaker-system",
                "system:authenticated"
            ]
        );
        assert_eq!(UserInfo::anonymous().groups, ["system:unauthenticated"]);
        assert!(UserInfo::new("root", [MASTERS.to_string()]).is_master());
    }
}
