//! A real three-member etcd cluster whose members are installed and restarted only by
//! caretaker's agents: each member has its own agent (the real `caretaker_agent` server, in
//! this process, over mutual TLS on loopback) with an etcd section, and a restart hook script
//! that stops the member's etcd by its pid file and starts it again on the files in its
//! directory. The test provisions the members once, from the first `etcd-all-certs` (as
//! `kubeadm init` would); every revision after that is the agents' work.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::etcd::{EtcdConfig, EtcdInstaller, EtcdLayout};
use caretaker_agent::refresh::Refresher;
use caretaker_agent::server::{AgentService, serve};
use caretaker_agent::upgrade::Upgrader;
use caretaker_agent::{NodeLayout, tls};
use caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT;
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::etcd::EtcdClient;

/// The Secret holding the agents' CA.
pub const AGENTS_CA_SECRET: &str = "etcd-agents-ca";

pub struct AgentMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub dir: PathBuf,
    pub agent_url: String,
    agent: tokio::task::JoinHandle<()>,
}

impl AgentMember {
    pub fn client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("etcd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The member's etcd log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }
}

pub struct AgentCluster {
    pub members: Vec<AgentMember>,
    /// Where the members' directories are.
    pub dir: PathBuf,
    /// The temporary directory `dir` is, removed on drop ([`Self::new`]).
    _temp: Option<tempfile::TempDir>,
    pub agents_ca: CertificateAuthority,
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The hook: stops the member (TERM, then KILL after 10 s; a zombie counts as stopped) and
/// starts it again.
const RESTART: &str = r#"#!/bin/sh
cd "$(dirname "$0")"
if [ -f etcd.pid ]; then
  pid=$(cat etcd.pid)
  kill -TERM "$pid" 2>/dev/null
  i=0
  while :; do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
    [ -z "$state" ] || [ "$state" = Z ] && break
    i=$((i+1))
    [ "$i" -eq 100 ] && kill -KILL "$pid" 2>/dev/null
    sleep 0.1
  done
fi
exec ./start.sh
"#;

/// A hook that restarts the member (`restart-now.sh`, [`RESTART`]), then says so
/// (`hook-restarted`) and finishes only once `hook-release` exists: a test acts between a
/// member's restart and the moment its agent reports it.
const HELD: &str = r#"#!/bin/sh
cd "$(dirname "$0")"
./restart-now.sh || exit 1
touch hook-restarted
while [ ! -e hook-release ]; do sleep 0.1; done
"#;

/// A hook that refuses to restart anything.
const BROKEN: &str = "#!/bin/sh\necho 'restart refused: etcd.service is masked' >&2\nexit 1\n";

impl AgentCluster {
    /// Three members, m0 to m2, not started; each with its agent serving (certificate naming
    /// only the member's name, so that on loopback one agent cannot pass for another).
    pub async fn new(client: &kube::Client, namespace: &str) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let mut cluster = Self::new_in(client, namespace, temp.path()).await;
        cluster._temp = Some(temp);
        cluster
    }

