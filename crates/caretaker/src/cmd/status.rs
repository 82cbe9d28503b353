//! `caretaker status cluster NAME`: a Cluster's rollout at a glance; `caretaker status
//! certificates`: every certificate caretaker keeps, the first to expire first.

mod certificates;
pub mod expiry;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use caretaker_api::names::{self, Operation, rollout_state};
use caretaker_operator::machine::MachineView;
use caretaker_operator::rollout::RequestState;
use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};

#[derive(Debug, clap::Subcommand)]
pub enum StatusCommand {
    /// Show a Cluster's rollout: request, status, a progress bar and a table of its Machines
    /// (role, status, certificate expiry, release, last event).
    ///
    /// A trigger the operator has not taken up yet shows as `requested`: --watch waits for it
    /// rather than ending on the previous request's status.
    ///
    /// Exit status: 0 when the rollout is done (or none was asked for), 1 when it failed or
    /// was cancelled, 2 while it is requested or in progress (without --watch).
    Cluster(ClusterArgs),
    /// Show every certificate caretaker keeps or follows, across the cluster, the first to
    /// expire first: CertificateAuthorities, IssuedCertificates, each EtcdCertificates' two
    /// signers and its certificates, each Machine's node certificates (the earliest, as its
    /// machine.cluster.x-k8s.io/certificates-expiry says) and each trust-manager Bundle and
    /// ClusterBundle's earliest-expiring CA, with when caretaker renews it and the state of
    /// its object, as `kubeadm certs check-expiration` and `cmctl status certificate` show
    /// theirs.
    ///
    /// RESIDUAL is the time left; a RENEWAL time marked `(overdue)` has passed without a
    /// renewal. Kinds whose CRDs are not installed are left out. Only certificates are read
    /// from Secrets (an etcd-all-certs' `*.crt` keys); nothing of a key is ever shown.
    ///
    /// Exit status: 0, or 1 when the API server could not be read.
    #[command(visible_alias = "expiry")]
    Certificates(certificates::CertificatesArgs),
}

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// The Cluster's name.
    name: String,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// Follow the rollout until it ends.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    kubeconfig: super::KubeconfigArg,
}

/// How a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    None,
    InProgress,
    Done,
    Failed,
}

impl Outcome {
    pub fn exit_code(self) -> ExitCode {
        match self {
            Outcome::None | Outcome::Done => ExitCode::SUCCESS,
            Outcome::Failed => ExitCode::from(1),
            Outcome::InProgress => ExitCode::from(2),
        }
    }
}

