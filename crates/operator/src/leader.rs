//! Leader election on a `coordination.k8s.io/v1` Lease, with kube-lease-manager: of the
//! replicas of `caretaker operator --leader-elect`, only the Lease's holder reconciles; the
//! others stand by (serving the webhook and `/metrics`, as the holder does) and take the Lease
//! once it has gone unrenewed for its duration.
//!
//! A holder that cannot renew stops at once ([`Role::Lost`]): it cannot know whether a standby
//! has taken over, and two replicas reconciling could refresh one Machine twice. The process
//! then ends, as controller-runtime's managers do, and comes back as a standby.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// What `--leader-elect` and its flags ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica, as the Lease's `holderIdentity` names it.
    pub identity: String,
    /// How long a Lease not renewed stays its holder's; the holder renews it a third of that
    /// before it ends.
    pub duration: Duration,
}

/// How often a standby reads the Lease, as controller-runtime's retry period.
const STANDBY_RETRY: Duration = Duration::from_secs(2);

/// The Lease caretaker's replicas share, unless `--leader-election-id` says otherwise.
pub const DEFAULT_LEASE: &str = "caretaker-operator";

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

    /// The Lease's duration and renewal margin in whole seconds, as kube-lease-manager takes
    /// them: at least 2 s, renewed a third of the duration (at least 1 s) before it ends.
    fn seconds(&self) -> (u64, u64) {
        let duration = self.duration.as_secs().max(2);
        (duration, (duration / 3).max(1))
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
    /// Joins the election (creating the Lease if it does not exist). Fails when the Lease
    /// cannot be read or made: wrong namespace, or no permission.
    pub async fn join(client: Client, settings: LeaseSettings) -> Result<Election, String> {
        // Read once here, so that a Lease this replica may not read stops it at start.
        let manager = manager(&client, &settings).await?;
        let (sender, role) = watch::channel(Role::Standby);
        let (leave, left) = oneshot::channel();
        let task = tokio::spawn(follow(client, settings, manager, sender, left));
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

async fn manager(client: &Client, settings: &LeaseSettings) -> Result<LeaseManager, String> {
    let (duration, grace) = settings.seconds();
    LeaseManagerBuilder::new(client.clone(), &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager("caretaker-leader-election")
        .build()
        .await
        .map_err(|e| format!("the Lease {}/{}: {e}", settings.namespace, settings.name))
}

/// Stands by until this replica takes the Lease, then holds it until it loses it or is told
/// to leave, publishing each change of role.
///
/// kube-lease-manager's standby reads the Lease again only once the holder's term has run
/// out, so it would miss a Lease given up early; a standby here takes a new manager, which
/// reads the Lease afresh, every [`STANDBY_RETRY`].
async fn follow(
    client: Client,
    settings: LeaseSettings,
    first: LeaseManager,
    role: watch::Sender<Role>,
    mut left: oneshot::Receiver<()>,
) {
    let mut manager = Some(first);
    let mut retry = Duration::from_millis(500);
    let leader = loop {
        let standby = match manager.take() {
            Some(m) => m,
            None => match self::manager(&client, &settings).await {
                Ok(m) => m,
                Err(e) => {
                    if !back_off(&e, &mut retry, &mut left).await {
                        return;
                    }
                    continue;
                }
            },
        };
        tokio::select! {
            _ = &mut left => return,
            changed = tokio::time::timeout(STANDBY_RETRY, standby.changed()) => match changed {
                Ok(Ok(true)) => break standby,
                Ok(Ok(false)) | Err(_) => {}
                Ok(Err(e)) => {
                    if !back_off(&e, &mut retry, &mut left).await {
                        return;
                    }
                }
            },
        }
    };
    tracing::info!(identity = %settings.identity, "holding the leader Lease: reconciling");
    role.send_replace(Role::Leading);
    tokio::select! {
        _ = &mut left => {
            match leader.release().await {
                Ok(()) => tracing::info!(lease = %settings.name, namespace = %settings.namespace, "gave the leader Lease up"),
                Err(e) => tracing::warn!(error = %e, "could not give the leader Lease up: a standby takes it when it expires"),
            }
        }
        // Renews until the Lease is no longer this replica's: any answer is the end.
        changed = leader.changed() => {
            let why = match changed {
                Ok(_) => "another replica holds the leader Lease".to_string(),
                Err(e) => format!("renewing the leader Lease failed: {e}"),
            };
            role.send_replace(Role::Lost(why));
        }
    }
}

/// After a failed read of the Lease: says so, waits `retry` (doubled for next time, up to
/// 10 s), and returns false if told to leave meanwhile.
async fn back_off(
    error: &(dyn std::fmt::Display + Sync),
    retry: &mut Duration,
    left: &mut oneshot::Receiver<()>,
) -> bool {
    tracing::warn!(error = %error, "reading the leader Lease failed; trying again");
    let waited = tokio::select! {
        _ = left => false,
        () = tokio::time::sleep(*retry) => true,
    };
    *retry = (*retry * 2).min(Duration::from_secs(10));
    waited
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unique_per_process_and_name_their_base() {
        let a = LeaseSettings::identity("caretaker-operator-7d9f-abcde");
        let b = LeaseSettings::identity("caretaker-operator-7d9f-abcde");
        assert!(a.starts_with("caretaker-operator-7d9f-abcde_"), "{a}");
        assert_eq!(a.len(), "caretaker-operator-7d9f-abcde_".len() + 8);
        assert_ne!(a, b);
    }

    #[test]
    fn the_lease_is_renewed_a_third_of_its_duration_before_it_ends() {
        let settings = |secs| LeaseSettings {
            namespace: "caretaker-system".into(),
            name: DEFAULT_LEASE.into(),
            identity: "x".into(),
            duration: Duration::from_secs(secs),
        };
        assert_eq!(settings(15).seconds(), (15, 5));
        assert_eq!(settings(3).seconds(), (3, 1));
        // kube-lease-manager refuses a grace as long as the duration.
        assert_eq!(settings(1).seconds(), (2, 1));
        assert_eq!(settings(0).seconds(), (2, 1));
    }
}
