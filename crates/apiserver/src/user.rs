//! Who a request is from: a user's name and groups, as kube-apiserver's `user.Info` holds them.
//! Its own module so that the API's verbs (which tell admission webhooks who asks) and the
//! authentication module (which finds it out, and reads the API's stored roles) depend on it,
//! not on each other.

use std::collections::BTreeMap;

/// The group whose members every request is allowed to, without RBAC (kube-apiserver's
/// privileged group authorizer).
pub const MASTERS: &str = "system:masters";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const ANONYMOUS: &str = "system:anonymous";

/// Who a request is from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
    /// Its UID, when something names one (an impersonating request's `Impersonate-Uid`).
    pub uid: String,
    /// Its extra attributes, by key (an impersonating request's `Impersonate-Extra-KEY`).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// `system:serviceaccount:NAMESPACE:NAME`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups every ServiceAccount of `namespace` is in.
pub fn service_account_groups(namespace: &str) -> [String; 2] {
    [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

impl UserInfo {
    /// A user with `groups`, and `system:authenticated` as every authenticated user has.
    pub fn new(name: impl Into<String>, groups: impl IntoIterator<Item = String>) -> UserInfo {
        let mut groups: Vec<String> = groups.into_iter().collect();
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.into());
        }
        UserInfo {
            name: name.into(),
            groups,
            ..UserInfo::default()
        }
    }

    pub fn service_account(namespace: &str, name: &str) -> UserInfo {
        UserInfo::new(
            service_account_user(namespace, name),
            service_account_groups(namespace),
        )
    }

    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS.into(),
            groups: vec![UNAUTHENTICATED.into()],
            ..UserInfo::default()
        }
    }

    /// The user of a client certificate that chains to the server's client CA: its subject's
    /// CN is the name, its O values the groups.
    pub fn from_certificate(der: &[u8]) -> Option<UserInfo> {
        let info = caretaker_pki::CertificateInfo::from_der(der).ok()?;
        let name = info.common_name.filter(|cn| !cn.is_empty())?;
        Some(UserInfo::new(name, info.organizations))
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}
