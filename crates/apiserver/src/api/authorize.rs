//! What authorization decides where a write is stored, not before the request is read, as
//! kube-apiserver decides it in its storage: whether a server-side apply creates is known only
//! when it finds nothing stored, so that is where it must be allowed to `create`; what an RBAC
//! object grants is known only once it is patched, applied and admitted, so that is where its
//! writer must be shown to hold it. The `auth` module implements [`WriteAuthorizer`]; the verbs
//! only call it, so that neither module imports the other.

use serde_json::Value;

use super::ApiState;
use super::options::WriteOptions;
use crate::error::ApiError;
use crate::store::registry::ResourceDef;
use crate::user::UserInfo;

/// The checks of a write, answered with kube-apiserver's errors (403 Forbidden).
pub trait WriteAuthorizer: Send + Sync {
    /// Ok if `user` may create `name` of `def` in `namespace` (cluster-scoped kinds ignore it).
    fn may_create(
        &self,
        api: &ApiState,
        user: &UserInfo,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError>;

    /// Ok if `user` may store `new` over `old` (None for a create) of `def`, for what it
    /// grants: RBAC's escalation prevention; objects of other kinds grant nothing.
    fn may_store(
        &self,
        api: &ApiState,
        user: &UserInfo,
        def: &ResourceDef,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError>;
}

impl ApiState {
    /// Ok if the request's user may create `name`: always, without an authorizer or a user
    /// (authorization off, or the server's own writes).
    pub(super) fn authorize_create(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        opts: &WriteOptions,
    ) -> Result<(), ApiError> {
        match (&self.authorizer, &opts.user) {
            (Some(authorizer), Some(user)) => {
                authorizer.may_create(self, user, def, namespace, name)
            }
            _ => Ok(()),
        }
    }

    /// Ok if the request's user may store `new` over `old`, as [`WriteAuthorizer::may_store`]
    /// says; always without an authorizer or a user.
    pub(super) fn authorize_store(
        &self,
        def: &ResourceDef,
        new: &Value,
        old: Option<&Value>,
        opts: &WriteOptions,
    ) -> Result<(), ApiError> {
        match (&self.authorizer, &opts.user) {
            (Some(authorizer), Some(user)) => authorizer.may_store(self, user, def, new, old),
            _ => Ok(()),
        }
    }
}
