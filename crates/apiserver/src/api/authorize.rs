//! What authorization decides where a write is stored, not before the request is read, as
//! kube-apiserver decides it in its storage: whether a server-side apply creates is known only
//! when it finds nothing stored, so that is where it must be allowed to `create`. The `auth`
//! module implements [`WriteAuthorizer`]; the verbs only call it, so that neither module
//! imports the other.

use super::ApiState;
use super::options::WriteOptions;
use crate::error::ApiError;
use crate::registry::ResourceDef;
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
}