    /// [`Self::new`], the members' directories under `dir` (kept when dropped).
    pub async fn new_in(client: &kube::Client, namespace: &str, dir: &Path) -> Self {
        let agents_ca = CertificateAuthority::create(&CaSpec::new("etcd-agents")).unwrap();
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|_| {
                (
                    crate::ports::reusable_port().unwrap(),
                    crate::ports::reusable_port().unwrap(),
                )
            })
            .collect();
        let initial = (ports.iter().enumerate())
            .map(|(i, (_, peer))| format!("m{i}=https://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client_port, peer_port)) in ports.into_iter().enumerate() {
            let name = format!("m{i}");
            let member_dir = dir.join(&name);
            std::fs::create_dir_all(member_dir.join("pki")).unwrap();
            let client_url = format!("https://127.0.0.1:{client_port}");
            let peer_url = format!("https://127.0.0.1:{peer_port}");
            let start = format!(
                "#!/bin/sh\ncd \"$(dirname \"$0\")\"\n\
                 setsid etcd --name {name} --data-dir data \
                 --listen-client-urls {client_url} --advertise-client-urls {client_url} \
                 --listen-peer-urls {peer_url} --initial-advertise-peer-urls {peer_url} \
                 --initial-cluster {initial} --initial-cluster-state new \
                 --initial-cluster-token caretaker-agents-test \
                 --cert-file pki/server.crt --key-file pki/server.key \
                 --trusted-ca-file pki/ca.crt --client-cert-auth \
                 --peer-cert-file pki/peer.crt --peer-key-file pki/peer.key \
                 --peer-trusted-ca-file pki/ca.crt --peer-client-cert-auth \
                 --logger zap --log-level warn --log-outputs etcd.log \
                 --heartbeat-interval 50 --election-timeout 500 \
                 </dev/null >>etcd.out 2>&1 &\n\
                 echo $! > etcd.pid\n"
            );
            write_script(&member_dir.join("start.sh"), &start);
            write_script(&member_dir.join("restart.sh"), RESTART);
            let agent_url;
            let agent = {
                let installer = EtcdInstaller::new(
                    EtcdConfig {
                        member: name.clone(),
                        dir: member_dir.join("pki"),
                        names: EtcdLayout::Kubeadm.file_names(),
                        client_url: client_url.clone(),
                        restart: CommandTemplate::parse(
                            &member_dir.join("restart.sh").display().to_string(),
                        )
                        .unwrap(),
                        restart_timeout: Duration::from_secs(30),
                        health_timeout: Duration::from_secs(30),
                    },
                    member_dir.join("state"),
                );
                let (url, task) =
                    start_agent(&agents_ca, (&name, None), &member_dir, installer).await;
                agent_url = url;
                task
            };
            members.push(AgentMember {
                name,
                client_port,
                peer_port,
                dir: member_dir,
                agent_url,
                agent,
            });
        }
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let data = [
            ("tls.crt", agents_ca.certificate_pem()),
            ("tls.key", agents_ca.private_key_pem()),
        ];
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(AGENTS_CA_SECRET.into()),
                // Whoever keeps the agents' CA lets the EtcdCertificates `etcd` use it.
                annotations: Some(
                    [(
                        caretaker_api::names::ETCD_AGENTS_CA_FOR.to_string(),
                        format!("EtcdCertificates/{namespace}/etcd"),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                (data.into_iter())
                    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                    .collect(),
            ),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        Self {
            members,
            dir: dir.to_path_buf(),
            _temp: None,
            agents_ca,
            secrets,
            config_maps: Api::namespaced(client.clone(), namespace),
        }
    }

    /// The EtcdCertificates `etcd` for these members, each with its agent's endpoint, and
    /// both signers' `trustPropagation` 1 s.
    pub fn certificates_object(
        &self,
        namespace: &str,
    ) -> caretaker_api::v1alpha1::EtcdCertificates {
        let members = (self.members.iter())
            .map(|m| {
                let mut member = crate::etcd::member_json(&m.name);
                member["agentEndpoint"] = serde_json::json!(m.agent_url);
                member
            })
            .collect();
        crate::etcd::certificates_object(
            namespace,
            members,
            self.endpoints(),
            Some(AGENTS_CA_SECRET),
        )
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(AgentMember::client_url).collect()
    }

    /// Provisions the members once from the first `etcd-all-certs` and starts them (what
    /// `kubeadm init` does; every later revision is the agents').
    pub async fn bootstrap(&self, seconds: u64) {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let all = loop {
            if let Some(secret) = self.secrets.get_opt("etcd-all-certs").await.unwrap() {
                break secret.data.unwrap_or_default();
            }
            assert!(Instant::now() < deadline, "no etcd-all-certs in {seconds}s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let text = |k: &str| String::from_utf8(all[k].0.clone()).unwrap();
        for m in &self.members {
            for (file, key) in crate::etcd::member_files(&m.name) {
                std::fs::write(m.pki().join(file), text(&key)).unwrap();
            }
            let status = std::process::Command::new(m.dir.join("start.sh"))
                .status()
                .unwrap();
            assert!(status.success());
        }
        for i in 0..self.members.len() {
            self.wait_healthy(i, seconds).await;
        }
    }

    pub async fn client(&self) -> EtcdClient {
        EtcdClient::of(self.endpoints(), &self.secrets, &self.config_maps).await
    }

    pub async fn wait_healthy(&self, index: usize, seconds: u64) {
        let client = self.client().await;
        let member = &self.members[index];
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while !client.healthy(&member.client_url()).await {
            assert!(
                Instant::now() < deadline,
                "member {} not healthy within {seconds}s; log: {}",
                member.name,
                member.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Makes member `index`'s restart hook fail (without touching the member).
    pub fn break_hook(&self, index: usize) {
        write_script(&self.members[index].dir.join("restart.sh"), BROKEN);
    }

    pub fn fix_hook(&self, index: usize) {
        write_script(&self.members[index].dir.join("restart.sh"), RESTART);
    }

    /// Makes member `index`'s hook restart it and then wait for [`Self::release_hook`].
    pub fn hold_hook(&self, index: usize) {
        let dir = &self.members[index].dir;
        write_script(&dir.join("restart-now.sh"), RESTART);
        write_script(&dir.join("restart.sh"), HELD);
    }

    /// Whether member `index`'s held hook has restarted it (and now waits).
    pub fn hook_restarted(&self, index: usize) -> bool {
        self.members[index].dir.join("hook-restarted").exists()
    }

    /// Lets member `index`'s held hook finish.
    pub fn release_hook(&self, index: usize) {
        std::fs::write(self.members[index].dir.join("hook-release"), "").unwrap();
    }

    /// Stops member `index` (SIGTERM, as its hook does), behind its agent's back.
    pub fn stop_member(&self, index: usize) {
        let pid = self.members[index].pid().expect("the member runs");
        // SAFETY: signals the etcd this cluster started, by the pid its script wrote.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        assert!(
            crate::process::exits_soon(pid) || {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                crate::process::exits_soon(pid)
            },
            "member {} did not stop",
            self.members[index].name
        );
    }

    /// Starts member `index` again on the files it has, behind its agent's back.
    pub fn start_member(&self, index: usize) {
        let status = std::process::Command::new(self.members[index].dir.join("start.sh"))
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Each member's etcd pid now.
    pub fn pids(&self) -> Vec<Option<i32>> {
        self.members.iter().map(AgentMember::pid).collect()
    }

    /// Lines of the members' logs that speak of a TLS or certificate failure, and how many
    /// lines were the operator's trust probe being refused. The probe (a client certificate
    /// from the next signer, offered to learn whether a member trusts it yet) is refused by
    /// design until the trust revision is in place, and etcd logs each refusal as
    /// `failed to verify client certificate: x509: certificate signed by unknown authority`;
    /// those lines are counted apart, every other TLS line is an error.
    pub fn tls_errors_in_logs(&self) -> (Vec<String>, usize) {
        let mut found = Vec::new();
        let mut probes = 0;
        for m in &self.members {
            for line in m.log().lines() {
                let lower = line.to_ascii_lowercase();
                if lower.contains("failed to verify client certificate")
                    && lower.contains("certificate signed by unknown authority")
                {
                    probes += 1;
                } else if lower.contains("bad certificate")
                    || lower.contains("unknown authority")
                    || lower.contains("certificate signed by")
                    || lower.contains("tls: ")
                {
                    found.push(format!("{}: {line}", m.name));
                }
            }
        }
        (found, probes)
    }

    pub fn secrets(&self) -> &Api<Secret> {
        &self.secrets
    }

    pub fn config_maps(&self) -> &Api<ConfigMap> {
        &self.config_maps
    }
}

impl Drop for AgentCluster {
    fn drop(&mut self) {
        for m in &self.members {
            m.agent.abort();
            if let Some(pid) = m.pid() {
                // SAFETY: signals the etcd this test started, by the pid its script wrote.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// A member's agent: the real server with the etcd section, its serving certificate from the
/// agents' CA naming `name` (and `ip`, where it listens; else it listens on 127.0.0.1 and its
/// certificate names no address).
pub async fn start_agent(
    agents_ca: &CertificateAuthority,
    (name, ip): (&str, Option<std::net::IpAddr>),
    dir: &Path,
    installer: EtcdInstaller,
) -> (String, tokio::task::JoinHandle<()>) {
    let mut spec = LeafSpec::new(name, Usage::Server).with_dns_names([name]);
    if let Some(ip) = ip {
        spec = spec.with_ip_addresses([ip]);
    }
    let serving = agents_ca.issue(&spec).unwrap();
    let key = serving.key.as_ref().unwrap().to_pem();
    let config = tls::server_config(
        &serving.certificate_pem,
        &key,
        &agents_ca.certificate_pem(),
        DEFAULT_ALLOWED_CLIENT,
    )
    .unwrap();
    let ip = ip.unwrap_or([127, 0, 0, 1].into());
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let url = format!("https://{ip}:{}", listener.local_addr().unwrap().port());
    let state = dir.join("state");
    let layout = NodeLayout::new(dir.join("node-pki"), dir.join("node-kubeconfigs"));
    let router = AgentService::new(Refresher::new(layout, &state), Upgrader::new(&state, None))
        .with_etcd(Some(installer))
        .router();
    let task = tokio::spawn(async move {
        let _ = serve(listener, config, router).await;
    });
    (url, task)
}
