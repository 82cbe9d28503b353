//! `caretaker demo --etcd`: a real three-member etcd cluster on loopback (peer and client
//! certificate authentication), each member with its own agent, under an EtcdCertificates
//! the operator keeps; a signer rotation while a client writes, the members' revisions printed
//! as they move, and the client's count of writes at the end.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use caretaker_api::v1alpha1::{EtcdCertificates, EtcdCertificatesStatus};
use caretaker_testkit::etcd::Load;
use caretaker_testkit::etcd_agents::AgentCluster;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use super::{NAMESPACE, step};

/// The EtcdCertificates' name.
const OBJECT: &str = "etcd";
/// Writers the client runs at once (the machine may have 2 cores).
const WRITERS: usize = 2;

/// The etcd part of the demo, still running.
pub struct EtcdDemo {
    /// The members and their agents, running until this is dropped.
    _running: AgentCluster,
    /// Whether a write failed, a certificate error was seen or a member ended unhealthy.
    pub failed: bool,
}

/// Starts the members and their agents under DIR/etcd, waits for the operator to bootstrap
/// them, and (with `rotate`) rotates the signer while a client writes.
pub async fn run(client: &kube::Client, dir: &Path, rotate: bool) -> Result<EtcdDemo, String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in caretaker_api::v1alpha1::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| format!("installing caretaker's CRDs: {e}"))?;
    }
    let cluster = AgentCluster::new_in(client, NAMESPACE, &dir.join("etcd")).await;
    let objects: Api<EtcdCertificates> = Api::namespaced(client.clone(), NAMESPACE);
    objects
        .create(
            &PostParams::default(),
            &cluster.certificates_object(NAMESPACE),
        )
        .await
        .map_err(|e| format!("creating EtcdCertificates {OBJECT}: {e}"))?;
    step(&format!(
        "etcd: members m0, m1, m2 at {}, each with its agent (etcd files and logs under {}); EtcdCertificates {OBJECT}",
        cluster.endpoints().join(", "),
        dir.join("etcd").display()
    ));
    step(
        "etcd: waiting for the operator's first etcd-all-certs, then starting the members on it (as kubeadm init would)",
    );
    cluster.bootstrap(120).await;
    step("etcd: members healthy; each agent installs revision 1 once, one member at a time");
    let mut said = BTreeSet::new();
    follow((&objects, &mut said), 1, Duration::from_secs(300)).await?;
    if !rotate {
        return Ok(EtcdDemo {
            _running: cluster,
            failed: false,
        });
    }

    let etcd_client = cluster.client().await;
    let apis = (cluster.secrets().clone(), cluster.config_maps().clone());
    let load = Load::start_with(apis, &etcd_client, WRITERS);
    step(&format!(
        "etcd: a client writes without pause ({WRITERS} writers, every endpoint, transient errors retried, each write read back)"
    ));
    let patch = serde_json::json!({"metadata": {"annotations": {"auth.openshift.io/certificate-not-after": null}}});
    cluster
        .secrets()
        .patch(
            "etcd-signer",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| format!("rotating etcd-signer: {e}"))?;
    step(
        "etcd: rotating etcd-signer (its auth.openshift.io/certificate-not-after removed): three revisions, trust, certificates, untrust; each restarts the members one at a time",
    );
    let started = Instant::now();
    let followed = follow((&objects, &mut said), 4, Duration::from_secs(600)).await;
    let load = load.stop().await;
    followed?;
    step(&format!(
        "etcd: rotation done in {:.1}s",
        started.elapsed().as_secs_f64()
    ));

    let mut unhealthy = Vec::new();
    let checker = cluster.client().await;
    for member in &cluster.members {
        if let Err(why) = checker.health(&member.client_url()).await {
            unhealthy.push(format!("{}: {why}", member.name));
        }
    }
    let failures = load.failed();
    let certificate_errors = etcd_client.certificate_errors.lock().unwrap().clone();
    let summary = Summary {
        writes: load.done() / 2,
        failed: failures.len(),
        retries: etcd_client.retries.load(Ordering::Relaxed),
        certificate_errors: certificate_errors.len(),
        unhealthy: unhealthy.len(),
    };
    step(&format!("etcd: {}", summary.line()));
    for why in failures.iter().chain(&certificate_errors).chain(&unhealthy) {
        println!("  {why}");
    }
    Ok(EtcdDemo {
        _running: cluster,
        failed: summary.failed(),
    })
}

/// What the client and the members' health say at the end.
struct Summary {
    writes: usize,
    failed: usize,
    retries: u64,
    certificate_errors: usize,
    unhealthy: usize,
}

impl Summary {
    fn failed(&self) -> bool {
        self.failed > 0 || self.certificate_errors > 0 || self.unhealthy > 0
    }

