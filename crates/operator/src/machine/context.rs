//! What the Machine controllers ask of the shared context ([`Context`]): the work running on
//! each Machine in this process, its cluster's credentials and agent, and writes and events on
//! Machines. Kept here so that the shared runtime knows nothing of Machines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::{DynamicObject, Patch, PatchParams};

use caretaker_agent_api::client::AgentClient;

use super::MachineView;
use super::plan::end_patch;
use crate::Error;
use crate::changes::{AnnotationChanges, Event};
use crate::context::Context;
use crate::credentials::ClusterCredentials;
use caretaker_api::names::Operation;

/// A Machine's agent, reachable only if it is the agent of that Machine's node.
pub struct MachineAgent {
    pub url: String,
    pub client: AgentClient,
}

impl Context {
    /// Runs `work` of `operation` for a Machine unless such work is already running in this
    /// process. Returns whether it started.
    #[must_use]
    pub fn spawn_for(
        self: &Arc<Self>,
        operation: Operation,
        machine: &MachineView,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let key = work_key(operation, machine);
        if !self.try_begin(&key) {
            return false;
        }
        let ctx = self.clone();
        tokio::spawn(async move {
            work.await;
            ctx.end(&key);
        });
        true
    }

    /// How long the Machine's `operation` work has been running in this process, if it is.
    pub fn running_for(&self, operation: Operation, machine: &MachineView) -> Option<Duration> {
        self.running
            .lock()
            .expect("running lock")
            .get(&work_key(operation, machine))
            .map(Instant::elapsed)
    }

    /// The work running in this process now, as [`Context::running_for`] would find it: for a
    /// pass that asks of every Machine, one lock and no allocation per Machine.
    pub fn work_running_now(&self) -> WorkRunning {
        WorkRunning(
            self.running
                .lock()
                .expect("running lock")
                .keys()
                .cloned()
                .collect(),
        )
    }

    /// The credentials of the Machine's cluster: its CAs and a client for its agents.
    pub async fn credentials_for(
        &self,
        machine: &MachineView,
    ) -> Result<Arc<ClusterCredentials>, Error> {
        self.credentials
            .get(
                &self.client,
                &machine.namespace,
                &machine.cluster_name,
                self.settings.agent_timeout,
            )
            .await
    }

    /// The Machine's agent: its URL, and a client that accepts only an agent whose serving
    /// certificate names the Machine's node (its node name or one of its addresses).
    pub async fn agent_of(&self, machine: &MachineView) -> Result<MachineAgent, Error> {
        let no_endpoint = || Error::NoAgentEndpoint {
            machine: machine.name.clone(),
        };
        let url = machine
            .agent_url(self.settings.agent_port)
            .ok_or_else(no_endpoint)?;
        let names: Vec<String> = machine
            .node_name
            .iter()
            .chain(&machine.addresses)
            .cloned()
            .collect();
        if names.is_empty() {
            return Err(no_endpoint());
        }
        let client = self.credentials_for(machine).await?.agent_for(&names)?;
        Ok(MachineAgent { url, client })
    }

    /// Merge-patches a Machine's annotations; returns the Machine as the write left it.
    pub async fn patch_annotations(
        &self,
        machine: &MachineView,
        changes: &AnnotationChanges,
    ) -> Result<DynamicObject, Error> {
        let body = changes.merge_patch(None);
        Ok(self
            .api(
                &machine.namespace,
                &caretaker_api::cluster_api::machine_api_resource(),
            )
            .patch(&machine.name, &PatchParams::default(), &Patch::Merge(&body))
            .await?)
    }

    /// Records the end of work the Machine did for trigger value `worked` (see
    /// [`end_patch`]): reads it fresh and writes `changes` on that version, reading again if it
    /// changed meanwhile. `false` when nothing was written: the Machine is gone or its trigger
    /// now asks for something else.
    pub async fn record_end(
        &self,
        machine: &MachineView,
        trigger_key: &str,
        worked: Option<&str>,
        changes: &AnnotationChanges,
    ) -> Result<bool, Error> {
        self.record_end_after(machine, None, trigger_key, worked, changes)
            .await
    }

