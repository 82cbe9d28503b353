//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leader election runs it:
//! of the replicas of `caretaker operator --leader-elect`, only the Lease's holder reconciles;
//! the others stand by (serving the webhook and `/metrics`, as the holder does) and take the
//! Lease once they have seen it go unrenewed for its duration.
//!
//! The times ([`Timing`], scaled from the Lease's duration as client-go's 15 s / 10 s / 2 s):
//! - a standby reads the Lease every retry period, and takes it when it is free, or when its
//!   record has not changed for the record's `leaseDurationSeconds`, counted on this replica's
//!   own clock from when it saw the record change (never from the `renewTime` another replica
//!   wrote: clocks differ);
//! - the holder renews every retry period, and stops ([`Role::Lost`]) once its renew deadline
//!   has passed since the start of its last successful renewal. That deadline is kept on the
//!   local clock, whatever a stalled call is doing: each call is cut off when the deadline
//!   passes. The deadline ends a third of the duration before any standby may take the Lease
//!   (a standby counts from a change it saw, which is after that renewal started), so two
//!   replicas never reconcile at once.
//!
//! Every write names the resourceVersion it was decided on, so two replicas cannot both take
//! a Lease, and a replica that has lost it cannot renew or release another's. A holder that
//! loses the Lease stops at once; the process then ends, as controller-runtime's managers do,
//! and comes back as a standby.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What `--leader-elect` and its flags ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica, as the Lease's `holderIdentity` names it.
    pub identity: String,
    /// How long a Lease not renewed stays its holder's ([`Timing`] follows from it).
    pub duration: Duration,
}

/// The Lease caretaker's replicas share, unless `--leader-election-id` says otherwise.
pub const DEFAULT_LEASE: &str = "caretaker-operator";

/// The field manager of every write to the Lease.
const FIELD_MANAGER: &str = "caretaker-leader-election";

/// The times of the election, from the Lease's duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `leaseDurationSeconds`: whole seconds, at least 2.
    pub lease: Duration,
    /// How long after the start of its last successful renewal the holder stops: two thirds
    /// of the duration.
    pub renew_deadline: Duration,
    /// How often a standby reads the Lease and the holder renews it: 2 s, or a fifth of the
    /// renew deadline when that is shorter.
    pub retry: Duration,
}

impl LeaseSettings {
    /// A unique identity for this process: `BASE_` and 8 random hex digits (two processes on
    /// one host, or a restarted Pod, must not take each other's Lease for their own).
    pub fn identity(base: &str) -> String {
        let mut random = [0u8; 4];
        // Without entropy the suffix is zeros: still the base's, just less unique.
        let _ = getrandom::fill(&mut random);
        let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
        format!("{base}_{suffix}")
    }

    pub fn timing(&self) -> Timing {
        let lease = Duration::from_secs(self.duration.as_secs().max(2));
        let renew_deadline = lease * 2 / 3;
        Timing {
            lease,
            renew_deadline,
            retry: (renew_deadline / 5).min(Duration::from_secs(2)),
        }
    }
}

/// Where this replica stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Standby,
    Leading,
    /// It led, and no longer may: why.
    Lost(String),
}

