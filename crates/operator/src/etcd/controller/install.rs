//! The rollout's glue ([`crate::etcd::rollout`]): asks each member's agent what it has
//! installed, asks the members for their health, and carries out the plan's next step, again
//! and again until it is done, held or stopped: one member at a time, the gate asked before
//! each, each install verified by the operator itself (the member answers healthy presenting
//! the new serving certificate) before the next.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use caretaker_agent_api::client::AgentClient;
use caretaker_agent_api::etcd::InstallRequest;
use caretaker_agent_api::tls::ClientIdentity;
use caretaker_api::names;
use caretaker_api::v1alpha1::{EtcdCertificates, EtcdCertificatesStatus, MemberStatus};
use caretaker_pki::{CertificateAuthority, LeafSpec, Ttl, Usage};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Resource, ResourceExt};

use super::Shared;
use super::health::Asker;
use crate::authority::Certificate;
use crate::changes::Event;
use crate::context::Context;
use crate::credentials::OPERATOR_CLIENT_NAME;
use crate::etcd::policy::{EtcdPolicy, MemberSpec};
use crate::etcd::rollout::{self, MemberView, Next, Target};
use crate::etcd::{
    self, EndpointHealth, EtcdObserved, EtcdPlan, EtcdStep, Quorum, Role, member_secret,
};

/// How long an install may take: the agent's restart hook and its health wait (2 min each by
/// default) and some slack.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long asking an agent what it has installed may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a rollout pass did.
#[derive(Debug, Default)]
pub(super) struct Rolled {
    /// Where the rollout stopped, and why.
    pub stopped: Option<(String, String)>,
    /// A member waits for the gate: the member, and the gate's message.
    pub held: Option<(String, String)>,
    /// The members as last seen.
    pub views: Vec<MemberView>,
    /// Members the pass installed the target on and saw serving it.
    pub installed: Vec<String>,
    /// Members whose install failed this pass.
    pub failed: Vec<String>,
}

/// The operator's client identity for the agents, issued from `spec.agents.caSecretName`'s
/// CA for this pass (an hour), or why there is none. The Secret must consent to serve
/// `for_object` (`EtcdCertificates/namespace/name`) with [`names::ETCD_AGENTS_CA_FOR`].
pub(super) async fn identity(
    client: &kube::Client,
    namespace: &str,
    policy: &EtcdPolicy,
    for_object: &str,
) -> Option<Result<ClientIdentity, String>> {
    let name = policy.agents_ca_secret.as_ref()?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    Some(
        async {
            let secret = (secrets.get_opt(name).await)
                .map_err(|e| format!("reading Secret {name:?}: {e}"))?
                .ok_or_else(|| format!("the agents' CA Secret {name:?} does not exist"))?;
            agents_ca_consents(&secret, name, for_object)?;
            let data = secret.data.unwrap_or_default();
            let text = |key: &str| {
                data.get(key)
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
                    .ok_or_else(|| format!("the agents' CA Secret {name:?} has no {key}"))
            };
            let ca = CertificateAuthority::from_pem(&text("tls.crt")?, &text("tls.key")?)
                .map_err(|e| format!("the agents' CA Secret {name:?}: {e}"))?;
            let lifetime = Ttl::from_duration(Duration::from_secs(3600)).expect("a valid lifetime");
            let issued = ca
                .issue(&LeafSpec::new(OPERATOR_CLIENT_NAME, Usage::Client).with_validity(lifetime))
                .map_err(|e| format!("issuing the operator's agent client certificate: {e}"))?;
            let key = issued.key.as_ref().expect("issue() returns a key").to_pem();
            ClientIdentity::from_pem(&ca.certificate_pem(), &issued.certificate_pem, &key)
                .map_err(|e| e.to_string())
        }
        .await,
    )
}