    fn line(&self) -> String {
        format!(
            "{} writes, each read back: {} failed, {} certificate errors, {} transient retries; {}",
            self.writes,
            self.failed,
            self.certificate_errors,
            self.retries,
            if self.unhealthy == 0 {
                "every member healthy".to_string()
            } else {
                format!("{} members unhealthy", self.unhealthy)
            }
        )
    }
}

/// The reason of the event said as each member comes up on a new revision; the status is
/// written once a pass is over, the event as each member is done.
const MEMBER_UPDATED: &str = "NodeCurrentRevisionChanged";

/// Prints the members' revisions each time they change (and each member's
/// `NodeCurrentRevisionChanged` as it comes), until every member is at the newest revision,
/// at least `at_least`, and nothing is rotating.
/// `said_events` holds the events already printed.
async fn follow(
    (objects, said_events): (&Api<EtcdCertificates>, &mut BTreeSet<String>),
    at_least: i64,
    timeout: Duration,
) -> Result<(), String> {
    let events: Api<Event> = Api::namespaced(objects.clone().into_client(), NAMESPACE);
    let started = Instant::now();
    let mut last = String::new();
    let mut last_said = Instant::now();
    while started.elapsed() < timeout {
        // Best effort: a failed list is only a line less.
        let listed = events.list(&ListParams::default()).await.map(|l| l.items);
        for event in listed.unwrap_or_default() {
            if event.reason.as_deref() == Some(MEMBER_UPDATED)
                && let Some(message) = event.message
                && said_events.insert(message.clone())
            {
                println!("  {MEMBER_UPDATED}: {message}");
                last_said = Instant::now();
            }
        }
        let status = objects
            .get_opt(OBJECT)
            .await
            .map_err(|e| format!("reading EtcdCertificates {OBJECT}: {e}"))?
            .and_then(|o| o.status)
            .unwrap_or_default();
        let line = members_line(&status);
        if line != last && !status.members.is_empty() {
            println!("  {line}");
            last = line;
            last_said = Instant::now();
        } else if last_said.elapsed() > Duration::from_secs(15) {
            println!(
                "  … still waiting ({:.0}s): {}",
                started.elapsed().as_secs_f64(),
                waiting_for(&status)
            );
            last_said = Instant::now();
        }
        let _ = std::io::stdout().flush();
        if settled(&status, at_least) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "the etcd members did not reach revision {at_least} within {}s",
        timeout.as_secs()
    ))
}

/// `latest revision 2: m0 at 2, m1 at 1 (installing 2), m2 at 1`, from `status.members[]`.
fn members_line(status: &EtcdCertificatesStatus) -> String {
    let members: Vec<String> = (status.members.iter())
        .map(|m| {
            let mut said = format!("{} at {}", m.name, m.current_revision);
            if m.target_revision > m.current_revision {
                said.push_str(&format!(" (installing {})", m.target_revision));
            }
            if m.last_failed_revision > m.current_revision {
                said.push_str(&format!(" (failed {})", m.last_failed_revision));
            }
            said
        })
        .collect();
    format!(
        "latest revision {}: {}",
        status
            .latest_revision
            .map_or("-".to_string(), |r| r.to_string()),
        members.join(", ")
    )
}

/// The Ready or Degraded condition's message, whichever says why it is not done.
fn waiting_for(status: &EtcdCertificatesStatus) -> String {
    let find = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    match (find("EtcdCertSignerControllerDegraded"), find("Ready")) {
        (Some(d), _) if d.status == "True" => d.message.clone(),
        (_, Some(r)) => r.message.clone(),
        _ => "no status yet".to_string(),
    }
}

/// Ready, no signer rotating, and every member at the newest revision, at least `at_least`.
fn settled(status: &EtcdCertificatesStatus, at_least: i64) -> bool {
    let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
    let rotating = (status.signer.iter().chain(&status.metrics_signer))
        .any(|s| s.next_serial_number.is_some() || !s.previous_serial_numbers.is_empty());
    let latest = status.latest_revision.unwrap_or(-1);
    ready
        && !rotating
        && latest >= at_least
        && !status.members.is_empty()
        && status.members.iter().all(|m| m.current_revision == latest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(value: serde_json::Value) -> EtcdCertificatesStatus {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_line_says_each_members_revision_and_what_it_installs() {
        let status = status(serde_json::json!({
            "latestRevision": 2,
            "members": [
                {"name": "m0", "currentRevision": 2, "targetRevision": 0, "lastFailedRevision": 0},
                {"name": "m1", "currentRevision": 1, "targetRevision": 2, "lastFailedRevision": 0},
                {"name": "m2", "currentRevision": 1, "targetRevision": 2, "lastFailedRevision": 2},
            ],
        }));
        assert_eq!(
            members_line(&status),
            "latest revision 2: m0 at 2, m1 at 1 (installing 2), m2 at 1 (installing 2) (failed 2)"
        );
        assert!(!settled(&status, 2));
    }
}
