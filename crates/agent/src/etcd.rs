//! The etcd revision installer: on an etcd member's node, writes ONE revision of that member's
//! files (sent by the operator, [`caretaker_agent_api::etcd`]), restarts the member with the
//! configured hook and waits until it answers `/health` presenting the new serving certificate.
//!
//! - Only files for the configured member are taken; another name is refused, nothing written.
//! - All or nothing: every file is checked first (certificates parse, each key matches its
//!   certificate, the bundle holds certificates only), then the files in place are kept as the
//!   previous revision in the state directory (`etcd/previous/`, keys 0600), written whole and
//!   synced under another name and only then swapped in, then a marker (`etcd/installing.json`)
//!   is synced, and only then are the new files staged, synced and renamed into place. A failed
//!   write or a failed hook puts the kept files back.
//! - Crash-safe: a kill at any point leaves the marker; on the agent's start (and before the
//!   next install) [`EtcdInstaller::recover`] removes the staged temporary files and, when the
//!   marker is there and the install was not recorded, puts the kept revision back. It restores
//!   rather than finishes: the agent holds no copy of the new revision's files (the staged ones
//!   may be partial or gone), the kept one is whole and is what the member last ran healthy
//!   with, adjacent revisions trust each other by the rotation's design, and the operator sends
//!   the new revision again (the agent reports the kept one), which then installs with its
//!   restart and health check.
//! - Only regular files are read from the etcd directory and the kept copy: a symlink, FIFO or
//!   device there (or one of more than [`MAX_FILE_BYTES`]) is refused, naming the path.
//! - The health check presents the member's new serving certificate as its client certificate
//!   (serving certificates are issued for both usages) and trusts only the new bundle: no
//!   client certificate is ever sent to a node.
//! - Errors and logs name files and members, never their contents.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use caretaker_agent_api::etcd::{
    InstallOutcome, InstallRequest, Installed, MAX_INSTALL_BYTES, MemberFiles, is_revision,
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
/// The most one file of the etcd directory (or of the kept copy) may hold when read: a
/// member's files are a few KiB, and all of them travel in one install body.
pub const MAX_FILE_BYTES: usize = MAX_INSTALL_BYTES;
/// The kept previous revision, in the state directory; written whole under `KEPT_NEW` first.
const KEPT: &str = "previous";
const KEPT_NEW: &str = "previous.new";
const KEPT_OLD: &str = "previous.old";
/// Present from before the first live file is replaced until the install is recorded (or the
/// kept revision is back): its target revision.
const MARKER: &str = "installing.json";
const CURRENT: &str = "current.json";
const KEPT_RECORD: &str = "revision.json";

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

impl FileNames {
    fn all(&self) -> [&str; 5] {
        [
            &self.ca_bundle,
            &self.peer_certificate,
            &self.peer_key,
            &self.serving_certificate,
            &self.serving_key,
        ]
    }

    fn is_key(&self, name: &str) -> bool {
        name == self.peer_key || name == self.serving_key
    }
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
    #[error("{} is {what}: the etcd installer reads only regular files of at most {MAX_FILE_BYTES} bytes, never through a symlink; nothing was changed", .path.display())]
    NotRegularFile { path: PathBuf, what: String },
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
    /// Tests: the step at which an install stops dead, as a killed agent would.
    #[cfg(test)]
    crash_at: Option<Step>,
}

