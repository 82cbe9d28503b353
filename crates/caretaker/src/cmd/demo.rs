//! `caretaker demo`: the embedded API server, the real Cluster API CRDs, a Cluster with its CA
//! Secrets, a CK8sControlPlane, a MachineDeployment with its MachineSet, one real agent
//! process per Machine with a kubeadm-layout node on disk, and the operator as its own
//! process; then a certificate refresh of every Machine, shown before and after. With
//! `--etcd`, also a real etcd cluster whose certificates the operator rotates ([`etcd`]).

mod etcd;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use caretaker_agent::NodeLayout;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_apiserver::ApiServer;
use caretaker_operator::machine::refresh::format_time;
use caretaker_pki::files;
use caretaker_testkit::capi_objects::{self, ClusterObjects, MachineObject, MachineRole};
use caretaker_testkit::provision::{ClusterCas, NodeSpec, agent_serving_leaf, provision_node};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

use super::Failure;

const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const ENDPOINT_HOST: &str = "demo.caretaker.local";

/// Run API server, operator and one agent per Machine on this machine, and refresh every
/// Machine's certificates.
///
/// Everything lives under --state-dir: the API server's data and DIR/kubeconfig, one directory
/// per Machine under DIR/nodes/MACHINE (pki/, kubeconfigs/ with certificates that expire in 30
/// days, the agent's state, agent.pid, and the demo hooks upgrade.sh and restart.sh, which
/// fail when a file named fail-upgrade or fail-restart exists beside them), and the operator's
/// log and pid. Without --no-trigger the certificates of every Machine are refreshed through one
/// cluster-wide request on the Cluster (control plane first, then workers), with its progress
/// and a before/after expiry table; with --upgrade-to the Machines are upgraded in place
/// instead.
///
/// With --etcd (and an etcd binary on PATH; without one the demo says so and skips this
/// part): a real three-member etcd cluster on loopback with peer and client certificate
/// authentication, under DIR/etcd/m0..m2 (files, logs, restart hooks), each member with its
/// own agent, and an EtcdCertificates the operator keeps. The operator bootstraps the members'
/// certificates; then, while a client writes without pause (every endpoint, transient errors
/// retried, each write read back), the signer is rotated (three revisions, each installed by
/// the agents and restarting the members one at a time under the quorum gate), the members'
/// revisions are printed as they move, and at the end the number of writes and how many
/// failed. The demo exits non-zero if a write failed or a member ended unhealthy.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to keep everything (default: a new directory under the system temp dir).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Control-plane Machines.
    #[arg(long, value_name = "N", default_value_t = 3)]
    control_planes: u32,
    /// Worker Machines (one MachineDeployment).
    #[arg(long, value_name = "N", default_value_t = 3)]
    workers: u32,
    /// TTL of the refreshed certificates.
    #[arg(
        long,
        value_name = "TTL",
        default_value = "1y",
        allow_hyphen_values = true
    )]
    refresh: String,
    /// Run a cluster-wide in-place upgrade to this release option (channel=…, revision=…,
    /// localPath=…) instead of the certificate refresh.
    #[arg(long, value_name = "OPTION")]
    upgrade_to: Option<String>,
    /// Stay up until Ctrl-C (or SIGTERM or SIGHUP), and print how to use kubectl against the
    /// demo.
    #[arg(long)]
    keep_running: bool,
    /// Set everything up but refresh nothing.
    #[arg(long)]
    no_trigger: bool,
    /// Start everything but the operator (run `caretaker operator --kubeconfig DIR/kubeconfig`
    /// yourself).
    #[arg(long)]
    no_operator: bool,
    /// Also run a real three-member etcd cluster, each member with an agent, and rotate its
    /// signer while a client writes (needs `etcd` on PATH; Debian: etcd-server).
    #[arg(long)]
    etcd: bool,
}

pub fn run(args: DemoArgs) -> ExitCode {
    super::run_async("demo", async {
        // Handled before anything starts: the default action of these signals ends the demo
        // at once and leaves its agents and operator running.
        let mut stop = StopSignals::install().map_err(|e| format!("cannot handle signals: {e}"))?;
        let keep_running = args.keep_running;
        let running = tokio::select! {
            running = demo(args) => running?,
            // A signal dropped the demo half-way, and with it the processes it had started.
            (name, number) = stop.recv() => return Err(stopped_by(name, number)),
        };
        if keep_running {
            stop.recv().await;
        }
        Ok(running.stop().await)
    })
}

