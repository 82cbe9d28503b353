//! Rotation never breaks a handshake (issue 12): caretaker's own webhook server
//! ([`webhook::Webhook`], serving the `kubernetes.io/tls` Secret it watches and swapping the
//! certificate in place when the Secret changes) is called by the embedded API server's
//! admission path without a pause, while the CA behind its certificate is rotated three
//! times. Every admission call is a new TCP connection and a new TLS handshake verified
//! against the webhook configuration's `caBundle` (the embedded API server builds a client
//! configuration and connects for each call), so a single moment in which the served leaf is
//! not trusted by the `caBundle` shows as a failed call.
//!
//! The load: a few tasks create an invalid CertificateAuthority (`spec.validity: 10x`, dry
//! run) in a loop. The webhook denies each with the same message; that denial is an answered
//! call. Anything else (`failed calling webhook` for a certificate the `caBundle` does not
//! verify, a timeout, an admitted object, ...) is a failed call, and the first few are
//! printed.
//!
//! - [`three_operator_rotations_fail_no_admission_call`]: the operator's CertificateAuthority,
//!   IssuedCertificate and CA-bundle injection controllers rotate a CA of 20 s (`renewBefore:
//!   10s`, `trustPropagation: 2s`) three times; the leaf is issued again by each new CA and
//!   served, and no call fails.
//! - [`signing_before_trusting_fails_admission_calls`]: the control. The same server, load and
//!   count, but the test rotates in the wrong order itself (a new CA signs a new leaf that is
//!   served first, and the `caBundle` takes the new CA up only after the same 2 s): calls
//!   fail in every rotation (`invalid peer certificate: BadSignature`: the CAs share their
//!   subject, so the old CA is the issuer found and its signature does not verify), so the
//!   count above can see a broken handshake.
//!
//! Rate: each test prints its admission calls per second. Measured on a 2-core machine in a
//! debug build, with another build running beside it (load average 3 to 5): 210 to 360
//! answered calls per second through the operator's rotations when it runs alone (about
//! 36 s), 170 to 230 while the control runs beside it; the control makes 140 to 350 calls per
//! second (about 10 s). The rate is printed, not asserted (figures are never timed assertions
//! in the test suite); what is asserted is that calls were answered through each rotation.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_api::names;
use caretaker_api::v1alpha1::{CertificateAuthority as CaObject, IssuedCertificate};
use caretaker_apiserver::{ApiServer, TestServer};
use caretaker_operator::authority::Certificate;
use caretaker_operator::authority::controller as authority_controller;
use caretaker_operator::injection::controller as ca_injection;
use caretaker_operator::webhook::{
    self, CertificateSource, Endpoint, Limits, ServingCertificate, Webhook,
};
use caretaker_operator::{BindAddress, Context};
use caretaker_pki::{CaSpec, CertificateAuthority};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use common::authorities::{
    certificate_authority, create_namespace, eventually, install_caretaker_crds, tls_secret,
};

const NAMESPACE: &str = "caretaker-system";
/// The webhook's serving certificate.
const SECRET: &str = "rot-webhook-tls";
const CONFIGURATION: &str = "rot";
/// The CertificateAuthority rotated (its Secret `rot-ca`, its bundle `rot-ca-bundle`).
const AUTHORITY: &str = "rot";
/// The webhook of [`CONFIGURATION`] the load goes through.
const CA_WEBHOOK: &str = "certificateauthorities.caretaker.dev";
/// How long a new CA is trusted before it signs, in both tests.
const TRUST_PROPAGATION: Duration = Duration::from_secs(2);
/// Tasks issuing admission calls at once.
const WORKERS: usize = 8;
/// What an answered call says.
const DENIED: &str = "admission webhook \"certificateauthorities.caretaker.dev\" denied the \
                      request: CertificateAuthority \"load\" is invalid: spec.validity: \
                      invalid TTL \"10x\"";

/// The API server with caretaker's CRDs, caretaker's webhook serving the Secret [`SECRET`],
/// and whatever else the test runs beside them.
struct Harness {
    _server: ApiServer,
    client: kube::Client,
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn harness() -> Harness {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NAMESPACE).await;
    let source = CertificateSource::Secret {
        namespace: NAMESPACE.into(),
        name: SECRET.into(),
    };
    let address: BindAddress = "127.0.0.1:0".parse().unwrap();
    let webhook = Webhook::bind(&address, source, Limits::default())
        .await
        .unwrap();
    let addr = webhook.local_addr().unwrap();
    let certificate = webhook.certificate();
    let tasks = vec![tokio::spawn(webhook.run(client.clone()))];
    Harness {
        _server: server,
        client,
        addr,
        certificate,
        tasks,
    }
}

