//! RBAC's escalation prevention, as kube-apiserver's RBAC storage does it
//! (pkg/registry/rbac: `ConfirmNoEscalation`, `RoleEscalationAuthorized`, `BindingAuthorized`;
//! `Covers` of k8s.io/component-helpers/auth/rbac/validation). Being allowed to write RBAC
//! objects is not being allowed to grant anything:
//!
//! - a Role or ClusterRole may grant only what its writer already holds (in its namespace,
//!   cluster-wide for a ClusterRole), unless the writer may `escalate` it;
//! - a ClusterRole with an `aggregationRule` (which gathers whatever is labelled for it, now or
//!   later) needs every permission (`*` on everything) of its writer, as does removing one;
//! - a RoleBinding or ClusterRoleBinding may bind only a role whose permissions its writer
//!   holds where the binding grants them, unless the writer may `bind` that role (its name
//!   may be pinned by resourceNames, and a RoleBinding's namespace by where `bind` is granted).
//!
//! Pure functions of the [`Policy`], the writer and the object written; the caller exempts
//! `system:masters` and servers without authorization (`EscalationAllowed`).

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef};
use serde_json::{Value, json};

use super::UserInfo;
use super::attributes::{Attributes, ResourceAttributes};
use super::rbac::{Decision, Policy};
use crate::error::{self, ApiError};

/// The API group of RBAC's kinds.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// What writing an RBAC object grants.
#[derive(Debug, Clone, PartialEq)]
pub enum Grant {
    /// A Role (in `namespace`) or ClusterRole (`namespace` ""): its rules, and whether it has,
    /// or had before this write, an `aggregationRule`.
    Role {
        resource: &'static str,
        namespace: String,
        name: String,
        rules: Vec<PolicyRule>,
        aggregation: bool,
    },
    /// A RoleBinding (in `namespace`) or ClusterRoleBinding (`namespace` ""): the role it binds.
    Binding {
        resource: &'static str,
        namespace: String,
        name: String,
        role_ref: RoleRef,
    },
}

impl Grant {
    /// What storing `new` (over `old`, for an update) of the RBAC resource `plural` grants; None
    /// for any other resource. 400 if it cannot be read as its kind (it could not grant
    /// anything, but what cannot be checked is not stored).
    pub fn of(plural: &str, new: &Value, old: Option<&Value>) -> Result<Option<Grant>, ApiError> {
        let (resource, namespaced) = match plural {
            "roles" => ("roles", true),
            "clusterroles" => ("clusterroles", false),
            "rolebindings" => ("rolebindings", true),
            "clusterrolebindings" => ("clusterrolebindings", false),
            _ => return Ok(None),
        };
        let text = |pointer: &str| {
            new.pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = text("/metadata/name");
        let namespace = if namespaced {
            text("/metadata/namespace")
        } else {
            String::new()
        };
        let unreadable = |e: serde_json::Error| {
            ApiError::bad_request(format!(
                "{} {name:?} cannot be read: {e}",
                error::qualified(GROUP, resource)
            ))
        };
        let field = |key: &str| new.get(key).cloned().unwrap_or(Value::Null);
        Ok(Some(match resource {
            "roles" | "clusterroles" => {
                let rules: Option<Vec<PolicyRule>> =
                    serde_json::from_value(field("rules")).map_err(unreadable)?;
                let aggregates = |o: &Value| {
                    o.pointer("/aggregationRule/clusterRoleSelectors")
                        .and_then(Value::as_array)
                        .is_some_and(|selectors| !selectors.is_empty())
                };
                Grant::Role {
                    resource,
                    namespace,
                    name,
                    rules: rules.unwrap_or_default(),
                    aggregation: !namespaced && (aggregates(new) || old.is_some_and(aggregates)),
                }
            }
            _ => Grant::Binding {
                resource,
                namespace,
                role_ref: serde_json::from_value(field("roleRef")).map_err(unreadable)?,
                name,
            },
        }))
    }
}

/// Ok if `user` may make `grant`; kube-apiserver's refusal otherwise: 403 naming what the user
/// does not hold, or 404 for a binding of a role that does not exist (unless the user may
/// `bind` it).
pub fn check(policy: &Policy, user: &UserInfo, grant: &Grant) -> Result<(), ApiError> {
    match grant {
        Grant::Role {
            resource,
            namespace,
            name,
            rules,
            aggregation,
        } => {
            if allowed(policy, user, "escalate", GROUP, resource, namespace, name) {
                return Ok(());
            }
            let (held, errors) = policy.rules_for(user, namespace);
            let missing = uncovered(&held, rules);
            if !missing.is_empty() {
                let why = not_held(user, &missing, &errors);
                return Err(forbidden(resource, name, &why));
            }
            if *aggregation && !uncovered(&held, &full_authority()).is_empty() {
                let why = "must have cluster-admin privileges to use the aggregationRule";
                return Err(forbidden(resource, name, why));
            }
            Ok(())
        }
        Grant::Binding {
            resource,
            namespace,
            name,
            role_ref,
        } => {
            let role_resource = match role_ref.kind.as_str() {
                "ClusterRole" => "clusterroles",
                "Role" => "roles",
                other => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("unsupported role reference kind: {other:?}"),
                    ));
                }
            };
            let group = role_ref.api_group.as_deref().unwrap_or_default();
            let role = &role_ref.name;
            if allowed(policy, user, "bind", group, role_resource, namespace, role) {
                return Ok(());
            }
            let rules = policy
                .role_ref_rules(role_ref, namespace)
                .map_err(|_| ApiError::not_found(GROUP, role_resource, role))?;
            let (held, errors) = policy.rules_for(user, namespace);
            let missing = uncovered(&held, rules);
            if missing.is_empty() {
                Ok(())
            } else {
                Err(forbidden(
                    resource,
                    name,
                    &not_held(user, &missing, &errors),
                ))
            }
        }
    }
}

