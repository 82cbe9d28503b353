//! RBAC as kube-apiserver evaluates it (plugin/pkg/auth/authorizer/rbac and
//! pkg/apis/rbac/v1/evaluation_helpers.go): a pure function of the stored Roles, ClusterRoles
//! and their bindings, a user and a request's [`Attributes`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::UserInfo;
use super::attributes::{Attributes, ResourceAttributes};

/// Every RBAC object of the cluster, with aggregated ClusterRoles' rules filled in.
#[derive(Debug, Default)]
pub struct Policy {
    cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    /// (namespace, name) → rules.
    roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    cluster_role_bindings: Vec<Binding>,
    /// namespace → its RoleBindings.
    role_bindings: BTreeMap<String, Vec<Binding>>,
}

#[derive(Debug)]
struct Binding {
    kind: &'static str,
    name: String,
    /// "" for a ClusterRoleBinding.
    namespace: String,
    role_ref: RoleRef,
    subjects: Vec<Subject>,
}

/// What RBAC says of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Which binding allowed it, as kube-apiserver's reason words it.
    Allow(String),
    /// Why not: empty when no rule matched; the roles that could not be found otherwise.
    Deny(String),
}

impl Policy {
    pub fn new(
        cluster_roles: Vec<ClusterRole>,
        roles: Vec<Role>,
        cluster_role_bindings: Vec<ClusterRoleBinding>,
        role_bindings: Vec<RoleBinding>,
    ) -> Policy {
        let mut policy = Policy {
            cluster_roles: aggregate(&cluster_roles),
            ..Policy::default()
        };
        for role in roles {
            let namespace = role.metadata.namespace.unwrap_or_default();
            let name = role.metadata.name.unwrap_or_default();
            policy
                .roles
                .insert((namespace, name), role.rules.unwrap_or_default());
        }
        for b in cluster_role_bindings {
            policy.cluster_role_bindings.push(Binding {
                kind: "ClusterRoleBinding",
                name: b.metadata.name.unwrap_or_default(),
                namespace: String::new(),
                role_ref: b.role_ref,
                subjects: b.subjects.unwrap_or_default(),
            });
        }
        for b in role_bindings {
            let namespace = b.metadata.namespace.unwrap_or_default();
            policy
                .role_bindings
                .entry(namespace.clone())
                .or_default()
                .push(Binding {
                    kind: "RoleBinding",
                    name: b.metadata.name.unwrap_or_default(),
                    namespace,
                    role_ref: b.role_ref,
                    subjects: b.subjects.unwrap_or_default(),
                });
        }
        policy
    }