/// This replica's part in the election; see the module's documentation.
pub struct Election {
    role: watch::Receiver<Role>,
    leave: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Election {
    /// Joins the election, creating the Lease (held by nobody) if it does not exist. Fails
    /// when the Lease cannot be read or made: wrong namespace, or no permission.
    pub async fn join(client: Client, settings: LeaseSettings) -> Result<Election, String> {
        let leases = Leases {
            api: Api::namespaced(client, &settings.namespace),
            timing: settings.timing(),
            settings,
        };
        // Here, so that a Lease this replica may not read or make stops it at start.
        let first = leases
            .read_or_create()
            .await
            .map_err(|e| format!("the Lease {}: {e}", leases.describe()))?;
        let (sender, role) = watch::channel(Role::Standby);
        let (leave, left) = oneshot::channel();
        let task = tokio::spawn(follow(leases, first, sender, left));
        Ok(Election {
            role,
            leave: Some(leave),
            task,
        })
    }

    /// Waits until this replica holds the Lease; Err if the election ended first.
    pub async fn leading(&mut self) -> Result<(), String> {
        let role = self
            .role
            .wait_for(|r| *r != Role::Standby)
            .await
            .map_err(|_| "the election ended".to_string())?;
        match &*role {
            Role::Leading => Ok(()),
            Role::Lost(why) => Err(why.clone()),
            Role::Standby => unreachable!("waited for another role"),
        }
    }

    /// Completes when this replica, leading, may no longer lead: why.
    pub async fn lost(&mut self) -> String {
        match self.role.wait_for(|r| matches!(r, Role::Lost(_))).await {
            Ok(role) => match &*role {
                Role::Lost(why) => why.clone(),
                _ => unreachable!("waited for Lost"),
            },
            Err(_) => "the election ended".into(),
        }
    }

    /// Leaves the election, giving the Lease up if this replica holds it, so that a standby
    /// takes it at once rather than after its duration. Waits at most `bound`.
    pub async fn leave(mut self, bound: Duration) {
        if let Some(leave) = self.leave.take() {
            let _ = leave.send(());
        }
        if tokio::time::timeout(bound, &mut self.task).await.is_err() {
            tracing::warn!(
                "giving the leader Lease up timed out: a standby takes it when it expires"
            );
        }
    }
}

/// An election dropped without [`Election::leave`] (its replica crashed, or was cut off)
/// stops renewing: the Lease then expires and a standby takes it.
impl Drop for Election {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Lease as this replica last saw it, and since when (on this replica's clock) its record
/// has been as it is.
#[derive(Debug, Clone)]
struct Observed {
    spec: LeaseSpec,
    version: String,
    since: Instant,
}

impl Observed {
    fn of(lease: &Lease, now: Instant) -> Observed {
        Observed {
            spec: lease.spec.clone().unwrap_or_default(),
            version: lease.resource_version().unwrap_or_default(),
            since: now,
        }
    }

    /// Takes `lease` in; the clock restarts only when its record changed.
    fn see(&mut self, lease: &Lease, now: Instant) {
        let seen = Observed::of(lease, now);
        let since = if seen.spec == self.spec {
            self.since
        } else {
            now
        };
        *self = Observed { since, ..seen };
    }
}

/// Whether a standby named `identity` may take the Lease it has observed, at `now`: nobody
/// holds it, it is this replica's own, or its record has not changed for its duration.
fn may_take(observed: &Observed, identity: &str, fallback: Duration, now: Instant) -> bool {
    let holder = observed.spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let duration = observed
        .spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(fallback, Duration::from_secs);
    now.duration_since(observed.since) >= duration
}

/// The merge patch that takes the Lease observed at `version` for `identity`.
fn take_patch(observed: &Observed, identity: &str, timing: Timing, now: MicroTime) -> Value {
    let transitions = observed.spec.lease_transitions.unwrap_or_default();
    let changes_hands = observed.spec.holder_identity.as_deref() != Some(identity);
    json!({
        "metadata": {"resourceVersion": observed.version},
        "spec": {
            "holderIdentity": identity,
            "acquireTime": now,
            "renewTime": now,
            "leaseDurationSeconds": timing.lease.as_secs(),
            "leaseTransitions": transitions + i32::from(changes_hands),
        },
    })
}

/// The merge patch that renews the Lease this replica holds at `version`.
fn renew_patch(version: &str, timing: Timing, now: MicroTime) -> Value {
    json!({
        "metadata": {"resourceVersion": version},
        "spec": {"renewTime": now, "leaseDurationSeconds": timing.lease.as_secs()},
    })
}

/// The merge patch that gives the Lease held at `version` up: no holder, so a standby takes
/// it at its next read.
fn release_patch(version: &str) -> Value {
    json!({
        "metadata": {"resourceVersion": version},
        "spec": {"holderIdentity": null, "acquireTime": null, "renewTime": null,
                 "leaseDurationSeconds": null},
    })
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Why a call about the Lease did not succeed.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("another replica holds it ({0:?})")]
    HeldByAnother(String),
    /// Still this replica's, but changed since the version written on: renew on this one.
    #[error("it changed since it was read")]
    Changed { version: String },
}

impl LeaseError {
    fn is_conflict(&self) -> bool {
        matches!(self, LeaseError::Api(kube::Error::Api(e)) if e.code == 409)
    }
}

/// The Lease and the calls about it, each bounded in time.
struct Leases {
    api: Api<Lease>,
    settings: LeaseSettings,
    timing: Timing,
}

impl Leases {
    fn describe(&self) -> String {
        format!("{}/{}", self.settings.namespace, self.settings.name)
    }

    /// A standby's calls: at most its renew deadline each, so that a stalled call delays the
    /// next read by no more than that.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        let bound = self.timing.renew_deadline;
        match tokio::time::timeout(bound, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(LeaseError::TimedOut(bound)),
        }
    }

    async fn read_or_create(&self) -> Result<Lease, LeaseError> {
        let name = &self.settings.name;
        if let Some(lease) = self.bounded(self.api.get_opt(name)).await? {
            return Ok(lease);
        }
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match self.bounded(self.api.create(&params, &lease)).await {
            Ok(created) => Ok(created),
            // Made by another replica meanwhile.
            Err(e) if e.is_conflict() => Ok(self.bounded(self.api.get(name)).await?),
            Err(e) => Err(e),
        }
    }

