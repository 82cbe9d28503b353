//! Who the members are: the listed ones and the selected Nodes', each checked as a listed one
//! is ([`super::policy::member_spec`]: anyone who may write a Node chooses its name and
//! addresses), and none whose Secrets would be another's.
//!
//! A member's name goes into its Secrets' names, and `etcd-serving-` is a prefix of
//! `etcd-serving-metrics-`: member `metrics-m0`'s serving Secret is member `m0`'s metrics
//! serving Secret. Two members issuing one Secret would each replace the other's certificate on
//! every pass. So candidates are taken in a fixed order and one whose Secrets are already
//! another member's, or one of the cluster's fixed Secrets, is refused: listed members before
//! Nodes, then those `etcd-all-certs` already holds (a new Node cannot displace a running
//! member), then shorter names first (of `m0` and `metrics-m0`, `m0` keeps its Secrets), then
//! by name. A refused candidate never stops the others: they are members as if it did not
//! exist.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::policy::{EtcdPolicy, MemberSpec};
use super::{
    ALL_CERTS, CLIENT_SECRET, METRICS_CLIENT_SECRET, METRICS_SIGNER_SECRET, Role, SIGNER_SECRET,
    member_secret,
};
use crate::validation::SpecError;

/// Where a would-be member comes from. Listed members come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    Listed,
    Node,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Listed => "listed member",
            Origin::Node => "Node",
        })
    }
}

/// A would-be member: its name, where it comes from, and it checked (or why it is not valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub origin: Origin,
    pub checked: Result<MemberSpec, SpecError>,
}

/// Who has a Secret name already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Member {
        name: String,
        origin: Origin,
    },
    /// A signer, a client certificate, the health checks' client Secret or `etcd-all-certs`.
    Fixed,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Member { name, origin } => write!(f, "already {origin} {name:?}'s"),
            Owner::Fixed => f.write_str("one of the cluster's own Secrets"),
        }
    }
}

/// Why a candidate is not a member. Names it and, for a collision, the member it collides with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{origin} {name:?} is not a member: {problems}")]
    Invalid {
        name: String,
        origin: Origin,
        problems: SpecError,
    },
    #[error("{origin} {name:?} is not a member: its Secret {secret:?} is {owner}")]
    Collides {
        name: String,
        origin: Origin,
        secret: String,
        owner: Owner,
    },
}

impl Refusal {
    pub fn name(&self) -> &str {
        match self {
            Refusal::Invalid { name, .. } | Refusal::Collides { name, .. } => name,
        }
    }
}

/// The members, by name, and the candidates refused, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub members: Vec<MemberSpec>,
    pub refused: Vec<Refusal>,
}

