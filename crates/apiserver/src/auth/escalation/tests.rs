use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

use super::*;

fn rule(v: Value) -> PolicyRule {
    serde_json::from_value(v).expect("a valid PolicyRule")
}

fn rules(v: Value) -> Vec<PolicyRule> {
    serde_json::from_value(v).expect("valid PolicyRules")
}

/// `Covers(owner, servant)` is `expected`, missing exactly `missing` (in any order).
fn assert_covers(owner: Value, servant: Value, missing: Value) {
    let mut got = uncovered(&rules(owner.clone()), &rules(servant.clone()));
    let mut want = rules(missing);
    let key = |r: &PolicyRule| compact_string(r);
    got.sort_by_key(key);
    want.sort_by_key(key);
    assert_eq!(got, want, "owner {owner}, servant {servant}");
}

// The cases of upstream's policy_comparator_test.go (TestCovers…), in its order.

#[test]
fn exact_matches_and_star_slash_subresources_cover() {
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*/scale"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["foo/scale"]}]),
        json!([]),
    );
}

#[test]
fn several_rules_cover_one_together_and_one_covers_several() {
    assert_covers(
        json!([
            {"apiGroups": ["v1"], "verbs": ["delete"], "resources": ["deployments"]},
            {"apiGroups": ["v1"], "verbs": ["delete"], "resources": ["builds"]},
            {"apiGroups": ["v1"], "verbs": ["update"], "resources": ["builds", "deployments"]}
        ]),
        json!([{"apiGroups": ["v1"], "verbs": ["delete", "update"], "resources": ["builds", "deployments"]}]),
        json!([]),
    );
    let per_group = json!([
        {"apiGroups": ["group1"], "verbs": ["delete"], "resources": ["deployments"]},
        {"apiGroups": ["group1"], "verbs": ["delete"], "resources": ["builds"]},
        {"apiGroups": ["group1"], "verbs": ["update"], "resources": ["builds", "deployments"]},
        {"apiGroups": ["group2"], "verbs": ["delete"], "resources": ["deployments"]},
        {"apiGroups": ["group2"], "verbs": ["delete"], "resources": ["builds"]},
        {"apiGroups": ["group2"], "verbs": ["update"], "resources": ["builds", "deployments"]}
    ]);
    let both_groups = json!([{"apiGroups": ["group1", "group2"], "verbs": ["delete", "update"], "resources": ["builds", "deployments"]}]);
    assert_covers(per_group.clone(), both_groups.clone(), json!([]));
    assert_covers(both_groups, per_group, json!([]));
}

