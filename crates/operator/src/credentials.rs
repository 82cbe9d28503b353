//! A cluster's CAs (the Cluster API Secrets `<cluster>-ca`, `-etcd`, `-proxy`) and the
//! operator's client certificate for that cluster's agents, minted from the cluster CA and
//! renewed before it expires.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::client::AgentClient;
use caretaker_agent_api::kubeadm::SigningCa;
use caretaker_agent_api::tls::ClientIdentity;
use caretaker_pki::{CertificateAuthority, LeafSpec, RotationPolicy, Ttl, Usage};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use time::OffsetDateTime;
use tokio::sync::Mutex;

use crate::Error;

/// The client identity agents accept by default.
pub const OPERATOR_CLIENT_NAME: &str = caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT;
/// The operator's client certificates live this long and are replaced after two thirds.
const CLIENT_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// Everything needed to refresh one cluster's Machines.
pub struct ClusterCredentials {
    authorities: HashMap<SigningCa, CertificateAuthority>,
    /// The operator's client certificate for this cluster's agents.
    client: ClientIdentity,
    agent_timeout: Duration,
    client_not_before: OffsetDateTime,
    client_not_after: OffsetDateTime,
}

impl ClusterCredentials {
    pub fn authority(
        &self,
        ca: SigningCa,
        namespace: &str,
        cluster: &str,
    ) -> Result<&CertificateAuthority, Error> {
        self.authorities.get(&ca).ok_or_else(|| Error::ClusterCa {
            namespace: namespace.into(),
            name: secret_name(cluster, ca),
            reason: "not found".into(),
        })
    }

    /// A client for the agent of the node named `names` (its node name and addresses): it
    /// refuses, in the TLS handshake, an agent whose serving certificate names none of them.
    pub fn agent_for(&self, names: &[String]) -> Result<AgentClient, Error> {
        AgentClient::for_node(&self.client, names, self.agent_timeout).map_err(Error::AgentClient)
    }

    fn needs_renewal(&self, now: OffsetDateTime) -> bool {
        RotationPolicy::Fraction(2.0 / 3.0).is_due(
            self.client_not_before,
            self.client_not_after,
            now,
        )
    }
}

/// The suffix of a CA's Secret name, as Cluster API names them.
fn secret_suffix(ca: SigningCa) -> &'static str {
    match ca {
        SigningCa::Cluster => "ca",
        SigningCa::Etcd => "etcd",
        SigningCa::FrontProxy => "proxy",
    }
}

pub fn secret_name(cluster: &str, ca: SigningCa) -> String {
    format!("{cluster}-{}", secret_suffix(ca))
}

/// The cluster whose CA Secret this could be (`c1` for `c1-ca`, `c1-etcd`, `c1-proxy`).
pub fn cluster_of_ca_secret(secret: &str) -> Option<&str> {
    SigningCa::ALL.iter().find_map(|ca| {
        secret
            .strip_suffix(secret_suffix(*ca))?
            .strip_suffix('-')
            .filter(|cluster| !cluster.is_empty())
    })
}

/// Credentials per cluster, loaded on first use and reloaded when the client certificate is
/// due or when asked to (a CA rotated).
#[derive(Default)]
pub struct CredentialStore {
    cache: Mutex<HashMap<(String, String), Arc<ClusterCredentials>>>,
}

impl CredentialStore {
    pub async fn get(
        &self,
        client: &kube::Client,
        namespace: &str,
        cluster: &str,
        agent_timeout: Duration,
    ) -> Result<Arc<ClusterCredentials>, Error> {
        let now = OffsetDateTime::now_utc();
        self.get_at(client, namespace, cluster, agent_timeout, now)
            .await
    }

    /// [`Self::get`] as of `now`.
    async fn get_at(
        &self,
        client: &kube::Client,
        namespace: &str,
        cluster: &str,
        agent_timeout: Duration,
        now: OffsetDateTime,
    ) -> Result<Arc<ClusterCredentials>, Error> {
        let key = (namespace.to_string(), cluster.to_string());
        let mut cache = self.cache.lock().await;
        if let Some(found) = cache.get(&key).filter(|c| !c.needs_renewal(now)) {
            return Ok(found.clone());
        }
        let loaded = Arc::new(load(client, namespace, cluster, agent_timeout).await?);
        cache.insert(key, loaded.clone());
        Ok(loaded)
    }

    /// Forgets a cluster's credentials, so the next use reloads the Secrets. Returns whether
    /// they were loaded.
    ///
    /// A load in progress holds the cache's lock until it has stored its result, so a change
    /// seen here after the load read the old Secret still removes what that load stored.
    pub async fn forget(&self, namespace: &str, cluster: &str) -> bool {
        self.cache
            .lock()
            .await
            .remove(&(namespace.to_string(), cluster.to_string()))
            .is_some()
    }