impl Harness {
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn configurations(&self) -> Api<ValidatingWebhookConfiguration> {
        Api::all(self.client.clone())
    }

    /// Creates [`CONFIGURATION`] (caretaker's two webhooks, `failurePolicy: Fail`) trusting
    /// `ca_bundle`, and injected from `inject_from` if given.
    async fn create_configuration(&self, ca_bundle: &str, inject_from: Option<&str>) {
        let endpoint = Endpoint::Url(format!("https://127.0.0.1:{}", self.addr.port()));
        let mut configuration = webhook::configuration(CONFIGURATION, &endpoint, ca_bundle);
        if let Some(authority) = inject_from {
            configuration.metadata.annotations =
                Some([(names::injection::INJECT_CA_FROM.into(), authority.into())].into());
        }
        self.configurations()
            .create(&PostParams::default(), &configuration)
            .await
            .unwrap();
    }

    /// The CAs the webhook the load goes through trusts: their fingerprints.
    async fn trusted(&self) -> Vec<String> {
        let configuration = self.configurations().get(CONFIGURATION).await.unwrap();
        let hook = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .find(|hook| hook.name == CA_WEBHOOK)
            .unwrap();
        let pem = hook
            .client_config
            .ca_bundle
            .map(|b| b.0)
            .unwrap_or_default();
        fingerprints(&certificates(&String::from_utf8(pem).unwrap()))
    }

    /// The first certificate under `key` of Secret `name`, if there is one.
    async fn certificate_in(&self, name: &str, key: &str) -> Option<Certificate> {
        let mut data = self.secrets().get_opt(name).await.unwrap()?.data?;
        let pem = String::from_utf8(data.remove(key)?.0).ok()?;
        certificates(&pem).into_iter().next()
    }

    /// Waits until the webhook serves `leaf`.
    async fn wait_served(&self, leaf: &Certificate) {
        eventually("the webhook serves the new leaf", 30, || async {
            let served = self.certificate.info()?;
            (served.sha256_fingerprint == leaf.fingerprint()).then_some(())
        })
        .await
    }

    /// Starts the admission calls.
    fn load(&self) -> Load {
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..WORKERS)
            .map(|_| tokio::spawn(call_until(self.client.clone(), stop.clone(), tally.clone())))
            .collect();
        Load {
            tally,
            stop,
            tasks,
            started: Instant::now(),
        }
    }
}

fn certificates(pem: &str) -> Vec<Certificate> {
    if pem.trim().is_empty() {
        return Vec::new();
    }
    Certificate::parse_pem(pem).unwrap()
}

fn fingerprints(certificates: &[Certificate]) -> Vec<String> {
    certificates
        .iter()
        .map(|c| c.fingerprint().to_string())
        .collect()
}

fn signed_by(leaf: &Certificate, ca: &Certificate) -> bool {
    caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap()
}

/// Admission calls so far.
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    failed: AtomicU64,
    /// The messages of the first failed calls.
    first_failures: Mutex<Vec<String>>,
}

/// Admission calls going on.
struct Load {
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

/// What a [`Load`] counted.
#[derive(Debug)]
struct Counted {
    answered: u64,
    failed: u64,
    first_failures: Vec<String>,
    elapsed: Duration,
}

impl Counted {
    fn rate(&self) -> f64 {
        self.answered as f64 / self.elapsed.as_secs_f64()
    }
}

impl Load {
    fn answered(&self) -> u64 {
        self.tally.answered.load(Ordering::SeqCst)
    }

    fn failed(&self) -> u64 {
        self.tally.failed.load(Ordering::SeqCst)
    }

