//! The etcd revision installer: on an etcd member's node, writes ONE revision of that member's
//! files (sent by the operator, [`caretaker_agent_api::etcd`]), restarts the member with the
//! configured hook and waits until it answers `/health` presenting the new serving certificate.
//!
//! - Only files for the configured member are taken; another name is refused, nothing written.
//! - All or nothing: every file is checked first (certificates parse, each key matches its
//!   certificate, the bundle holds certificates only), then the files in place are copied to
//!   the state directory (`etcd/previous/`, keys 0600), then the new ones are staged, synced
//!   and renamed into place together ([`files::write_all`]). A failed write or a failed hook
//!   puts the previous files back.
//! - The health check presents the member's new serving certificate as its client certificate
//!   (serving certificates are issued for both usages) and trusts only the new bundle: no
//!   client certificate is ever sent to a node.
//! - Errors and logs name files and members, never their contents.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use caretaker_agent_api::etcd::{
    InstallOutcome, InstallRequest, Installed, MemberFiles, is_revision,
};
use caretaker_agent_api::refresh::HookOutcome;
use caretaker_agent_api::tls::{certificates, install_crypto_provider, private_key, roots};
use caretaker_pki::PrivateKey;
use caretaker_pki::files::{self, FileToWrite};
use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};

use crate::command::{CommandTemplate, run_blocking};

/// Between two `/health` asks while the member restarts.
const HEALTH_INTERVAL: Duration = Duration::from_millis(200);
/// One `/health` ask.
const HEALTH_ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// Where etcd reads its files: kubeadm's static pod, or a plain `--cert-file` layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdLayout {
    /// `/etc/kubernetes/pki/etcd/{ca.crt,peer.crt,peer.key,server.crt,server.key}`, as
    /// kubeadm's etcd manifest reads them. kubeadm's `healthcheck-client.*` is a client
    /// certificate and is never written (the Machine refresh renews it).
    Kubeadm,
    /// `/etc/etcd/pki/{ca.pem,cert.pem,key.pem,peer-cert.pem,peer-key.pem}`, named after
    /// etcd's `--trusted-ca-file`, `--cert-file`, `--key-file`, `--peer-cert-file` and
    /// `--peer-key-file` (a systemd unit points both trusted-CA flags at `ca.pem`).
    Plain,
}

impl EtcdLayout {
    pub fn default_dir(self) -> &'static str {
        match self {
            EtcdLayout::Kubeadm => "/etc/kubernetes/pki/etcd",
            EtcdLayout::Plain => "/etc/etcd/pki",
        }
    }

    pub fn file_names(self) -> FileNames {
        let names = match self {
            EtcdLayout::Kubeadm => ["ca.crt", "peer.crt", "peer.key", "server.crt", "server.key"],
            EtcdLayout::Plain => [
                "ca.pem",
                "peer-cert.pem",
                "peer-key.pem",
                "cert.pem",
                "key.pem",
            ],
        };
        let [
            ca_bundle,
            peer_certificate,
            peer_key,
            serving_certificate,
            serving_key,
        ] = names.map(str::to_string);
        FileNames {
            ca_bundle,
            peer_certificate,
            peer_key,
            serving_certificate,
            serving_key,
        }
    }
}

impl std::str::FromStr for EtcdLayout {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "kubeadm" => Ok(EtcdLayout::Kubeadm),
            "plain" => Ok(EtcdLayout::Plain),
            other => Err(format!("unknown etcd layout {other:?}: kubeadm or plain")),
        }
    }
}

/// The file names (in the etcd directory) of each of a member's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileNames {
    pub ca_bundle: String,
    pub peer_certificate: String,
    pub peer_key: String,
    pub serving_certificate: String,
    pub serving_key: String,
}

/// The agent's etcd section.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// The member this node runs.
    pub member: String,
    /// The directory etcd reads its files from.
    pub dir: PathBuf,
    pub names: FileNames,
    /// The member's client URL, asked for `/health` after a restart.
    pub client_url: String,
    pub restart: CommandTemplate,
    pub restart_timeout: Duration,
    pub health_timeout: Duration,
}

