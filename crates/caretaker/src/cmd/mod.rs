//! The subcommands, and what they share: how a command runs and reports failure, how a
//! Kubernetes client is built from `--kubeconfig`, and how flags are parsed.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use caretaker_pki::Ttl;

pub mod agent;
#[cfg(feature = "apiserver")]
pub mod apiserver;
pub mod certs;
pub mod crds;
#[cfg(feature = "demo")]
pub mod demo;
pub mod logging;
pub mod operator;
pub mod pki;
pub mod status;

/// Why a command failed: one line for stderr, and the exit status (1 unless said otherwise).
#[derive(Debug)]
pub struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    /// Ends the command with exit status `code` instead of 1.
    #[cfg(feature = "apiserver")]
    pub fn with_code(mut self, code: u8) -> Self {
        self.code = code;
        self
    }
}

/// Any error, by its message: `?` works on every error a command meets, and on the `String`
/// messages it writes itself.
impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            message: e.to_string(),
            code: 1,
        }
    }
}

/// Runs `caretaker COMMAND`: its exit status, or its failure as one line
/// `caretaker COMMAND: message` on stderr.
pub fn run(command: &str, body: impl FnOnce() -> Result<ExitCode, Failure>) -> ExitCode {
    match body() {
        Ok(code) => code,
        Err(Failure { message, code }) => {
            eprintln!("caretaker {command}: {message}");
            ExitCode::from(code)
        }
    }
}

/// [`run`] for an async command, on a new multi-threaded tokio runtime.
pub fn run_async(command: &str, body: impl Future<Output = Result<ExitCode, Failure>>) -> ExitCode {
    run(command, || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        runtime.block_on(body)
    })
}

/// Creates `dir` given by `flag` and its parents, or says which flag named what could not be.
pub fn create_dir(flag: &str, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {flag} {}: {e}", dir.display()))
}

/// `--kubeconfig`, for the commands that talk to a cluster.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArg {
    /// Kubeconfig to use; default: in-cluster configuration, then $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
}

impl KubeconfigArg {
    /// A client from `--kubeconfig`, else the in-cluster configuration, then $KUBECONFIG or
    /// ~/.kube/config, with the operator's timeouts on every call. Installs the process's TLS
    /// crypto provider first.
    pub async fn client(&self) -> Result<kube::Client, String> {
        caretaker_agent_api::tls::install_crypto_provider();
        let config = match self.kubeconfig.as_deref() {
            Some(path) => from_file(path).await?,
            None => kube::Config::infer()
                .await
                .map_err(|e| format!("no Kubernetes configuration found: {e}"))?,
        };
        // Every call bounded: a connection that stops answering fails calls, never hangs them.
        let config = caretaker_operator::context::with_timeouts(config);
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }
}

async fn from_file(path: &Path) -> Result<kube::Config, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("cannot read --kubeconfig {}: {e}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("unusable --kubeconfig {}: {e}", path.display()))
}

/// Examples of what a TTL or a DURATION flag accepts.
const TTL_EXAMPLES: &str = "e.g. 90d, 1y, 1y6mo, 720h";
const DURATION_EXAMPLES: &str = "e.g. 500ms, 30s, 5m, 1h";

/// The value parser of DURATION flags (timeouts, delays): what a TTL accepts, as the
/// approximate [`Duration`] it stands for. clap names the flag and the value on an error.
pub fn duration(value: &str) -> Result<Duration, String> {
    value
        .parse::<Ttl>()
        .map(|ttl| ttl.approximate())
        .map_err(|e| format!("{} ({DURATION_EXAMPLES})", e.problem))
}

/// A TTL flag's value (a certificate lifetime), or the one line that names the flag and the
/// bad value. TTL flags are parsed in the command rather than by clap, so that a bad one is
/// reported like every other bad input of the offline commands: one line, exit status 1.
pub fn ttl(flag: &str, value: &str) -> Result<Ttl, String> {
    value.parse().map_err(|e: caretaker_pki::TtlError| {
        format!("invalid {flag} {value:?} ({TTL_EXAMPLES}): {}", e.problem)
    })
}

/// Ctrl-C (SIGINT) or SIGTERM, which is how systemd and the kubelet stop a process.
pub async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
