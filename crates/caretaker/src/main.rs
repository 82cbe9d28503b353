//! The `caretaker` binary: one executable for the operator, the node agent, the embedded API
//! server, the demo and the offline tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// caretaker keeps a Kubernetes fleet's certificates, trust bundles and node releases fresh,
/// and rolls changes out across whole clusters safely.
#[derive(Debug, Parser)]
#[command(name = "caretaker", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process, so the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controllers against a cluster.
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
    ///
    /// Admission webhook: with a serving certificate (--webhook-secret, or --webhook-cert-path),
    /// the operator validates every CREATE and UPDATE of a CertificateAuthority at
    /// /validate-caretaker-dev-v1alpha1-certificateauthority and of an IssuedCertificate at
    /// /validate-caretaker-dev-v1alpha1-issuedcertificate (HTTPS on --webhook-bind-address),
    /// refusing a bad spec with every bad field and value named, and an IssuedCertificate whose
    /// issuerRef names no CertificateAuthority. A ValidatingWebhookConfiguration sends it the
    /// reviews. A new certificate in the Secret is served from the next connection on, without a
    /// restart.
    ///
    /// Metrics and probes, over plain HTTP as controller-runtime serves them: /metrics on
    /// --metrics-bind-address (reconciles, their errors by category and durations, certificate
    /// expiry, rotations; over mutual TLS with --metrics-cert-path and --metrics-client-ca),
    /// /healthz and /readyz on --health-probe-bind-address. Only GET and HEAD on those paths
    /// are answered; nothing secret is in them.
    Operator(cmd::operator::OperatorArgs),
    /// Run the node agent that refreshes a node's certificates and upgrades it.
    Agent(cmd::agent::AgentArgs),
    /// Serve the embedded Kubernetes-compatible API server on loopback.
    #[cfg(feature = "apiserver")]
    Apiserver(cmd::apiserver::ApiserverArgs),
    /// Run API server, operator and agents together on this machine, and refresh every
    /// Machine's certificates.
    #[cfg(feature = "demo")]
    Demo(cmd::demo::DemoArgs),
    /// Show a cluster-wide rollout's progress.
    #[command(subcommand)]
    Status(cmd::status::StatusCommand),
    /// Check and renew a node's certificates offline, like `kubeadm certs`.
    #[command(subcommand)]
    Certs(cmd::certs::CertsCommand),
    /// Create CAs, issue certificates and inspect certificates by hand.
    #[command(subcommand)]
    Pki(cmd::pki::PkiCommand),
    /// Print caretaker's CustomResourceDefinitions, generated from its Rust types.
    ///
    /// Prints the CRDs of CertificateAuthority and IssuedCertificate (caretaker.dev/v1alpha1)
    /// on stdout as one multi-document YAML stream, the same bytes on every run of the same
    /// build. Install or update them with `caretaker crds | kubectl apply -f -`; docs/reference.md
    /// describes every field.
    Crds(cmd::crds::CrdsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(feature = "apiserver")]
        Command::Apiserver(args) => cmd::apiserver::run(args),
        Command::Pki(command) => cmd::pki::run(command),
        Command::Operator(args) => cmd::operator::run(args),
        Command::Agent(args) => cmd::agent::run(args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => cmd::demo::run(args),
        Command::Status(command) => cmd::status::run(command),
        Command::Certs(command) => cmd::certs::run(command),
        Command::Crds(args) => cmd::crds::run(args),
    }
}
