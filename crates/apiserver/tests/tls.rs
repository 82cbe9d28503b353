//! HTTPS serving: the CA kept in the data directory, trusted by clients through the kubeconfig.

use caretaker_apiserver::ApiServer;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

#[tokio::test]
async fn https_with_a_persistent_ca() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::builder()
        .data_dir(dir.path())
        .tls(true)
        .start()
        .await
        .unwrap();
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let ca = server.ca_pem().unwrap().to_string();
    let namespaces: Api<Namespace> = Api::all(server.client());
    assert!(namespaces.get("default").await.is_ok());

    // The kubeconfig carries the CA; a client built from it trusts the server.
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let from_file = kube::Client::try_from(config).unwrap();
    assert!(
        Api::<Namespace>::all(from_file)
            .get("kube-system")
            .await
            .is_ok()
    );

    // A client that does not trust the CA is refused.
    let mut untrusting = kube::Config::new(server.url().parse().unwrap());
    untrusting.root_cert = Some(vec![]);
    let stranger = kube::Client::try_from(untrusting).unwrap();
    assert!(
        Api::<Namespace>::all(stranger)
            .get("default")
            .await
            .is_err()
    );

    // Restarting on the same data directory keeps the CA.
    server.shutdown().await;
    let again = ApiServer::builder()
        .data_dir(dir.path())
        .tls(true)
        .start()
        .await
        .unwrap();
    assert_eq!(again.ca_pem().unwrap(), ca);
    assert!(
        Api::<Namespace>::all(again.client())
            .get("default")
            .await
            .is_ok()
    );
}
