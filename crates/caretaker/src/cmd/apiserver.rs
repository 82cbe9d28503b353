//! `caretaker apiserver`: the embedded Kubernetes-compatible API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use caretaker_apiserver::{ApiServer, Authorization, Subject};

use super::Failure;

/// Serve the embedded Kubernetes-compatible API server (crates/apiserver).
///
/// State lives in SQLite in DIR/state.sqlite, so stopping and starting again with the same
/// --data-dir keeps every object and continues the same resourceVersion sequence. The server
/// writes DIR/kubeconfig for kubectl and clients (with the CA inline when --tls is given; the
/// CA and serving certificate are kept in DIR/pki and reused on restart).
///
/// By default there is no authentication and no authorization: anyone who can connect has
/// full access. That is why the server listens on loopback only, unless --allow-remote is
/// given. With --tls --authorization rbac, users are identified by client certificates (CN the
/// user, O its groups) and ServiceAccounts by bearer tokens, and RBAC (Roles, ClusterRoles
/// and their bindings, as kube-apiserver evaluates them) decides; DIR/kubeconfig is then the
/// admin's (system:masters), and --kubeconfig-for writes one for anyone else.
///
/// Examples:
///   caretaker apiserver --data-dir /tmp/k --listen 127.0.0.1:6443 --tls &
///   KUBECONFIG=/tmp/k/kubeconfig kubectl get namespaces
///
///   caretaker apiserver --data-dir /tmp/k --tls --authorization rbac &
///   caretaker apiserver --data-dir /tmp/k --kubeconfig-for \
///     system:serviceaccount:caretaker-system:caretaker > operator.kubeconfig
///   kubectl --kubeconfig operator.kubeconfig auth can-i list secrets
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
    ///
    /// Anyone who can reach the address can read and change everything. Clients must address
    /// the server by its IP address and port (https://192.0.2.10:6443, not a DNS name): a Host
    /// header naming anything but a loopback name or that address is refused with 403, against
    /// DNS rebinding. With --tls, the serving certificate names only localhost, 127.0.0.1 and
    /// ::1, so remote clients must set tls-server-name: localhost (kubectl
    /// --tls-server-name=localhost); DIR/kubeconfig carries it.
    #[arg(long)]
    pub allow_remote: bool,

    /// How requests are authorized: always-allow (anyone may do anything), or rbac (needs
    /// --tls: client certificates and ServiceAccount tokens identify users; RBAC decides).
    #[arg(long, value_enum, default_value_t = AuthorizationArg::AlwaysAllow)]
    pub authorization: AuthorizationArg,

    /// Instead of serving: print a kubeconfig for SUBJECT, a user (a client certificate from
    /// DIR/pki/client-ca.crt, with --group for its groups) or
    /// system:serviceaccount:NAMESPACE:NAME (a bearer token the running server issues, valid
    /// for 24 hours and while that ServiceAccount exists: deleting it, or deleting and
    /// creating it again, revokes the token; `kubectl create token` makes tokens of other
    /// lifetimes), for the server of DIR/kubeconfig. The output holds a private key or a
    /// token: keep it as you would a password.
    #[arg(long, value_name = "SUBJECT")]
    pub kubeconfig_for: Option<String>,

    /// With --kubeconfig-for USER: a group of the user (repeatable).
    #[arg(long, value_name = "GROUP", requires = "kubeconfig_for")]
    pub group: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthorizationArg {
    AlwaysAllow,
    Rbac,
}

pub fn run(args: ApiserverArgs) -> ExitCode {
    if let Some(subject) = &args.kubeconfig_for {
        return super::run_async("apiserver", print_kubeconfig(&args, subject));
    }
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return super::run("apiserver", || {
            Err(Failure::from(format!(
                "refusing to listen on {}: it is not a loopback address, and this server has no \
                 authentication or authorization, so anyone who can reach it could read and change everything. \
                 Use a 127.0.0.1 or [::1] address, or pass --allow-remote if you really mean it.",
                args.listen
            ))
            .with_code(2))
        });
    }
    super::run_async("apiserver", serve(args, super::stop_requested()))
}

/// `--kubeconfig-for`: the kubeconfig of `subject` on the server whose data directory and
/// kubeconfig are in `--data-dir`.
async fn print_kubeconfig(args: &ApiserverArgs, subject: &str) -> Result<ExitCode, Failure> {
    let subject = Subject::parse(subject, &args.group)
        .map_err(|e| Failure::from(format!("--kubeconfig-for: {e}")).with_code(2))?;
    let admin = args.data_dir.join("kubeconfig");
    let url = kube::config::Kubeconfig::read_from(&admin)
        .ok()
        .and_then(|k| k.clusters.into_iter().next())
        .and_then(|c| c.cluster?.server)
        .ok_or_else(|| {
            format!(
                "cannot read the server's address from {}: start `caretaker apiserver --data-dir {} --tls --authorization rbac` first",
                admin.display(),
                args.data_dir.display()
            )
        })?;
    if !url.starts_with("https://") {
        return Err(format!(
            "the server at {url} does not serve TLS: users need --tls --authorization rbac"
        )
        .into());
    }
    let kubeconfig = caretaker_apiserver::kubeconfig_for(&args.data_dir, &url, &subject).await?;
    print!("{kubeconfig}");
    Ok(ExitCode::SUCCESS)
}

