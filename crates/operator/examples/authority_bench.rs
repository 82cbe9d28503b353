//! Self-managed CA benchmark (issue 12): N IssuedCertificates (default 10,000) under one
//! CertificateAuthority with `trustPropagation: 0s`, on the embedded API server. It forces a
//! rotation of the CA the documented way (removing `auth.openshift.io/certificate-not-after`
//! from the CA Secret) and prints:
//!
//! - the time from the rotation until every certificate's Secret holds a leaf signed by the new
//!   CA, as this benchmark's own watch on the Secrets sees them (each leaf's authority key id
//!   is compared with the old CA's while it runs; afterwards every leaf counted is verified to
//!   be signed by the new CA, signature and all);
//! - the operator's writes during the rotation: to the Secrets (per Secret, from the
//!   operator's own request count, and how many changes each Secret went through, from the
//!   watch), and separately the IssuedCertificates' status writes, the CA's objects and events;
//! - the operator's writes during the steady state that follows (default 60 s);
//! - the operator's memory (VmRSS, and VmHWM: the peak), and its CPU time.
//!
//! The operator runs in a child process, as in `rollout_bench` (see `common`): all of
//! `controllers::run`, as `caretaker operator` runs it.
//!
//! `cargo run --release -p caretaker-operator --example authority_bench [-- COUNT [STEADY_SECONDS]]`
//! (defaults: 10000 certificates, 60 s).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_api::names;
use caretaker_api::v1alpha1::{self, CertificateAuthority, IssuedCertificate};
use caretaker_apiserver::TestServer;
use caretaker_pki::CertificateInfo;
use common::{Operator, cpu_seconds, is_write, made, verdict};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const SYSTEM: &str = "caretaker-system";
const DEMO: &str = "demo";
const CA: &str = "bench";
const CA_SECRET: &str = "bench-ca";

/// The goals of issue 12.
const GOAL_ROTATION_S: f64 = 5.0;
const GOAL_SECRET_WRITES: f64 = 1.0;
const GOAL_STEADY_WRITES: u64 = 0;
const GOAL_MEMORY_MIB: f64 = 128.0;
/// Issue 33's goal for later work: renewals per second as a share of the server's raw creates.
const GOAL_RAW_RATIO: f64 = 0.5;

/// How long the operator must write nothing for the rotation to count as settled.
const QUIET: Duration = Duration::from_secs(3);

fn main() {
    let Some((args, runtime)) = common::start() else {
        return;
    };
    let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let steady: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(60);
    runtime.block_on(run(count, Duration::from_secs(steady)));
}