/// Why an install failed. The category decides the HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("this agent installs files for member {mine:?}, not {asked:?}; nothing was written")]
    WrongMember { mine: String, asked: String },
    #[error("{0}; nothing was written")]
    BadRequest(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("the restart hook failed ({}), {restored}; its output: {}", hook_summary(.outcome), .outcome.output_tail)]
    HookFailed {
        outcome: HookOutcome,
        restored: String,
    },
    #[error("member {member} did not answer /health with revision {revision}'s serving certificate within {}s (last: {last}); the revision stays installed", .timeout.as_secs())]
    NotHealthy {
        member: String,
        revision: String,
        timeout: Duration,
        last: String,
    },
}

fn hook_summary(outcome: &HookOutcome) -> String {
    match (outcome.timed_out, outcome.exit_code) {
        (true, _) => "timed out".into(),
        (false, Some(code)) => format!("exit code {code}"),
        (false, None) => "killed by a signal or not started".into(),
    }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> InstallError {
    let context = context.into();
    move |source| InstallError::Io { context, source }
}

/// What the state directory records of a revision.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    revision: String,
}

/// Installs revisions of one member's files.
#[derive(Debug, Clone)]
pub struct EtcdInstaller {
    config: EtcdConfig,
    state_dir: PathBuf,
}

/// The member's files as they were before an install, by name: contents and mode, `None` for
/// a file that did not exist.
type Previous = Vec<(String, Option<(Vec<u8>, u32)>)>;

/// A file of the member's, as written: its name in the etcd directory, contents and mode.
struct MemberFile {
    name: String,
    contents: Vec<u8>,
    mode: u32,
}

impl EtcdInstaller {
    pub fn new(config: EtcdConfig, state_dir: impl AsRef<Path>) -> Self {
        Self {
            config,
            state_dir: state_dir.as_ref().join("etcd"),
        }
    }

    pub fn member(&self) -> &str {
        &self.config.member
    }

    /// The member and the revision in place.
    pub fn installed(&self) -> Installed {
        Installed {
            member: self.config.member.clone(),
            revision: read_record(&self.state_dir.join("current.json")),
        }
    }

    /// Checks, writes, restarts and waits (blocking: run it on a blocking thread).
    pub fn install(&self, request: &InstallRequest) -> Result<InstallOutcome, InstallError> {
        if request.member != self.config.member {
            return Err(InstallError::WrongMember {
                mine: self.config.member.clone(),
                asked: request.member.clone(),
            });
        }
        if !is_revision(&request.revision) {
            return Err(InstallError::BadRequest(format!(
                "invalid revision {:?}: expected 16 lowercase hex digits",
                request.revision
            )));
        }
        check(&request.files).map_err(InstallError::BadRequest)?;
        let new = self.files_of(&request.files);
        let previous_revision = self.installed().revision;
        let in_place = previous_revision.as_deref() == Some(request.revision.as_str())
            && new
                .iter()
                .all(|f| fs::read(self.config.dir.join(&f.name)).is_ok_and(|c| c == f.contents));
        let restart = if in_place {
            // Asked again (an operator that lost the answer): no second restart.
            HookOutcome {
                success: true,
                exit_code: Some(0),
                timed_out: false,
                output_tail: "already installed; not restarted again".into(),
            }
        } else {
            self.replace(&new, previous_revision.as_deref(), &request.revision)?
        };
        let started = Instant::now();
        let retries = self.wait_healthy(&request.files, &request.revision)?;
        tracing::info!(member = %self.config.member, revision = %request.revision, "etcd revision installed; the member is healthy with it");
        Ok(InstallOutcome {
            member: self.config.member.clone(),
            revision: request.revision.clone(),
            previous_revision: if in_place { None } else { previous_revision },
            restart,
            healthy_after_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            health_retries: retries,
        })
    }

