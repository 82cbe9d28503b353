//! Impersonation (`kubectl --as`, `--as-group`, `--as-uid`): a request carrying
//! `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` or `Impersonate-Extra-KEY`
//! headers acts as the user they name, once its own user may `impersonate` each thing named,
//! as kube-apiserver's impersonation filter decides it.

use std::collections::BTreeMap;

use axum::http::HeaderMap;

use super::attributes::{Attributes, ResourceAttributes};
use crate::error::ApiError;
use crate::user::{ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED, UserInfo, service_account_groups};

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";
/// Where `uids` and `userextras` are, for RBAC.
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Who a request asks to act as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Impersonation {
    user: String,
    groups: Vec<String>,
    uid: Option<String>,
    extra: BTreeMap<String, Vec<String>>,
}

impl Impersonation {
    /// The impersonation `headers` ask for, if any. Groups, a UID or extras without a user are
    /// refused, as kube-apiserver refuses them (500).
    pub fn of(headers: &HeaderMap) -> Result<Option<Impersonation>, ApiError> {
        let mut asked = Impersonation::default();
        let mut any = false;
        for (name, value) in headers {
            let name = name.as_str();
            if !name.starts_with("impersonate-") {
                continue;
            }
            let value = value.to_str().map_err(|_| {
                ApiError::bad_request(format!("the {name} header is not valid text"))
            })?;
            match name {
                // An empty user names no one (kube-apiserver's `len(requestedUser) > 0`).
                USER if value.is_empty() => continue,
                USER => asked.user = value.to_string(),
                GROUP => asked.groups.push(value.to_string()),
                UID => asked.uid = Some(value.to_string()),
                _ => match name.strip_prefix(EXTRA_PREFIX) {
                    Some(key) => {
                        let values = asked.extra.entry(percent_decoded(key)).or_default();
                        values.push(value.to_string());
                    }
                    None => continue,
                },
            }
            any = true;
        }
        if !any {
            return Ok(None);
        }
        if asked.user.is_empty() {
            return Err(ApiError::internal(
                "requested impersonation of groups, a UID or extra attributes without impersonating a user",
            ));
        }
        Ok(Some(asked))
    }

    /// What the requester must be allowed to `impersonate`, in kube-apiserver's order: the user
    /// (a ServiceAccount as `serviceaccounts` in its namespace), each group, each extra value,
    /// the UID.
    pub fn checks(&self) -> Vec<Attributes> {
        let impersonate =
            |group: &str, resource: &str, subresource: &str, namespace, name: &str| {
                Attributes::Resource(ResourceAttributes {
                    verb: "impersonate".into(),
                    group: group.into(),
                    resource: resource.into(),
                    subresource: subresource.into(),
                    namespace: String::from(namespace),
                    name: name.into(),
                    ..Default::default()
                })
            };
        let mut checks = vec![match self.service_account() {
            Some((namespace, name)) => impersonate("", "serviceaccounts", "", namespace, name),
            None => impersonate("", "users", "", "", &self.user),
        }];
        for group in &self.groups {
            checks.push(impersonate("", "groups", "", "", group));
        }
        for (key, values) in &self.extra {
            for value in values {
                checks.push(impersonate(
                    AUTHENTICATION_GROUP,
                    "userextras",
                    key,
                    "",
                    value,
                ));
            }
        }
        if let Some(uid) = &self.uid {
            checks.push(impersonate(AUTHENTICATION_GROUP, "uids", "", "", uid));
        }
        checks
    }

    /// `system:serviceaccount:NAMESPACE:NAME` as (namespace, name).
    fn service_account(&self) -> Option<(&str, &str)> {
        let rest = self.user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
        rest.split_once(':')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
    }

    /// The user the request acts as, grouped as kube-apiserver groups it: the groups named, or
    /// a ServiceAccount's own when none are; then `system:authenticated`, unless a group named
    /// already says whether the user is authenticated (`system:unauthenticated` for
    /// `system:anonymous`, unless named).
    pub fn user(self) -> UserInfo {
        let mut groups = self.groups.clone();
        if groups.is_empty()
            && let Some((namespace, _)) = self.service_account()
        {
            groups.extend(service_account_groups(namespace));
        }
        // Which groups already say whether the user is authenticated.
        let (everyone, settled_by): (_, &[&str]) = if self.user == ANONYMOUS {
            (UNAUTHENTICATED, &[UNAUTHENTICATED])
        } else {
            (AUTHENTICATED, &[AUTHENTICATED, UNAUTHENTICATED])
        };
        if !groups.iter().any(|g| settled_by.contains(&g.as_str())) {
            groups.push(everyone.to_string());
        }
        UserInfo {
            name: self.user,
            groups,
            uid: self.uid.unwrap_or_default(),
            extra: self.extra,
        }
    }
}

