//! `caretaker operator`: the controllers.

use std::process::ExitCode;
use std::time::Duration;

use caretaker_operator::controllers;
use caretaker_operator::{Context, Settings};

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
    #[command(flatten)]
    kubeconfig: super::KubeconfigArg,
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
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration)]
    retry_base: Duration,
    /// How long one call to an agent may take (e.g. 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration)]
    agent_timeout: Duration,
    /// How often a running in-place upgrade is read from its agent (e.g. 2s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = super::duration)]
    upgrade_poll: Duration,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

pub fn run(args: OperatorArgs) -> ExitCode {
    logging::init(args.log_format);
    let settings = Settings {
        agent_port: args.agent_port,
        max_attempts: args.max_attempts,
        retry_base: args.retry_base,
        agent_timeout: args.agent_timeout,
        upgrade_poll: args.upgrade_poll,
    };
    super::run_async("operator", async move {
        let client = args.kubeconfig.client().await?;
        tracing::info!(namespace = ?args.namespace, "operator starting");
        let ctx = Context::new(client, settings);
        tokio::select! {
            _ = controllers::run(ctx, args.namespace.clone()) => {}
            _ = tokio::signal::ctrl_c() => tracing::info!("stopping"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