/// Whether the agents' CA Secret `name` names `for_object` in its
/// [`names::ETCD_AGENTS_CA_FOR`] annotation; else why not (nothing of it is read further).
fn agents_ca_consents(secret: &Secret, name: &str, for_object: &str) -> Result<(), String> {
    let marked = secret.annotations().get(names::ETCD_AGENTS_CA_FOR);
    if marked.map(String::as_str) == Some(for_object) {
        return Ok(());
    }
    let found = match marked {
        None => "it has no such annotation".to_string(),
        Some(other) => format!(
            "it names {:?}",
            caretaker_agent_api::client::bounded(other.clone(), 256)
        ),
    };
    Err(format!(
        "the agents' CA Secret {name:?} is not marked for this object: whoever keeps that CA \
         must annotate the Secret {}={for_object:?} ({found}); its CA was not used",
        names::ETCD_AGENTS_CA_FOR
    ))
}

/// The names a member's agent must present one of: its name and its addresses.
fn names_of(member: &MemberSpec) -> Vec<String> {
    std::iter::once(member.name.clone())
        .chain(member.dns_names.iter().cloned())
        .chain(member.ip_addresses.iter().map(|ip| ip.to_string()))
        .collect()
}

/// Everything a rollout pass works with.
pub(super) struct Rollout<'a> {
    pub identity: Option<&'a Result<ClientIdentity, String>>,
    pub members: &'a [MemberSpec],
    pub endpoints: &'a BTreeMap<String, String>,
    /// `etcd-all-certs`' data at the target revision.
    pub all: &'a BTreeMap<String, String>,
    pub target: Target,
    pub asker: &'a Asker,
    pub health_endpoints: &'a [String],
    /// Each member's current revision number as the status says it.
    pub current: BTreeMap<String, i64>,
    /// Where the events go, and what they are about.
    pub ctx: &'a Context,
    pub reference: &'a ObjectReference,
    /// Failed installs so far, by `object/member/revision hash` (the events' count).
    pub failures: &'a Mutex<HashMap<String, u32>>,
    /// The object's `namespace/name`, for the failure counts and the log.
    pub key: &'a str,
}

