//! `caretaker agent`: the node agent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::etcd::{EtcdConfig, EtcdInstaller, EtcdLayout};
use caretaker_agent::refresh::Refresher;
use caretaker_agent::server::{AgentService, serve};
use caretaker_agent::upgrade::Upgrader;
use caretaker_agent::{NodeLayout, tls};
use caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT;

use super::Failure;
use super::logging::{self, LogFormat};

/// Run the node agent: serves the node's certificate inventory, two-step certificate refresh
/// and in-place upgrades over HTTPS with mutual TLS only.
///
/// The serving certificate (--tls-cert/--tls-key) and the operator's client certificate must
/// chain to --client-ca (the cluster CA); only a client certificate whose common name is
/// --allowed-client is accepted, anything else fails the TLS handshake. Private keys made
/// for a refresh never leave the node; CA keys are never needed on it.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// kubeadm's PKI directory.
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes/pki")]
    pki_dir: PathBuf,
    /// Directory of the kubeconfigs (admin.conf, kubelet.conf, …).
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes")]
    kubeconfig_dir: PathBuf,
    /// Address and port to serve on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9443")]
    listen: SocketAddr,
    /// The agent's serving certificate (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert: PathBuf,
    /// The agent's serving key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: PathBuf,
    /// CA bundle that client certificates must chain to.
    #[arg(long, value_name = "FILE")]
    client_ca: PathBuf,
    /// The client certificate common name accepted.
    #[arg(long, value_name = "CN", default_value = DEFAULT_ALLOWED_CLIENT)]
    allowed_client: String,
    /// Command run after new certificates are written (split on spaces, no shell).
    #[arg(long, value_name = "COMMAND")]
    restart_command: Option<String>,
    /// How long the restart command may run; then it and every process it started are killed
    /// and the restart is reported failed (the new certificates stay). E.g. 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = super::duration)]
    restart_timeout: Duration,
    /// In-place upgrade command (split on spaces, no shell). The release option
    /// (channel=…, revision=… or localPath=…) replaces `{release}` in an argument, or is
    /// appended as the last argument.
    #[arg(long, value_name = "COMMAND")]
    upgrade_command: Option<String>,
    /// How long an upgrade may run; then it and every process it started are killed and the
    /// upgrade fails. E.g. 30m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::duration)]
    upgrade_timeout: Duration,
    /// Where staged keys, backups and upgrade operations are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/caretaker-agent")]
    state_dir: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    etcd: EtcdArgs,
}

/// The etcd section: set --etcd-member on an etcd member's node to let the operator install
/// each revision of that member's certificates and restart it (only that member's files are
/// ever taken).
#[derive(Debug, clap::Args)]
pub struct EtcdArgs {
    /// The etcd member this node runs (its name in EtcdCertificates); turns the etcd
    /// installer on. Files for any other member are refused.
    #[arg(long, value_name = "NAME", requires = "etcd_restart_command")]
    etcd_member: Option<String>,
    /// The file names etcd reads: `kubeadm` (ca.crt, peer.crt, peer.key, server.crt,
    /// server.key) or `plain` (ca.pem, cert.pem, key.pem, peer-cert.pem, peer-key.pem).
    #[arg(long, value_name = "LAYOUT", default_value = "kubeadm")]
    etcd_layout: EtcdLayout,
    /// The directory of those files; default /etc/kubernetes/pki/etcd (kubeadm) or
    /// /etc/etcd/pki (plain).
    #[arg(long, value_name = "DIR")]
    etcd_dir: Option<PathBuf>,
    /// The member's client URL, asked for /health after each restart.
    #[arg(long, value_name = "URL", default_value = "https://127.0.0.1:2379")]
    etcd_client_url: String,
    /// Command that restarts the member (split on spaces, no shell), for example
    /// `systemctl restart etcd`.
    #[arg(long, value_name = "COMMAND")]
    etcd_restart_command: Option<String>,
    /// How long the etcd restart command may run; then it is killed, the previous files are
    /// put back and the install fails.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = super::duration)]
    etcd_restart_timeout: Duration,
    /// How long the member may take after the restart to answer /health with its new
    /// certificate.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = super::duration)]
    etcd_health_timeout: Duration,
}

impl EtcdArgs {
    fn installer(&self, state_dir: &Path) -> Result<Option<EtcdInstaller>, String> {
        let Some(member) = &self.etcd_member else {
            return Ok(None);
        };
        let restart = command(
            "--etcd-restart-command",
            self.etcd_restart_command.as_deref(),
        )?
        .ok_or("--etcd-member needs --etcd-restart-command")?;
        let dir = (self.etcd_dir.clone())
            .unwrap_or_else(|| PathBuf::from(self.etcd_layout.default_dir()));
        let config = EtcdConfig {
            member: member.clone(),
            dir,
            names: self.etcd_layout.file_names(),
            client_url: self.etcd_client_url.clone(),
            restart,
            restart_timeout: self.etcd_restart_timeout,
            health_timeout: self.etcd_health_timeout,
        };
        Ok(Some(EtcdInstaller::new(config, state_dir)))
    }
}

pub fn run(args: AgentArgs) -> ExitCode {
    logging::init(args.log_format);
    super::run_async("agent", serve_agent(args))
}

fn read(flag: &str, path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
}

fn command(flag: &str, value: Option<&str>) -> Result<Option<CommandTemplate>, String> {
    value
        .map(|v| CommandTemplate::parse(v).map_err(|e| format!("invalid {flag}: {e}")))
        .transpose()
}

async fn serve_agent(args: AgentArgs) -> Result<ExitCode, Failure> {
    let config = tls::server_config(
        &read("--tls-cert", &args.tls_cert)?,
        &read("--tls-key", &args.tls_key)?,
        &read("--client-ca", &args.client_ca)?,
        &args.allowed_client,
    )?;
    super::create_dir("--state-dir", &args.state_dir)?;
    let layout = NodeLayout::new(&args.pki_dir, &args.kubeconfig_dir);
    let refresher = Refresher::new(layout, &args.state_dir)
        .with_restart_command(command(
            "--restart-command",
            args.restart_command.as_deref(),
        )?)
        .with_restart_timeout(args.restart_timeout);
    let upgrader = Upgrader::new(
        &args.state_dir,
        command("--upgrade-command", args.upgrade_command.as_deref())?,
    )
    .with_timeout(args.upgrade_timeout);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, allowed_client = %args.allowed_client, "agent serving with mutual TLS");
    let etcd = args.etcd.installer(&args.state_dir)?;
    if let Some(etcd) = &etcd {
        // An install the agent was killed in the middle of: one whole revision before serving.
        let recovered = etcd.recover().map_err(|e| {
            format!("cannot recover the etcd files after an interrupted install: {e}")
        })?;
        for did in recovered {
            tracing::warn!(member = %etcd.member(), "{did}");
        }
        tracing::info!(member = %etcd.member(), "installs etcd revisions for this member");
    }
    let router = AgentService::new(refresher, upgrader)
        .with_etcd(etcd)
        .router();
    tokio::select! {
        result = serve(listener, config, router) => {
            result.map_err(|e| format!("serving failed: {e}"))?;
        }
        _ = super::stop_requested() => tracing::info!("stopping"),
    }
    Ok(ExitCode::SUCCESS)
}