/// An extra's key as its header names it, `%XX` escapes decoded (kube-apiserver's
/// `unescapeExtraKey`); the key as it is when an escape is malformed.
fn percent_decoded(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = key
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return key.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn headers_name_the_user_and_what_must_be_allowed() {
        assert_eq!(
            Impersonation::of(&headers(&[("Accept", "x")])).unwrap(),
            None
        );
        let asked = Impersonation::of(&headers(&[
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "team"),
            ("Impersonate-Group", "ops"),
            ("Impersonate-Uid", "1234"),
            ("Impersonate-Extra-Scopes%2fA", "view"),
        ]))
        .unwrap()
        .unwrap();
        let checks: Vec<String> = asked.checks().iter().map(|c| c.to_string()).collect();
        assert_eq!(
            checks,
            [
                "impersonate resource \"users\" in API group \"\" at the cluster scope",
                "impersonate resource \"groups\" in API group \"\" at the cluster scope",
                "impersonate resource \"groups\" in API group \"\" at the cluster scope",
                "impersonate resource \"userextras/scopes/a\" in API group \"authentication.k8s.io\" at the cluster scope",
                "impersonate resource \"uids\" in API group \"authentication.k8s.io\" at the cluster scope",
            ]
        );
        let user = asked.user();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["team", "ops", "system:authenticated"]);
        assert_eq!(user.uid, "1234");
        assert_eq!(user.extra["scopes/a"], ["view"]);

        let group_alone = Impersonation::of(&headers(&[("Impersonate-Group", "team")]));
        assert_eq!(group_alone.unwrap_err().code, 500);
        // An empty user names no one: alone it asks for nothing, with a group it is refused.
        let empty = Impersonation::of(&headers(&[("Impersonate-User", "")]));
        assert_eq!(empty.unwrap(), None);
        let empty_with_group = Impersonation::of(&headers(&[
            ("Impersonate-User", ""),
            ("Impersonate-Group", "team"),
        ]));
        assert_eq!(empty_with_group.unwrap_err().code, 500);
    }

    fn groups_of(pairs: &[(&str, &str)]) -> Vec<String> {
        Impersonation::of(&headers(pairs))
            .unwrap()
            .unwrap()
            .user()
            .groups
    }

    #[test]
    fn a_named_group_settles_whether_the_user_is_authenticated() {
        let user = ("Impersonate-User", "alice");
        let anonymous = ("Impersonate-User", "system:anonymous");
        let authenticated = ("Impersonate-Group", "system:authenticated");
        let unauthenticated = ("Impersonate-Group", "system:unauthenticated");
        assert_eq!(groups_of(&[user]), ["system:authenticated"]);
        assert_eq!(groups_of(&[user, authenticated]), ["system:authenticated"]);
        assert_eq!(
            groups_of(&[user, unauthenticated]),
            ["system:unauthenticated"]
        );
        assert_eq!(groups_of(&[anonymous]), ["system:unauthenticated"]);
        assert_eq!(
            groups_of(&[anonymous, unauthenticated]),
            ["system:unauthenticated"]
        );
        assert_eq!(
            groups_of(&[anonymous, authenticated]),
            ["system:authenticated", "system:unauthenticated"]
        );
    }

    #[test]
    fn a_service_account_is_impersonated_in_its_namespace_with_its_groups() {
        let asked = Impersonation::of(&headers(&[(
            "Impersonate-User",
            "system:serviceaccount:team:builder",
        )]))
        .unwrap()
        .unwrap();
        let Attributes::Resource(check) = &asked.checks()[0] else {
            panic!("a resource check");
        };
        assert_eq!(
            (
                check.resource.as_str(),
                check.namespace.as_str(),
                check.name.as_str()
            ),
            ("serviceaccounts", "team", "builder")
        );
        assert_eq!(
            asked.user().groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                "system:authenticated"
            ]
        );
        // Groups named replace the ServiceAccount's own.
        let named = groups_of(&[
            ("Impersonate-User", "system:serviceaccount:team:builder"),
            ("Impersonate-Group", "ops"),
        ]);
        assert_eq!(named, ["ops", "system:authenticated"]);
    }
}
