//! `caretaker apiserver`: the embedded Kubernetes-compatible API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use caretaker_apiserver::ApiServer;

/// Serve the embedded Kubernetes-compatible API server (crates/apiserver).
///
/// State lives in SQLite in DIR/state.sqlite, so stopping and starting again with the same
/// --data-dir keeps every object and continues the same resourceVersion sequence. The server
/// writes DIR/kubeconfig for kubectl and clients (with the CA inline when --tls is given; the
/// CA and serving certificate are kept in DIR/pki and reused on restart).
///
/// There is no authentication and no authorization: anyone who can connect has full access.
/// That is why the server listens on loopback only, unless --allow-remote is given.
///
/// Example:
///   caretaker apiserver --data-dir /tmp/k --listen 127.0.0.1:6443 --tls &
///   KUBECONFIG=/tmp/k/kubeconfig kubectl get namespaces
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ApiserverArgs {
    /// Directory for the database, the kubeconfig and (with --tls) the certificates.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// Address to listen on. Port 0 picks a free port (see DIR/kubeconfig for the one chosen).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,

    /// Serve HTTPS with a self-signed CA instead of plain HTTP.
    #[arg(long)]
    pub tls: bool,

    /// Allow listening on a non-loopback address. The server has no authentication.
    #[arg(long)]
    pub allow_remote: bool,
}

pub fn run(args: ApiserverArgs) -> ExitCode {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        eprintln!(
            "caretaker apiserver: refusing to listen on {}: it is not a loopback address, and this server has no \
             authentication or authorization, so anyone who can reach it could read and change everything. \
             Use a 127.0.0.1 or [::1] address, or pass --allow-remote if you really mean it.",
            args.listen
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("caretaker apiserver: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(args))
}

async fn serve(args: ApiserverArgs) -> ExitCode {
    let server = match ApiServer::builder()
        .data_dir(&args.data_dir)
        .listen(args.listen)
        .tls(args.tls)
        .start()
        .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("caretaker apiserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kubeconfig = args.data_dir.join("kubeconfig");
    if let Err(e) = server.write_kubeconfig(&kubeconfig) {
        eprintln!("caretaker apiserver: writing {}: {e}", kubeconfig.display());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "caretaker apiserver: serving {} (data in {}, resourceVersion {}); kubeconfig: {}",
        server.url(),
        args.data_dir.display(),
        server.resource_version(),
        kubeconfig.display()
    );
    wait_for_stop().await;
    eprintln!("caretaker apiserver: stopping");
    server.shutdown().await;
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM.
async fn wait_for_stop() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(listen: &str, allow_remote: bool) -> ApiserverArgs {
        ApiserverArgs {
            data_dir: std::env::temp_dir().join("caretaker-apiserver-never-created"),
            listen: listen.parse().unwrap(),
            tls: false,
            allow_remote,
        }
    }

    #[test]
    fn refuses_non_loopback_without_allow_remote() {
        assert_eq!(run(args("0.0.0.0:6443", false)), ExitCode::from(2));
        assert_eq!(run(args("192.0.2.1:6443", false)), ExitCode::from(2));
        assert!(!args("0.0.0.0:6443", false).data_dir.exists());
    }

    #[test]
    fn help_explains_the_flags() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ApiserverArgs,
        }
        let help = Wrapper::command().render_long_help().to_string();
        for flag in [
            "--data-dir",
            "--listen",
            "--tls",
            "--allow-remote",
            "no authentication",
        ] {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
    }
}
