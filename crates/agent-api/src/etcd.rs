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

/// Whether `revision` has the shape of a content hash (16 lowercase hex digits).
pub fn is_revision(revision: &str) -> bool {
    revision.len() == 16
        && revision
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