impl Membership {
    /// Every refusal, for the Degraded condition; `None` when there is none.
    pub fn refused_message(&self) -> Option<String> {
        (!self.refused.is_empty()).then(|| {
            (self.refused.iter())
                .map(Refusal::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

/// A member's three Secret names, in `etcd-all-certs` order.
pub fn member_secrets(member: &str) -> [String; 3] {
    Role::MEMBER.map(|role| member_secret(role, member))
}

/// The Secrets no member may have: the signers, the client certificates, `etcd-all-certs`, and
/// the Secret the health checks present.
pub fn fixed_secrets(policy: &EtcdPolicy) -> BTreeSet<String> {
    [
        SIGNER_SECRET,
        METRICS_SIGNER_SECRET,
        CLIENT_SECRET,
        METRICS_CLIENT_SECRET,
        ALL_CERTS,
        policy.client_secret.as_str(),
    ]
    .into_iter()
    .map(str::to_string)
    .collect()
}

/// The members among `candidates` (see the module's comment for the order), given the members
/// `etcd-all-certs` holds now (`incumbents`) and the Secrets no member may have (`fixed`). A
/// Node of a listed member's name is that member (the listing wins) and is not refused.
pub fn choose(
    candidates: Vec<Candidate>,
    incumbents: &BTreeSet<String>,
    fixed: &BTreeSet<String>,
) -> Membership {
    let listed: BTreeSet<String> = (candidates.iter())
        .filter(|c| c.origin == Origin::Listed)
        .map(|c| c.name.clone())
        .collect();
    let mut candidates: Vec<Candidate> = (candidates.into_iter())
        .filter(|c| c.origin == Origin::Listed || !listed.contains(&c.name))
        .collect();
    candidates.sort_by(|a, b| {
        let key = |c: &Candidate| (c.origin, !incumbents.contains(&c.name), c.name.len());
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
    });
    let mut owners: BTreeMap<String, Owner> = fixed
        .iter()
        .map(|name| (name.clone(), Owner::Fixed))
        .collect();
    let mut membership = Membership::default();
    for Candidate {
        name,
        origin,
        checked,
    } in candidates
    {
        let member = match checked {
            Ok(member) => member,
            Err(problems) => {
                membership.refused.push(Refusal::Invalid {
                    name,
                    origin,
                    problems,
                });
                continue;
            }
        };
        let secrets = member_secrets(&member.name);
        if let Some((secret, owner)) =
            (secrets.iter()).find_map(|s| owners.get(s).map(|owner| (s.clone(), owner.clone())))
        {
            membership.refused.push(Refusal::Collides {
                name,
                origin,
                secret,
                owner,
            });
            continue;
        }
        for secret in secrets {
            let owner = Owner::Member {
                name: name.clone(),
                origin,
            };
            owners.insert(secret, owner);
        }
        membership.members.push(member);
    }
    membership.members.sort_by(|a, b| a.name.cmp(&b.name));
    membership.refused.sort_by(|a, b| a.name().cmp(b.name()));
    membership
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::etcd::policy::member_spec;

    fn candidate(origin: Origin, name: &str, addresses: &[&str]) -> Candidate {
        let addresses: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
        let at = |i: usize| format!("status.addresses[{i}].address");
        Candidate {
            name: name.to_string(),
            origin,
            checked: member_spec("metadata.name", name, &at, &addresses),
        }
    }

    fn node(name: &str) -> Candidate {
        candidate(Origin::Node, name, &["10.0.0.1"])
    }

    fn fixed() -> BTreeSet<String> {
        [
            "etcd-signer",
            "etcd-metric-signer",
            "etcd-client",
            "etcd-metric-client",
            "etcd-all-certs",
        ]
        .map(String::from)
        .into()
    }

    fn names(membership: &Membership) -> Vec<&str> {
        membership.members.iter().map(|m| m.name.as_str()).collect()
    }

    /// The attack: a Node named after a member's metrics serving Secret.
    #[test]
    fn a_node_named_metrics_member_is_refused_naming_both() {
        let listed = candidate(Origin::Listed, "m0", &["10.0.0.1"]);
        let chosen = choose(vec![node("metrics-m0"), listed], &BTreeSet::new(), &fixed());
        assert_eq!(names(&chosen), ["m0"]);
        assert_eq!(
            chosen.refused_message().unwrap(),
            "Node \"metrics-m0\" is not a member: its Secret \"etcd-serving-metrics-m0\" is \
             already listed member \"m0\"'s"
        );
    }

    /// Among Nodes, a running member keeps its Secrets; else the shorter name does.
    #[test]
    fn a_running_member_is_never_displaced_and_else_the_shorter_name_wins() {
        let fresh = choose(
            vec![node("metrics-n0"), node("n0")],
            &BTreeSet::new(),
            &fixed(),
        );
        assert_eq!(names(&fresh), ["n0"]);
        let running = choose(
            vec![node("metrics-n0"), node("n0")],
            &["metrics-n0".to_string()].into(),
            &fixed(),
        );
        assert_eq!(names(&running), ["metrics-n0"]);
        assert_eq!(running.refused[0].name(), "n0");
    }

    /// The attack: a non-ASCII address (no DNS name, no IA5String) refuses that Node alone.
    #[test]
    fn a_bad_address_refuses_only_its_node() {
        let chosen = choose(
            vec![
                candidate(Origin::Node, "cp-1", &["10.0.0.2", "nœud.example"]),
                node("cp-0"),
            ],
            &BTreeSet::new(),
            &fixed(),
        );
        assert_eq!(names(&chosen), ["cp-0"]);
        let message = chosen.refused_message().unwrap();
        assert!(
            message.starts_with(
                "Node \"cp-1\" is not a member: status.addresses[1].address: \"nœud.example\" \
                 is not a DNS name"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_node_of_a_listed_members_name_is_that_member() {
        let chosen = choose(
            vec![
                candidate(Origin::Node, "m0", &["bad address"]),
                candidate(Origin::Listed, "m0", &["10.0.0.1"]),
            ],
            &BTreeSet::new(),
            &fixed(),
        );
        assert_eq!(names(&chosen), ["m0"]);
        assert!(chosen.refused.is_empty());
        assert_eq!(
            chosen.members[0].ip_addresses,
            ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn the_health_checks_client_secret_is_no_members() {
        let mut fixed = fixed();
        fixed.insert("etcd-peer-n0".into());
        let chosen = choose(vec![node("n0"), node("n1")], &BTreeSet::new(), &fixed);
        assert_eq!(names(&chosen), ["n1"]);
        assert!(matches!(
            &chosen.refused[0],
            Refusal::Collides { owner: Owner::Fixed, secret, .. } if secret == "etcd-peer-n0"
        ));
    }

    /// Names from a few letters, with and without `metrics-` (collisions are common), and some
    /// that are no DNS label.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "(metrics-){0,2}[ab][0-1]?",
            1 => "[ab]\\.[ab]|[AB]|-a",
        ]
    }

    fn address() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => Just("10.0.0.1".to_string()),
            3 => Just("a.example".to_string()),
            1 => Just("nœud.example".to_string()),
            1 => Just("a b".to_string()),
        ]
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec(
            (
                name(),
                prop::bool::weighted(0.2),
                prop::collection::vec(address(), 0..3),
            ),
            0..8,
        )
        .prop_map(|raw| {
            let mut seen = BTreeSet::new();
            raw.into_iter()
                // Names are unique per origin (a spec with a name twice is refused whole; the
                // API server keeps Node names unique).
                .filter(|(name, listed, _)| seen.insert((name.clone(), *listed)))
                .map(|(name, listed, addresses)| {
                    let origin = if listed { Origin::Listed } else { Origin::Node };
                    let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
                    candidate(origin, &name, &addresses)
                })
                // Listed members are valid: a spec with a bad one is refused whole.
                .filter(|c| c.origin == Origin::Node || c.checked.is_ok())
                .collect()
        })
    }

    proptest! {
        /// For any candidates: the members' Secret names are pairwise distinct and none is a
        /// fixed one; every candidate is a member, refused, or a listed member's Node; a
        /// collision names a member; and the invalid candidates change nothing about who the
        /// others are.
        #[test]
        fn members_never_share_a_secret_and_a_bad_candidate_blocks_no_other(
            candidates in candidates(),
            incumbents in prop::collection::btree_set(name(), 0..3),
        ) {
            let chosen = choose(candidates.clone(), &incumbents, &fixed());
            let mut secrets = BTreeSet::new();
            for member in &chosen.members {
                for secret in member_secrets(&member.name) {
                    prop_assert!(!fixed().contains(&secret), "{secret}");
                    prop_assert!(secrets.insert(secret.clone()), "{secret} twice");
                }
            }
            let listed: BTreeSet<&str> = candidates.iter()
                .filter(|c| c.origin == Origin::Listed)
                .map(|c| c.name.as_str())
                .collect();
            let decided = chosen.members.len() + chosen.refused.len();
            let shadowed = candidates.iter()
                .filter(|c| c.origin == Origin::Node && listed.contains(c.name.as_str()))
                .count();
            prop_assert_eq!(decided + shadowed, candidates.len());
            let members: BTreeSet<&str> = names(&chosen).into_iter().collect();
            for refusal in &chosen.refused {
                if let Refusal::Collides { owner: Owner::Member { name, .. }, .. } = refusal {
                    prop_assert!(members.contains(name.as_str()), "{refusal}");
                }
            }
            let valid: Vec<Candidate> = candidates.iter()
                .filter(|c| c.checked.is_ok())
                .cloned()
                .collect();
            let without_invalid = choose(valid, &incumbents, &fixed());
            prop_assert_eq!(&chosen.members, &without_invalid.members);
        }

        /// Members `etcd-all-certs` holds, valid and sharing no Secret among themselves or
        /// with a listed member, stay members whatever Nodes appear.
        #[test]
        fn no_new_node_displaces_a_running_member(
            candidates in candidates(),
            newcomers in prop::collection::vec(name(), 0..4),
        ) {
            let before = choose(candidates.clone(), &BTreeSet::new(), &fixed());
            let running: BTreeSet<String> = before.members.iter().map(|m| m.name.clone()).collect();
            let mut more = candidates;
            let taken: BTreeSet<String> = more.iter().map(|c| c.name.clone()).collect();
            more.extend(newcomers.iter().filter(|n| !taken.contains(*n)).map(|n| node(n)));
            let after = choose(more, &running, &fixed());
            for member in &before.members {
                prop_assert!(after.members.contains(member), "{} displaced", member.name);
            }
        }
    }
}