/// The points of an install a crash can fall between (the tests interrupt each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Step {
    /// The kept revision is whole in `previous/`.
    Kept,
    /// The marker is on disk.
    Marked,
    /// The new files are staged beside the live ones.
    Staged,
    /// This many new files are renamed into place.
    Renamed(usize),
    /// The restart hook ran (successfully).
    HookRan,
    /// The new revision is recorded; the marker not yet removed.
    Recorded,
}

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
            #[cfg(test)]
            crash_at: None,
        }
    }

    /// Stops as a kill would at `step` (tests only): nothing after it runs, nothing is undone.
    fn crash_point(&self, step: Step) {
        #[cfg(test)]
        if self.crash_at == Some(step) {
            panic!("interrupted at {step:?}");
        }
        let _ = step;
    }

    pub fn member(&self) -> &str {
        &self.config.member
    }

    /// The member and the revision in place.
    pub fn installed(&self) -> Installed {
        Installed {
            member: self.config.member.clone(),
            revision: read_record(&self.state_dir.join(CURRENT)),
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
        // An install interrupted before this one: one whole revision first.
        self.recover()?;
        let new = self.files_of(&request.files);
        let previous_revision = self.installed().revision;
        let mut in_place = previous_revision.as_deref() == Some(request.revision.as_str());
        for file in &new {
            let found = read_regular(&self.config.dir.join(&file.name))?;
            in_place &= found.is_some_and(|(contents, _)| contents == file.contents);
        }
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

    /// Keeps the files in place as the previous revision, marks the install, writes `new`,
    /// runs the restart hook and records `revision`; a failed write or hook puts the kept
    /// files back.
    fn replace(
        &self,
        new: &[MemberFile],
        previous_revision: Option<&str>,
        revision: &str,
    ) -> Result<HookOutcome, InstallError> {
        let dir = &self.config.dir;
        fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
        self.keep_previous(new, previous_revision)?;
        self.crash_point(Step::Kept);
        files::write_atomic(&self.state_dir.join(MARKER), &record_of(revision), 0o600)
            .map_err(io("cannot mark the install"))?;
        self.crash_point(Step::Marked);
        if let Err(e) = self.write_live(new) {
            let restored = self.restore_kept();
            return Err(io(format!("cannot write the new files ({restored})"))(e));
        }
        let outcome = run_blocking(&self.config.restart, None, self.config.restart_timeout);
        self.crash_point(Step::HookRan);
        if !outcome.success {
            let restored = self.restore_kept();
            tracing::warn!(member = %self.config.member, revision, "the etcd restart hook failed; {restored}");
            return Err(InstallError::HookFailed { outcome, restored });
        }
        self.record(Some(revision))?;
        self.crash_point(Step::Recorded);
        self.unmark()?;
        Ok(outcome)
    }

    /// Stages every new file, then renames each into place, then syncs the directory.
    fn write_live(&self, new: &[MemberFile]) -> std::io::Result<()> {
        let dir = &self.config.dir;
        let staged = files::stage_all(dir, &to_write(new))?;
        self.crash_point(Step::Staged);
        let mut renamed = 0;
        let result = (|| {
            for file in &staged {
                fs::rename(&file.temp, &file.target)?;
                renamed += 1;
                self.crash_point(Step::Renamed(renamed));
            }
            File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            for file in &staged[renamed..] {
                let _ = fs::remove_file(&file.temp);
            }
        }
        result
    }

    /// Keeps the member's files in place (those that exist) as `previous/`, with the revision
    /// they are: written whole and synced as `previous.new/`, then swapped in, so that the
    /// kept revision is never a half-written one.
    fn keep_previous(
        &self,
        new: &[MemberFile],
        revision: Option<&str>,
    ) -> Result<(), InstallError> {
        let mut kept = Vec::new();
        for file in new {
            if let Some((contents, mode)) = read_regular(&self.config.dir.join(&file.name))? {
                kept.push((file.name.clone(), contents, self.mode_of(&file.name, mode)));
            }
        }
        let state = &self.state_dir;
        let staging = state.join(KEPT_NEW);
        remove_tree(&staging).map_err(io("cannot remove a half-kept revision"))?;
        fs::create_dir_all(&staging).map_err(io("cannot keep the previous revision"))?;
        fs::set_permissions(state, fs::Permissions::from_mode(0o700))
            .and_then(|()| fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)))
            .map_err(io("cannot restrict the kept revision"))?;
        let record = record_of(revision.unwrap_or_default());
        let mut copies: Vec<FileToWrite<'_>> = (kept.iter())
            .map(|(name, contents, mode)| FileToWrite {
                name,
                contents,
                mode: *mode,
            })
            .collect();
        copies.push(FileToWrite {
            name: KEPT_RECORD,
            contents: &record,
            mode: 0o600,
        });
        files::write_all(&staging, &copies).map_err(io("cannot keep the previous revision"))?;
        let (current, old) = (state.join(KEPT), state.join(KEPT_OLD));
        remove_tree(&old).map_err(io("cannot remove the older kept revision"))?;
        let swapped = (|| {
            if current.exists() {
                fs::rename(&current, &old)?;
            }
            fs::rename(&staging, &current)?;
            File::open(state)?.sync_all()
        })();
        swapped.map_err(io("cannot keep the previous revision"))?;
        remove_tree(&old).map_err(io("cannot remove the older kept revision"))
    }

    /// Keys are 0600 whatever mode they were found with.
    fn mode_of(&self, name: &str, found: u32) -> u32 {
        if self.config.names.is_key(name) {
            files::PRIVATE_KEY_MODE
        } else {
            found
        }
    }

    /// Puts the kept revision back in place (removing the member's files it did not have),
    /// records it as the installed one and removes the marker; says what it did. On failure
    /// the marker stays, so that the next start or install tries again.
    fn restore_kept(&self) -> String {
        match self.try_restore_kept() {
            Ok(()) => "the previous files are back in place".into(),
            Err(e) => format!(
                "putting the previous files back FAILED ({e}); they are kept in {}",
                self.state_dir.join(KEPT).display()
            ),
        }
    }

    fn try_restore_kept(&self) -> Result<(), InstallError> {
        let kept = self.state_dir.join(KEPT);
        let dir = &self.config.dir;
        let mut back = Vec::new();
        let mut absent = Vec::new();
        for name in self.config.names.all() {
            match read_regular(&kept.join(name))? {
                Some((contents, mode)) => back.push((name, contents, self.mode_of(name, mode))),
                None => absent.push(name),
            }
        }
        let files: Vec<FileToWrite<'_>> = (back.iter())
            .map(|(name, contents, mode)| FileToWrite {
                name,
                contents,
                mode: *mode,
            })
            .collect();
        files::write_all(dir, &files).map_err(io("cannot write the kept files"))?;
        for name in absent {
            match files::remove_file_securely(&dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(format!("cannot remove {name}"))(e));
                }
                _ => {}
            }
        }
        self.record(read_record(&kept.join(KEPT_RECORD)).as_deref())?;
        self.unmark()
    }

    /// Makes the member's files one whole revision again after an install was interrupted (a
    /// crash, a kill, a restore that failed): removes the staged temporary files, finishes or
    /// undoes the swap of the kept revision and, if the marker is there and its revision was
    /// not recorded, puts the kept revision back. Run on the agent's start and before each
    /// install; returns what it did, for the log.
    pub fn recover(&self) -> Result<Vec<String>, InstallError> {
        let mut did = Vec::new();
        let dir = &self.config.dir;
        let removed = files::remove_staged_leftovers(dir, &self.config.names.all()).map_err(io(
            format!("cannot remove staged files in {}", dir.display()),
        ))?;
        if !removed.is_empty() {
            did.push(format!(
                "removed {} staged file(s) of an interrupted write",
                removed.len()
            ));
        }
        let state = &self.state_dir;
        files::remove_staged_leftovers(state, &[CURRENT, MARKER])
            .map_err(io("cannot remove staged records"))?;
        let (kept, old) = (state.join(KEPT), state.join(KEPT_OLD));
        remove_tree(&state.join(KEPT_NEW)).map_err(io("cannot remove a half-kept revision"))?;
        if !kept.exists() && old.exists() {
            // The swap was interrupted between its renames: the older copy is whole.
            fs::rename(&old, &kept).map_err(io("cannot put the kept revision back"))?;
        }
        remove_tree(&old).map_err(io("cannot remove the older kept revision"))?;
        let Some(target) = read_record(&state.join(MARKER)) else {
            return Ok(did);
        };
        if self.installed().revision.as_deref() == Some(target.as_str()) {
            self.unmark()?;
            did.push(format!("the install of revision {target} had finished"));
            return Ok(did);
        }
        self.try_restore_kept()?;
        let kept_revision = self.installed().revision.unwrap_or_else(|| "none".into());
        did.push(format!(
            "the install of revision {target} was interrupted; the kept revision ({kept_revision}) is back in place"
        ));
        Ok(did)
    }

    fn unmark(&self) -> Result<(), InstallError> {
        match fs::remove_file(self.state_dir.join(MARKER)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io("cannot remove the install marker")(e))
            }
            _ => File::open(&self.state_dir)
                .and_then(|d| d.sync_all())
                .map_err(io("cannot remove the install marker")),
        }
    }

    /// Records `revision` as installed (`None`: nothing installed by the agent).
    fn record(&self, revision: Option<&str>) -> Result<(), InstallError> {
        let path = self.state_dir.join(CURRENT);
        let written = match revision.filter(|r| !r.is_empty()) {
            Some(revision) => files::write_atomic(&path, &record_of(revision), 0o600),
            None => match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        written.map_err(io("cannot record the installed revision"))
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

fn record_of(revision: &str) -> Vec<u8> {
    serde_json::to_vec(&Record {
        revision: revision.to_string(),
    })
    .expect("records serialize")
}

/// Removes the tree at `path` (securely) if it is there.
fn remove_tree(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(_) => files::remove_dir_all_securely(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The contents and mode of the regular file at `path`, `None` if there is none. A symlink
/// (to anything), FIFO, socket or device is refused and never opened through; the file is
/// opened without following a symlink and without blocking, checked again once open, and
/// read no further than [`MAX_FILE_BYTES`].
fn read_regular(path: &Path) -> Result<Option<(Vec<u8>, u32)>, InstallError> {
    let refuse = |what: &str| InstallError::NotRegularFile {
        path: path.to_path_buf(),
        what: what.to_string(),
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
    };
    if !meta.file_type().is_file() {
        return Err(refuse(kind_of(meta.file_type())));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("a symlink"),
            _ => io(format!("cannot read {}", path.display()))(e),
        })?;
    let meta = file
        .metadata()
        .map_err(io(format!("cannot read {}", path.display())))?;
    if !meta.file_type().is_file() {
        return Err(refuse(kind_of(meta.file_type())));
    }
    let mut contents = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut contents)
        .map_err(io(format!("cannot read {}", path.display())))?;
    if contents.len() > MAX_FILE_BYTES {
        return Err(refuse("over the size limit"));
    }
    Ok(Some((contents, meta.permissions().mode() & 0o777)))
}

fn kind_of(file_type: fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
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

    /// Every file under `dir` (recursively) whose name marks a staged temporary file.
    fn staged_leftovers(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                found.extend(staged_leftovers(&path));
            } else if entry.file_name().to_string_lossy().contains(".tmp-") {
                found.push(path);
            }
        }
        found
    }

    /// The revision `files` as they sit in the kubeadm layout.
    fn as_on_disk(files: &MemberFiles) -> BTreeMap<String, (Vec<u8>, u32)> {
        [
            ("ca.crt", &files.ca_bundle, 0o644),
            ("peer.crt", &files.peer_certificate, 0o644),
            ("peer.key", &files.peer_key, 0o600),
            ("server.crt", &files.serving_certificate, 0o644),
            ("server.key", &files.serving_key, 0o600),
        ]
        .into_iter()
        .map(|(name, contents, mode)| (name.to_string(), (contents.as_bytes().to_vec(), mode)))
        .collect()
    }

    /// Installs revision A (its health wait fails: no member listens, but A is recorded).
    fn installed_a(dir: &Path, ca: &CertificateAuthority) -> MemberFiles {
        let a = files_for(ca, "m1");
        let first = installer(dir, "true").install(&request("m1", "aaaaaaaaaaaaaaaa", a.clone()));
        assert!(
            matches!(first, Err(InstallError::NotHealthy { .. })),
            "{first:?}"
        );
        a
    }

    /// The attack: the agent is killed in the middle of installing revision B, at each step in
    /// turn. After a restart the etcd directory holds one whole revision (A, or B when B was
    /// already recorded), no staged temporary file is left anywhere, the keys are 0600, the
    /// reported revision is the one on disk, and the kept revision is A, whole: a retry of B
    /// whose hook fails puts A back, not a mix (the code before kept the half-installed files
    /// as "previous" on the retry and left the staged keys behind).
    #[test]
    fn an_install_killed_at_any_step_leaves_one_whole_revision_after_a_restart() {
        let steps = [
            Step::Kept,
            Step::Marked,
            Step::Staged,
            Step::Renamed(1),
            Step::Renamed(2),
            Step::Renamed(3),
            Step::Renamed(4),
            Step::Renamed(5),
            Step::HookRan,
            Step::Recorded,
        ];
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        let hook = tempfile::tempdir().unwrap();
        let failing_hook = hook.path().join("fail.sh");
        fs::write(&failing_hook, "#!/bin/sh\nexit 1\n").unwrap();
        fs::set_permissions(&failing_hook, fs::Permissions::from_mode(0o755)).unwrap();
        for step in steps {
            let dir = tempfile::tempdir().unwrap();
            let a = installed_a(dir.path(), &ca);
            let b = files_for(&ca, "m1");
            let mut crashing = installer(dir.path(), "true");
            crashing.crash_at = Some(step);
            let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crashing.install(&request("m1", "bbbbbbbbbbbbbbbb", b.clone()))
            }));
            assert!(killed.is_err(), "{step:?}: the install was interrupted");

            // The agent starts again.
            let restarted = installer(dir.path(), "true");
            let did = restarted.recover().unwrap();
            let (expected, revision) = if step == Step::Recorded {
                (&b, "bbbbbbbbbbbbbbbb")
            } else {
                (&a, "aaaaaaaaaaaaaaaa")
            };
            assert_eq!(
                on_disk(dir.path()),
                as_on_disk(expected),
                "{step:?}: {did:?}"
            );
            assert_eq!(
                restarted.installed().revision.as_deref(),
                Some(revision),
                "{step:?}"
            );
            assert_eq!(
                staged_leftovers(dir.path()),
                Vec::<PathBuf>::new(),
                "{step:?}"
            );
            assert!(
                !dir.path().join("state/etcd").join(MARKER).exists(),
                "{step:?}"
            );
            if step == Step::Recorded {
                continue;
            }
            // The kept revision was not overwritten by the half-installed files.
            let retry = installer(dir.path(), &failing_hook.display().to_string());
            let error = retry
                .install(&request("m1", "bbbbbbbbbbbbbbbb", b.clone()))
                .unwrap_err();
            assert!(
                matches!(error, InstallError::HookFailed { .. }),
                "{step:?}: {error}"
            );
            assert_eq!(
                on_disk(dir.path()),
                as_on_disk(&a),
                "{step:?}: after the retry"
            );
            assert_eq!(
                staged_leftovers(dir.path()),
                Vec::<PathBuf>::new(),
                "{step:?}"
            );
        }
    }

    /// A kill between the two renames that swap the kept revision leaves only the older copy,
    /// under its temporary name: the restart puts it back as the kept revision.
    #[test]
    fn a_kill_while_swapping_the_kept_revision_keeps_the_older_copy() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        installed_a(dir.path(), &ca);
        let state = dir.path().join("state/etcd");
        fs::rename(state.join(KEPT), state.join(KEPT_OLD)).unwrap();
        fs::create_dir(state.join(KEPT_NEW)).unwrap();
        fs::write(state.join(KEPT_NEW).join("ca.crt"), "half").unwrap();
        installer(dir.path(), "true").recover().unwrap();
        assert!(state.join(KEPT).join(KEPT_RECORD).exists());
        assert!(!state.join(KEPT_OLD).exists());
        assert!(!state.join(KEPT_NEW).exists());
    }

    /// The attack: the etcd directory's files are a symlink to a file outside it, a FIFO (a
    /// read would block the install, and the node's one file-work slot, for ever) and a symlink
    /// to /dev/zero (a read would fill the memory). Each is refused with an error naming it;
    /// nothing is followed, copied into the kept revision or written. The code before read
    /// through each.
    #[test]
    fn symlinks_fifos_and_devices_in_the_etcd_directory_are_refused() {
        let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
        let outside_secret = "a file outside the etcd directory";
        type Plant = fn(&Path, &Path);
        let plants: [(&str, &str, Plant); 4] = [
            ("server.key", "a symlink", |path, outside| {
                std::os::unix::fs::symlink(outside, path).unwrap()
            }),
            ("ca.crt", "a FIFO", |path, _| {
                let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
            ("peer.key", "a symlink", |path, _| {
                std::os::unix::fs::symlink("/dev/zero", path).unwrap()
            }),
            ("peer.crt", "over the size limit", |path, _| {
                fs::write(path, vec![b'a'; MAX_FILE_BYTES + 1]).unwrap()
            }),
        ];
        for (name, what, plant) in plants {
            let dir = tempfile::tempdir().unwrap();
            let outside = dir.path().join("outside");
            fs::write(&outside, outside_secret).unwrap();
            fs::create_dir_all(dir.path().join("pki")).unwrap();
            let planted = dir.path().join("pki").join(name);
            plant(&planted, &outside);
            let marker = dir.path().join("hook-ran");
            let installer = installer(dir.path(), &format!("touch {}", marker.display()));
            let error = installer
                .install(&request("m1", "bbbbbbbbbbbbbbbb", files_for(&ca, "m1")))
                .unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, InstallError::NotRegularFile { .. }),
                "{name}: {message}"
            );
            assert!(
                message.contains(&planted.display().to_string()),
                "{message}"
            );
            assert!(message.contains(what), "{message}");
            assert!(!marker.exists(), "{name}: no restart");
            assert_eq!(fs::read_to_string(&outside).unwrap(), outside_secret);
            let kept = dir.path().join("state/etcd").join(KEPT);
            assert!(!kept.exists(), "{name}: nothing kept");
            let written = fs::read_dir(dir.path().join("pki")).unwrap().count();
            assert_eq!(written, 1, "{name}: nothing written beside it");
        }
    }
}
