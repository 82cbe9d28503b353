//! Who a request is from, as a client asks and sets it: `kubectl auth whoami`
//! (SelfSubjectReview) and impersonation (`kubectl --as`, kube-rs's `impersonate`), allowed
//! by RBAC's `impersonate` verb and refused (403) to those without it, as kube-apiserver does.

use caretaker_apiserver::{ApiServer, Authorization, Subject};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

mod common;
use common::api_status;

#[path = "../../testkit/src/kubectl.rs"]
mod kubectl;
use kubectl::Kubectl;

async fn rbac_server() -> ApiServer {
    ApiServer::builder()
        .tls(true)
        .authorization(Authorization::Rbac)
        .start()
        .await
        .expect("start an RBAC server")
}

fn user(name: &str, groups: &[&str]) -> Subject {
    Subject::User {
        name: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

/// Creates a ClusterRole `name` with `rules` and binds it to user `who`, as the admin.
async fn grant(server: &ApiServer, who: &str, name: &str, rules: Value) {
    let client = server.client();
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let role = json!({"metadata": {"name": name}, "rules": rules});
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client);
    let binding = json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": who}]});
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_whoami_names_the_requester() {
    let Some(kubectl) = Kubectl::find("kubectl_auth_whoami_names_the_requester") else {
        return;
    };
    let server = rbac_server().await;
    let alice = server.kubeconfig_for(&user("alice", &["team"])).unwrap();
    let k = kubectl.against(&alice);
    let me = k.json(&["auth", "whoami"]).await;
    assert_eq!(me["kind"], "SelfSubjectReview", "{me}");
    assert_eq!(me["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(me["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["team", "system:authenticated"])
    );
    let table = k.ok(&["auth", "whoami"], None).await;
    assert!(table.contains("alice"), "{table}");
}

/// The attack of the issue: the admin asks whether alice may delete ConfigMaps in `team`;
/// with the impersonation ignored, the admin's own `yes` came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_as_asks_and_acts_as_the_impersonated_user() {
    let Some(kubectl) = Kubectl::find("kubectl_as_asks_and_acts_as_the_impersonated_user") else {
        return;
    };
    let server = rbac_server().await;
    let k = kubectl.against(&server.kubeconfig());
    let can_i = ["auth", "can-i", "delete", "configmaps", "-n", "team"];
    assert_eq!(k.ok(&can_i, None).await.trim(), "yes");
    let mut as_alice = can_i.to_vec();
    as_alice.extend(["--as", "alice"]);
    let output = k.run(&as_alice, None).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "no");

    let me = k
        .json(&["auth", "whoami", "--as", "alice", "--as-group", "team"])
        .await;
    assert_eq!(me["status"]["userInfo"]["username"], "alice", "{me}");
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["team", "system:authenticated"])
    );

    // Acting as alice, the admin may do only what alice may.
    let refused = k
        .fails(&["get", "configmaps", "-n", "team", "--as", "alice"], None)
        .await;
    assert!(
        refused.contains(
            "configmaps is forbidden: User \"alice\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
        "{refused}"
    );
}