impl Rollout<'_> {
    /// An agent client for `member`, or why there is none (`None`: it has no agent).
    fn agent(
        &self,
        member: &MemberSpec,
        timeout: Duration,
    ) -> Option<Result<(String, AgentClient), String>> {
        let url = self.endpoints.get(&member.name)?;
        let identity = match self.identity {
            None => {
                return Some(Err(
                    "it has an agent endpoint but spec.agents.caSecretName is not set".into(),
                ));
            }
            Some(Err(e)) => return Some(Err(e.clone())),
            Some(Ok(identity)) => identity,
        };
        Some(
            AgentClient::for_node(identity, &names_of(member), timeout)
                .map(|client| (url.clone(), client))
                .map_err(|e| e.to_string()),
        )
    }

    /// Each member: what its agent has installed, and whether it serves the target.
    async fn observe(&self, health: &[EndpointHealth]) -> Vec<MemberView> {
        let asks = self.members.iter().map(|member| async move {
            let agent = match self.agent(member, ASK_TIMEOUT) {
                None => None,
                Some(Err(e)) => Some(Err(e)),
                Some(Ok((url, client))) => Some(match client.etcd_installed(&url).await {
                    Ok(installed) if installed.member == member.name => Ok(installed.revision),
                    Ok(installed) => Err(format!(
                        "the agent at {url} installs for member {:?}",
                        installed.member
                    )),
                    Err(e) => Err(e.to_string()),
                }),
            };
            MemberView {
                name: member.name.clone(),
                agent,
                serving_target: self.serves_target(&member.name, health),
            }
        });
        futures::future::join_all(asks).await
    }

    /// Whether an endpoint answered healthy presenting `member`'s serving certificate of the
    /// target.
    fn serves_target(&self, member: &str, health: &[EndpointHealth]) -> bool {
        let key = format!("{}.crt", member_secret(Role::Serving, member));
        let Some(expected) = (self.all.get(&key))
            .and_then(|pem| Certificate::parse_pem(pem).ok()?.into_iter().next())
        else {
            return false;
        };
        health.iter().any(|h| {
            matches!(&h.answer, Ok(a) if a.healthy
                && a.serving.as_ref().is_some_and(|s| s.fingerprint() == expected.fingerprint()))
        })
    }

    async fn say(&self, event: Event) {
        tracing::info!(etcd = %self.key, reason = event.reason, note = %event.note, "EtcdCertificates event");
        self.ctx.event(self.reference, event).await;
    }

    /// How many times installing the target on `member` has failed, this one counted.
    fn count_failure(&self, member: &str) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures
            .entry(format!("{}/{member}/{}", self.key, self.target.hash))
            .or_default();
        *count += 1;
        *count
    }

    /// Rolls the target out from `health` (the members' answers this pass started with),
    /// saying each event as it happens.
    pub(super) async fn run(&self, mut health: Vec<EndpointHealth>) -> Rolled {
        let mut rolled = Rolled::default();
        // Each round installs one member or ends: at most one round per member, and one more.
        for _ in 0..=self.members.len() {
            let views = self.observe(&health).await;
            let gate = Quorum::of(&health, self.members);
            let next = rollout::next(&self.target, &views, gate.open());
            rolled.views = views;
            let member = match next {
                Next::Done => break,
                Next::Held(member) => {
                    tracing::warn!(member = %member, unhealthy = %gate.unhealthy.join(", "), "{}", crate::etcd::SKIPPING_FOR_QUORUM);
                    rolled.held = Some((member, gate.closed_message()));
                    break;
                }
                Next::Stopped { member, why } => {
                    rolled.stopped = Some((member, why));
                    break;
                }
                Next::Install(member) => member,
            };
            let spec = (self.members.iter())
                .find(|m| m.name == member)
                .expect("the plan names a member");
            let (url, client) = match self.agent(spec, INSTALL_TIMEOUT) {
                Some(Ok(agent)) => agent,
                _ => unreachable!("the plan installs only on members whose agent answered"),
            };
            let from = self.current.get(&member).copied().unwrap_or(0);
            let to = self.target.number;
            self.say(Event::normal(
                rollout::EVENT_TARGET_CHANGED,
                rollout::target_changed(
                    &member,
                    from,
                    to,
                    &format!("revision {to} of etcd-all-certs is the newest"),
                ),
            ))
            .await;
            let Some(files) = rollout::member_files(self.all, &member) else {
                rolled.stopped = Some((member, "etcd-all-certs holds no files for it".into()));
                break;
            };
            let request = InstallRequest {
                member: member.clone(),
                revision: self.target.hash.clone(),
                files,
            };
            tracing::info!(member, revision = to, hash = %self.target.hash, "installing an etcd revision on its member");
            let result = client.etcd_install(&url, &request).await;
            if let Err(e) = result {
                let error = e.to_string();
                let count = self.count_failure(&member);
                self.say(Event::warning(
                    rollout::EVENT_INSTALL_FAILED,
                    rollout::install_failed(&member, to, count, &error),
                ))
                .await;
                rolled.failed.push(member.clone());
                rolled.stopped =
                    Some((member, format!("installing revision {to} failed: {error}")));
                break;
            }
            // The agent says the member is back; the operator sees it for itself.
            health = self.asker.ask_all(self.health_endpoints).await;
            if !self.serves_target(&member, &health) {
                let why = format!(
                    "its agent installed revision {to}, but the member does not answer healthy \
                     presenting its certificate"
                );
                rolled.stopped = Some((member, why));
                break;
            }
            self.say(Event::normal(
                rollout::EVENT_CURRENT_CHANGED,
                rollout::current_changed(&member, from, to),
            ))
            .await;
            rolled.installed.push(member);
        }
        rolled
    }
}

/// The revision to roll out: `etcd-all-certs`' once the plan's writes are in place, numbered
/// one more than the status's when its hash changed.
pub(super) fn target_of(plan: &EtcdPlan, old: &EtcdCertificatesStatus) -> Option<rollout::Target> {
    let hash = plan.status.revision.clone()?;
    let number = match (old.latest_revision, &old.all_certs_revision) {
        (Some(number), Some(before)) if *before == hash => number,
        (Some(number), _) => number + 1,
        (None, _) => 1,
    };
    Some(rollout::Target { hash, number })
}