    async fn patch(&self, body: &Value) -> Result<Lease, kube::Error> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.api
            .patch(&self.settings.name, &params, &Patch::Merge(body))
            .await
    }

    /// One renewal of the Lease held at `version`: its new version. A Lease changed since
    /// (409) is read again: still this replica's, it is renewed on the new version next.
    async fn renew(&self, version: &str) -> Result<String, LeaseError> {
        match self.patch(&renew_patch(version, self.timing, now())).await {
            Ok(lease) => Ok(lease.resource_version().unwrap_or_default()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let lease = self.api.get(&self.settings.name).await?;
                let spec = lease.spec.clone().unwrap_or_default();
                let holder = spec.holder_identity.unwrap_or_default();
                if holder == self.settings.identity {
                    Err(LeaseError::Changed {
                        version: lease.resource_version().unwrap_or_default(),
                    })
                } else {
                    Err(LeaseError::HeldByAnother(holder))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Stands by until this replica takes the Lease, then holds it until it loses it or is told
/// to leave, publishing each change of role.
async fn follow(
    leases: Leases,
    first: Lease,
    role: watch::Sender<Role>,
    mut left: oneshot::Receiver<()>,
) {
    let identity = leases.settings.identity.clone();
    let timing = leases.timing;
    let mut observed = Observed::of(&first, Instant::now());
    let mut said = None::<String>;
    // Standing by: a read every retry period (the first at once).
    let (mut version, mut renewed) = loop {
        let started = Instant::now();
        if may_take(&observed, &identity, timing.lease, started) {
            let take = take_patch(&observed, &identity, timing, now());
            match leases.bounded(leases.patch(&take)).await {
                Ok(lease) => break (lease.resource_version().unwrap_or_default(), started),
                // Taken by another, or changed: the next read says.
                Err(e) if e.is_conflict() => {}
                Err(e) => say_once(&mut said, &e),
            }
        }
        tokio::select! {
            _ = &mut left => return,
            () = tokio::time::sleep(timing.retry) => {}
        }
        match leases
            .bounded(leases.api.get_opt(&leases.settings.name))
            .await
        {
            Ok(Some(lease)) => observed.see(&lease, Instant::now()),
            Ok(None) => match leases.read_or_create().await {
                Ok(lease) => observed = Observed::of(&lease, Instant::now()),
                Err(e) => say_once(&mut said, &e),
            },
            Err(e) => say_once(&mut said, &e),
        }
    };
    tracing::info!(%identity, renew_deadline = ?timing.renew_deadline, "holding the leader Lease: reconciling");
    role.send_replace(Role::Leading);
    // Leading: a renewal every retry period, the deadline counted from the start of the last
    // one that succeeded.
    loop {
        let deadline = renewed + timing.renew_deadline;
        tokio::select! {
            _ = &mut left => {
                release(&leases, &version).await;
                return;
            }
            outcome = renew_round(&leases, &version, deadline) => match outcome {
                Ok((started, new_version)) => (renewed, version) = (started, new_version),
                Err(why) => {
                    tracing::warn!(%why, "lost the leader Lease: stopping");
                    role.send_replace(Role::Lost(why));
                    return;
                }
            },
        }
    }
}

/// Waits a retry period, then renews until one renewal succeeds (its start and the Lease's new
/// version) or `deadline` passes: then why this replica may no longer lead. A call still
/// running at the deadline is abandoned there.
async fn renew_round(
    leases: &Leases,
    version: &str,
    deadline: Instant,
) -> Result<(Instant, String), String> {
    let timing = leases.timing;
    let passed = || {
        format!(
            "no renewal of the leader Lease succeeded within its renew deadline ({:?})",
            timing.renew_deadline
        )
    };
    let mut version = version.to_string();
    loop {
        tokio::time::sleep_until((Instant::now() + timing.retry).min(deadline)).await;
        let started = Instant::now();
        if started >= deadline {
            return Err(passed());
        }
        match tokio::time::timeout_at(deadline, leases.renew(&version)).await {
            Err(_) => return Err(passed()),
            Ok(Ok(new_version)) => return Ok((started, new_version)),
            Ok(Err(LeaseError::HeldByAnother(holder))) => {
                return Err(format!(
                    "another replica holds the leader Lease ({holder:?})"
                ));
            }
            Ok(Err(LeaseError::Changed { version: current })) => version = current,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewing the leader Lease failed; trying again until its renew deadline");
            }
        }
    }
}

/// Gives the Lease up, if it is still this replica's at `version` (a Lease renewed or taken
/// since is left alone).
async fn release(leases: &Leases, version: &str) {
    match leases.bounded(leases.patch(&release_patch(version))).await {
        Ok(_) => tracing::info!(lease = %leases.describe(), "gave the leader Lease up"),
        Err(e) => {
            tracing::warn!(error = %e, "could not give the leader Lease up: a standby takes it when it expires")
        }
    }
}

/// Logs a failed call about the Lease, once until another one fails differently.
fn say_once(said: &mut Option<String>, error: &LeaseError) {
    let error = error.to_string();
    if said.as_ref() != Some(&error) {
        tracing::warn!(%error, "reading or taking the leader Lease failed; trying again");
        *said = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(secs: u64) -> LeaseSettings {
        LeaseSettings {
            namespace: "caretaker-system".into(),
            name: DEFAULT_LEASE.into(),
            identity: "me_00000000".into(),
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn identities_are_unique_per_process_and_name_their_base() {
        let a = LeaseSettings::identity("caretaker-operator-7d9f-abcde");
        let b = LeaseSettings::identity("caretaker-operator-7d9f-abcde");
        assert!(a.starts_with("caretaker-operator-7d9f-abcde_"), "{a}");
        assert_eq!(a.len(), "caretaker-operator-7d9f-abcde_".len() + 8);
        assert_ne!(a, b);
    }

    /// client-go's 15 s / 10 s / 2 s, scaled: the holder gives up (renew deadline, plus at most
    /// a retry before the round began) before any standby may take the Lease.
    #[test]
    fn the_renew_deadline_ends_before_a_standby_may_take_the_lease() {
        let secs = |s: u64| Duration::from_secs(s);
        assert_eq!(
            settings(15).timing(),
            Timing {
                lease: secs(15),
                renew_deadline: secs(10),
                retry: secs(2)
            }
        );
        assert_eq!(settings(3).timing().retry, Duration::from_millis(400));
        for lease in [0, 1, 2, 3, 7, 15, 60, 3600] {
            let timing = settings(lease).timing();
            assert!(timing.lease >= secs(2));
            assert!(timing.renew_deadline < timing.lease, "{timing:?}");
            assert!(timing.retry < timing.renew_deadline, "{timing:?}");
        }
    }

    fn lease(holder: Option<&str>, renewed: i64, duration: i32) -> Lease {
        Lease {
            metadata: kube::api::ObjectMeta {
                resource_version: Some(format!("{renewed}")),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(renewed).unwrap(),
                )),
                lease_duration_seconds: Some(duration),
                lease_transitions: Some(4),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_standby_takes_a_lease_unchanged_for_its_duration_on_its_own_clock() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let fallback = Duration::from_secs(15);
        let mut observed = Observed::of(&lease(Some("other"), 100, 10), start);
        assert!(!may_take(&observed, "me", fallback, at(9)));
        // A renewal seen restarts the count, whatever renewTime says.
        observed.see(&lease(Some("other"), 101, 10), at(9));
        assert!(!may_take(&observed, "me", fallback, at(18)));
        // The same record read again does not.
        observed.see(&lease(Some("other"), 101, 10), at(18));
        assert!(may_take(&observed, "me", fallback, at(19)));
        // Free, or this replica's own: at once.
        observed.see(&lease(None, 102, 10), at(19));
        assert!(may_take(&observed, "me", fallback, at(19)));
        observed.see(&lease(Some("me"), 103, 10), at(20));
        assert!(may_take(&observed, "me", fallback, at(20)));
    }

    #[test]
    fn every_write_names_the_version_it_was_decided_on() {
        let observed = Observed::of(&lease(Some("other"), 100, 10), Instant::now());
        let timing = settings(15).timing();
        let t = MicroTime(k8s_openapi::jiff::Timestamp::from_second(200).unwrap());
        let take = take_patch(&observed, "me", timing, t.clone());
        assert_eq!(take["metadata"]["resourceVersion"], "100");
        assert_eq!(take["spec"]["holderIdentity"], "me");
        assert_eq!(take["spec"]["leaseTransitions"], 5);
        assert_eq!(take["spec"]["leaseDurationSeconds"], 15);
        let renew = renew_patch("101", timing, t);
        assert_eq!(renew["metadata"]["resourceVersion"], "101");
        assert_eq!(renew["spec"].as_object().unwrap().len(), 2);
        let release = release_patch("102");
        assert_eq!(release["metadata"]["resourceVersion"], "102");
        assert_eq!(release["spec"]["holderIdentity"], Value::Null);
    }
}