    /// The bindings that can grant a request in `namespace`: every ClusterRoleBinding, then the
    /// namespace's RoleBindings (none for cluster-scoped and non-resource requests).
    fn bindings<'a>(&'a self, namespace: &str) -> impl Iterator<Item = &'a Binding> {
        let local = (!namespace.is_empty())
            .then(|| self.role_bindings.get(namespace))
            .flatten();
        self.cluster_role_bindings
            .iter()
            .chain(local.into_iter().flatten())
    }

    /// The rules a binding grants, or why they cannot be found.
    fn rules_of(&self, binding: &Binding) -> Result<&[PolicyRule], String> {
        self.role_ref_rules(&binding.role_ref, &binding.namespace)
    }

    /// The rules of the role `role_ref` names for a binding in `namespace` ("" for a
    /// ClusterRoleBinding), an aggregated ClusterRole's aggregated; or why they cannot be found
    /// (`GetRoleReferenceRules`).
    pub fn role_ref_rules(
        &self,
        role_ref: &RoleRef,
        namespace: &str,
    ) -> Result<&[PolicyRule], String> {
        let name = &role_ref.name;
        match role_ref.kind.as_str() {
            "ClusterRole" => self
                .cluster_roles
                .get(name)
                .map(Vec::as_slice)
                .ok_or_else(|| {
                    format!("clusterrole.rbac.authorization.k8s.io \"{name}\" not found")
                }),
            "Role" => self
                .roles
                .get(&(namespace.to_string(), name.clone()))
                .map(Vec::as_slice)
                .ok_or_else(|| format!("role.rbac.authorization.k8s.io \"{name}\" not found")),
            other => Err(format!("unknown roleRef kind {other:?}")),
        }
    }

    pub fn authorize(&self, user: &UserInfo, request: &Attributes) -> Decision {
        let namespace = match request {
            Attributes::Resource(r) => r.namespace.as_str(),
            Attributes::NonResource { .. } => "",
        };
        let mut errors = BTreeSet::new();
        for binding in self.bindings(namespace) {
            let Some(subject) = binding
                .subjects
                .iter()
                .find(|s| applies_to(s, user, &binding.namespace))
            else {
                continue;
            };
            match self.rules_of(binding) {
                Err(e) => {
                    errors.insert(e);
                }
                Ok(rules) if rules.iter().any(|rule| allows(rule, request)) => {
                    return Decision::Allow(allowed_by(binding, subject));
                }
                Ok(_) => {}
            }
        }
        if errors.is_empty() {
            Decision::Deny(String::new())
        } else {
            let errors: Vec<_> = errors.into_iter().collect();
            Decision::Deny(format!("RBAC: [{}]", errors.join(", ")))
        }
    }

    /// Every rule granted to `user` in `namespace` (`RulesFor`: SelfSubjectRulesReview, and what
    /// a writer of RBAC objects holds), and why the roles that could not be found are missing
    /// (the rules are then incomplete).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        for binding in self.bindings(namespace) {
            if !binding
                .subjects
                .iter()
                .any(|s| applies_to(s, user, &binding.namespace))
            {
                continue;
            }
            match self.rules_of(binding) {
                Ok(granted) => rules.extend(granted.iter().cloned()),
                Err(e) => errors.push(e),
            }
        }
        (rules, errors)
    }
}

/// `RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to User "z"`; a RoleBinding is
/// `"name/namespace"`, and so is a ServiceAccount.
fn allowed_by(binding: &Binding, subject: &Subject) -> String {
    let binding_name = if binding.namespace.is_empty() {
        binding.name.clone()
    } else {
        format!("{}/{}", binding.name, binding.namespace)
    };
    let subject_name = match (subject.kind.as_str(), subject.namespace.as_deref()) {
        ("ServiceAccount", namespace) => format!(
            "{}/{}",
            subject.name,
            namespace.unwrap_or(&binding.namespace)
        ),
        _ => subject.name.clone(),
    };
    format!(
        "RBAC: allowed by {} {binding_name:?} of {} {:?} to {} {subject_name:?}",
        binding.kind, binding.role_ref.kind, binding.role_ref.name, subject.kind,
    )
}

/// Whether a binding's subject is `user`. A ServiceAccount without a namespace is one of the
/// binding's namespace; in a ClusterRoleBinding it names nobody.
fn applies_to(subject: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let namespace = subject.namespace.as_deref().unwrap_or(binding_namespace);
            !namespace.is_empty()
                && user.name == super::service_account_user(namespace, &subject.name)
        }
        _ => false,
    }
}

/// Whether `rule` allows `request` (`RuleAllows`).
pub fn allows(rule: &PolicyRule, request: &Attributes) -> bool {
    match request {
        Attributes::Resource(r) => {
            has(&rule.verbs, &r.verb)
                && has(rule.api_groups.as_deref().unwrap_or_default(), &r.group)
                && resource_matches(rule.resources.as_deref().unwrap_or_default(), r)
                && name_matches(rule.resource_names.as_deref().unwrap_or_default(), &r.name)
        }
        Attributes::NonResource { verb, path } => {
            has(&rule.verbs, verb)
                && rule
                    .non_resource_urls
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|url| url_matches(url, path))
        }
    }
}

/// `values` holds `wanted` or `*`.
fn has(values: &[String], wanted: &str) -> bool {
    values.iter().any(|v| v == "*" || v == wanted)
}