/// Serves until `stop` completes.
async fn serve(
    args: ApiserverArgs,
    stop: impl std::future::Future<Output = ()>,
) -> Result<ExitCode, Failure> {
    let server = ApiServer::builder()
        .data_dir(&args.data_dir)
        .listen(args.listen)
        .tls(args.tls)
        .authorization(match args.authorization {
            AuthorizationArg::AlwaysAllow => Authorization::AlwaysAllow,
            AuthorizationArg::Rbac => Authorization::Rbac,
        })
        .start()
        .await?;
    let kubeconfig = args.data_dir.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| format!("writing {}: {e}", kubeconfig.display()))?;
    eprintln!(
        "caretaker apiserver: serving {} (data in {}, resourceVersion {}); kubeconfig: {}",
        server.url(),
        args.data_dir.display(),
        server.resource_version(),
        kubeconfig.display()
    );
    stop.await;
    eprintln!("caretaker apiserver: stopping");
    server.shutdown().await;
    Ok(ExitCode::SUCCESS)
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
            authorization: AuthorizationArg::AlwaysAllow,
            kubeconfig_for: None,
            group: vec![],
        }
    }

    #[test]
    fn refuses_non_loopback_without_allow_remote() {
        assert_eq!(run(args("0.0.0.0:6443", false)), ExitCode::from(2));
        assert_eq!(run(args("192.0.2.1:6443", false)), ExitCode::from(2));
        assert!(!args("0.0.0.0:6443", false).data_dir.exists());
    }

    #[test]
    fn kubeconfig_for_refuses_bad_subjects_and_servers_without_tls() {
        let dir = tempfile::tempdir().unwrap();
        let with = |subject: &str, groups: &[&str]| ApiserverArgs {
            data_dir: dir.path().to_path_buf(),
            kubeconfig_for: Some(subject.into()),
            group: groups.iter().map(|g| g.to_string()).collect(),
            ..args("127.0.0.1:0", false)
        };
        // A ServiceAccount takes no groups, and needs both its namespace and name.
        assert_eq!(
            run(with("system:serviceaccount:a:b", &["x"])),
            ExitCode::from(2)
        );
        assert_eq!(run(with("system:serviceaccount:a", &[])), ExitCode::from(2));
        // No server has written its kubeconfig here: nothing to address.
        assert_eq!(run(with("alice", &[])), ExitCode::FAILURE);
        std::fs::write(
            dir.path().join("kubeconfig"),
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n",
        )
        .unwrap();
        assert_eq!(
            run(with("alice", &[])),
            ExitCode::FAILURE,
            "a plain-HTTP server has no users"
        );
        assert!(
            !dir.path().join("pki").exists(),
            "nothing was made for a refused request"
        );
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
            "IP address",
            "tls-server-name",
            "--authorization <AUTHORIZATION>",
            "always-allow",
            "rbac",
            "--kubeconfig-for <SUBJECT>",
            "system:serviceaccount:NAMESPACE:NAME",
            "--group <GROUP>",
        ] {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
    }

    /// One plain HTTP/1.1 request; returns the status code and body.
    async fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        (
            out[9..12].parse().unwrap(),
            out.split_once("\r\n\r\n").unwrap().1.to_string(),
        )
    }

    /// Runs `serve` until the returned sender fires; gives the address from DIR/kubeconfig.
    async fn start(
        dir: &std::path::Path,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<ExitCode, Failure>>,
        String,
    ) {
        let _ = std::fs::remove_file(dir.join("kubeconfig"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let args = ApiserverArgs {
            data_dir: dir.to_path_buf(),
            ..args("127.0.0.1:0", false)
        };
        let task = tokio::spawn(serve(args, async move {
            let _ = rx.await;
        }));
        for _ in 0..200 {
            if let Ok(text) = std::fs::read_to_string(dir.join("kubeconfig"))
                && let Some(line) = text
                    .lines()
                    .find(|l| l.trim_start().starts_with("server: http://"))
            {
                return (
                    tx,
                    task,
                    line.trim()
                        .trim_start_matches("server: http://")
                        .to_string(),
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("DIR/kubeconfig never appeared");
    }

    #[tokio::test]
    async fn serves_writes_a_kubeconfig_and_reopens_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let (stop, task, addr) = start(dir.path()).await;
        let cm =
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept"},"data":{"k":"v"}}"#;
        let (code, body) = http(&addr, "POST", "/api/v1/namespaces/default/configmaps", cm).await;
        assert_eq!(code, 201, "{body}");
        let rv: u64 = serde_json::from_str::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        stop.send(()).unwrap();
        assert_eq!(task.await.unwrap().unwrap(), ExitCode::SUCCESS);

        let (stop, task, addr) = start(dir.path()).await;
        let (code, body) = http(
            &addr,
            "GET",
            "/api/v1/namespaces/default/configmaps/kept",
            "",
        )
        .await;
        assert_eq!(code, 200, "{body}");
        let (code, body) = http(
            &addr,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            &cm.replace("kept", "next"),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        let next: u64 = serde_json::from_str::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            next,
            rv + 1,
            "the resourceVersion sequence continues across restarts"
        );
        stop.send(()).unwrap();
        assert_eq!(task.await.unwrap().unwrap(), ExitCode::SUCCESS);
    }
}