fn stopped_by(signal: &str, number: i32) -> Failure {
    Failure::from(format!(
        "stopped by {signal}; stopped the agents and the operator it had started"
    ))
    .with_code(128u8.saturating_add(u8::try_from(number).unwrap_or(0)))
}

/// SIGINT (Ctrl-C), SIGTERM (`timeout`, systemd, CI runners) and SIGHUP (a closed terminal):
/// each stops the demo and everything it started.
struct StopSignals(Vec<(tokio::signal::unix::Signal, &'static str, i32)>);

impl StopSignals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        [
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::hangup(), "SIGHUP"),
        ]
        .into_iter()
        .map(|(kind, name)| Ok((signal(kind)?, name, kind.as_raw_value())))
        .collect::<std::io::Result<_>>()
        .map(Self)
    }

    /// The next of them to arrive: its name and number.
    async fn recv(&mut self) -> (&'static str, i32) {
        let waits = self.0.iter_mut().map(|(signal, name, number)| {
            Box::pin(async move {
                signal.recv().await;
                (*name, *number)
            })
        });
        futures::future::select_all(waits).await.0
    }
}

/// Child processes, stopped when the demo ends, fails half-way or is stopped by a signal.
/// Every child goes in here as soon as it is spawned, so no way out of the demo skips it.
#[derive(Default)]
struct Processes(Vec<(String, Child)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A demo that has done its work and still runs, until [`Self::stop`].
struct Running {
    processes: Processes,
    server: ApiServer,
    /// The etcd members and their agents, with `--etcd`.
    etcd: Option<etcd::EtcdDemo>,
    failed: bool,
}

impl Running {
    async fn stop(self) -> ExitCode {
        drop(self.etcd);
        drop(self.processes);
        self.server.shutdown().await;
        if self.failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

struct DemoMachine {
    name: String,
    role: NodeRole,
    layout: NodeLayout,
}

async fn demo(args: DemoArgs) -> Result<Running, String> {
    caretaker_agent_api::tls::install_crypto_provider();
    let ttl = super::ttl("--refresh", &args.refresh)?;
    if let Some(option) = &args.upgrade_to {
        caretaker_agent_api::upgrade::ReleaseOption::parse(option)
            .map_err(|e| format!("invalid --upgrade-to: {e}"))?;
    }
    if args.control_planes == 0 {
        return Err("--control-planes must be at least 1".into());
    }
    let dir = empty_state_dir(args.state_dir.as_deref())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let started = Instant::now();
    step(&format!("state in {}", dir.display()));

    let server = ApiServer::builder()
        .data_dir(dir.join("apiserver"))
        .start()
        .await
        .map_err(|e| format!("cannot start the API server: {e}"))?;
    server
        .write_kubeconfig(dir.join("kubeconfig"))
        .map_err(|e| e.to_string())?;
    let client = server.client();
    step(&format!(
        "embedded API server at {} (kubeconfig: {})",
        server.url(),
        dir.join("kubeconfig").display()
    ));

    capi_objects::install_upstream_crds(&client)
        .await
        .map_err(|e| format!("installing the Cluster API CRDs: {e}"))?;
    step("installed the Cluster API and CK8sControlPlane CRDs");

    let cas = ClusterCas::create().map_err(|e| e.to_string())?;
    let cluster = ClusterObjects::new(&client, NAMESPACE, CLUSTER, ENDPOINT_HOST);
    create_cluster(&cluster, &cas).await?;
    step(&format!(
        "Cluster {CLUSTER} with CA Secrets {CLUSTER}-ca, {CLUSTER}-etcd, {CLUSTER}-proxy; CK8sControlPlane, MachineDeployment and MachineSet"
    ));

    let mut processes = Processes::default();
    let mut machines = Vec::new();
    let names = (0..args.control_planes)
        .map(|i| (format!("{CLUSTER}-cp-{i}"), NodeRole::ControlPlane))
        .chain((0..args.workers).map(|i| (format!("{DEPLOYMENT}-{i}"), NodeRole::Worker)));
    for (name, role) in names {
        let machine =
            start_machine(&cluster, &cas, &dir, &exe, &name, role, &mut processes).await?;
        machines.push(machine);
    }
    step(&format!(
        "{} Machines, each with a node on disk and an agent process",
        machines.len()
    ));

    if !args.no_operator {
        start_operator(&exe, &dir, &mut processes)?;
    }

    let mut failed = false;
    if !args.no_trigger && !args.no_operator {
        let request = match &args.upgrade_to {
            Some(option) => ClusterRequest::Upgrade(option.clone()),
            None => ClusterRequest::Refresh(ttl.to_string()),
        };
        failed = !request.run(&client, &machines).await?;
        println!();
        step(&format!(
            "{} in {:.1}s",
            if failed { "FAILED" } else { "done" },
            started.elapsed().as_secs_f64()
        ));
    }

    let etcd = if !args.etcd {
        None
    } else if args.no_operator {
        step("--etcd: skipped: its certificates come from the operator, and --no-operator is set");
        None
    } else if !caretaker_testkit::etcd::etcd_installed() {
        step("--etcd: skipped: no etcd binary on PATH (Debian: apt-get install etcd-server)");
        None
    } else {
        let demo = etcd::run(&client, &dir, !args.no_trigger).await?;
        failed |= demo.failed;
        Some(demo)
    };

    if args.keep_running {
        print_how_to_explore(&dir, etcd.is_some());
    }
    Ok(Running {
        processes,
        server,
        etcd,
        failed,
    })
}

/// The given --state-dir, or a new one under the system temp dir; refused unless empty, so
/// that the demo never mixes its files with someone else's.
fn empty_state_dir(given: Option<&Path>) -> Result<PathBuf, String> {
    let dir = match given {
        Some(dir) => dir.to_path_buf(),
        None => std::env::temp_dir().join(format!("caretaker-demo-{}", std::process::id())),
    };
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        return Err(format!(
            "--state-dir {} is not empty; choose a new directory",
            dir.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// The operator as its own process, logging to DIR/operator.log, its pid in DIR/operator.pid.
fn start_operator(exe: &Path, dir: &Path, processes: &mut Processes) -> Result<(), String> {
    let log = std::fs::File::create(dir.join("operator.log")).map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .args(["operator", "--kubeconfig"])
        .arg(dir.join("kubeconfig"))
        .args(["--retry-base", "2s"])
        // Loopback, on ports of its own: the log says which.
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .args(["--health-probe-bind-address", "127.0.0.1:0"])
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start the operator: {e}"))?;
    let pid = child.id();
    processes.0.push(("operator".into(), child));
    std::fs::write(dir.join("operator.pid"), pid.to_string()).map_err(|e| e.to_string())?;
    step(&format!(
        "operator running (log: {})",
        dir.join("operator.log").display()
    ));
    Ok(())
}

/// The demo's one cluster-wide request, made on the Cluster.
enum ClusterRequest {
    /// A certificate refresh to this TTL.
    Refresh(String),
    /// An in-place upgrade to this release option.
    Upgrade(String),
}

impl ClusterRequest {
    /// Make the request, follow it to its end, print where it ended (and, for a refresh, each
    /// Machine's earliest expiry before and after); true when it ended `done`.
    async fn run(&self, client: &kube::Client, machines: &[DemoMachine]) -> Result<bool, String> {
        let before = expiries(machines);
        let (key, value, what) = match self {
            Self::Upgrade(option) => (names::IN_PLACE_UPGRADE_TO, option, "in-place upgrade"),
            Self::Refresh(ttl) => (names::REFRESH_CERTIFICATES, ttl, "certificate refresh"),
        };
        let clusters: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            NAMESPACE,
            &caretaker_api::cluster_api::cluster_api_resource(),
        );
        let body = json!({ "metadata": { "annotations": { key: value } } });
        clusters
            .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(|e| e.to_string())?;
        step(&format!(
            "cluster-wide {what} ({key}={value} on Cluster {CLUSTER}); follow it with `caretaker status cluster {CLUSTER} --watch`"
        ));
        let (view, outcome) = follow(client).await?;
        println!();
        print!("{view}");
        if let Self::Refresh(_) = self {
            let after = expiries(machines);
            println!();
            println!(
                "{:<16} {:<14} {:<22} {:<22}",
                "MACHINE", "ROLE", "EARLIEST EXPIRY BEFORE", "EARLIEST EXPIRY AFTER"
            );
            for m in machines {
                println!(
                    "{:<16} {:<14} {:<22} {:<22}",
                    m.name,
                    role_name(m.role),
                    before[&m.name],
                    after[&m.name]
                );
            }
        }
        Ok(outcome == super::status::Outcome::Done)
    }
}

fn print_how_to_explore(dir: &Path, etcd: bool) {
    println!();
    println!("The demo is running. Try:");
    println!("  export KUBECONFIG={}", dir.join("kubeconfig").display());
    println!("  kubectl get machines");
    println!(
        "  kubectl annotate machine {}-cp-0 {}=90d --overwrite",
        CLUSTER,
        names::REFRESH_CERTIFICATES
    );
    println!("  kubectl describe machine {CLUSTER}-cp-0");
    println!(
        "  caretaker certs check-expiration --pki-dir {0}/nodes/{CLUSTER}-cp-0/pki --kubeconfig-dir {0}/nodes/{CLUSTER}-cp-0/kubeconfigs",
        dir.display()
    );
    if etcd {
        println!("  kubectl get etcdcertificates etcd -o yaml");
        println!("  kubectl annotate secret etcd-signer auth.openshift.io/certificate-not-after-");
        println!("  tail {}/etcd/m0/etcd.log", dir.display());
    }
    println!("Press Ctrl-C to stop (or send SIGTERM or SIGHUP).");
    let _ = std::io::stdout().flush();
}

fn step(message: &str) {
    println!("==> {message}");
    let _ = std::io::stdout().flush();
}

fn role_name(role: NodeRole) -> &'static str {
    match role {
        NodeRole::ControlPlane => "control-plane",
        NodeRole::Worker => "worker",
    }
}

fn expiries(machines: &[DemoMachine]) -> BTreeMap<String, String> {
    machines
        .iter()
        .map(|m| {
            let expiry = caretaker_agent::inventory::discover(&m.layout)
                .earliest_expiry()
                .map(format_time)
                .unwrap_or_else(|| "-".into());
            (m.name.clone(), expiry)
        })
        .collect()
}

/// Prints the rollout's progress as it changes, until it ends; returns the final view.
async fn follow(client: &kube::Client) -> Result<(String, super::status::Outcome), String> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = String::new();
    while Instant::now() < deadline {
        let (view, outcome) = super::status::render(client, NAMESPACE, CLUSTER).await?;
        let progress: String = view
            .lines()
            .filter(|l| l.starts_with("status") || l.starts_with("progress"))
            .collect::<Vec<_>>()
            .join("  ");
        if progress != last && !progress.is_empty() {
            println!("  {progress}");
            last = progress;
        }
        // `None` until the operator has taken the request up.
        if !matches!(
            outcome,
            super::status::Outcome::InProgress | super::status::Outcome::None
        ) {
            return Ok((view, outcome));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err("the rollout did not end within 10 minutes".into())
}

async fn create_cluster(cluster: &ClusterObjects, cas: &ClusterCas) -> Result<(), String> {
    cluster
        .create(cas)
        .await
        .map_err(|e| format!("creating Cluster {CLUSTER}: {e}"))?;
    cluster
        .create_machine_deployment(DEPLOYMENT)
        .await
        .map_err(|e| format!("creating MachineDeployment {DEPLOYMENT}: {e}"))?;
    // The MachineSet Cluster API would make for the MachineDeployment, for `kubectl get`.
    let machine_sets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineSet"),
        "machinesets",
    );
    let machine_set: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
        "metadata": { "name": format!("{DEPLOYMENT}-demo"), "labels": { "cluster.x-k8s.io/deployment-name": DEPLOYMENT } },
        "spec": {
            "clusterName": CLUSTER,
            "selector": { "matchLabels": { "cluster.x-k8s.io/deployment-name": DEPLOYMENT } },
            "template": cluster.machine_template(DEPLOYMENT)
        }
    }))
    .map_err(|e| e.to_string())?;
    cluster
        .api(&machine_sets)
        .create(&PostParams::default(), &machine_set)
        .await
        .map_err(|e| format!("creating MachineSet {DEPLOYMENT}-demo: {e}"))?;
    Ok(())
}

const RESTART_SCRIPT: &str = r#"#!/bin/sh
# caretaker demo restart hook: succeeds after about a second unless fail-restart exists beside it.
here=$(dirname "$0")
if [ -e "$here/fail-restart" ]; then
  echo "restart failed: $here/fail-restart exists" >&2
  exit 1
fi
sleep 1
echo "restarted the control-plane components of $(basename "$here")"
"#;

const UPGRADE_SCRIPT: &str = r#"#!/bin/sh
# caretaker demo upgrade command: records the release after about a second, unless
# fail-upgrade exists beside it.
here=$(dirname "$0")
if [ -e "$here/fail-upgrade" ]; then
  echo "upgrade to $1 failed: $here/fail-upgrade exists" >&2
  exit 1
fi
echo "upgrading $(basename "$here") to $1"
sleep 1
echo "$1" > "$here/release"
echo "now at $1"
"#;

async fn start_machine(
    cluster: &ClusterObjects,
    cas: &ClusterCas,
    dir: &Path,
    exe: &Path,
    name: &str,
    role: NodeRole,
    processes: &mut Processes,
) -> Result<DemoMachine, String> {
    let node_dir = dir.join("nodes").join(name);
    let layout = NodeLayout::new(node_dir.join("pki"), node_dir.join("kubeconfigs"));
    provision_node(
        &layout,
        cas,
        &NodeSpec {
            node_name: name.to_string(),
            addresses: vec!["127.0.0.1".parse().expect("valid")],
            role,
            control_plane_host: ENDPOINT_HOST.into(),
            server_url: format!("https://{ENDPOINT_HOST}:6443"),
            validity: "30d".parse().expect("valid"),
        },
    )
    .map_err(|e| format!("provisioning {name}: {e}"))?;
    for (script, text) in [
        ("restart.sh", RESTART_SCRIPT),
        ("upgrade.sh", UPGRADE_SCRIPT),
    ] {
        let path = node_dir.join(script);
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    // The agent's serving pair and the CA its clients must chain to.
    let agent_dir = node_dir.join("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|e| e.to_string())?;
    let serving = cas
        .cluster
        .issue(&agent_serving_leaf(
            name,
            &["127.0.0.1".parse().expect("valid")],
        ))
        .map_err(|e| e.to_string())?;
    let key = serving
        .key
        .as_ref()
        .expect("issue() returns a key")
        .to_pem();
    files::write_all(
        &agent_dir,
        &[
            files::FileToWrite {
                name: "tls.crt",
                contents: serving.certificate_pem.as_bytes(),
                mode: files::CERTIFICATE_MODE,
            },
            files::FileToWrite {
                name: "tls.key",
                contents: key.as_bytes(),
                mode: files::PRIVATE_KEY_MODE,
            },
            files::FileToWrite {
                name: "client-ca.crt",
                contents: cas.cluster.certificate_pem().as_bytes(),
                mode: files::CERTIFICATE_MODE,
            },
        ],
    )
    .map_err(|e| e.to_string())?;

    let port = caretaker_testkit::ports::reusable_port()?;
    let log = std::fs::File::create(node_dir.join("agent.log")).map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .arg("agent")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--pki-dir")
        .arg(&layout.pki_dir)
        .arg("--kubeconfig-dir")
        .arg(&layout.kubeconfig_dir)
        .arg("--tls-cert")
        .arg(agent_dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(agent_dir.join("tls.key"))
        .arg("--client-ca")
        .arg(agent_dir.join("client-ca.crt"))
        .arg("--state-dir")
        .arg(node_dir.join("state"))
        .arg("--restart-command")
        .arg(node_dir.join("restart.sh"))
        .arg("--upgrade-command")
        .arg(node_dir.join("upgrade.sh"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start the agent of {name}: {e}"))?;
    let pid = child.id();
    processes.0.push((name.to_string(), child));
    std::fs::write(node_dir.join("agent.pid"), pid.to_string()).map_err(|e| e.to_string())?;

    cluster
        .create_machine(&MachineObject {
            name,
            role: MachineRole::of(role, DEPLOYMENT),
            node_name: name,
            address: "127.0.0.1",
            agent_url: &format!("https://127.0.0.1:{port}"),
        })
        .await
        .map_err(|e| format!("creating Machine {name}: {e}"))?;
    Ok(DemoMachine {
        name: name.to_string(),
        role,
        layout,
    })
}
