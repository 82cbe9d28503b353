//! Shared plumbing of the controllers: the Kubernetes client, the event recorder, settings and
//! the cluster credentials.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::Resource;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use caretaker_agent_api::client::AgentClient;

use crate::Error;
use crate::machine::MachineView;

use crate::credentials::{ClusterCredentials, CredentialStore};

/// Operator settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Port of the agents when a Machine has no `caretaker.dev/agent-endpoint`.
    pub agent_port: u16,
    /// Attempts per request before it ends `failed`.
    pub max_attempts: u32,
    /// The first retry delay; it doubles per failed attempt.
    pub retry_base: Duration,
    /// How long one call to an agent may take.
    pub agent_timeout: Duration,
    /// How often a running upgrade's operation is read from its agent (agents cannot notify).
    pub upgrade_poll: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            agent_port: 9443,
            max_attempts: 3,
            retry_base: Duration::from_secs(10),
            agent_timeout: Duration::from_secs(30),
            upgrade_poll: Duration::from_secs(2),
        }
    }
}

/// Severity of an event, as `kubectl describe` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// A Machine's agent, reachable only if it is the agent of that Machine's node.
pub struct MachineAgent {
    pub url: String,
    pub client: AgentClient,
}

pub struct Context {
    pub client: Client,
    reporting_instance: String,
    pub settings: Settings,
    pub credentials: CredentialStore,
    /// Machines (namespace/name) with work running in this process, and since when, so a
    /// reconcile never starts the same work twice and never waits for it.
    running: Mutex<HashMap<String, Instant>>,
}

impl Context {
    pub fn new(client: Client, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            reporting_instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "caretaker".into()),
            client,
            settings,
            credentials: CredentialStore::default(),
            running: Mutex::default(),
        })
    }

    /// Marks `key` busy; false if it already was.
    pub fn try_begin(&self, key: &str) -> bool {
        let mut running = self.running.lock().expect("running lock");
        if running.contains_key(key) {
            return false;
        }
        running.insert(key.to_string(), Instant::now());
        true
    }

    pub fn end(&self, key: &str) {
        self.running.lock().expect("running lock").remove(key);
    }

    /// Runs `work` of one capability (`refresh`, `upgrade`) for a Machine unless such work is
    /// already running in this process. Returns whether it started; when it did not, the
    /// caller must look again later, since the running work may end without changing the
    /// Machine.
    #[must_use]
    pub fn spawn_for(
        self: &Arc<Self>,
        capability: &str,
        machine: &MachineView,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let key = work_key(capability, machine);
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

    /// How long the Machine's `capability` work has been running in this process (zero when
    /// none is).
    pub fn running_for(&self, capability: &str, machine: &MachineView) -> Duration {
        self.running
            .lock()
            .expect("running lock")
            .get(&work_key(capability, machine))
            .map_or(Duration::ZERO, Instant::elapsed)
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
        let url = machine
            .agent_url(self.settings.agent_port)
            .ok_or_else(|| Error::NoAgentEndpoint(machine.name.clone()))?;
        let names: Vec<String> = machine
            .node_name
            .iter()
            .chain(&machine.addresses)
            .cloned()
            .collect();
        if names.is_empty() {
            return Err(Error::NoAgentEndpoint(machine.name.clone()));
        }
        let client = self.credentials_for(machine).await?.agent_for(&names)?;
        Ok(MachineAgent { url, client })
    }

    /// Merge-patches a Machine's annotations (`null` removes one).
    pub async fn patch_annotations(
        &self,
        machine: &MachineView,
        annotations: BTreeMap<String, Value>,
    ) -> Result<(), Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &machine.namespace,
            &crate::machine::api_resource(),
        );
        let body = json!({ "metadata": { "annotations": annotations } });
        api.patch(&machine.name, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        Ok(())
    }

    /// Records the end of work the Machine did for trigger value `worked` (see
    /// [`crate::machine::end_patch`]): reads it fresh and writes `annotations` on that version,
    /// reading again if it changed meanwhile. `false` when nothing was written: the Machine is
    /// gone or its trigger now asks for something else.
    pub async fn record_end(
        &self,
        machine: &MachineView,
        trigger_key: &str,
        worked: Option<&str>,
        annotations: BTreeMap<String, Value>,
    ) -> Result<bool, Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &machine.namespace,
            &crate::machine::api_resource(),
        );
        let mut conflicts = 0;
        loop {
            let Some(object) = api.get_opt(&machine.name).await? else {
                return Ok(false);
            };
            let fresh = MachineView::from_object(&object);
            let Some(body) = crate::machine::end_patch(&fresh, trigger_key, worked, &annotations)
            else {
                tracing::info!(machine = %machine.name, "the trigger changed while the work ran; its end is not recorded, the new value starts anew");
                return Ok(false);
            };
            match api
                .patch(&machine.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 && conflicts < 5 => conflicts += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publishes an event about a Machine.
    pub async fn machine_event(
        &self,
        machine: &DynamicObject,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = machine.object_ref(&crate::machine::api_resource());
        self.event(&reference, type_, reason, note).await;
    }

    /// Publishes an events.k8s.io/v1 Event; a failure to publish is logged, never fatal.
    ///
    /// Every call creates a new Event. kube-rs's `Recorder` folds events with the same reason
    /// into one series that keeps the first note, which would hide, say, the second bad
    /// trigger value; each of these notes matters.
    pub async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let now = time_now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or("object"),
                    now.unix_timestamp_nanos()
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            action: Some(reason.into()),
            reason: Some(reason.into()),
            // The API server caps notes at 1 KiB.
            note: Some(note.chars().take(1000).collect()),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            regarding: Some(regarding.clone()),
            reporting_controller: Some("caretaker.dev/operator".into()),
            reporting_instance: Some(self.reporting_instance.clone()),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(reason, error = %e, "cannot publish an event");
        }
    }
}

/// Names one capability's work for one Machine.
fn work_key(capability: &str, machine: &MachineView) -> String {
    format!("{capability}:{}/{}", machine.namespace, machine.name)
}
