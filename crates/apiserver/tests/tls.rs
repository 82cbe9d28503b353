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
    let refused = Api::<Namespace>::all(stranger)
        .get("default")
        .await
        .unwrap_err();
    assert_eq!(
        tls_error(&refused),
        Some(&rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer
        )),
        "{refused:?}"
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

/// The TLS error somewhere in `e`'s chain of causes. tokio-rustls wraps it in an io::Error, whose
/// `source()` skips the wrapped error, so io::Errors are opened by hand.
fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        let wrapped = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        if let Some(tls) = e
            .downcast_ref::<rustls::Error>()
            .or_else(|| wrapped.and_then(|w| w.downcast_ref::<rustls::Error>()))
        {
            return Some(tls);
        }
        next = wrapped.or_else(|| e.source());
    }
    None
}