    /// [`Self::record_end`], trying first to write on `known`, the Machine as this process's own
    /// last write (or read) left it, without reading it again. That write is made only if
    /// `known` still has the trigger worked on, and only at `known`'s version (the API server
    /// refuses it if the Machine changed since); otherwise it reads fresh, as
    /// [`Self::record_end`] does.
    pub async fn record_end_after(
        &self,
        machine: &MachineView,
        known: Option<&MachineView>,
        trigger_key: &str,
        worked: Option<&str>,
        changes: &AnnotationChanges,
    ) -> Result<bool, Error> {
        let api = self.api(
            &machine.namespace,
            &caretaker_api::cluster_api::machine_api_resource(),
        );
        let mut conflicts = 0;
        let mut known = known
            .filter(|k| k.resource_version.is_some())
            .and_then(|k| end_patch(k, trigger_key, worked, changes));
        loop {
            let body = match known.take() {
                Some(body) => body,
                None => {
                    let Some(object) = api.get_opt(&machine.name).await? else {
                        return Ok(false);
                    };
                    let fresh = MachineView::from_object(&object);
                    match end_patch(&fresh, trigger_key, worked, changes) {
                        Some(body) => body,
                        None => {
                            tracing::info!(machine = %machine.name, "the trigger changed while the work ran; its end is not recorded, the new value starts anew");
                            return Ok(false);
                        }
                    }
                }
            };
            match api
                .patch(&machine.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => return Ok(true),
                // Gone, as a fresh read would have found it.
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
                Err(kube::Error::Api(e)) if e.code == 409 && conflicts < 5 => conflicts += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publishes an event about a Machine.
    pub async fn machine_event(&self, machine: &DynamicObject, event: Event) {
        let reference = machine.object_ref(&caretaker_api::cluster_api::machine_api_resource());
        self.event(&reference, event).await;
    }

    /// Publishes an event about a Machine after the caller has moved on
    /// ([`Context::publish_in_order`]): the Machine controller's next step (its attempt, the
    /// parent's next start) waits on no event's round trip.
    pub fn publish_machine_event(self: &Arc<Self>, machine: &DynamicObject, event: Event) {
        self.publish_in_order(
            machine.object_ref(&caretaker_api::cluster_api::machine_api_resource()),
            event,
        );
    }
}

/// The keys of the work running in this process at one moment.
pub struct WorkRunning(Vec<String>);

impl WorkRunning {
    /// Whether the Machine's `operation` work was running: a key as `work_key` writes it,
    /// read back without making one per Machine.
    pub fn contains(&self, operation: Operation, machine: &MachineView) -> bool {
        self.0.iter().any(|key| {
            key.strip_prefix(operation.names().work)
                .and_then(|rest| rest.strip_prefix(':'))
                .and_then(|rest| rest.strip_prefix(machine.namespace.as_str()))
                .and_then(|rest| rest.strip_prefix('/'))
                == Some(machine.name.as_str())
        })
    }
}

/// Names one operation's work for one Machine.
fn work_key(operation: Operation, machine: &MachineView) -> String {
    format!(
        "{}:{}/{}",
        operation.names().work,
        machine.namespace,
        machine.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_machine;

    #[test]
    fn running_work_is_told_by_operation_namespace_and_whole_name() {
        let machine = |namespace: &str, name: &str| {
            let mut m = test_machine(&[]);
            m.namespace = namespace.into();
            m.name = name.into();
            m
        };
        let refresh = Operation::RefreshCertificates;
        let upgrade = Operation::InPlaceUpgrade;
        let running = WorkRunning(vec![work_key(refresh, &machine("ns", "w-1"))]);
        assert!(running.contains(refresh, &machine("ns", "w-1")));
        assert!(!running.contains(upgrade, &machine("ns", "w-1")));
        assert!(!running.contains(refresh, &machine("ns", "w-10")));
        assert!(!running.contains(refresh, &machine("ns", "w-")));
        assert!(!running.contains(refresh, &machine("other", "w-1")));
        assert!(!WorkRunning(Vec::new()).contains(refresh, &machine("ns", "w-1")));
    }
}