/// Whether RBAC allows `user` to `verb` the `resource` named `name` in `namespace`.
fn allowed(
    policy: &Policy,
    user: &UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> bool {
    let request = Attributes::Resource(ResourceAttributes {
        verb: verb.into(),
        group: group.into(),
        version: "*".into(),
        resource: resource.into(),
        subresource: String::new(),
        namespace: namespace.into(),
        name: name.into(),
    });
    matches!(policy.authorize(user, &request), Decision::Allow(_))
}

/// Whether storing `new` over `old` changes only what the garbage collector changes (owner
/// references and finalizers), and what this server keeps itself (resourceVersion,
/// managedFields): such a write grants nothing new (`IsOnlyMutatingGCFields`).
pub fn only_garbage_collection_fields_change(old: &Value, new: &Value) -> bool {
    const IGNORED: [&str; 5] = [
        "ownerReferences",
        "finalizers",
        "selfLink",
        "resourceVersion",
        "managedFields",
    ];
    let without_them = |object: &Value| {
        let mut object = object.clone();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in IGNORED {
                metadata.remove(key);
            }
        }
        object
    };
    without_them(old) == without_them(new)
}

/// `*` on every resource and every non-resource URL: what an `aggregationRule` needs.
fn full_authority() -> Vec<PolicyRule> {
    let all = || Some(vec!["*".to_string()]);
    vec![
        PolicyRule {
            verbs: vec!["*".into()],
            api_groups: all(),
            resources: all(),
            ..Default::default()
        },
        PolicyRule {
            verbs: vec!["*".into()],
            non_resource_urls: all(),
            ..Default::default()
        },
    ]
}

/// The parts of `servant` that `owner` does not allow (`Covers`); empty when `owner` covers
/// it. Each servant rule is broken down to one group, resource, verb and name (or one URL and
/// verb), so that each part is covered, or not, by a single owner rule. A `*` is covered only
/// by `*`, not by any enumeration.
pub fn uncovered(owner: &[PolicyRule], servant: &[PolicyRule]) -> Vec<PolicyRule> {
    servant
        .iter()
        .flat_map(breakdown)
        .filter(|part| !owner.iter().any(|rule| rule_covers(rule, part)))
        .collect()
}

fn list(values: &Option<Vec<String>>) -> &[String] {
    values.as_deref().unwrap_or_default()
}

/// `rule` as rules of at most one verb, group, resource and name, or one verb and URL
/// (`BreakdownRule`).
fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |value: &String| Some(vec![value.clone()]);
    let mut parts = Vec::new();
    for group in list(&rule.api_groups) {
        for resource in list(&rule.resources) {
            for verb in &rule.verbs {
                let part = PolicyRule {
                    api_groups: one(group),
                    resources: one(resource),
                    verbs: vec![verb.clone()],
                    ..Default::default()
                };
                let names = list(&rule.resource_names);
                if names.is_empty() {
                    parts.push(part);
                } else {
                    parts.extend(names.iter().map(|name| PolicyRule {
                        resource_names: one(name),
                        ..part.clone()
                    }));
                }
            }
        }
    }
    for url in list(&rule.non_resource_urls) {
        for verb in &rule.verbs {
            parts.push(PolicyRule {
                non_resource_urls: one(url),
                verbs: vec![verb.clone()],
                ..Default::default()
            });
        }
    }
    parts
}

fn contains(set: &[String], wanted: &str) -> bool {
    set.iter().any(|s| s == wanted)
}

