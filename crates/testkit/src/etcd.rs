//! A real three-member etcd cluster on loopback, installed the way a static-pod installer
//! installs OpenShift's: each member's certificates and trusted CAs are written from
//! `etcd-all-certs`, and when it changes the members restart one at a time onto it, each
//! waited for until healthy. Also a small etcd client (the v3 JSON gateway over mutual TLS)
//! that keeps its trust and client certificate as the cluster's ConfigMap and Secret say.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use caretaker_agent_api::tls::ClientIdentity;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_rustls::TlsConnector;

/// Whether `etcd` is installed; a test that needs it says why it skips (CI installs it and
/// sets `CARETAKER_REQUIRE_ETCD=1`, so there it fails instead).
pub fn etcd_available(test: &str) -> bool {
    let found = etcd_installed();
    if !found {
        if std::env::var_os("CARETAKER_REQUIRE_ETCD").is_some() {
            panic!("{test}: etcd is not installed and CARETAKER_REQUIRE_ETCD is set");
        }
        eprintln!("{test}: skipped: etcd is not installed (Debian: etcd-server)");
    }
    found
}

/// Whether an `etcd` binary runs here.
pub fn etcd_installed() -> bool {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Member `name`'s files (kubeadm's names) and the `etcd-all-certs` key each is written from.
pub fn member_files(name: &str) -> [(&'static str, String); 5] {
    [
        ("peer.crt", format!("etcd-peer-{name}.crt")),
        ("peer.key", format!("etcd-peer-{name}.key")),
        ("server.crt", format!("etcd-serving-{name}.crt")),
        ("server.key", format!("etcd-serving-{name}.key")),
        ("ca.crt", "ca-bundle.crt".to_string()),
    ]
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    dir: PathBuf,
    process: Option<Child>,
    /// The `etcd-all-certs` revision it last started with.
    pub revision: Option<String>,
}

impl Member {
    pub fn client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.peer_port)
    }

    fn write_files(&self, all: &BTreeMap<String, String>) {
        std::fs::create_dir_all(&self.dir).unwrap();
        for (file, key) in member_files(&self.name) {
            let path = self.dir.join(file);
            std::fs::write(&path, &all[&key]).unwrap();
        }
    }

    /// Starts etcd; `initial_cluster` names every member, and `joins` says that this member
    /// joins a running cluster (added with the member API first).
    fn start_with(&mut self, initial_cluster: &str, joins: bool) {
        let dir = &self.dir;
        let file = |f: &str| dir.join(f).display().to_string();
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .args(["--data-dir", &file("data")])
            .args(["--listen-client-urls", &self.client_url()])
            .args(["--advertise-client-urls", &self.client_url()])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args([
                "--initial-cluster-state",
                if joins { "existing" } else { "new" },
            ])
            .args(["--initial-cluster-token", "caretaker-test"])
            .args(["--cert-file", &file("server.crt")])
            .args(["--key-file", &file("server.key")])
            .args(["--trusted-ca-file", &file("ca.crt")])
            .arg("--client-cert-auth")
            .args(["--peer-cert-file", &file("peer.crt")])
            .args(["--peer-key-file", &file("peer.key")])
            .args(["--peer-trusted-ca-file", &file("ca.crt")])
            .arg("--peer-client-cert-auth")
            .args(["--logger", "zap", "--log-level", "error"])
            .args(["--log-outputs", &file("etcd.log")])
            // Loopback and a temp directory: no fsync latency worth waiting for.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("etcd starts");
        self.process = Some(child);
    }

    fn start(&mut self, initial_cluster: &str) {
        self.start_with(initial_cluster, false)
    }

    /// Stops the member as a container runtime would: SIGTERM, then waits.
    async fn stop(&mut self) {
        if let Some(mut child) = self.process.take() {
            if let Some(pid) = child.id() {
                // SAFETY: sends a signal to our own child process.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    pub fn running(&self) -> bool {
        self.process.is_some()
    }
}

/// The cluster, and the installer that follows `etcd-all-certs`.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    pub dir: tempfile::TempDir,
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    /// Every revision installed, in order.
    pub installed: Vec<String>,
    /// Per member: stopped on purpose (or restarting and not yet seen healthy).
    down: Arc<Mutex<Vec<bool>>>,
}