#[test]
fn a_missing_verb_and_resource_pair_is_named_alone() {
    assert_covers(
        json!([
            {"apiGroups": ["v1"], "verbs": ["delete", "update"], "resources": ["builds", "deployments"]},
            {"apiGroups": ["v1"], "verbs": ["delete"], "resources": ["pods"]}
        ]),
        json!([{"apiGroups": ["v1"], "verbs": ["delete", "update"], "resources": ["builds", "deployments", "pods"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["update"], "resources": ["pods"]}]),
    );
}

#[test]
fn a_star_covers_enumerations_and_stars_but_no_enumeration_covers_a_star() {
    // API groups.
    assert_covers(
        json!([{"apiGroups": ["*"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["group1", "group2"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["dummy-group"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["*"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["*"], "verbs": ["get"], "resources": ["roles"]}]),
    );
    assert_covers(
        json!([{"apiGroups": ["*"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["*"], "verbs": ["get"], "resources": ["roles"]}]),
        json!([]),
    );
    // Verbs.
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["*"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["watch", "list"], "resources": ["roles"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get", "list", "watch", "create", "update", "delete", "exec"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["*"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["*"], "resources": ["roles"]}]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["*"], "resources": ["roles"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["*"], "resources": ["roles"]}]),
        json!([]),
    );
    // Resources.
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["resourcegroup:deployments"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["roles", "resourcegroup:deployments"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*"]}]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["*"]}]),
        json!([]),
    );
}

#[test]
fn no_resource_names_cover_any_names_and_names_never_cover_all() {
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["pods"], "resourceNames": []}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["pods"], "resourceNames": ["foo", "bar"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["pods"], "resourceNames": ["foo", "bar"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["pods"], "resourceNames": []}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["pods"]}]),
    );
}

#[test]
fn non_resource_urls_cover_exactly_or_by_a_star_suffix() {
    assert_covers(
        json!([{"nonResourceURLs": ["/apis"], "verbs": ["*"]}]),
        json!([{"nonResourceURLs": ["/apis"], "verbs": ["*"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        json!([{"nonResourceURLs": ["/apis", "/apis/v1", "/"], "verbs": ["*"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"nonResourceURLs": ["/apis/*"], "verbs": ["*"]}]),
        json!([{"nonResourceURLs": ["/apis", "/apis/v1"], "verbs": ["get"]}]),
        json!([{"nonResourceURLs": ["/apis"], "verbs": ["get"]}]),
    );
    assert_covers(
        json!([{"nonResourceURLs": ["/apis/*"], "verbs": ["*"]}]),
        json!([{"nonResourceURLs": ["/apis/v1/foo", "/apis/v1"], "verbs": ["get"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"], "nonResourceURLs": ["/apis"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"], "nonResourceURLs": ["/apis"]}]),
        json!([]),
    );
    assert_covers(
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"]}]),
        json!([{"apiGroups": ["v1"], "verbs": ["get"], "resources": ["builds"], "nonResourceURLs": ["/apis"]}]),
        json!([{"nonResourceURLs": ["/apis"], "verbs": ["get"]}]),
    );
}

#[test]
fn a_url_prefix_covers_what_starts_with_it() {
    // Upstream's TestNonResourceURLCovers.
    let cases = [
        ("*", "", true),
        ("*", "/", true),
        ("*", "/api", true),
        ("/*", "", false),
        ("/*", "/", true),
        ("/*", "/foo", true),
        ("/api", "/api", true),
        ("/apis", "/api", false),
        ("/api/v1", "/api", false),
        ("/api/v1", "/api/v1", true),
        ("/api/*", "/api/v1", true),
        ("/api/*", "/api", false),
        ("/api/*/*", "/api/v1", false),
        ("/*/v1/*", "/api/v1", false),
    ];
    for (owner, requested, covers) in cases {
        assert_eq!(url_covers(owner, requested), covers, "{owner} {requested}");
    }
}

#[test]
fn missing_permissions_are_named_as_kube_apiserver_names_them() {
    let alice = UserInfo::new("alice", ["team".to_string()]);
    let missing = uncovered(
        &[],
        &rules(json!([
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"], "resourceNames": ["web"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
        ])),
    );
    assert_eq!(
        not_held(&alice, &missing, &[]),
        "user \"alice\" (groups=[\"team\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
         {APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}\n\
         {APIGroups:[\"apps\"], Resources:[\"deployments\"], ResourceNames:[\"web\"], Verbs:[\"get\"]}\n\
         {NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}"
    );
    let with_errors = not_held(&alice, &missing, &["role \"x\" not found".to_string()]);
    assert!(
        with_errors.ends_with("; resolution errors: [role \"x\" not found]"),
        "{with_errors}"
    );
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid RBAC object")
}

/// erin may write RBAC objects and read ConfigMaps; dave may `bind` cluster-admin in "team"
/// only, and `escalate` the Role "pinned" there; root holds everything.
fn policy() -> Policy {
    let cluster_roles: Vec<ClusterRole> = vec![
        from(
            json!({"metadata": {"name": "cluster-admin"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
        ),
        from(
            json!({"metadata": {"name": "rbac-writer"}, "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["*"], "verbs": ["create", "update", "patch"]}, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        ),
        from(
            json!({"metadata": {"name": "aggregate"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}}),
        ),
        from(
            json!({"metadata": {"name": "secrets-part", "labels": {"x": "y"}}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
        ),
    ];
    let roles: Vec<Role> = vec![from(
        json!({"metadata": {"name": "binder", "namespace": "team"}, "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}, {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"], "resourceNames": ["pinned"]}]}),
    )];
    let binding = |name: &str, role: &str, subject: &str| -> ClusterRoleBinding {
        from(
            json!({"metadata": {"name": name}, "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role}, "subjects": [{"kind": "User", "apiGroup": GROUP, "name": subject}]}),
        )
    };
    let role_bindings: Vec<RoleBinding> = vec![from(
        json!({"metadata": {"name": "dave-binds", "namespace": "team"}, "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "binder"}, "subjects": [{"kind": "User", "apiGroup": GROUP, "name": "dave"}]}),
    )];
    Policy::new(
        cluster_roles,
        roles,
        vec![
            binding("root", "cluster-admin", "root"),
            binding("erin", "rbac-writer", "erin"),
            binding("dave", "rbac-writer", "dave"),
        ],
        role_bindings,
    )
}

fn role(resource: &'static str, namespace: &str, name: &str, granted: Value) -> Grant {
    Grant::Role {
        resource,
        namespace: namespace.into(),
        name: name.into(),
        rules: rules(granted),
        aggregation: false,
    }
}

fn binding(resource: &'static str, namespace: &str, kind: &str, role: &str) -> Grant {
    Grant::Binding {
        resource,
        namespace: namespace.into(),
        name: "b".into(),
        role_ref: from(json!({"apiGroup": GROUP, "kind": kind, "name": role})),
    }
}

fn user(name: &str) -> UserInfo {
    UserInfo::new(name, [])
}

#[test]
fn a_role_may_grant_what_its_writer_holds_and_no_more() {
    let p = policy();
    let configmaps = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]);
    let secrets = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
    check(
        &p,
        &user("erin"),
        &role("roles", "team", "r", configmaps.clone()),
    )
    .unwrap();
    check(
        &p,
        &user("erin"),
        &role("clusterroles", "", "r", configmaps),
    )
    .unwrap();
    let refused = check(
        &p,
        &user("erin"),
        &role("roles", "team", "r", secrets.clone()),
    )
    .unwrap_err();
    assert_eq!((refused.code, refused.reason), (403, "Forbidden"));
    assert_eq!(
        refused.message,
        "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"erin\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}"
    );
    assert_eq!(
        refused.details,
        Some(json!({"name": "r", "group": GROUP, "kind": "roles"}))
    );
    check(
        &p,
        &user("root"),
        &role("clusterroles", "", "r", secrets.clone()),
    )
    .unwrap();
    // `escalate`, pinned to a name and a namespace.
    check(
        &p,
        &user("dave"),
        &role("roles", "team", "pinned", secrets.clone()),
    )
    .unwrap();
    for (namespace, name) in [("team", "other"), ("elsewhere", "pinned")] {
        let refused = check(
            &p,
            &user("dave"),
            &role("roles", namespace, name, secrets.clone()),
        );
        assert_eq!(refused.unwrap_err().code, 403, "{namespace}/{name}");
    }
}

#[test]
fn an_aggregation_rule_needs_every_permission() {
    let p = policy();
    let aggregated = |name: &str| Grant::Role {
        resource: "clusterroles",
        namespace: String::new(),
        name: name.into(),
        rules: Vec::new(),
        aggregation: true,
    };
    let refused = check(&p, &user("erin"), &aggregated("gathers")).unwrap_err();
    assert_eq!(
        refused.message,
        "clusterroles.rbac.authorization.k8s.io \"gathers\" is forbidden: must have cluster-admin privileges to use the aggregationRule"
    );
    check(&p, &user("root"), &aggregated("gathers")).unwrap();
    // Had one: removing it needs as much.
    let old = json!({"metadata": {"name": "aggregate"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}});
    let new = json!({"metadata": {"name": "aggregate"}, "rules": []});
    let grant = Grant::of("clusterroles", &new, Some(&old))
        .unwrap()
        .unwrap();
    assert_eq!(check(&p, &user("erin"), &grant).unwrap_err().code, 403);
    let empty = json!({"metadata": {"name": "x"}, "aggregationRule": {"clusterRoleSelectors": []}});
    let grant = Grant::of("clusterroles", &empty, None).unwrap().unwrap();
    check(&p, &user("erin"), &grant).unwrap();
}

#[test]
fn a_binding_needs_the_bound_roles_permissions_or_bind_on_it() {
    let p = policy();
    // erin holds rbac-writer's rules cluster-wide: she may bind it, anywhere.
    check(
        &p,
        &user("erin"),
        &binding("clusterrolebindings", "", "ClusterRole", "rbac-writer"),
    )
    .unwrap();
    check(
        &p,
        &user("erin"),
        &binding("rolebindings", "team", "ClusterRole", "rbac-writer"),
    )
    .unwrap();
    // Not cluster-admin, nor an aggregate of what she does not hold.
    for (resource, namespace, role) in [
        ("clusterrolebindings", "", "cluster-admin"),
        ("rolebindings", "team", "cluster-admin"),
        ("rolebindings", "team", "aggregate"),
    ] {
        let refused = check(
            &p,
            &user("erin"),
            &binding(resource, namespace, "ClusterRole", role),
        )
        .unwrap_err();
        assert_eq!(refused.code, 403, "{resource} {role}");
        assert!(
            refused.message.starts_with(&format!(
                "{resource}.rbac.authorization.k8s.io \"b\" is forbidden: user \"erin\""
            )),
            "{}",
            refused.message
        );
    }
    // dave may bind cluster-admin in "team" only: where `bind` is granted, by name.
    check(
        &p,
        &user("dave"),
        &binding("rolebindings", "team", "ClusterRole", "cluster-admin"),
    )
    .unwrap();
    let elsewhere = [
        binding("rolebindings", "other", "ClusterRole", "cluster-admin"),
        binding("clusterrolebindings", "", "ClusterRole", "cluster-admin"),
        binding("rolebindings", "team", "ClusterRole", "aggregate"),
    ];
    for grant in elsewhere {
        assert_eq!(
            check(&p, &user("dave"), &grant).unwrap_err().code,
            403,
            "{grant:?}"
        );
    }
    // A role that does not exist: 404, unless one may bind it.
    let missing = check(
        &p,
        &user("erin"),
        &binding("rolebindings", "team", "Role", "nope"),
    )
    .unwrap_err();
    assert_eq!(
        (missing.code, missing.message.as_str()),
        (404, "roles.rbac.authorization.k8s.io \"nope\" not found")
    );
    check(
        &p,
        &user("root"),
        &binding("rolebindings", "team", "Role", "nope"),
    )
    .unwrap();
}

#[test]
fn rbac_objects_are_read_as_their_kinds() {
    let role = json!({"metadata": {"name": "r", "namespace": "team"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    assert_eq!(
        Grant::of("roles", &role, None).unwrap(),
        Some(Grant::Role {
            resource: "roles",
            namespace: "team".into(),
            name: "r".into(),
            rules: vec![rule(
                json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})
            )],
            aggregation: false,
        })
    );
    assert_eq!(Grant::of("configmaps", &role, None).unwrap(), None);
    let unreadable = json!({"metadata": {"name": "r"}, "rules": "everything"});
    assert_eq!(
        Grant::of("clusterroles", &unreadable, None)
            .unwrap_err()
            .code,
        400
    );
    let no_role = json!({"metadata": {"name": "b", "namespace": "team"}, "subjects": []});
    assert_eq!(
        Grant::of("rolebindings", &no_role, None).unwrap_err().code,
        400
    );
}

#[test]
fn owner_references_and_finalizers_are_the_garbage_collectors() {
    let old = json!({"metadata": {"name": "r", "resourceVersion": "1"}, "rules": []});
    let collected = json!({"metadata": {"name": "r", "resourceVersion": "2", "finalizers": ["x"], "ownerReferences": [{"uid": "u"}], "managedFields": []}, "rules": []});
    assert!(only_garbage_collection_fields_change(&old, &collected));
    let relabelled = json!({"metadata": {"name": "r", "labels": {"x": "y"}}, "rules": []});
    assert!(!only_garbage_collection_fields_change(&old, &relabelled));
    let regranted = json!({"metadata": {"name": "r"}, "rules": [{"verbs": ["*"]}]});
    assert!(!only_garbage_collection_fields_change(&old, &regranted));
}