async fn run(count: usize, steady: Duration) {
    println!(
        "authority benchmark: {count} IssuedCertificates under one CertificateAuthority \
         (trustPropagation 0s), operator in a child process"
    );
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in v1alpha1::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in [SYSTEM, DEMO] {
        let namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    let ca: CertificateAuthority = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1",
        "kind": "CertificateAuthority",
        "metadata": { "name": CA },
        "spec": {
            "commonName": "bench-ca",
            "secret": { "name": CA_SECRET, "namespace": SYSTEM },
            "bundle": { "name": "bench-ca-bundle", "namespace": SYSTEM },
            "trustPropagation": "0s",
        },
    }))
    .unwrap();
    Api::<CertificateAuthority>::all(client.clone())
        .create(&PostParams::default(), &ca)
        .await
        .unwrap();
    create_certificates(&client, count).await;

    let watch = SecretWatch::start(Api::namespaced(client.clone(), DEMO));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let started = Instant::now();
    let mut operator = Operator::start(&kubeconfig);
    let mut last = 0;
    while watch.issued() < count {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let issued = watch.issued();
        if issued / 1000 > last / 1000 {
            println!(
                "  {issued} Secrets issued after {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        last = issued;
    }
    let first_issue = started.elapsed();
    println!(
        "first issuance: all {count} Secrets hold a certificate {:.2} s after the operator started",
        first_issue.as_secs_f64()
    );
    let settled = settle(&mut operator).await;
    println!(
        "  and the operator stopped writing {:.2} s after it started",
        (settled - started).as_secs_f64()
    );
    let (rss_issued, hwm_issued) = operator.memory();

    // The rotation.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM);
    let old_ca = ca_certificate(&secrets.get(CA_SECRET).await.unwrap());
    let before = operator.requests();
    let cpu_before = (cpu_seconds(operator.pid()), cpu_seconds(std::process::id()));
    let rotated = Instant::now();
    watch.rotation_started(&old_ca, rotated);
    let body = json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } });
    secrets
        .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
    while watch.renewed() < count {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let renewed_seen = rotated.elapsed();
    let at_renewed = operator.requests();
    let settled = settle(&mut operator).await;
    let rotation_settled = settled - rotated;
    let after_rotation = operator.requests();
    let cpu_rotation = cpu_seconds(operator.pid()) - cpu_before.0;
    let cpu_rest = cpu_seconds(std::process::id()) - cpu_before.1;
    let (rss_rotation, hwm_rotation) = operator.memory();
    let changes_per_secret = watch.changes_per_secret();

    // Steady state.
    tokio::time::sleep(steady).await;
    let after_steady = operator.requests();
    let (rss, hwm) = operator.memory();
    drop(operator);
    // The server's raw write rate, with objects the size of a certificate's Secret data.
    let payload = serde_json::to_string(&first_certificate_secret(&client).await.data)
        .unwrap()
        .len();
    let raw_rate = common::raw_create_rate(&client, payload).await;

    // Every leaf counted, checked against the new CA, signature and all.
    let new_ca = ca_certificate(&secrets.get(CA_SECRET).await.unwrap());
    assert_ne!(new_ca, old_ca, "the CA rotated");
    let report = watch.report(&new_ca);
    watch.stop();
    let renewed = report.last_renewed.expect("every Secret renewed") - rotated;

    let to_renewed = made(&before, &at_renewed);
    let rotation = made(&before, &after_rotation);
    let steady_made = made(&after_rotation, &after_steady);
    // Writes to `resource` (`secrets`), or to its status (`issuedcertificates/status`).
    let writes = |made: &BTreeMap<String, u64>, resource: &str| -> u64 {
        let (name, status) = match resource.strip_suffix("/status") {
            Some(name) => (name, true),
            None => (resource, false),
        };
        made.iter()
            .filter(|(kind, _)| is_write(kind))
            .filter(|(kind, _)| {
                let path = kind.split(' ').nth(1).unwrap_or("");
                path.split('/').next() == Some(name) && path.ends_with("/status") == status
            })
            .map(|(_, n)| n)
            .sum()
    };
    let per = |n: u64| n as f64 / count as f64;
    let secret_writes = writes(&rotation, "secrets");
    let secret_writes_to_renewed = writes(&to_renewed, "secrets");
    let steady_writes: u64 = steady_made
        .iter()
        .filter(|(kind, _)| is_write(kind))
        .map(|(_, n)| n)
        .sum();

    println!(
        "rotation: every Secret holds a leaf from the new CA {:.2} s after the rotation was forced \
         ({} leaves verified against the new CA{}); the operator stopped writing {:.2} s after it",
        renewed.as_secs_f64(),
        report.verified,
        if report.not_from_new_ca > 0 {
            format!(
                ", {} first new leaves NOT signed by it",
                report.not_from_new_ca
            )
        } else {
            String::new()
        },
        rotation_settled.as_secs_f64(),
    );
    println!(
        "  (the benchmark's polling saw the last one after {:.2} s)",
        renewed_seen.as_secs_f64()
    );
    println!(
        "  Secret writes until every leaf was renewed: {secret_writes_to_renewed} ({:.2} per Secret); \
         until the operator stopped writing: {secret_writes} ({:.2} per Secret)",
        per(secret_writes_to_renewed),
        per(secret_writes)
    );
    println!("  changes of each Secret the watch saw, until the operator stopped writing:");
    for (changes, secrets) in &changes_per_secret {
        println!("    {changes} change(s): {secrets} Secrets");
    }
    println!("  the operator's requests from the rotation until it stopped writing, by kind:");
    for (kind, n) in &rotation {
        println!("    {kind:<52} {n:>7}  ({:.2} per certificate)", per(*n));
    }
    println!(
        "  CPU from the rotation until the operator stopped writing: operator {cpu_rotation:.2} s \
         ({:.2} ms per certificate), API server + this benchmark {cpu_rest:.2} s ({:.2} ms per \
         certificate); {:.2} s of wall on {} cores",
        cpu_rotation * 1000.0 / count as f64,
        cpu_rest * 1000.0 / count as f64,
        rotation_settled.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let rate = count as f64 / renewed.as_secs_f64();
    println!(
        "rate: {rate:.0} certificates renewed per second; the API server's raw write rate in this \
         run: {raw_rate:.0} creates/s (ConfigMaps of {payload} bytes, 8 clients, no operator): \
         {:.2} ×",
        rate / raw_rate
    );
    println!(
        "steady state: {} s after the rotation settled, the operator wrote {steady_writes} times",
        steady.as_secs()
    );
    for (kind, n) in steady_made.iter().filter(|(kind, _)| is_write(kind)) {
        println!("    {kind:<52} {n:>7}");
    }
    println!(
        "operator memory: VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB (after first issuance: VmRSS \
         {rss_issued:.1} MiB, VmHWM {hwm_issued:.1} MiB; after the rotation: VmRSS {rss_rotation:.1} MiB, \
         VmHWM {hwm_rotation:.1} MiB)"
    );
    println!();
    println!("| figure | measured | goal | |");
    println!("|---|---|---|---|");
    println!(
        "| rotation until every Secret holds a leaf from the new CA | {:.2} s | < {GOAL_ROTATION_S} s | {} |",
        renewed.as_secs_f64(),
        verdict(renewed.as_secs_f64() < GOAL_ROTATION_S && report.not_from_new_ca == 0)
    );
    // The goal's writes: each Secret's changes up to its leaf from the new CA, as the watch
    // saw them (the CA Secret is not among them).
    let most = f64::from(report.most_changes_to_renewed);
    println!(
        "| Secret writes per Secret until it holds a leaf from the new CA | {:.2} (at most {most}) | {GOAL_SECRET_WRITES} | {} |",
        per(report.changes_to_renewed),
        verdict(most <= GOAL_SECRET_WRITES)
    );
    println!(
        "| renewal rate / the API server's raw write rate | {:.2} × ({rate:.0} / {raw_rate:.0} per s) | ≥ {GOAL_RAW_RATIO} × (later work) | {} |",
        rate / raw_rate,
        verdict(rate / raw_rate >= GOAL_RAW_RATIO)
    );
    println!(
        "| Secret writes per Secret, rotation until the operator stopped writing | {:.2} | (reported) | |",
        per(secret_writes)
    );
    println!(
        "| IssuedCertificate status writes per certificate, same span | {:.2} | (reported) | |",
        per(writes(&rotation, "issuedcertificates/status"))
    );
    println!(
        "| operator writes in {} s of steady state | {steady_writes} | {GOAL_STEADY_WRITES} | {} |",
        steady.as_secs(),
        verdict(steady_writes == GOAL_STEADY_WRITES)
    );
    println!(
        "| operator memory, peak (VmHWM) | {hwm:.1} MiB | < {GOAL_MEMORY_MIB} MiB | {} |",
        verdict(hwm < GOAL_MEMORY_MIB)
    );
}

/// Creates `count` IssuedCertificates in demo (`c-<i>`, Secret `c-<i>-tls`, serving
/// `c-<i>.demo.svc`), a few at a time, with progress.
async fn create_certificates(client: &kube::Client, count: usize) {
    let api: Api<IssuedCertificate> = Api::namespaced(client.clone(), DEMO);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let certificate: IssuedCertificate = serde_json::from_value(json!({
                    "apiVersion": "caretaker.dev/v1alpha1",
                    "kind": "IssuedCertificate",
                    "metadata": { "name": format!("c-{i}"), "namespace": DEMO },
                    "spec": {
                        "issuerRef": { "name": CA },
                        "secretName": format!("c-{i}-tls"),
                        "commonName": format!("c-{i}.demo.svc"),
                        "dnsNames": [format!("c-{i}.demo.svc")],
                        "usages": ["server"],
                    },
                }))
                .unwrap();
                api.create(&PostParams::default(), &certificate).await
            }
        })
        .buffer_unordered(16)
        .enumerate()
        .map(|(done, result)| {
            if (done + 1) % 1000 == 0 || done + 1 == count {
                println!(
                    "  {} IssuedCertificates created after {:.1} s",
                    done + 1,
                    started.elapsed().as_secs_f64()
                );
            }
            result.map(|_| ())
        })
        .try_collect::<()>()
        .await
        .unwrap();
}