impl EtcdCluster {
    /// Three members, m0 to m2, not started.
    pub fn new(client: &kube::Client, namespace: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let members = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: crate::ports::reusable_port().unwrap(),
                peer_port: crate::ports::reusable_port().unwrap(),
                dir: dir.path().join(format!("m{i}")),
                process: None,
                revision: None,
            })
            .collect();
        Self {
            members,
            dir,
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            installed: Vec::new(),
            down: Arc::new(Mutex::new(vec![true; 3])),
        }
    }

    /// The EtcdCertificates `etcd` for these members (each named by `127.0.0.1` and
    /// `<name>.etcd.example`) and their endpoints, with both signers' `trustPropagation` 1 s.
    pub fn certificates_object(
        &self,
        namespace: &str,
    ) -> caretaker_api::v1alpha1::EtcdCertificates {
        let members = self.members.iter().map(|m| member_json(&m.name)).collect();
        certificates_object(namespace, members, self.endpoints(), None)
    }

    /// Forces a rotation of `etcd-signer` the documented way: its
    /// `auth.openshift.io/certificate-not-after` removed.
    pub async fn force_rotation(&self) {
        let patch = serde_json::json!({"metadata": {"annotations": {"auth.openshift.io/certificate-not-after": null}}});
        self.secrets
            .patch(
                "etcd-signer",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `etcd-all-certs` as stored, and its revision annotation.
    pub async fn all_certs(&self) -> Option<(String, BTreeMap<String, String>)> {
        let secret = self.secrets.get_opt("etcd-all-certs").await.ok()??;
        let revision = secret
            .metadata
            .annotations
            .as_ref()?
            .get("caretaker.dev/revision")?
            .clone();
        let data = secret
            .data?
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect();
        Some((revision, data))
    }

    /// Waits for the first `etcd-all-certs` and starts every member with it.
    pub async fn bootstrap(&mut self, seconds: u64) {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let (revision, all) = loop {
            if let Some(found) = self.all_certs().await {
                break found;
            }
            assert!(
                Instant::now() < deadline,
                "no etcd-all-certs within {seconds}s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let initial = self.initial_cluster();
        for member in &mut self.members {
            member.write_files(&all);
            member.start(&initial);
            member.revision = Some(revision.clone());
        }
        self.installed.push(revision);
        for i in 0..self.members.len() {
            self.wait_healthy(i, 30).await;
        }
    }

    /// The installer's round: while a running member is not on the stored `etcd-all-certs`,
    /// restarts the first such member onto it and waits until it is healthy. Each restart
    /// takes the revision stored at that moment, so a member may skip one that came out in
    /// the middle of a rollout, as OpenShift's installers do. Returns whether it restarted
    /// any member.
    pub async fn install_if_changed(&mut self) -> bool {
        let initial = self.initial_cluster();
        let mut restarted = false;
        loop {
            let Some((revision, all)) = self.all_certs().await else {
                return restarted;
            };
            let behind = self
                .members
                .iter()
                .position(|m| m.running() && m.revision.as_ref() != Some(&revision));
            let Some(i) = behind else {
                if restarted && self.installed.last() != Some(&revision) {
                    self.installed.push(revision);
                }
                return restarted;
            };
            if self.installed.last() != Some(&revision) {
                self.installed.push(revision.clone());
            }
            self.down.lock().unwrap()[i] = true;
            self.members[i].stop().await;
            self.members[i].write_files(&all);
            self.members[i].start(&initial);
            self.members[i].revision = Some(revision);
            self.wait_healthy(i, 30).await;
            restarted = true;
        }
    }

    /// Adds a member (`m<N>`) with etcd's member API and starts it from the stored
    /// `etcd-all-certs`, which must hold its certificates.
    pub async fn add_member(&mut self) {
        let index = self.members.len();
        let member = Member {
            name: format!("m{index}"),
            client_port: crate::ports::reusable_port().unwrap(),
            peer_port: crate::ports::reusable_port().unwrap(),
            dir: self.dir.path().join(format!("m{index}")),
            process: None,
            revision: None,
        };
        let client = self.client().await;
        let body = format!(r#"{{"peerURLs":["{}"]}}"#, member.peer_url());
        client
            .on_any("/v3/cluster/member/add", &body)
            .await
            .expect("member add");
        self.members.push(member);
        self.down.lock().unwrap().push(true);
        let (revision, all) = self.all_certs().await.expect("etcd-all-certs");
        let initial = self.initial_cluster();
        let new = &mut self.members[index];
        new.write_files(&all);
        new.start_with(&initial, true);
        new.revision = Some(revision);
        self.wait_healthy(index, 30).await;
    }

    /// Removes the last member with etcd's member API, and stops it.
    pub async fn remove_last_member(&mut self) {
        let client = self.client().await;
        let list = client
            .on_any("/v3/cluster/member/list", "{}")
            .await
            .expect("member list");
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        let name = self.members.last().unwrap().name.clone();
        let id = list["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name.as_str())
            .and_then(|m| m["ID"].as_str())
            .expect("the member is listed")
            .to_string();
        client
            .on_any("/v3/cluster/member/remove", &format!(r#"{{"ID":"{id}"}}"#))
            .await
            .expect("member remove");
        let index = self.members.len() - 1;
        self.stop_member(index).await;
        self.members.pop();
        self.down.lock().unwrap().pop();
    }

    /// Stops member `index` on purpose.
    pub async fn stop_member(&mut self, index: usize) {
        self.down.lock().unwrap()[index] = true;
        self.members[index].stop().await;
    }

    /// Asks every member that is neither stopped nor restarting for its health every 100 ms,
    /// until `stop`; returns each time one stayed unhealthy for longer than 2 s (longer than
    /// a leader election, during which every member says it has no leader).
    pub fn watch_health(
        &self,
        client: EtcdClient,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<Vec<String>> {
        let urls: Vec<String> = self.endpoints();
        let down = self.down.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut unhealthy_since: Vec<Option<Instant>> = vec![None; urls.len()];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, url) in urls.iter().enumerate() {
                    if down.lock().unwrap()[i] {
                        unhealthy_since[i] = None;
                        continue;
                    }
                    match client.health(url).await {
                        Err(why) if !down.lock().unwrap()[i] => {
                            let since = *unhealthy_since[i].get_or_insert_with(Instant::now);
                            if since.elapsed() > Duration::from_secs(2) {
                                seen.push(format!("{url}: {why}"));
                                unhealthy_since[i] = None;
                            }
                        }
                        _ => unhealthy_since[i] = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        })
    }

    /// Starts the stopped members again, with the files they had.
    pub async fn restart_stopped(&mut self) {
        let initial = self.initial_cluster();
        for i in 0..self.members.len() {
            if !self.members[i].running() {
                self.members[i].start(&initial);
                self.wait_healthy(i, 30).await;
            }
        }
    }

    /// A client as the cluster's consumers have one: `etcd-ca-bundle` to verify members,
    /// `etcd-client` to present.
    pub async fn client(&self) -> EtcdClient {
        EtcdClient::of(self.endpoints(), &self.secrets, &self.config_maps).await
    }

    pub async fn wait_healthy(&self, index: usize, seconds: u64) {
        let client = self.client().await;
        let url = self.members[index].client_url();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            if client.healthy(&url).await {
                self.down.lock().unwrap()[index] = false;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "member {} not healthy within {seconds}s; log: {}",
                self.members[index].name,
                std::fs::read_to_string(self.members[index].dir.join("etcd.log"))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn secrets(&self) -> &Api<Secret> {
        &self.secrets
    }

    pub fn config_maps(&self) -> &Api<ConfigMap> {
        &self.config_maps
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(child) = &mut member.process {
                let _ = child.start_kill();
            }
        }
    }
}

/// The v3 JSON gateway over mutual TLS, one connection per request, trying the endpoints in
/// turn as etcd's own client balances.
#[derive(Clone)]
pub struct EtcdClient {
    pub endpoints: Vec<String>,
    config: Arc<Mutex<Option<Arc<rustls::ClientConfig>>>>,
    /// Requests that failed on one endpoint and were tried again (on it or another).
    pub retries: Arc<std::sync::atomic::AtomicU64>,
    /// Failures that speak of a certificate (an unknown issuer, a refused client
    /// certificate): never transient, never allowed.
    pub certificate_errors: Arc<Mutex<Vec<String>>>,
}

impl EtcdClient {
    /// A client of `endpoints` with no trust yet ([`Self::refresh`] gives it).
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            config: Arc::new(Mutex::new(None)),
            retries: Arc::default(),
            certificate_errors: Arc::default(),
        }
    }

    /// A client of `endpoints` with the bundle and client certificate as stored now.
    pub async fn of(
        endpoints: Vec<String>,
        secrets: &Api<Secret>,
        config_maps: &Api<ConfigMap>,
    ) -> Self {
        let client = Self::new(endpoints);
        client.refresh(secrets, config_maps).await;
        client
    }

    /// Takes up the bundle and client certificate as stored now.
    pub async fn refresh(&self, secrets: &Api<Secret>, config_maps: &Api<ConfigMap>) {
        let (Ok(Some(bundle)), Ok(Some(secret))) = (
            config_maps.get_opt("etcd-ca-bundle").await,
            secrets.get_opt("etcd-client").await,
        ) else {
            return;
        };
        let ca = bundle.data.unwrap_or_default()["ca-bundle.crt"].clone();
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        let identity = ClientIdentity::from_pem(&ca, &text("tls.crt"), &text("tls.key")).unwrap();
        *self.config.lock().unwrap() = Some(Arc::new(identity.config().unwrap()));
    }

    fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.config
            .lock()
            .unwrap()
            .clone()
            .expect("the client has its trust")
    }

    pub async fn healthy(&self, url: &str) -> bool {
        self.health(url).await.is_ok()
    }

    /// `/health`'s answer when healthy, else why not.
    pub async fn health(&self, url: &str) -> Result<String, String> {
        match request(&self.tls(), url, "GET", "/health", "").await {
            Ok(body) if body.contains("\"health\":\"true\"") => Ok(body),
            Ok(body) => Err(body),
            Err(e) => Err(e),
        }
    }

    /// Puts `key`=`value`, on the first endpoint that answers.
    pub async fn put(&self, key: &str, value: &str) -> Result<(), String> {
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            STANDARD.encode(key),
            STANDARD.encode(value)
        );
        self.on_any("/v3/kv/put", &body).await.map(|_| ())
    }

    /// The value of `key`, on the first endpoint that answers.
    pub async fn get(&self, key: &str) -> Result<Option<String>, String> {
        let body = format!(r#"{{"key":"{}"}}"#, STANDARD.encode(key));
        let reply = self.on_any("/v3/kv/range", &body).await?;
        let value: serde_json::Value = serde_json::from_str(&reply).map_err(|e| e.to_string())?;
        Ok(value["kvs"][0]["value"]
            .as_str()
            .map(|v| String::from_utf8(STANDARD.decode(v).unwrap()).unwrap()))
    }

    /// The request on the first endpoint that answers; as etcd's own client, rounds over the
    /// endpoints are retried for up to 3 s (a leader election while a member restarts makes
    /// every member refuse proposals for a moment), and only then does the operation fail.
    pub async fn on_any(&self, path: &str, body: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let mut errors = Vec::new();
            for url in &self.endpoints {
                match request(&self.tls(), url, "POST", path, body).await {
                    Ok(reply) => return Ok(reply),
                    Err(e) => {
                        let lower = e.to_ascii_lowercase();
                        if lower.contains("certificate")
                            || lower.contains("unknownissuer")
                            || lower.contains("alert")
                        {
                            self.certificate_errors
                                .lock()
                                .unwrap()
                                .push(format!("{url}: {e}"));
                        }
                        self.retries
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        errors.push(format!("{url}: {e}"));
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(errors.join("; "));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One HTTP/1.1 request over a new TLS connection; the body of a 200 reply.
async fn request(
    config: &Arc<rustls::ClientConfig>,
    url: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, String> {
    let work = async {
        let uri: hyper::Uri = url.parse().map_err(|_| "bad url".to_string())?;
        let (host, port) = (uri.host().unwrap().to_string(), uri.port_u16().unwrap());
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from(host.clone()).unwrap();
        let mut tls = TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(head.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut reply = Vec::new();
        match tls.read_to_end(&mut reply).await {
            Ok(_) => {}
            // A server that closes without TLS's close_notify, after its whole reply.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !reply.is_empty() => {}
            Err(e) => return Err(format!("read: {e}")),
        }
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        if !head.starts_with("HTTP/1.1 200") {
            let body = if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked")
            {
                dechunk(body)
            } else {
                body.to_string()
            };
            return Err(format!(
                "reply: {} {}",
                head.lines().next().unwrap_or(""),
                body.trim()
            ));
        }
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Ok(dechunk(body));
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// A chunked body's content.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Clients writing and reading back continuously: `workers` writers, each on its own keys,
/// with the cluster's bundle and client certificate taken up as they change (as a workload
/// mounting them would).
pub struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub started: Instant,
    /// When each operation completed (a put, then its read), since `started`.
    pub completions: Arc<Mutex<Vec<Duration>>>,
    /// Why each failed operation failed.
    pub failures: Arc<Mutex<Vec<String>>>,
    /// The last value acknowledged for each key.
    pub written: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Load {
    pub fn start(cluster: &EtcdCluster, client: &EtcdClient, workers: usize) -> Self {
        Self::start_with(
            (cluster.secrets.clone(), cluster.config_maps.clone()),
            client,
            workers,
        )
    }

    /// [`Self::start`], taking the bundle and client certificate up from these Secrets and
    /// ConfigMaps.
    pub fn start_with(
        (secrets, config_maps): (Api<Secret>, Api<ConfigMap>),
        client: &EtcdClient,
        workers: usize,
    ) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = |stop: &Arc<std::sync::atomic::AtomicBool>| {
            !stop.load(std::sync::atomic::Ordering::Relaxed)
        };
        let started = Instant::now();
        let completions = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(Mutex::new(BTreeMap::new()));
        let mut tasks = Vec::new();
        let (c, s) = (client.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while running(&s) {
                c.refresh(&secrets, &config_maps).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
        for worker in 0..workers {
            let (c, s) = (client.clone(), stop.clone());
            let (completions, failures, written) =
                (completions.clone(), failures.clone(), written.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while running(&s) {
                    i += 1;
                    let (key, value) = (format!("w{worker}-k{}", i % 100), format!("v{i}"));
                    let result = match c.put(&key, &value).await {
                        Ok(()) => {
                            written.lock().unwrap().insert(key.clone(), value.clone());
                            c.get(&key).await.and_then(|got| match got {
                                Some(got) if got == value => Ok(()),
                                other => Err(format!("read {other:?} after writing {value}")),
                            })
                        }
                        Err(e) => Err(e),
                    };
                    match result {
                        Ok(()) => {
                            let at = started.elapsed();
                            completions.lock().unwrap().extend([at, at]);
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            }));
        }
        Self {
            stop,
            tasks,
            started,
            completions,
            failures,
            written,
        }
    }

    /// Stops the clients and waits for them.
    pub async fn stop(self) -> Self {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in &self.tasks {
            while !task.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self
    }

    pub fn done(&self) -> usize {
        self.completions.lock().unwrap().len()
    }

    pub fn failed(&self) -> Vec<String> {
        self.failures.lock().unwrap().clone()
    }

    /// The acknowledged writes `reader` does not find with their last value: lost ones.
    pub async fn lost(&self, reader: &EtcdClient) -> Vec<String> {
        let written = self.written.lock().unwrap().clone();
        let mut lost = Vec::new();
        for (key, value) in &written {
            let stored = reader.get(key).await;
            if stored.as_ref().map(Option::as_deref) != Ok(Some(value.as_str())) {
                lost.push(format!("{key}: wrote {value}, read {stored:?}"));
            }
        }
        lost
    }
}

/// A member of the tests' EtcdCertificates: named by `127.0.0.1` and `<name>.etcd.example`.
pub fn member_json(name: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "addresses": ["127.0.0.1", format!("{name}.etcd.example")]})
}

/// The tests' EtcdCertificates `etcd`: these members and quorum endpoints, both signers'
/// `trustPropagation` 1 s, and the agents' CA Secret when members have agents.
pub fn certificates_object(
    namespace: &str,
    members: Vec<serde_json::Value>,
    endpoints: Vec<String>,
    agents_ca_secret: Option<&str>,
) -> caretaker_api::v1alpha1::EtcdCertificates {
    let mut spec = serde_json::json!({
        "members": members,
        "signer": {"trustPropagation": "1s"},
        "metricsSigner": {"trustPropagation": "1s"},
        "quorum": {"endpoints": endpoints},
    });
    if let Some(secret) = agents_ca_secret {
        spec["agents"] = serde_json::json!({"caSecretName": secret});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
        "metadata": {"name": "etcd", "namespace": namespace},
        "spec": spec,
    }))
    .unwrap()
}
