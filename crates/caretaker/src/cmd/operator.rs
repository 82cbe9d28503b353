//! `caretaker operator`: the controllers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use caretaker_operator::controllers;
use caretaker_operator::{Context, Settings};
use caretaker_pki::Ttl;

use super::logging::{self, LogFormat};

/// Run caretaker's controllers against a cluster.
///
/// Per-Machine certificate refresh: set `v1beta2.k8sd.io/refresh-certificates: <ttl>`
/// on a Cluster API Machine; the operator asks the Machine's agent for CSRs, checks each
/// against what the Machine may hold, signs them with the Cluster API CA Secrets
/// (`<cluster>-ca`, `-etcd`, `-proxy`), has the agent install them, and reports through the
/// `v1beta2.k8sd.io/refresh-certificates-status` annotation and Events. Every Machine with a
/// node also gets `machine.cluster.x-k8s.io/certificates-expiry`.
///
/// Per-Machine in-place upgrade: set `v1beta2.k8sd.io/in-place-upgrade-to: <option>`
/// (channel=…, revision=… or localPath=…); the agent runs its upgrade command as an operation
/// whose id lands in `v1beta2.k8sd.io/in-place-upgrade-change-id`; removing the trigger while it
/// runs cancels it.
///
/// Cluster-wide: the same trigger annotations on a Cluster, a CK8sControlPlane or a
/// MachineDeployment roll the operation out over their Machines: control plane first, one at a
/// time and only while all control-plane agents are healthy, then workers
/// (`caretaker.dev/max-parallel` at once); the first failure stops the rollout; removing the
/// trigger cancels it; `caretaker.dev/progress` shows DONE/TOTAL.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    /// Kubeconfig to use; default: in-cluster configuration, then $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Port of the agents, for Machines without a caretaker.dev/agent-endpoint annotation.
    #[arg(long, value_name = "PORT", default_value_t = 9443)]
    agent_port: u16,
    /// Watch only this namespace.
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Attempts per request before it ends `failed`.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// First retry delay; it doubles after each failed attempt (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    retry_base: String,
    /// How long one call to an agent may take.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    agent_timeout: String,
    /// How often a running in-place upgrade is read from its agent.
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    upgrade_poll: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

pub(super) fn duration(flag: &str, value: &str) -> Result<Duration, String> {
    let ttl: Ttl = value
        .parse()
        .map_err(|e: caretaker_pki::TtlError| format!("invalid {flag} {value:?}: {}", e.problem))?;
    Ok(ttl.approximate())
}

pub fn run(args: OperatorArgs) -> ExitCode {
    logging::init(args.log_format);
    let result = (|| -> Result<(), String> {
        let settings = Settings {
            agent_port: args.agent_port,
            max_attempts: args.max_attempts,
            retry_base: duration("--retry-base", &args.retry_base)?,
            agent_timeout: duration("--agent-timeout", &args.agent_timeout)?,
            upgrade_poll: duration("--upgrade-poll", &args.upgrade_poll)?,
        };
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            caretaker_agent::tls::install_crypto_provider();
            let client = client(args.kubeconfig.as_deref()).await?;
            tracing::info!(namespace = ?args.namespace, "operator starting");
            let ctx = Context::new(client, settings);
            tokio::select! {
                _ = controllers::run(ctx, args.namespace.clone()) => Ok(()),
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("stopping");
                    Ok(())
                }
            }
        })
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("caretaker operator: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A client from `--kubeconfig`, or the in-cluster configuration, then $KUBECONFIG.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read --kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| format!("unusable --kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes configuration found: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}