/// `*`, the exact `resource[/subresource]`, or `*/subresource` for any resource's subresource.
fn resource_matches(rules: &[String], r: &ResourceAttributes) -> bool {
    let combined = r.resource_path();
    rules.iter().any(|rule| {
        rule == "*"
            || *rule == combined
            || (!r.subresource.is_empty()
                && rule.strip_prefix("*/") == Some(r.subresource.as_str()))
    })
}

/// No resourceNames allow every name; otherwise the request must name one of them (so they
/// never allow a create, or a list of everything).
fn name_matches(names: &[String], name: &str) -> bool {
    names.is_empty() || names.iter().any(|n| n == name)
}

/// `*`, the exact path, or a prefix ending in `*`.
fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Each ClusterRole's rules, with those of aggregated ClusterRoles (`aggregationRule`) replaced
/// by the rules of every ClusterRole their selectors match, as kube's aggregation controller
/// writes them. Aggregates of aggregates resolve too; a cycle contributes nothing more.
/// `cluster_roles` must be in name order (the store lists them so).
fn aggregate(cluster_roles: &[ClusterRole]) -> BTreeMap<String, Vec<PolicyRule>> {
    fn resolve(
        role: &ClusterRole,
        all: &[ClusterRole],
        visiting: &mut BTreeSet<String>,
    ) -> Vec<PolicyRule> {
        let name = role.metadata.name.clone().unwrap_or_default();
        let Some(selectors) = role
            .aggregation_rule
            .as_ref()
            .and_then(|a| a.cluster_role_selectors.as_ref())
        else {
            return role.rules.clone().unwrap_or_default();
        };
        if !visiting.insert(name.clone()) {
            return Vec::new();
        }
        let mut rules: Vec<PolicyRule> = Vec::new();
        let labels = |r: &ClusterRole| r.metadata.labels.clone().unwrap_or_default();
        // Selector by selector, each one's roles by name (`all` is in name order), as the
        // aggregation controller orders them.
        for selector in selectors {
            for other in all {
                if other.metadata.name.as_deref() == Some(name.as_str())
                    || !selects(selector, &labels(other))
                {
                    continue;
                }
                for rule in resolve(other, all, visiting) {
                    if !rules.contains(&rule) {
                        rules.push(rule);
                    }
                }
            }
        }
        visiting.remove(&name);
        rules
    }
    cluster_roles
        .iter()
        .map(|role| {
            let name = role.metadata.name.clone().unwrap_or_default();
            (name, resolve(role, cluster_roles, &mut BTreeSet::new()))
        })
        .collect()
}