fn contains_all(set: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| contains(set, w))
}

/// Whether `owner` covers `part`, a rule of [`breakdown`] (`ruleCovers`).
fn rule_covers(owner: &PolicyRule, part: &PolicyRule) -> bool {
    let verbs = contains(&owner.verbs, "*") || contains_all(&owner.verbs, &part.verbs);
    let (owner_groups, part_groups) = (list(&owner.api_groups), list(&part.api_groups));
    let groups = contains(owner_groups, "*") || contains_all(owner_groups, part_groups);
    let resources = resources_cover(list(&owner.resources), list(&part.resources));
    let urls = list(&part.non_resource_urls).iter().all(|path| {
        list(&owner.non_resource_urls)
            .iter()
            .any(|o| url_covers(o, path))
    });
    let (owner_names, part_names) = (list(&owner.resource_names), list(&part.resource_names));
    let names =
        owner_names.is_empty() || (!part_names.is_empty() && contains_all(owner_names, part_names));
    verbs && groups && resources && urls && names
}

/// `*`, each resource by name, or a subresource by `*/subresource` (`resourceCoversAll`).
fn resources_cover(owner: &[String], wanted: &[String]) -> bool {
    if contains(owner, "*") || contains_all(owner, wanted) {
        return true;
    }
    wanted.iter().all(|path| {
        contains(owner, path)
            || path
                .split_once('/')
                .is_some_and(|(_, sub)| contains(owner, &format!("*/{sub}")))
    })
}

/// The same path, or a prefix ending in `*` (`nonResourceURLCovers`).
fn url_covers(owner: &str, path: &str) -> bool {
    owner == path || (owner.ends_with('*') && path.starts_with(owner.trim_end_matches('*')))
}

/// kube-apiserver's 403 for an RBAC object: `clusterrolebindings.rbac.authorization.k8s.io "x"
/// is forbidden: …`.
fn forbidden(resource: &str, name: &str, why: &str) -> ApiError {
    ApiError {
        details: Some(json!({"name": name, "group": GROUP, "kind": resource})),
        ..ApiError::forbidden(format!(
            "{} {name:?} is forbidden: {why}",
            error::qualified(GROUP, resource)
        ))
    }
}

/// `ConfirmNoEscalation`'s message: who, and each missing permission (compacted, sorted) on a
/// line of its own; the roles that could not be read, if any.
fn not_held(user: &UserInfo, missing: &[PolicyRule], errors: &[String]) -> String {
    let mut lines: Vec<String> = compact(missing).iter().map(compact_string).collect();
    lines.sort();
    lines.dedup();
    let mut message = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        go_quoted(&user.groups),
        lines.join("\n")
    );
    if !errors.is_empty() {
        let mut errors = errors.to_vec();
        errors.sort();
        errors.dedup();
        let aggregate = match errors.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        message.push_str(&format!("; resolution errors: [{aggregate}]"));
    }
    message
}

/// Rules of one group and one resource, with verbs only, merged into one per group and
/// resource (`CompactRules`); others as they are.
fn compact(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut compacted: Vec<PolicyRule> = Vec::new();
    let mut simple: Vec<PolicyRule> = Vec::new();
    for rule in rules {
        let (groups, resources) = (list(&rule.api_groups), list(&rule.resources));
        let is_simple = groups.len() == 1
            && resources.len() == 1
            && list(&rule.resource_names).is_empty()
            && list(&rule.non_resource_urls).is_empty();
        if !is_simple {
            compacted.push(rule.clone());
            continue;
        }
        match simple
            .iter_mut()
            .find(|s| (&s.api_groups, &s.resources) == (&rule.api_groups, &rule.resources))
        {
            Some(same) => same.verbs.extend(rule.verbs.iter().cloned()),
            None => simple.push(rule.clone()),
        }
    }
    compacted.extend(simple);
    compacted
}

/// A rule as kube-apiserver's escalation messages write it (`CompactString`):
/// `{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list"]}`.
fn compact_string(rule: &PolicyRule) -> String {
    let parts: Vec<String> = [
        ("APIGroups", list(&rule.api_groups)),
        ("Resources", list(&rule.resources)),
        ("NonResourceURLs", list(&rule.non_resource_urls)),
        ("ResourceNames", list(&rule.resource_names)),
        ("Verbs", rule.verbs.as_slice()),
    ]
    .into_iter()
    .filter(|(_, values)| !values.is_empty())
    .map(|(field, values)| format!("{field}:{}", go_quoted(values)))
    .collect();
    format!("{{{}}}", parts.join(", "))
}

/// A list of strings as Go's `%q` prints it: `["a" "b"]`.
fn go_quoted(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

#[cfg(test)]
mod tests;
