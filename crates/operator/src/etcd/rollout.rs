//! Rolling a revision of `etcd-all-certs` onto the members whose nodes run caretaker's agent,
//! as OpenShift's installer controller rolls a static pod revision: one member at a time, the
//! quorum gate checked before each, the next only once the one before answers healthy
//! presenting the new revision's serving certificate. A member whose install failed, whose
//! agent cannot be asked, or that does not come back stops the rollout there: nothing more is
//! restarted until it is fixed, and the next pass resumes.
//!
//! A member's agent is the one at its endpoint (a listed member's `agentEndpoint`, a Node
//! member's `caretaker.dev/agent-endpoint` annotation) whose serving certificate, chaining to
//! `spec.agents.caSecretName`'s CA, names the member (its name or one of its addresses). A
//! member without an endpoint has no agent: `etcd-all-certs` is where caretaker's work for it
//! ends, as before. A member sent files gets only its own ([`member_files`]).
//!
//! Revisions are numbered per object (`status.latestRevision`), one more each time the content
//! hash of `etcd-all-certs` changes, so the status and events read as OpenShift's do.

use std::collections::BTreeMap;

use caretaker_agent_api::etcd::MemberFiles;

use super::{ALL_CERTS_CA_BUNDLE, Role, member_secret};

/// Event reasons and phrases, as OpenShift's installer controller says them.
pub const EVENT_TARGET_CHANGED: &str = "NodeTargetRevisionChanged";
pub const EVENT_CURRENT_CHANGED: &str = "NodeCurrentRevisionChanged";
pub const EVENT_INSTALL_FAILED: &str = "InstallerPodFailed";
/// Degraded (and Ready False) reason while a member's install failed or it does not come back.
pub const REASON_INSTALL_FAILED: &str = "InstallerPodFailed";
/// The phrase runbooks search for (`to T because static pod is ready`).
pub const STATIC_POD_READY: &str = "static pod is ready";

/// The revision being rolled out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its content hash (`caretaker.dev/revision`).
    pub hash: String,
    /// Its number (`status.latestRevision`).
    pub number: i64,
}

/// A member as the rollout sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub name: String,
    /// Its agent's answer: the revision it has installed (`None`: none yet), or why it could
    /// not be asked. `None` when the member has no agent.
    pub agent: Option<Result<Option<String>, String>>,
    /// An endpoint answered healthy presenting this member's serving certificate of the target.
    pub serving_target: bool,
}

impl MemberView {
    /// Whether the member runs the target: it serves it, and its agent (if any) installed it.
    /// A member provisioned from `etcd-all-certs` whose agent has installed nothing yet is
    /// not: serving the target's certificate says nothing of its bundle (a trust revision
    /// changes only that), so its agent installs the target once.
    pub fn at(&self, target: &Target) -> bool {
        self.serving_target
            && match &self.agent {
                None => true,
                Some(Ok(installed)) => installed.as_deref() == Some(target.hash.as_str()),
                Some(Err(_)) => false,
            }
    }
}

/// What the rollout does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Every member with an agent runs the target.
    Done,
    /// Install the target on this member (the gate is open).
    Install(String),
    /// A member waits for the target, but the quorum gate is closed: nothing is restarted.
    Held(String),
    /// Stopped at this member, for this reason: nothing more is restarted.
    Stopped { member: String, why: String },
}

/// The next step of rolling `target` out over `members` (by name), with the gate as asked now.
pub fn next(target: &Target, members: &[MemberView], gate_open: bool) -> Next {
    let mut members: Vec<&MemberView> = members.iter().filter(|m| m.agent.is_some()).collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    // A member that cannot be asked, or that has the target installed and does not answer
    // with it (it did not come back), stops everything: one at a time means none other moves.
    for member in &members {
        match &member.agent {
            Some(Err(why)) => {
                return Next::Stopped {
                    member: member.name.clone(),
                    why: format!("its agent cannot be asked: {why}"),
                };
            }
            Some(Ok(Some(installed))) if *installed == target.hash && !member.serving_target => {
                return Next::Stopped {
                    member: member.name.clone(),
                    why: format!(
                        "revision {} is installed but the member does not answer healthy \
                         presenting its certificate",
                        target.number
                    ),
                };
            }
            _ => {}
        }
    }
    match members.iter().find(|m| !m.at(target)) {
        None => Next::Done,
        Some(member) if gate_open => Next::Install(member.name.clone()),
        Some(member) => Next::Held(member.name.clone()),
    }
}

/// The files of `member` from `etcd-all-certs`' data: its peer and serving pairs and the
/// members' bundle, and nothing else (no other member's key, no metrics or client pair).
pub fn member_files(all: &BTreeMap<String, String>, member: &str) -> Option<MemberFiles> {
    let get = |role: Role, suffix: &str| {
        all.get(&format!("{}.{suffix}", member_secret(role, member)))
            .cloned()
    };
    Some(MemberFiles {
        ca_bundle: all.get(ALL_CERTS_CA_BUNDLE)?.clone(),
        peer_certificate: get(Role::Peer, "crt")?,
        peer_key: get(Role::Peer, "key")?,
        serving_certificate: get(Role::Serving, "crt")?,
        serving_key: get(Role::Serving, "key")?,
    })
}