/// Rolls the target out over the members with agents (see [`install`]); without a target or
/// any agent, only sees which members serve the target.
pub(super) async fn roll_out(
    shared: &Shared,
    object: &EtcdCertificates,
    (members, endpoints, policy, asker): (
        &[MemberSpec],
        &BTreeMap<String, String>,
        &EtcdPolicy,
        &Asker,
    ),
    seen: &EtcdObserved,
    plan: &EtcdPlan,
    target: Option<&rollout::Target>,
) -> Rolled {
    let Some(target) = target else {
        return Rolled::default();
    };
    // etcd-all-certs as this pass left it: written by it, or as stored.
    let all = (plan.steps.iter())
        .find_map(|s| match s {
            EtcdStep::AllCerts(all) => Some(all.data.clone()),
            _ => None,
        })
        .or_else(|| seen.all_certs())
        .unwrap_or_default();
    let namespace = object.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", object.name_any());
    let identity = if endpoints.is_empty() {
        None
    } else {
        let for_object = crate::runtime::claims::owner_of(object).reference();
        identity(&shared.ctx.client, &namespace, policy, &for_object).await
    };
    let reference = object.object_ref(&());
    let current = (object.status.iter())
        .flat_map(|s| &s.members)
        .map(|m| (m.name.clone(), m.current_revision))
        .collect();
    let rollout = Rollout {
        identity: identity.as_ref(),
        members,
        endpoints,
        all: &all,
        target: target.clone(),
        asker,
        health_endpoints: &policy.endpoints,
        current,
        ctx: &shared.ctx,
        reference: &reference,
        failures: &shared.memory.install_failures,
        key: &key,
    };
    rollout.run(seen.health.clone()).await
}

/// Degraded (and Ready False) naming the member the rollout stopped at, beside whatever else
/// is degraded.
pub(super) fn stop_message(plan: &mut EtcdPlan, member: &str, why: &str) {
    let message = format!("the rollout stopped at member {member:?}: {why}");
    let degraded = &plan.status.degraded;
    plan.status.degraded = if degraded.status {
        crate::authority::Condition::new(
            true,
            degraded.reason,
            format!("{}; {message}", degraded.message),
        )
    } else {
        crate::authority::Condition::new(true, rollout::REASON_INSTALL_FAILED, message.clone())
    };
    plan.status.ready = crate::authority::Condition::new(
        false,
        rollout::REASON_INSTALL_FAILED,
        format!("{message} (see {})", etcd::CONDITION_DEGRADED),
    );
}

/// Each member's status after a pass: its current revision (the target once it runs it, else
/// what the status said), the target while it failed, the last failed revision, and when any
/// of them changed.
pub(super) fn member_statuses(
    members: &[MemberSpec],
    views: &[MemberView],
    target: Option<&Target>,
    failed: &[String],
    old: &[MemberStatus],
    now: &str,
) -> Vec<MemberStatus> {
    members
        .iter()
        .map(|member| {
            let name = &member.name;
            let before = old.iter().find(|m| m.name == *name);
            let view = views.iter().find(|v| v.name == *name);
            let mut status = before.cloned().unwrap_or_else(|| MemberStatus {
                name: name.clone(),
                ..MemberStatus::default()
            });
            if let (Some(target), Some(view)) = (target, view) {
                if view.at(target) {
                    status.current_revision = target.number;
                    status.target_revision = 0;
                } else if failed.contains(name) {
                    status.target_revision = target.number;
                    status.last_failed_revision = target.number;
                }
            }
            let changed = before.is_none_or(|b| {
                (
                    b.current_revision,
                    b.target_revision,
                    b.last_failed_revision,
                ) != (
                    status.current_revision,
                    status.target_revision,
                    status.last_failed_revision,
                )
            });
            if changed {
                status.last_change_time = Some(now.to_string());
            }
            status
        })
        .collect()
}