    /// Whether a cluster's credentials are loaded.
    pub async fn is_loaded(&self, namespace: &str, cluster: &str) -> bool {
        self.cache
            .lock()
            .await
            .contains_key(&(namespace.to_string(), cluster.to_string()))
    }
}

async fn load(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    agent_timeout: Duration,
) -> Result<ClusterCredentials, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut authorities = HashMap::new();
    for ca in SigningCa::ALL {
        let name = secret_name(cluster, ca);
        let error = |reason: String| Error::ClusterCa {
            namespace: namespace.into(),
            name: name.clone(),
            reason,
        };
        let Some(secret) = secrets.get_opt(&name).await? else {
            // Only the cluster CA is required; a cluster without etcd or front-proxy CAs
            // fails only if a node asks for a certificate signed by them.
            if ca == SigningCa::Cluster {
                return Err(error("not found".into()));
            }
            continue;
        };
        let field = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .ok_or_else(|| error(format!("has no {key}")))
        };
        let authority = CertificateAuthority::from_pem(&field("tls.crt")?, &field("tls.key")?)
            .map_err(|e| error(e.to_string()))?;
        authorities.insert(ca, authority);
    }
    let cluster_ca = &authorities[&SigningCa::Cluster];
    let lifetime = Ttl::from_duration(CLIENT_CERTIFICATE_LIFETIME).expect("a valid lifetime");
    let issued = cluster_ca
        .issue(&LeafSpec::new(OPERATOR_CLIENT_NAME, Usage::Client).with_validity(lifetime))
        .map_err(|e| Error::OperatorCertificate {
            reason: e.to_string(),
        })?;
    let key = issued.key.as_ref().expect("issue() returns a key").to_pem();
    let client =
        ClientIdentity::from_pem(&cluster_ca.certificate_pem(), &issued.certificate_pem, &key)
            .map_err(|e| Error::OperatorCertificate {
                reason: e.to_string(),
            })?;
    let info = issued.info();
    Ok(ClusterCredentials {
        client_not_before: info.not_before,
        client_not_after: info.not_after,
        authorities,
        client,
        agent_timeout,
    })
}

#[cfg(test)]
mod tests {
    use caretaker_pki::CaSpec;
    use k8s_openapi::ByteString;
    use kube::api::{ObjectMeta, PostParams};

    use super::*;

    #[test]
    fn ca_secret_names_map_back_to_their_cluster() {
        for ca in SigningCa::ALL {
            assert_eq!(cluster_of_ca_secret(&secret_name("c1", ca)), Some("c1"));
            assert_eq!(
                cluster_of_ca_secret(&secret_name("my-ca", ca)),
                Some("my-ca")
            );
        }
        for other in ["c1-kubeconfig", "ca", "-ca", "c1ca", "c1-proxy-x", "etcd"] {
            assert_eq!(cluster_of_ca_secret(other), None, "{other}");
        }
    }

    #[tokio::test]
    async fn the_client_certificate_is_replaced_after_two_thirds_of_its_life() {
        caretaker_agent_api::tls::install_crypto_provider();
        let server = caretaker_apiserver::TestServer::start().await;
        let client = server.client();
        // Only the cluster CA's Secret is required.
        let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
        let data = [
            ("tls.crt", ca.certificate_pem()),
            ("tls.key", ca.private_key_pem()),
        ];
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name("c1", SigningCa::Cluster)),
                ..Default::default()
            },
            data: Some(
                data.into_iter()
                    .map(|(key, pem)| (key.to_string(), ByteString(pem.into_bytes())))
                    .collect(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let store = CredentialStore::default();
        let timeout = Duration::from_secs(5);
        let get = |now| store.get_at(&client, "default", "c1", timeout, now);

        let start = OffsetDateTime::now_utc();
        let first = get(start).await.unwrap();
        let lifetime = first.client_not_after - first.client_not_before;
        assert_eq!(lifetime.whole_days(), 7);
        let day = time::Duration::days(1);
        let kept = get(start + 4 * day).await.unwrap();
        assert!(
            Arc::ptr_eq(&first, &kept),
            "before two thirds the same client is used"
        );
        let renewed = get(start + 5 * day).await.unwrap();
        assert!(
            !Arc::ptr_eq(&first, &renewed),
            "after two thirds a new one is minted"
        );
        assert!(renewed.client_not_after >= first.client_not_after);
    }
}