/// Waits until the operator has written nothing for [`QUIET`] (at most two minutes); returns
/// when it last wrote, as far as a poll every 100 ms tells.
async fn settle(operator: &mut Operator) -> Instant {
    let writes = |requests: &BTreeMap<String, u64>| -> u64 {
        requests
            .iter()
            .filter(|(kind, _)| is_write(kind))
            .map(|(_, n)| n)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (writes(&operator.requests()), Instant::now());
    while last.1.elapsed() < QUIET && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = writes(&operator.requests());
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    last.1
}

/// One certificate's Secret, as the operator wrote it.
async fn first_certificate_secret(client: &kube::Client) -> Secret {
    Api::<Secret>::namespaced(client.clone(), DEMO)
        .get("c-0-tls")
        .await
        .unwrap()
}

/// The CA that signs now: `tls.crt` of the CA Secret, in DER.
fn ca_certificate(secret: &Secret) -> Vec<u8> {
    let pem = tls_crt(secret).expect("the CA Secret holds tls.crt");
    first_der(&pem)
}

fn tls_crt(secret: &Secret) -> Option<String> {
    let data = secret.data.as_ref()?.get("tls.crt")?;
    Some(String::from_utf8_lossy(&data.0).into_owned()).filter(|s| !s.trim().is_empty())
}

fn first_der(pem: &str) -> Vec<u8> {
    caretaker_operator::authority::Certificate::parse_pem(pem)
        .unwrap()
        .swap_remove(0)
        .der()
        .to_vec()
}

/// What this benchmark's watch on the certificates' Secrets saw.
#[derive(Default)]
struct Seen {
    /// Secrets holding a certificate.
    issued: usize,
    /// Set when the rotation is forced: the old CA's subject key id, and when.
    rotation: Option<(String, Instant)>,
    secrets: HashMap<String, SecretSeen>,
    /// Secrets holding a leaf from another CA than the old one since the rotation.
    renewed: usize,
}

#[derive(Default)]
struct SecretSeen {
    issued: bool,
    resource_version: Option<String>,
    /// Changes seen since the rotation was forced.
    changes: u32,
    /// The first leaf from another CA than the old one, and when it was seen.
    renewed: Option<(Instant, String)>,
    /// Changes seen since the rotation up to and with that leaf's.
    changes_to_renewed: u32,
}

/// A watch on the certificates' Secrets, counting them as the operator writes them.
struct SecretWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the watch saw, checked against the new CA.
struct Report {
    last_renewed: Option<Instant>,
    verified: usize,
    not_from_new_ca: usize,
    /// Changes of each Secret up to its new leaf: all of them, and the most of one Secret.
    changes_to_renewed: u64,
    most_changes_to_renewed: u32,
}

impl SecretWatch {
    fn start(api: Api<Secret>) -> Self {
        use kube::runtime::WatchStreamExt;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let events = kube::runtime::watcher(api, Default::default())
                .default_backoff()
                .applied_objects();
            let mut events = std::pin::pin!(events);
            while let Some(Ok(secret)) = events.next().await {
                let now = Instant::now();
                let name = secret.metadata.name.clone().unwrap_or_default();
                let pem = tls_crt(&secret);
                let mut seen = record.lock().unwrap();
                let rotation = seen.rotation.clone();
                let entry = seen.secrets.entry(name).or_default();
                if entry.resource_version == secret.metadata.resource_version {
                    continue;
                }
                entry.resource_version = secret.metadata.resource_version.clone();
                let newly_issued = pem.is_some() && !entry.issued;
                entry.issued |= pem.is_some();
                let mut newly_renewed = false;
                if let Some((old_key_id, at)) = &rotation
                    && now >= *at
                {
                    entry.changes += 1;
                    if entry.renewed.is_none()
                        && let Some(pem) = pem
                        && authority_key_id(&pem).as_ref() != Some(old_key_id)
                    {
                        entry.renewed = Some((now, pem));
                        entry.changes_to_renewed = entry.changes;
                        newly_renewed = true;
                    }
                }
                seen.issued += usize::from(newly_issued);
                seen.renewed += usize::from(newly_renewed);
            }
        });
        SecretWatch { seen, task }
    }

    fn issued(&self) -> usize {
        self.seen.lock().unwrap().issued
    }

    fn renewed(&self) -> usize {
        self.seen.lock().unwrap().renewed
    }

    fn rotation_started(&self, old_ca: &[u8], at: Instant) {
        let key_id = CertificateInfo::from_der(old_ca)
            .unwrap()
            .subject_key_id
            .expect("the CA has a subject key id");
        self.seen.lock().unwrap().rotation = Some((key_id, at));
    }

    /// Each leaf counted as renewed, verified to be signed by `new_ca`.
    fn report(&self, new_ca: &[u8]) -> Report {
        let seen = self.seen.lock().unwrap();
        let mut report = Report {
            last_renewed: None,
            verified: 0,
            not_from_new_ca: 0,
            changes_to_renewed: 0,
            most_changes_to_renewed: 0,
        };
        for secret in seen.secrets.values() {
            let Some((at, pem)) = &secret.renewed else {
                continue;
            };
            if caretaker_pki::is_issued_by(&first_der(pem), new_ca).unwrap_or(false) {
                report.verified += 1;
            } else {
                report.not_from_new_ca += 1;
            }
            report.last_renewed = report.last_renewed.max(Some(*at));
            report.changes_to_renewed += u64::from(secret.changes_to_renewed);
            report.most_changes_to_renewed =
                (report.most_changes_to_renewed).max(secret.changes_to_renewed);
        }
        report
    }

    /// How many Secrets went through each number of changes since the rotation.
    fn changes_per_secret(&self) -> BTreeMap<u32, usize> {
        let mut counts = BTreeMap::new();
        for secret in self.seen.lock().unwrap().secrets.values() {
            *counts.entry(secret.changes).or_default() += 1;
        }
        counts
    }

    fn stop(self) {
        self.task.abort();
    }
}

fn authority_key_id(pem: &str) -> Option<String> {
    CertificateInfo::from_pem(pem).ok()?.authority_key_id
}