/// A label selector's `matchLabels` and `matchExpressions` against `labels`. An empty
/// selector selects everything.
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && expressions_match
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a valid RBAC object")
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    fn request(verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Attributes {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Attributes::Resource(ResourceAttributes {
            verb: verb.into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    fn rule(v: serde_json::Value) -> PolicyRule {
        from(v)
    }

    #[test]
    fn verbs_groups_and_resources_match_exactly_or_by_star() {
        let r =
            rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["secrets"]}));
        assert!(allows(&r, &request("get", "", "secrets", "a", "s")));
        assert!(allows(&r, &request("list", "", "secrets", "", "")));
        assert!(!allows(&r, &request("watch", "", "secrets", "a", "")));
        assert!(!allows(&r, &request("get", "apps", "secrets", "a", "s")));
        assert!(!allows(&r, &request("get", "", "configmaps", "a", "s")));
        // The main resource does not grant its subresources.
        assert!(!allows(&r, &request("get", "", "secrets/status", "a", "s")));
        let star = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        assert!(allows(
            &star,
            &request("deletecollection", "x.io", "things/scale", "a", "")
        ));
    }

    #[test]
    fn subresources_match_by_their_full_name_or_star_slash() {
        let status = rule(
            json!({"verbs": ["patch"], "apiGroups": ["caretaker.dev"], "resources": ["issuedcertificates/status"]}),
        );
        assert!(allows(
            &status,
            &request(
                "patch",
                "caretaker.dev",
                "issuedcertificates/status",
                "d",
                "w"
            )
        ));
        assert!(!allows(
            &status,
            &request("patch", "caretaker.dev", "issuedcertificates", "d", "w")
        ));
        let any_status =
            rule(json!({"verbs": ["patch"], "apiGroups": ["*"], "resources": ["*/status"]}));
        assert!(allows(
            &any_status,
            &request("patch", "x", "machines/status", "d", "m")
        ));
        assert!(!allows(
            &any_status,
            &request("patch", "x", "machines", "d", "m")
        ));
        assert!(!allows(
            &any_status,
            &request("patch", "x", "machines/scale", "d", "m")
        ));
    }

    #[test]
    fn resource_names_never_allow_a_create_or_an_unnamed_list() {
        let named = rule(
            json!({"verbs": ["get", "create", "list"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["caretaker-operator"]}),
        );
        let lease = |verb, name| {
            request(
                verb,
                "coordination.k8s.io",
                "leases",
                "caretaker-system",
                name,
            )
        };
        assert!(allows(&named, &lease("get", "caretaker-operator")));
        assert!(!allows(&named, &lease("get", "other")));
        assert!(!allows(&named, &lease("create", "")));
        assert!(!allows(&named, &lease("list", "")));
        assert!(allows(&named, &lease("list", "caretaker-operator")));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix_and_only_non_resource_requests() {
        let r = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        let path = |p: &str| Attributes::NonResource {
            verb: "get".into(),
            path: p.into(),
        };
        assert!(allows(&r, &path("/healthz")));
        assert!(!allows(&r, &path("/healthz/etcd")));
        assert!(allows(&r, &path("/apis/apps/v1")));
        assert!(!allows(&r, &path("/api")));
        assert!(!allows(&r, &request("get", "", "healthz", "", "")));
        let resources_only = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        assert!(!allows(&resources_only, &path("/healthz")));
    }

    fn policy() -> Policy {
        Policy::new(
            vec![
                from(
                    json!({"metadata": {"name": "secret-reader"}, "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}]}),
                ),
                from(
                    json!({"metadata": {"name": "discovery"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*"]}]}),
                ),
            ],
            vec![from(
                json!({"metadata": {"name": "lease", "namespace": "sys"}, "rules": [{"verbs": ["update"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}]}),
            )],
            vec![
                from(
                    json!({"metadata": {"name": "everyone-discovers"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "discovery"}, "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:authenticated"}]}),
                ),
                from(
                    json!({"metadata": {"name": "alice-reads"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secret-reader"}, "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]}),
                ),
                from(
                    json!({"metadata": {"name": "sa-without-namespace"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secret-reader"}, "subjects": [{"kind": "ServiceAccount", "name": "op"}]}),
                ),
            ],
            vec![
                from(
                    json!({"metadata": {"name": "op-reads-here", "namespace": "sys"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secret-reader"}, "subjects": [{"kind": "ServiceAccount", "name": "op"}]}),
                ),
                from(
                    json!({"metadata": {"name": "op-lease", "namespace": "sys"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"}, "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "sys"}]}),
                ),
                from(
                    json!({"metadata": {"name": "dangling", "namespace": "sys"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gone"}, "subjects": [{"kind": "Group", "name": "system:authenticated"}]}),
                ),
            ],
        )
    }

    #[test]
    fn cluster_role_bindings_grant_everywhere_and_role_bindings_in_their_namespace_only() {
        let p = policy();
        let alice = user("alice", &["system:authenticated"]);
        assert!(matches!(
            p.authorize(&alice, &request("get", "", "secrets", "any", "s")),
            Decision::Allow(_)
        ));
        let op = user(
            "system:serviceaccount:sys:op",
            &["system:serviceaccounts", "system:authenticated"],
        );
        // A RoleBinding of a ClusterRole grants it in the binding's namespace only.
        assert_eq!(
            p.authorize(&op, &request("get", "", "secrets", "sys", "s")),
            Decision::Allow("RBAC: allowed by RoleBinding \"op-reads-here/sys\" of ClusterRole \"secret-reader\" to ServiceAccount \"op/sys\"".into())
        );
        assert!(matches!(
            p.authorize(&op, &request("get", "", "secrets", "other", "s")),
            Decision::Deny(_)
        ));
        assert!(matches!(
            p.authorize(
                &op,
                &request("update", "coordination.k8s.io", "leases", "sys", "l")
            ),
            Decision::Allow(_)
        ));
        // A ServiceAccount subject without a namespace in a ClusterRoleBinding names nobody.
        assert!(matches!(
            p.authorize(&op, &request("get", "", "secrets", "", "s")),
            Decision::Deny(_)
        ));
        // Groups: every authenticated user may discover.
        let discover = Attributes::NonResource {
            verb: "get".into(),
            path: "/api/v1".into(),
        };
        assert!(matches!(p.authorize(&op, &discover), Decision::Allow(_)));
        assert!(matches!(
            p.authorize(&user("anon", &["system:unauthenticated"]), &discover),
            Decision::Deny(_)
        ));
    }

    #[test]
    fn a_missing_role_is_named_in_the_denial_and_makes_rules_incomplete() {
        let p = policy();
        let bob = user("bob", &["system:authenticated"]);
        assert_eq!(
            p.authorize(&bob, &request("get", "", "secrets", "sys", "s")),
            Decision::Deny("RBAC: [role.rbac.authorization.k8s.io \"gone\" not found]".into())
        );
        assert_eq!(
            p.authorize(&bob, &request("get", "", "secrets", "elsewhere", "s")),
            Decision::Deny(String::new())
        );
        let (rules, errors) = p.rules_for(&bob, "sys");
        assert_eq!(
            errors,
            ["role.rbac.authorization.k8s.io \"gone\" not found"]
        );
        assert_eq!(rules.len(), 1, "the discovery rule: {rules:?}");
        let (rules, errors) = p.rules_for(&user("system:serviceaccount:sys:op", &[]), "sys");
        assert!(errors.is_empty());
        assert_eq!(rules.len(), 2, "secret-reader and lease: {rules:?}");
    }

    #[test]
    fn aggregated_cluster_roles_hold_the_rules_of_the_roles_they_select() {
        let roles: Vec<ClusterRole> = vec![
            from(
                json!({"metadata": {"name": "view"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg/view": "true"}}]}}),
            ),
            from(
                json!({"metadata": {"name": "edit"}, "aggregationRule": {"clusterRoleSelectors": [{"matchExpressions": [{"key": "agg/edit", "operator": "Exists"}]}, {"matchLabels": {"agg/view-into-edit": "true"}}]}, "rules": [{"verbs": ["delete"], "apiGroups": ["*"], "resources": ["*"]}]}),
            ),
            from(
                json!({"metadata": {"name": "view-machines", "labels": {"agg/view": "true"}}, "rules": [{"verbs": ["get"], "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"]}]}),
            ),
            from(
                json!({"metadata": {"name": "edit-machines", "labels": {"agg/edit": ""}}, "rules": [{"verbs": ["patch"], "apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"]}]}),
            ),
            from(
                json!({"metadata": {"name": "view-as-part-of-edit", "labels": {"agg/view-into-edit": "true"}}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg/view": "true"}}]}}),
            ),
            from(
                json!({"metadata": {"name": "unlabelled"}, "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}),
            ),
        ];
        let rules = aggregate(&roles);
        let verbs = |name: &str| -> Vec<String> {
            rules[name].iter().flat_map(|r| r.verbs.clone()).collect()
        };
        assert_eq!(verbs("view"), ["get"]);
        // The stored rules of an aggregated role are replaced, as the controller does; an
        // aggregate of an aggregate contributes its own aggregated rules.
        assert_eq!(verbs("edit"), ["patch", "get"]);
        assert_eq!(verbs("unlabelled"), ["*"]);
    }
}
