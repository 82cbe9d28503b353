//! The bodies of an etcd revision install: the operator sends a member's agent ONE revision of
//! that member's own files (its peer and serving pairs and the trusted CA bundle; never another
//! member's key, never a client certificate), and the agent writes them all or nothing,
//! restarts its member and answers once the member is healthy with them.

use serde::{Deserialize, Serialize};

use crate::refresh::HookOutcome;

/// The most an install body may hold. A member's files are a few KiB (two pairs and a bundle
/// of a few CAs); anything larger is refused before it is read.
pub const MAX_INSTALL_BYTES: usize = 64 * 1024;

/// The reason of a refusal because the files are for another member (403).
pub const WRONG_MEMBER: &str = "WrongMember";
/// The reason of a failed restart hook (the previous files are back in place).
pub const HOOK_FAILED: &str = "HookFailed";
/// The reason of a member that did not answer `/health` with the new certificate in time.
pub const NOT_HEALTHY: &str = "NotHealthy";

/// Body of `POST /v1/etcd/revisions`: one revision of one member's files.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallRequest {
    /// The member the files are for; the agent refuses any name but its own.
    pub member: String,
    /// The revision's content hash (`caretaker.dev/revision` of `etcd-all-certs`): 16 hex digits.
    pub revision: String,
    pub files: MemberFiles,
}

impl std::fmt::Debug for InstallRequest {
    // The files hold private keys: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallRequest")
            .field("member", &self.member)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

/// A member's files, PEM.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberFiles {
    /// The CAs the member trusts for peers and clients (`etcd-all-certs`' `ca-bundle.crt`).
    pub ca_bundle: String,
    pub peer_certificate: String,
    pub peer_key: String,
    pub serving_certificate: String,
    pub serving_key: String,
}

impl std::fmt::Debug for MemberFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberFiles").finish_non_exhaustive()
    }
}

/// What an install did: the revision is in place and the member answered `/health` presenting
/// its new serving certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallOutcome {
    pub member: String,
    pub revision: String,
    /// The revision installed before (kept on the node for rollback).
    pub previous_revision: Option<String>,
    pub restart: HookOutcome,
    /// From the hook's end until the member answered healthy with the new certificate.
    pub healthy_after_ms: u64,
    /// `/health` asks that failed before the member answered (it was restarting).
    pub health_retries: u32,
}

/// Body of `GET /v1/etcd`: the member this agent installs for and the revision in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    pub member: String,
    /// `None` until the agent installed a revision.
    pub revision: Option<String>,
}

/// The most of a hook's output an agent sends back (the last 4 KiB, and a note of what was
/// cut).
pub const MAX_OUTPUT_TAIL_BYTES: usize = 8 * 1024;

/// The longest member name an agent may give (a DNS name's, as Node names are); a longer one
/// is refused, never repeated.
pub const MAX_MEMBER_NAME_BYTES: usize = 253;

/// Why an agent's `member` is out of shape, if it is.
fn check_member(member: &str) -> Result<(), String> {
    if member.len() > MAX_MEMBER_NAME_BYTES {
        return Err(format!(
            "the agent's member name is {} bytes, over the {MAX_MEMBER_NAME_BYTES} a member name may have",
            member.len()
        ));
    }
    Ok(())
}

fn check_revision(what: &str, revision: Option<&str>) -> Result<(), String> {
    match revision {
        Some(revision) if !is_revision(revision) => Err(format!(
            "the agent's {what} is not a revision (16 lowercase hex digits)"
        )),
        _ => Ok(()),
    }
}

impl Installed {
    /// Whether the answer has the shape an agent's must: a bounded member name, a revision.
    pub fn check(&self) -> Result<(), String> {
        check_member(&self.member)?;
        check_revision("installed revision", self.revision.as_deref())
    }
}

impl InstallOutcome {
    /// As [`Installed::check`], and the hook's output tail no longer than an agent keeps
    /// ([`MAX_OUTPUT_TAIL_BYTES`]).
    pub fn check(&self) -> Result<(), String> {
        check_member(&self.member)?;
        if self.restart.output_tail.len() > MAX_OUTPUT_TAIL_BYTES {
            return Err(format!(
                "the agent's hook output is {} bytes, over the {MAX_OUTPUT_TAIL_BYTES} an agent keeps",
                self.restart.output_tail.len()
            ));
        }
        check_revision("installed revision", Some(&self.revision))?;
        check_revision("previous revision", self.previous_revision.as_deref())
    }
}

/// Whether `revision` has the shape of a content hash (16 lowercase hex digits).
pub fn is_revision(revision: &str) -> bool {
    revision.len() == 16
        && revision
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