pub fn run(command: StatusCommand) -> ExitCode {
    let args = match command {
        StatusCommand::Cluster(args) => args,
        StatusCommand::Certificates(args) => return certificates::run(args),
    };
    super::run_async("status", async move {
        let client = args.kubeconfig.client().await?;
        loop {
            let (text, outcome) = render(&client, &args.namespace, &args.name).await?;
            if args.watch && outcome == Outcome::InProgress {
                // Clear the screen and redraw, like `watch`.
                print!("\x1b[2J\x1b[H{text}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            print!("{text}");
            return Ok(outcome.exit_code());
        }
    })
}

/// The status view of Cluster `name` and how its rollout stands.
pub async fn render(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(String, Outcome), String> {
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &caretaker_api::cluster_api::cluster_api_resource(),
    );
    let cluster = clusters
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("Cluster {namespace}/{name} not found"))?;
    let annotations = cluster.annotations();
    let get = |key: &str| annotations.get(key).map(String::as_str);
    // The operation in progress, else the one with the newest request.
    let current = Operation::ALL
        .into_iter()
        .filter(|operation| annotations.contains_key(operation.names().status))
        .max_by_key(|operation| {
            let names = operation.names();
            (
                get(names.status) == Some(names::STATUS_IN_PROGRESS),
                get(names.rollout_request),
            )
        });
    let mut out = String::new();
    let outcome = match (requested(annotations), current) {
        // Shown before the last request's status: that status is the previous request's.
        (Some((what, value)), _) => {
            let _ = writeln!(out, "Cluster {namespace}/{name}: {what} {value}");
            let _ = writeln!(out, "status   requested, not started by the operator yet");
            Outcome::InProgress
        }
        (None, None) => {
            let _ = writeln!(out, "Cluster {namespace}/{name}: no rollout requested");
            Outcome::None
        }
        (None, Some(operation)) => {
            let what = describe(operation);
            let operation = operation.names();
            let status = get(operation.status).unwrap_or("-");
            let progress = get(names::PROGRESS).unwrap_or("0/0").to_string();
            // A failed request's trigger is removed; its value stays on record.
            let value = get(operation.trigger)
                .or_else(|| get(operation.rollout_trigger))
                .or_else(|| get(operation.rollout_requested))
                .unwrap_or_default();
            let _ = writeln!(out, "Cluster {namespace}/{name}: {what} {value}");
            let _ = writeln!(
                out,
                "request  {}",
                get(operation.rollout_request).unwrap_or("-")
            );
            let _ = writeln!(out, "status   {status}");
            let _ = writeln!(out, "progress {} {progress}", bar(&progress));
            if let Some(waiting) = annotations.get(rollout_state::WAITING) {
                let _ = writeln!(out, "         {waiting}");
            }
            if let Some(other) = annotations.get(rollout_state::WAITING_FOR) {
                let _ = writeln!(out, "         waiting for the request on {other} to end");
            }
            match status {
                names::STATUS_IN_PROGRESS => Outcome::InProgress,
                names::STATUS_DONE => Outcome::Done,
                _ => Outcome::Failed,
            }
        }
    };

    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &caretaker_api::cluster_api::machine_api_resource(),
    );
    let list = machines
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut views: Vec<MachineView> = list
        .items
        .iter()
        .map(MachineView::from_object)
        .filter(|m| m.cluster_name == name)
        .collect();
    views.sort_by_key(|m| (!m.control_plane, m.name.clone()));
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let events = events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<18} {:<14} {:<12} {:<12} {:<22} {:<22} LAST EVENT",
        "MACHINE", "ROLE", "REFRESH", "UPGRADE", "CERTIFICATES EXPIRY", "RELEASE"
    );
    for m in &views {
        let last = events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(m.name.as_str()))
            .max_by_key(|e| {
                e.event_time
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .or_else(|| e.last_timestamp.as_ref().map(|t| t.0.to_string()))
            })
            .and_then(|e| e.reason.clone())
            .unwrap_or_else(|| "-".into());
        let get = |k: &str| m.annotation(k).unwrap_or("-").to_string();
        let _ = writeln!(
            out,
            "{:<18} {:<14} {:<12} {:<12} {:<22} {:<22} {last}",
            m.name,
            if m.control_plane {
                "control-plane"
            } else {
                "worker"
            },
            get(names::REFRESH_CERTIFICATES_STATUS),
            get(names::IN_PLACE_UPGRADE_STATUS),
            get(names::CERTIFICATES_EXPIRY),
            get(names::IN_PLACE_UPGRADE_RELEASE),
        );
    }
    Ok((out, outcome))
}

/// The operation whose trigger asks for a request the operator has not taken up yet (a new
/// value, or the trigger set again after an end), with that value: `--watch` waits for it
/// instead of ending on the previous request's status.
fn requested(annotations: &BTreeMap<String, String>) -> Option<(&'static str, &str)> {
    Operation::ALL.into_iter().find_map(|operation| {
        let names = operation.names();
        let get = |key: &str| annotations.get(key).map(String::as_str);
        match RequestState::of(
            get(names.trigger),
            get(names.status),
            get(names.rollout_trigger),
        ) {
            RequestState::New { trigger } => Some((describe(operation), trigger)),
            _ => None,
        }
    })
}

fn describe(operation: Operation) -> &'static str {
    match operation {
        Operation::RefreshCertificates => "certificate refresh",
        Operation::InPlaceUpgrade => "in-place upgrade",
    }
}

/// `[########------------]` for `DONE/TOTAL`.
fn bar(progress: &str) -> String {
    const WIDTH: usize = 30;
    let (done, total) = progress
        .split_once('/')
        .and_then(|(d, t)| Some((d.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
        .unwrap_or((0, 0));
    let filled = (done * WIDTH).checked_div(total).unwrap_or(0).min(WIDTH);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(WIDTH - filled))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bar_fills_with_progress() {
        assert_eq!(super::bar("0/4"), format!("[{}]", "-".repeat(30)));
        assert_eq!(
            super::bar("2/4"),
            format!("[{}{}]", "#".repeat(15), "-".repeat(15))
        );
        assert_eq!(super::bar("4/4"), format!("[{}]", "#".repeat(30)));
        assert_eq!(super::bar("bogus"), format!("[{}]", "-".repeat(30)));
    }
}
