//! Whether the members keep quorum with one more down ([`Quorum::open`]), from each
//! endpoint's answer ([`EndpointHealth`]).

use super::SKIPPING_FOR_QUORUM;
use super::policy::MemberSpec;
use crate::authority::Certificate;

/// What a member said when asked for its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAnswer {
    /// `/health` said `{"health":"true"}`.
    pub healthy: bool,
    /// The serving certificate it presented.
    pub serving: Option<Certificate>,
    /// Whether it accepted a client certificate signed by the next `etcd-signer` (asked
    /// only during a rotation).
    pub accepts_next: Option<bool>,
}

/// One endpoint of `spec.quorum.endpoints`, and its answer or why there was none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub answer: Result<MemberAnswer, String>,
}

/// How many members are healthy, and which are not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quorum {
    pub members: usize,
    pub healthy: usize,
    /// The unhealthy ones by member name (where an address matches the endpoint's host) or
    /// endpoint, each with why.
    pub unhealthy: Vec<String>,
}

impl Quorum {
    pub fn of(health: &[EndpointHealth], members: &[MemberSpec]) -> Self {
        let unhealthy: Vec<String> = health
            .iter()
            .filter_map(|h| {
                let why = match &h.answer {
                    Ok(answer) if answer.healthy => return None,
                    Ok(_) => "not healthy".to_string(),
                    Err(e) => e.clone(),
                };
                Some(format!("{} ({why})", member_at(&h.endpoint, members)))
            })
            .collect();
        Self {
            members: health.len(),
            healthy: health.len() - unhealthy.len(),
            unhealthy,
        }
    }

    /// Whether etcd keeps quorum with one more member down (for three members: all three
    /// healthy). With fewer than three no member can be lost at all, and every member must be
    /// healthy.
    pub fn open(&self) -> bool {
        if self.members >= 3 {
            self.healthy >= self.members / 2 + 2
        } else {
            self.healthy == self.members && self.members > 0
        }
    }

    pub(super) fn closed_message(&self) -> String {
        format!(
            "{SKIPPING_FOR_QUORUM}: {} of {} members healthy, {} needed to lose one; unhealthy: {}",
            self.healthy,
            self.members,
            if self.members >= 3 {
                self.members / 2 + 2
            } else {
                self.members
            },
            self.unhealthy.join(", ")
        )
    }
}

/// The member whose address is `endpoint`'s host (when only one has it), or the endpoint.
fn member_at(endpoint: &str, members: &[MemberSpec]) -> String {
    let host = endpoint
        .parse::<hyper::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()));
    let found: Vec<&MemberSpec> = host
        .iter()
        .flat_map(|host| {
            members.iter().filter(move |m| {
                m.dns_names.contains(host)
                    || m.ip_addresses.iter().any(|ip| ip.to_string() == *host)
            })
        })
        .collect();
    match found[..] {
        [member] => format!("member {} at {endpoint}", member.name),
        _ => endpoint.to_string(),
    }
}