    fn files_of(&self, files: &MemberFiles) -> Vec<MemberFile> {
        let names = &self.config.names;
        let file = |name: &str, contents: &str, mode: u32| MemberFile {
            name: name.to_string(),
            contents: contents.as_bytes().to_vec(),
            mode,
        };
        vec![
            file(&names.ca_bundle, &files.ca_bundle, files::CERTIFICATE_MODE),
            file(
                &names.peer_certificate,
                &files.peer_certificate,
                files::CERTIFICATE_MODE,
            ),
            file(&names.peer_key, &files.peer_key, files::PRIVATE_KEY_MODE),
            file(
                &names.serving_certificate,
                &files.serving_certificate,
                files::CERTIFICATE_MODE,
            ),
            file(
                &names.serving_key,
                &files.serving_key,
                files::PRIVATE_KEY_MODE,
            ),
        ]
    }

    /// Keeps the files in place as the previous revision, writes `new`, records `revision`
    /// and runs the restart hook; a failed write or hook puts the previous files back.
    fn replace(
        &self,
        new: &[MemberFile],
        previous_revision: Option<&str>,
        revision: &str,
    ) -> Result<HookOutcome, InstallError> {
        let dir = &self.config.dir;
        fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
        let previous = self.keep_previous(new, previous_revision)?;
        let written = files::write_all(dir, &to_write(new));
        if let Err(e) = written {
            let restored = self.restore(&previous);
            return Err(io(format!("cannot write the new files ({restored})"))(e));
        }
        let outcome = run_blocking(&self.config.restart, None, self.config.restart_timeout);
        if !outcome.success {
            let restored = self.restore(&previous);
            tracing::warn!(member = %self.config.member, revision, "the etcd restart hook failed; the previous files are back");
            return Err(InstallError::HookFailed { outcome, restored });
        }
        self.record(revision)?;
        Ok(outcome)
    }

