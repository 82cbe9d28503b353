//! Who a request is from, as a client asks it: `kubectl auth whoami` (SelfSubjectReview).

use caretaker_apiserver::{ApiServer, Authorization, Subject};
use serde_json::json;

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
