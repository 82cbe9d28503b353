//! `caretaker status certificates` (alias `expiry`), the glue: read what the table is made of
//! ([`Observed`]) from the API server, and print it, once or on every change (`--watch`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use caretaker_api::v1alpha1::{CertificateAuthority, EtcdCertificates, IssuedCertificate};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use time::OffsetDateTime;

use super::expiry::{self, Document, Observed, ObservedBundle, ObservedEtcd};

#[derive(Debug, clap::Args)]
pub struct CertificatesArgs {
    /// Output format: a table, or a document for scripts ({"certificates": [{kind,
    /// namespace, name, notAfter, renewalTime, state}]}, times in RFC 3339).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Keep reading, and print again whenever something changed (the table redrawn in
    /// place; a new document otherwise). Ctrl-C ends it.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    kubeconfig: crate::cmd::KubeconfigArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

/// How often `--watch` reads again.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

pub fn run(args: CertificatesArgs) -> ExitCode {
    crate::cmd::run_async("status certificates", async move {
        let client = args.kubeconfig.client().await?;
        let mut shown = None;
        loop {
            let rows = expiry::rows(&observe(&client).await?);
            if shown.as_ref() != Some(&rows) {
                let text = render(&rows, args.output)?;
                if args.watch && args.output == Output::Table {
                    // Clear the screen and redraw, like `watch`.
                    print!("\x1b[2J\x1b[H");
                }
                print!("{text}");
                shown = Some(rows);
            }
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
                _ = crate::cmd::stop_requested() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

fn render(rows: &[expiry::Row], output: Output) -> Result<String, String> {
    let document = Document { certificates: rows };
    match output {
        Output::Table => Ok(expiry::table(rows, OffsetDateTime::now_utc())),
        Output::Json => serde_json::to_string_pretty(&document)
            .map(|text| text + "\n")
            .map_err(|e| e.to_string()),
        Output::Yaml => serde_saphyr::to_string(&document).map_err(|e| e.to_string()),
    }
}

/// Everything the table is made of. A kind the API server does not serve (its CRD not
/// installed) is read as none.
async fn observe(client: &kube::Client) -> Result<Observed, String> {
    let authorities = list(Api::<CertificateAuthority>::all(client.clone())).await?;
    let certificates = list(Api::<IssuedCertificate>::all(client.clone())).await?;
    let mut etcd = Vec::new();
    for object in list(Api::<EtcdCertificates>::all(client.clone())).await? {
        let namespace = object.namespace().unwrap_or_default();
        let certificates = etcd_certificates(client, &namespace).await?;
        etcd.push(ObservedEtcd {
            object,
            certificates,
        });
    }
    let machines = list(Api::<DynamicObject>::all_with(
        client.clone(),
        &caretaker_api::cluster_api::machine_api_resource(),
    ))
    .await?;
    let mut bundles = Vec::new();
    for (kind, group, version, label) in [
        (
            "Bundle",
            "trust.cert-manager.io",
            "v1alpha1",
            caretaker_operator::trust::api::BUNDLE_LABEL,
        ),
        (
            "ClusterBundle",
            "trust-manager.io",
            "v1alpha2",
            caretaker_operator::trust::cluster_bundle::CLUSTER_BUNDLE_LABEL,
        ),
    ] {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        for bundle in list(Api::<DynamicObject>::all_with(client.clone(), &resource)).await? {
            bundles.push(observe_bundle(client, kind, label, &bundle).await?);
        }
    }
    Ok(Observed {
        authorities,
        certificates,
        etcd,
        machines,
        bundles,
    })
}

/// The certificates of the namespace's `etcd-all-certs` (its `*.crt` keys but the bundles),
/// and the client certificates beside it. Key entries are dropped unread.
async fn etcd_certificates(
    client: &kube::Client,
    namespace: &str,
) -> Result<BTreeMap<String, String>, String> {
    use caretaker_operator::etcd;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut certificates = BTreeMap::new();
    let bundles = [etcd::ALL_CERTS_CA_BUNDLE, etcd::ALL_CERTS_METRICS_CA_BUNDLE];
    if let Some(all) = get(&secrets, etcd::ALL_CERTS).await? {
        for (key, value) in all.data.unwrap_or_default() {
            if key.ends_with(".crt") && !bundles.contains(&key.as_str()) {
                certificates.insert(key, String::from_utf8_lossy(&value.0).into_owned());
            }
        }
    }
    for name in [etcd::CLIENT_SECRET, etcd::METRICS_CLIENT_SECRET] {
        let secret = get(&secrets, name).await?;
        let crt = secret.and_then(|s| s.data?.remove("tls.crt"));
        if let Some(crt) = crt {
            let pem = String::from_utf8_lossy(&crt.0).into_owned();
            certificates.insert(format!("{name}.crt"), pem);
        }
    }
    Ok(certificates)
}

/// A Bundle or ClusterBundle, its Synced condition and the data of one of its target
/// ConfigMaps (found by the label trust-manager puts on every target).
async fn observe_bundle(
    client: &kube::Client,
    kind: &'static str,
    label: &str,
    bundle: &DynamicObject,
) -> Result<ObservedBundle, String> {
    let name = bundle.name_any();
    let conditions = bundle.data["status"]["conditions"].as_array();
    let synced = conditions
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Synced")
        .map(|c| {
            let text = |key: &str| c[key].as_str().unwrap_or_default().to_string();
            (text("status"), text("reason"))
        });
    let configmaps: Api<ConfigMap> = Api::all(client.clone());
    let selector = ListParams::default()
        .labels(&format!("{label}={name}"))
        .limit(1);
    let target = configmaps
        .list(&selector)
        .await
        .map_err(|e| format!("cannot list the targets of {kind} {name}: {e}"))?
        .items
        .into_iter()
        .next()
        .map(|c| c.data.unwrap_or_default());
    Ok(ObservedBundle {
        kind,
        name,
        synced,
        target,
    })
}

/// Every object of `api`; none when the API server does not serve its kind.
async fn list<K>(api: Api<K>) -> Result<Vec<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(format!("cannot list {}: {e}", api.resource_url())),
    }
}

async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| format!("cannot read {name}: {e}"))
}