    /// Copies the member's files in place (those that exist) to `previous/`, with the revision
    /// they were; returns them as they were, `None` for a file that did not exist.
    fn keep_previous(
        &self,
        new: &[MemberFile],
        revision: Option<&str>,
    ) -> Result<Previous, InstallError> {
        let mut previous = Vec::new();
        for file in new {
            let path = self.config.dir.join(&file.name);
            let found = match fs::read(&path) {
                Ok(contents) => {
                    let mode = fs::metadata(&path)
                        .map(|m| m.permissions().mode() & 0o777)
                        .unwrap_or(file.mode);
                    Some((contents, mode))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
            };
            previous.push((file.name.clone(), found));
        }
        let kept = self.state_dir.join("previous");
        if kept.exists() {
            files::remove_dir_all_securely(&kept)
                .map_err(io("cannot remove the older kept revision"))?;
        }
        fs::create_dir_all(&kept).map_err(io("cannot keep the previous revision"))?;
        fs::set_permissions(&self.state_dir, fs::Permissions::from_mode(0o700))
            .and_then(|()| fs::set_permissions(&kept, fs::Permissions::from_mode(0o700)))
            .map_err(io("cannot restrict the kept revision"))?;
        let record = serde_json::to_vec(&Record {
            revision: revision.unwrap_or_default().to_string(),
        })
        .expect("records serialize");
        let mut copies = existing_files(&previous);
        copies.push(FileToWrite {
            name: "revision.json",
            contents: &record,
            mode: 0o600,
        });
        files::write_all(&kept, &copies).map_err(io("cannot keep the previous revision"))?;
        Ok(previous)
    }

    /// Puts `previous` back (removing the files that did not exist); says what it did.
    fn restore(&self, previous: &Previous) -> String {
        let dir = &self.config.dir;
        let back = existing_files(previous);
        let mut failures = Vec::new();
        if let Err(e) = files::write_all(dir, &back) {
            failures.push(e.to_string());
        }
        for (name, found) in previous {
            if found.is_none()
                && let Err(e) = files::remove_file_securely(&dir.join(name))
                && e.kind() != std::io::ErrorKind::NotFound
            {
                failures.push(format!("{name}: {e}"));
            }
        }
        if failures.is_empty() {
            "the previous files are back in place".into()
        } else {
            format!(
                "putting the previous files back FAILED ({}); they are kept in {}",
                failures.join(", "),
                self.state_dir.join("previous").display()
            )
        }
    }

    fn record(&self, revision: &str) -> Result<(), InstallError> {
        let record = serde_json::to_vec(&Record {
            revision: revision.to_string(),
        })
        .expect("records serialize");
        files::write_atomic(&self.state_dir.join("current.json"), &record, 0o600)
            .map_err(io("cannot record the installed revision"))
    }

    /// Asks `/health` until the member answers healthy presenting the new serving
    /// certificate; returns how many asks failed first.
    fn wait_healthy(&self, files: &MemberFiles, revision: &str) -> Result<u32, InstallError> {
        let bad = |e: String| InstallError::BadRequest(e);
        let config = Arc::new(health_config(files).map_err(bad)?);
        let expected = certificates(&files.serving_certificate, "the serving certificate")
            .map_err(|e| bad(e.to_string()))?
            .remove(0);
        let deadline = Instant::now() + self.config.health_timeout;
        let mut retries = 0;
        loop {
            let last = match ask_health(&config, &self.config.client_url) {
                Ok((true, presented)) if presented.as_deref() == Some(expected.as_ref()) => {
                    return Ok(retries);
                }
                Ok((true, _)) => "healthy, presenting another serving certificate".to_string(),
                Ok((false, _)) => "not healthy".to_string(),
                Err(e) => e,
            };
            retries += 1;
            if Instant::now() >= deadline {
                return Err(InstallError::NotHealthy {
                    member: self.config.member.clone(),
                    revision: revision.to_string(),
                    timeout: self.config.health_timeout,
                    last,
                });
            }
            std::thread::sleep(HEALTH_INTERVAL);
        }
    }
}

fn to_write(files: &[MemberFile]) -> Vec<FileToWrite<'_>> {
    files
        .iter()
        .map(|f| FileToWrite {
            name: &f.name,
            contents: &f.contents,
            mode: f.mode,
        })
        .collect()
}

fn read_record(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    let record: Record = serde_json::from_slice(&bytes).ok()?;
    Some(record.revision).filter(|r| !r.is_empty())
}

/// Every file as it must be: one certificate per pair, each key its certificate's, the bundle
/// certificates only. The messages name the file, never its contents.
fn check(files: &MemberFiles) -> Result<(), String> {
    caretaker_pki::bundle::parse(&files.ca_bundle)
        .map_err(|e| format!("the CA bundle: {e}"))
        .and_then(|cas| {
            if cas.is_empty() {
                Err("the CA bundle holds no certificate".into())
            } else {
                Ok(())
            }
        })?;
    for (what, certificate, key) in [
        ("peer", &files.peer_certificate, &files.peer_key),
        ("serving", &files.serving_certificate, &files.serving_key),
    ] {
        let parsed = caretaker_pki::bundle::parse(certificate)
            .map_err(|e| format!("the {what} certificate: {e}"))?;
        let [certificate] = parsed.as_slice() else {
            return Err(format!(
                "the {what} certificate: expected one certificate, got {}",
                parsed.len()
            ));
        };
        let key = PrivateKey::from_pem(key)
            .map_err(|_| format!("the {what} key is not a usable private key"))?;
        if !caretaker_pki::key_matches_certificate(&key, certificate.der()).unwrap_or(false) {
            return Err(format!("the {what} key is not its certificate's key"));
        }
    }
    Ok(())
}