/// `NodeTargetRevisionChanged`'s message.
pub fn target_changed(member: &str, from: i64, to: i64, because: &str) -> String {
    format!("Updating node {member:?} from revision {from} to {to} because {because}")
}

/// `NodeCurrentRevisionChanged`'s message.
pub fn current_changed(member: &str, from: i64, to: i64) -> String {
    format!("Updated node {member:?} from revision {from} to {to} because {STATIC_POD_READY}")
}

/// `InstallerPodFailed`'s message.
pub fn install_failed(member: &str, revision: i64, count: u32, error: &str) -> String {
    format!("Failed to install revision {revision} count {count} on node {member:?}: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            hash: "bbbbbbbbbbbbbbbb".into(),
            number: 4,
        }
    }

    fn member(name: &str, installed: Option<&str>, serving: bool) -> MemberView {
        MemberView {
            name: name.into(),
            agent: Some(Ok(installed.map(str::to_string))),
            serving_target: serving,
        }
    }

    const OLD: Option<&str> = Some("aaaaaaaaaaaaaaaa");
    const NEW: Option<&str> = Some("bbbbbbbbbbbbbbbb");

    #[test]
    fn one_member_at_a_time_in_name_order_under_the_gate() {
        let members = [
            member("m2", OLD, false),
            member("m0", OLD, false),
            member("m1", OLD, false),
        ];
        assert_eq!(next(&target(), &members, true), Next::Install("m0".into()));
        assert_eq!(next(&target(), &members, false), Next::Held("m0".into()));
        let members = [
            member("m0", NEW, true),
            member("m1", OLD, false),
            member("m2", OLD, false),
        ];
        assert_eq!(next(&target(), &members, true), Next::Install("m1".into()));
        let done = [member("m0", NEW, true), member("m1", NEW, true)];
        assert_eq!(next(&target(), &done, false), Next::Done);
    }

    /// A member that has the target installed but does not come back stops the rollout:
    /// the others are not restarted, even with the gate open.
    #[test]
    fn a_member_that_does_not_come_back_stops_everything() {
        let members = [
            member("m0", NEW, true),
            member("m1", NEW, false),
            member("m2", OLD, false),
        ];
        match next(&target(), &members, true) {
            Next::Stopped { member, why } => {
                assert_eq!(member, "m1");
                assert!(why.contains("revision 4"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let unreachable = [
            member("m0", OLD, false),
            MemberView {
                name: "m1".into(),
                agent: Some(Err("connect: refused".into())),
                serving_target: false,
            },
        ];
        assert!(matches!(
            next(&target(), &unreachable, true),
            Next::Stopped { member, .. } if member == "m1"
        ));
    }

    /// Members without an agent are left to whoever installs them (and are at the target once
    /// they serve it); a member whose agent installed nothing yet is not at the target even
    /// when it serves the target's certificate: a trust revision changes only the bundle.
    #[test]
    fn members_without_agents_are_skipped_and_never_installed_ones_are_installed() {
        let members = [
            MemberView {
                name: "m0".into(),
                agent: None,
                serving_target: false,
            },
            member("m1", None, true),
            member("m2", None, false),
        ];
        assert_eq!(next(&target(), &members, true), Next::Install("m1".into()));
        assert!(!members[1].at(&target()));
        let without_agent = MemberView {
            agent: None,
            serving_target: true,
            ..members[0].clone()
        };
        assert!(without_agent.at(&target()));
    }

    /// The attack: a member is sent another member's key or a client certificate. Only its
    /// own pairs and the bundle go out.
    #[test]
    fn a_member_is_sent_only_its_own_files() {
        let mut all = BTreeMap::new();
        for m in ["m0", "m1", "m10"] {
            for role in Role::MEMBER {
                for suffix in ["crt", "key"] {
                    let key = format!("{}.{suffix}", member_secret(role, m));
                    all.insert(key.clone(), format!("<{key}>"));
                }
            }
        }
        all.insert("ca-bundle.crt".into(), "<bundle>".into());
        all.insert("metrics-ca-bundle.crt".into(), "<metrics bundle>".into());
        let files = member_files(&all, "m1").unwrap();
        let sent = serde_json::to_string(&files).unwrap();
        for other in ["m0", "m10"] {
            assert!(!sent.contains(&format!("-{other}.")), "{other}: {sent}");
        }
        assert!(!sent.contains("metrics"), "{sent}");
        assert_eq!(files.peer_key, "<etcd-peer-m1.key>");
        assert_eq!(files.serving_key, "<etcd-serving-m1.key>");
        assert_eq!(files.ca_bundle, "<bundle>");
        assert!(member_files(&all, "m3").is_none());
    }

    #[test]
    fn the_events_read_as_openshifts() {
        assert_eq!(
            current_changed("m1", 3, 4),
            "Updated node \"m1\" from revision 3 to 4 because static pod is ready"
        );
        assert_eq!(
            target_changed("m1", 3, 4, "revision 4 is the newest"),
            "Updating node \"m1\" from revision 3 to 4 because revision 4 is the newest"
        );
    }
}