/// kube-rs's `impersonate`: refused (403, with kube-apiserver's message) to a user without
/// the `impersonate` verb on what it names; allowed, as that user, to one with it.
#[tokio::test]
async fn impersonating_needs_the_impersonate_verb_on_each_thing_named() {
    let server = rbac_server().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let cm = json!({"metadata": {"name": "shared"}});
    config_maps
        .create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
        .await
        .unwrap();
    grant(
        &server,
        "alice",
        "alice-reads-configmaps",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    )
    .await;
    let as_user = |who: &str, impersonate: &str, groups: &[&str]| {
        let mut config = server.kube_config_for(&user(who, &[])).unwrap();
        config.auth_info.impersonate = Some(impersonate.to_string());
        if !groups.is_empty() {
            config.auth_info.impersonate_groups =
                Some(groups.iter().map(|g| g.to_string()).collect());
        }
        let client = kube::Client::try_from(config).unwrap();
        Api::<ConfigMap>::namespaced(client, "default")
    };

    // Bob may not impersonate anyone.
    let refused = api_status(
        as_user("bob", "alice", &[])
            .get("shared")
            .await
            .unwrap_err(),
    );
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        refused.message,
        "users \"alice\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );

    // Carol may impersonate alice, and no group: as alice she reads what alice reads.
    grant(
        &server,
        "carol",
        "carol-impersonates-alice",
        json!([{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"],
                "resourceNames": ["alice"]}]),
    )
    .await;
    let read = as_user("carol", "alice", &[]).get("shared").await.unwrap();
    assert_eq!(read.metadata.name.as_deref(), Some("shared"));
    let refused = api_status(
        as_user("carol", "alice", &["system:masters"])
            .get("shared")
            .await
            .unwrap_err(),
    );
    assert_eq!(
        refused.message,
        "groups \"system:masters\" is forbidden: User \"carol\" cannot impersonate resource \"groups\" in API group \"\" at the cluster scope"
    );
    let refused = api_status(
        as_user("carol", "dave", &[])
            .get("shared")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 403);
    // Alice may not write, so carol as alice may not either.
    let alice = as_user("carol", "alice", &[]);
    let other = json!({"metadata": {"name": "other"}});
    let refused = api_status(
        alice
            .create(
                &PostParams::default(),
                &serde_json::from_value(other).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(
        refused.message,
        "configmaps is forbidden: User \"alice\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );

    // A ServiceAccount is impersonated in its namespace.
    let refused = api_status(
        as_user("bob", "system:serviceaccount:team:builder", &[])
            .get("shared")
            .await
            .unwrap_err(),
    );
    assert_eq!(
        refused.message,
        "serviceaccounts \"builder\" is forbidden: User \"bob\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"team\""
    );
}

/// The groups an impersonated user gets are kube-apiserver's: groups named replace a
/// ServiceAccount's own, a named `system:unauthenticated` is not joined by
/// `system:authenticated`, and an empty `Impersonate-User` alone asks for no one (it was a 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonated_users_are_grouped_as_kube_apiserver_groups_them() {
    let Some(kubectl) =
        Kubectl::find("impersonated_users_are_grouped_as_kube_apiserver_groups_them")
    else {
        return;
    };
    let server = rbac_server().await;
    let k = kubectl.against(&server.kubeconfig());
    let groups = |me: Value| me["status"]["userInfo"]["groups"].clone();
    let whoami = ["auth", "whoami"];

    let service_account = [&whoami[..], &["--as", "system:serviceaccount:team:builder"]].concat();
    assert_eq!(
        groups(k.json(&service_account).await),
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team",
            "system:authenticated"
        ])
    );
    let with_group = [&service_account[..], &["--as-group", "ops"]].concat();
    assert_eq!(
        groups(k.json(&with_group).await),
        json!(["ops", "system:authenticated"])
    );
    let unauthenticated = [
        &whoami[..],
        &["--as", "alice", "--as-group", "system:unauthenticated"],
    ]
    .concat();
    // Not authenticated, alice may not even review herself (`system:basic-user` is bound to
    // `system:authenticated` only), as on kube-apiserver; it was allowed while
    // `system:authenticated` was added beside the group named.
    let refused = k.fails(&unauthenticated, None).await;
    assert!(
        refused.contains("the selfsubjectreviews API is not enabled in the cluster or you do not have permission to call it"),
        "{refused}"
    );

    let own = k.json(&whoami).await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let request = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("Content-Type", "application/json")
        .header("Impersonate-User", "")
        .body(serde_json::to_vec(&review).unwrap())
        .unwrap();
    let me: Value = server.client().request(request).await.unwrap();
    assert_eq!(me["status"]["userInfo"], own["status"]["userInfo"], "{me}");
}