/// The health check's TLS: trust the new bundle, present the new serving pair.
fn health_config(files: &MemberFiles) -> Result<rustls::ClientConfig, String> {
    install_crypto_provider();
    let roots = roots(&files.ca_bundle).map_err(|e| e.to_string())?;
    let chain = certificates(&files.serving_certificate, "the serving certificate")
        .map_err(|e| e.to_string())?;
    let key = private_key(&files.serving_key).map_err(|e| e.to_string())?;
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|_| "the serving certificate and key do not make a client identity".into())
}

/// `GET /health` at `url`: whether etcd says healthy, and the serving certificate presented.
fn ask_health(
    config: &Arc<rustls::ClientConfig>,
    url: &str,
) -> Result<(bool, Option<Vec<u8>>), String> {
    let uri: hyper::Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("{url:?} has no host"))?
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(2379);
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host:?}: {e}"))?;
    let address = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .map_err(|e| format!("resolve: {e}"))?
        .next()
        .ok_or("resolve: no address")?;
    let tcp = TcpStream::connect_timeout(&address, HEALTH_ASK_TIMEOUT)
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(HEALTH_ASK_TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(HEALTH_ASK_TIMEOUT)))
        .map_err(|e| format!("connect: {e}"))?;
    let connection =
        rustls::ClientConnection::new(config.clone(), name).map_err(|e| format!("TLS: {e}"))?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let request = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| format!("TLS: {e}"))?;
    let presented = tls
        .conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|der| der.to_vec());
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if reply.len() > 16 * 1024 {
                    return Err("a reply over 16 KiB".into());
                }
            }
            // etcd closes without close_notify after its whole reply.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !reply.is_empty() => break,
            Err(e) => return Err(format!("TLS: {e}")),
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let healthy = head.starts_with("HTTP/1.1 200") && body.contains("\"health\":\"true\"");
    Ok((healthy, presented))
}