    /// Waits until `more` calls beyond those answered now are answered.
    async fn wait_answered(&self, more: u64) {
        let target = self.answered() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answered() < target {
            assert!(
                Instant::now() < deadline,
                "{more} more calls were not answered within 30s; {} failed, the first: {:#?}",
                self.failed(),
                self.tally.first_failures.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn stop(self) -> Counted {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let counted = Counted {
            answered: self.tally.answered.load(Ordering::SeqCst),
            failed: self.tally.failed.load(Ordering::SeqCst),
            first_failures: self.tally.first_failures.lock().unwrap().clone(),
            elapsed: self.started.elapsed(),
        };
        println!(
            "{} admission calls answered, {} failed, in {:.1?}: {:.0} calls/s, {:.0} answered/s; \
             first failures: {:#?}",
            counted.answered,
            counted.failed,
            counted.elapsed,
            (counted.answered + counted.failed) as f64 / counted.elapsed.as_secs_f64(),
            counted.rate(),
            counted.first_failures
        );
        counted
    }
}

/// One worker of a [`Load`]: creates an invalid CertificateAuthority (dry run) until told to
/// stop, counting each call as answered (the webhook's denial) or failed (anything else).
async fn call_until(client: kube::Client, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let authorities: Api<CaObject> = Api::all(client);
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let invalid = certificate_authority("load", NAMESPACE, json!({"validity": "10x"}));
    while !stop.load(Ordering::SeqCst) {
        let message = match authorities.create(&params, &invalid).await {
            Err(kube::Error::Api(status)) => status.message,
            Ok(_) => "admitted".to_string(),
            Err(e) => e.to_string(),
        };
        if message.starts_with(DENIED) {
            tally.answered.fetch_add(1, Ordering::SeqCst);
        } else {
            tally.failed.fetch_add(1, Ordering::SeqCst);
            let mut first = tally.first_failures.lock().unwrap();
            if first.len() < 5 {
                first.push(message);
            }
        }
    }
}

/// A CA rotation as the operator goes through it, seen from the objects.
#[derive(Debug)]
struct Rotation {
    /// Calls answered when the new CA first appeared in the CA Secret (`next.crt`).
    answered_at_next: u64,
    /// Calls answered once the old CA had left the `caBundle`.
    answered_at_end: u64,
    /// From the new CA's appearance to the old CA leaving the `caBundle`.
    took: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_operator_rotations_fail_no_admission_call() {
    let mut harness = harness().await;
    let ctx = Context::new(harness.client.clone(), common::fast());
    harness
        .tasks
        .push(tokio::spawn(authority_controller::run(ctx.clone(), None)));
    harness
        .tasks
        .push(tokio::spawn(ca_injection::run(ctx, None)));
    // A CA due 10 s after it is made, expiring 10 s later; its leaves are capped at its
    // notAfter and due 4 s before it, so each is issued again by the next CA well before.
    Api::<CaObject>::all(harness.client.clone())
        .create(
            &PostParams::default(),
            &certificate_authority(
                AUTHORITY,
                NAMESPACE,
                json!({"validity": "20s", "renewBefore": "10s", "trustPropagation": "2s"}),
            ),
        )
        .await
        .unwrap();
    let leaf: IssuedCertificate = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
        "metadata": {"name": "rot-webhook", "namespace": NAMESPACE},
        "spec": {
            "issuerRef": {"name": AUTHORITY}, "secretName": SECRET,
            "commonName": "rot-webhook", "ipAddresses": ["127.0.0.1"], "usages": ["server"],
            "validity": "1h", "renewBefore": "4s",
        },
    }))
    .unwrap();
    Api::<IssuedCertificate>::namespaced(harness.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &leaf)
        .await
        .unwrap();
    let ca_secret = format!("{AUTHORITY}-ca");
    let mut ca = eventually("the first CA", 30, || {
        harness.certificate_in(&ca_secret, "tls.crt")
    })
    .await;
    let first = eventually("the first leaf", 30, || async {
        let leaf = harness.certificate_in(SECRET, "tls.crt").await?;
        signed_by(&leaf, &ca).then_some(leaf)
    })
    .await;
    harness.wait_served(&first).await;
    harness.create_configuration("", Some(AUTHORITY)).await;
    eventually("the caBundle is injected", 30, || async {
        harness
            .trusted()
            .await
            .contains(&ca.fingerprint().to_string())
            .then_some(())
    })
    .await;

    let load = harness.load();
    load.wait_answered(100).await;
    assert_eq!(load.failed(), 0, "calls failed before any rotation");
    let mut rotations = Vec::new();
    for round in 1..=3 {
        // The next CA, or the CA that signs now if it is already promoted.
        let next = eventually(&format!("rotation {round}: a next CA"), 40, || async {
            let next = harness.certificate_in(&ca_secret, "next.crt").await;
            let signing = harness.certificate_in(&ca_secret, "tls.crt").await;
            next.or(signing.filter(|signing| *signing != ca))
        })
        .await;
        let began = Instant::now();
        let answered_at_next = load.answered();
        eventually(
            &format!("rotation {round}: the next CA signs"),
            30,
            || async {
                let signing = harness.certificate_in(&ca_secret, "tls.crt").await?;
                (signing == next).then_some(())
            },
        )
        .await;
        let leaf = eventually(
            &format!("rotation {round}: a leaf from the new CA"),
            30,
            || async {
                let leaf = harness.certificate_in(SECRET, "tls.crt").await?;
                signed_by(&leaf, &next).then_some(leaf)
            },
        )
        .await;
        harness.wait_served(&leaf).await;
        eventually(
            &format!("rotation {round}: the old CA leaves the caBundle"),
            30,
            || async {
                let trusted = harness.trusted().await;
                (trusted.contains(&next.fingerprint().to_string())
                    && !trusted.contains(&ca.fingerprint().to_string()))
                .then_some(())
            },
        )
        .await;
        rotations.push(Rotation {
            answered_at_next,
            answered_at_end: load.answered(),
            took: began.elapsed(),
        });
        ca = next;
    }
    let counted = load.stop().await;
    for (round, rotation) in rotations.iter().enumerate() {
        println!(
            "rotation {}: {:.1?} from the next CA to the old CA's leaving the caBundle, {} calls \
             answered meanwhile",
            round + 1,
            rotation.took,
            rotation.answered_at_end - rotation.answered_at_next
        );
    }

    assert_eq!(
        counted.failed, 0,
        "admission calls failed during the operator's rotations; the first: {:#?}",
        counted.first_failures
    );
    for (round, rotation) in rotations.iter().enumerate() {
        assert!(
            rotation.answered_at_end > rotation.answered_at_next,
            "no call was answered during rotation {}: {rotation:?}",
            round + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_before_trusting_fails_admission_calls() {
    let harness = harness().await;
    let mut ca = CertificateAuthority::create(&CaSpec::new("rot-ca")).unwrap();
    let secret = tls_secret(&ca, NAMESPACE, SECRET);
    harness
        .secrets()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let first = harness.certificate_in(SECRET, "tls.crt").await.unwrap();
    harness.wait_served(&first).await;
    harness
        .create_configuration(&ca.certificate_pem(), None)
        .await;

    let load = harness.load();
    load.wait_answered(100).await;
    assert_eq!(load.failed(), 0, "calls failed before any rotation");
    let mut failed_per_rotation = Vec::new();
    for _ in 1..=3 {
        let next = CertificateAuthority::create(&CaSpec::new("rot-ca")).unwrap();
        let failed_before = load.failed();
        // Sign first: the new CA's leaf is served while the caBundle trusts the old CA alone.
        let rotated = tls_secret(&next, NAMESPACE, SECRET);
        harness
            .secrets()
            .patch(
                SECRET,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": rotated.data})),
            )
            .await
            .unwrap();
        let leaf = harness.certificate_in(SECRET, "tls.crt").await.unwrap();
        harness.wait_served(&leaf).await;
        // ... and trust after the time the operator would have waited before signing.
        tokio::time::sleep(TRUST_PROPAGATION).await;
        let both = format!("{}{}", ca.certificate_pem(), next.certificate_pem());
        set_ca_bundle(&harness, &both).await;
        load.wait_answered(100).await;
        failed_per_rotation.push(load.failed() - failed_before);
        set_ca_bundle(&harness, &next.certificate_pem()).await;
        ca = next;
    }
    let counted = load.stop().await;
    println!("failed calls per rotation: {failed_per_rotation:?}");

    assert!(
        failed_per_rotation.iter().all(|&failed| failed > 0),
        "a rotation that signs before it trusts broke no call: {failed_per_rotation:?}"
    );
    assert_eq!(
        counted.failed,
        failed_per_rotation.iter().sum::<u64>(),
        "calls failed outside the rotations' windows: {:#?}",
        counted.first_failures
    );
    for failure in &counted.first_failures {
        assert!(
            failure.contains("failed calling webhook")
                && failure.contains("invalid peer certificate"),
            "not a handshake refused for the webhook's certificate: {failure}"
        );
    }
}

/// Makes every webhook of [`CONFIGURATION`] trust `pem` (an injector's work, by hand).
async fn set_ca_bundle(harness: &Harness, pem: &str) {
    let configurations = harness.configurations();
    let mut configuration = configurations.get(CONFIGURATION).await.unwrap();
    for hook in configuration.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(k8s_openapi::ByteString(pem.as_bytes().to_vec()));
    }
    configurations
        .replace(CONFIGURATION, &PostParams::default(), &configuration)
        .await
        .unwrap();
}