/// The files of `previous` that existed, to write as they were.
fn existing_files(previous: &Previous) -> Vec<FileToWrite<'_>> {
    previous
        .iter()
        .filter_map(|(name, found)| {
            let (contents, mode) = found.as_ref()?;
            Some(FileToWrite {
                name,
                contents,
                mode: *mode,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

    use super::*;

    fn pair(ca: &CertificateAuthority, name: &str) -> (String, String) {
        let issued = ca
            .issue(
                &LeafSpec::new(name, Usage::Both)
                    .with_dns_names(["localhost"])
                    .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
            )
            .unwrap();
        (issued.certificate_pem.clone(), issued.key.unwrap().to_pem())
    }

    fn files_for(ca: &CertificateAuthority, member: &str) -> MemberFiles {
        let (peer_certificate, peer_key) = pair(ca, &format!("system:etcd-peer:{member}"));
        let (serving_certificate, serving_key) = pair(ca, &format!("system:etcd-server:{member}"));
        MemberFiles {
            ca_bundle: ca.certificate_pem(),
            peer_certificate,
            peer_key,
            serving_certificate,
            serving_key,
        }
    }

    fn installer(dir: &Path, hook: &str) -> EtcdInstaller {
        let config = EtcdConfig {
            member: "m1".into(),
            dir: dir.join("pki"),
            names: EtcdLayout::Kubeadm.file_names(),
            // Nothing listens there: only reached after a successful hook.
            client_url: "https://127.0.0.1:9".into(),
            restart: CommandTemplate::parse(hook).unwrap(),
            restart_timeout: Duration::from_secs(10),
            health_timeout: Duration::from_millis(300),
        };
        EtcdInstaller::new(config, dir.join("state"))
    }

    /// Every file of the etcd directory: contents and mode.
    fn on_disk(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
        let mut found = BTreeMap::new();
        for entry in fs::read_dir(dir.join("pki"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
            let name = entry.file_name().to_string_lossy().into_owned();
            found.insert(name, (fs::read(entry.path()).unwrap(), mode));
        }
        found
    }

    fn request(member: &str, revision: &str, files: MemberFiles) -> InstallRequest {
        InstallRequest {
            member: member.into(),
            revision: revision.into(),
            files,
        }
    }

    /// The attack: m1's node asked to install m0's files (or m0's agent tricked into taking
    /// files named for it by another): refused, nothing written, no hook run.
    #[test]
    fn files_for_another_member_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        let marker = dir.path().join("hook-ran");
        let installer = installer(dir.path(), &format!("touch {}", marker.display()));
        let error = installer
            .install(&request("m0", "0123456789abcdef", files_for(&ca, "m0")))
            .unwrap_err();
        assert!(matches!(error, InstallError::WrongMember { .. }), "{error}");
        assert!(on_disk(dir.path()).is_empty());
        assert!(!marker.exists(), "no restart");
    }

    /// A key that is not its certificate's, or a private key in the bundle: refused whole, and
    /// the message never holds the key.
    #[test]
    fn a_mismatched_key_or_a_key_in_the_bundle_is_refused_without_repeating_it() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        let installer = installer(dir.path(), "true");
        let good = files_for(&ca, "m1");
        let mut swapped = good.clone();
        swapped.peer_key = good.serving_key.clone();
        let mut leaking = good.clone();
        leaking.ca_bundle = format!("{}{}", good.ca_bundle, good.serving_key);
        let key_body = good.serving_key.lines().nth(1).unwrap().to_string();
        for files in [swapped, leaking] {
            let error = installer
                .install(&request("m1", "0123456789abcdef", files))
                .unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, InstallError::BadRequest(_)), "{message}");
            assert!(!message.contains(&key_body), "{message}");
            assert!(on_disk(dir.path()).is_empty());
        }
        let error = installer
            .install(&request("m1", "../../etc", good))
            .unwrap_err();
        assert!(matches!(error, InstallError::BadRequest(_)), "{error}");
    }

    /// A hook that fails after the new files were written: the previous files are back, byte
    /// for byte and mode for mode, the recorded revision is the previous one, and the error
    /// carries the hook's output and no key.
    #[test]
    fn a_failed_hook_puts_the_previous_revision_back() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        let old = files_for(&ca, "m1");
        let ok = installer(dir.path(), "true");
        // The previous revision as an install leaves it (its health wait fails: no member).
        let first = ok.install(&request("m1", "aaaaaaaaaaaaaaaa", old.clone()));
        assert!(
            matches!(first, Err(InstallError::NotHealthy { .. })),
            "{first:?}"
        );
        assert_eq!(ok.installed().revision.as_deref(), Some("aaaaaaaaaaaaaaaa"));
        let before = on_disk(dir.path());
        assert_eq!(before["server.key"].1, 0o600);
        assert_eq!(before["peer.key"].1, 0o600);
        assert_eq!(before["ca.crt"].1, 0o644);

        let hook = dir.path().join("hook.sh");
        fs::write(&hook, "#!/bin/sh\necho etcd did not start\nexit 3\n").unwrap();
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
        let failing = installer(dir.path(), &hook.display().to_string());
        let new = files_for(&ca, "m1");
        let error = failing
            .install(&request("m1", "bbbbbbbbbbbbbbbb", new.clone()))
            .unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, InstallError::HookFailed { .. }),
            "{message}"
        );
        assert!(message.contains("exit code 3"), "{message}");
        assert!(message.contains("etcd did not start"), "{message}");
        assert!(message.contains("previous files are back"), "{message}");
        for key in [&new.peer_key, &new.serving_key, &old.serving_key] {
            assert!(!message.contains(key.lines().nth(1).unwrap()), "{message}");
        }
        assert_eq!(
            on_disk(dir.path()),
            before,
            "the previous revision, as it was"
        );
        assert_eq!(
            failing.installed().revision.as_deref(),
            Some("aaaaaaaaaaaaaaaa")
        );
        // The previous revision is kept in the state directory, private.
        let kept = dir.path().join("state/etcd/previous");
        assert_eq!(
            fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
