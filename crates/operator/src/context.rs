//! Shared plumbing of the controllers: the Kubernetes client, the event recorder, the work
//! running in this process, the cluster credentials, the metrics and the readiness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::Resource;
use kube::api::{
    Api, ApiResource, DynamicObject, PartialObjectMeta, Patch, PatchParams, PostParams,
};

use caretaker_agent_api::client::AgentClient;

use crate::Error;
use crate::Settings;
use crate::changes::{AnnotationChanges, Event, EventType};
use crate::machine::MachineView;
use crate::machine::plan::end_patch;
use crate::metrics::{Metrics, Readiness, ReconcileTimer};
use crate::names::Operation;

use crate::credentials::{ClusterCredentials, CredentialStore};
use crate::shutdown::{Running, Shutdown};

/// The operator's bounds on every call to the API server, set on its client configuration
/// ([`with_timeouts`]): connecting, sending a request, and waiting for each read of an
/// answer. The read bound is above the watches' own (kube's watcher ends a watch that has been
/// quiet for 295 s and starts another), so a quiet watch is never cut by it; a call on a
/// connection that stopped answering fails after it instead of hanging for good. Leader
/// election does not rely on these: its own calls are cut at its renew deadline.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const API_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
pub const API_READ_TIMEOUT: Duration = Duration::from_secs(300);

/// `config` with [`API_CONNECT_TIMEOUT`], [`API_WRITE_TIMEOUT`] and [`API_READ_TIMEOUT`], the
/// read bound counted from when each request was sent (not from when its pooled connection
/// went idle).
pub fn with_timeouts(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(API_CONNECT_TIMEOUT);
    config.write_timeout = Some(API_WRITE_TIMEOUT);
    config.read_timeout = Some(API_READ_TIMEOUT);
    config.reset_reader_on_write = true;
    config
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
    /// Parents (kind/namespace/name) this process wrote at a resourceVersion, and that version:
    /// a pass that still sees the parent at it sees it from before that write.
    parents_written_at: Mutex<HashMap<String, String>>,
    /// When this process last wrote each parent's (kind/namespace/name) progress.
    progress_written: Mutex<HashMap<String, Instant>>,
    /// Held by a rollout pass from its fresh look at the control plane until its start of a
    /// control-plane Machine is written: the passes of different parents and operations run
    /// concurrently, each on a cache that may lag, and only one may start a control-plane
    /// Machine at a time.
    pub control_plane_starts: tokio::sync::Mutex<()>,
    /// Bounds the expiry reads running at once: at start every Machine without an expiry is
    /// read, and a thousand TLS connections at once cost memory the process keeps.
    pub expiry_reads: tokio::sync::Semaphore,
    /// The process's metrics, served on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// What `/readyz` answers.
    pub readiness: Arc<Readiness>,
    /// Tells the controllers to stop taking new work (SIGTERM).
    pub shutdown: Arc<Shutdown>,
    /// Machine events waiting to be published, in order, by one task of their own
    /// ([`Self::publish_machine_event`]).
    machine_events: OnceLock<tokio::sync::mpsc::UnboundedSender<QueuedEvent>>,
}

/// An event waiting to be published, and the shutdown guard that keeps SIGTERM waiting for it.
type QueuedEvent = (ObjectReference, Event, Running);

/// A reconcile being run: see [`Context::reconcile_started`].
pub struct Reconciling {
    _timer: ReconcileTimer,
    _running: Running,
}

/// Expiry reads from agents at once.
const EXPIRY_READS: usize = 16;

impl Context {
    pub fn new(client: Client, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            reporting_instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "caretaker".into()),
            client,
            settings,
            credentials: CredentialStore::default(),
            running: Mutex::default(),
            parents_written_at: Mutex::default(),
            progress_written: Mutex::default(),
            control_plane_starts: tokio::sync::Mutex::new(()),
            expiry_reads: tokio::sync::Semaphore::new(EXPIRY_READS),
            metrics: Metrics::new(),
            readiness: Readiness::new(),
            shutdown: Shutdown::new(),
            machine_events: OnceLock::new(),
        })
    }

    /// Times one reconcile of `controller` and counts it as running (what SIGTERM waits
    /// for) until the returned guard is dropped.
    #[must_use = "the reconcile is recorded when the guard is dropped"]
    pub fn reconcile_started(&self, controller: &'static str) -> Reconciling {
        Reconciling {
            _timer: self.metrics.reconcile_started(controller),
            _running: self.shutdown.running(),
        }
    }

    /// Whether this process has written the parent `key` since it was at `version`: a write at
    /// that version would be refused (409 Conflict), so it is not sent.
    pub fn parent_written_since(&self, key: &str, version: &str) -> bool {
        self.parents_written_at
            .lock()
            .expect("parents lock")
            .get(key)
            .is_some_and(|at| at == version)
    }

    /// Notes that the parent `key` was written at `version`.
    pub fn parent_written(&self, key: &str, version: &str) {
        self.parents_written_at
            .lock()
            .expect("parents lock")
            .insert(key.to_string(), version.to_string());
    }

    /// How long ago this process wrote the progress of parent `key`, if it has.
    pub fn progress_age(&self, key: &str) -> Option<Duration> {
        self.progress_written
            .lock()
            .expect("progress lock")
            .get(key)
            .map(|at| at.elapsed())
    }

    /// Notes that the progress of parent `key` was written now.
    pub fn progress_written(&self, key: &str) {
        self.progress_written
            .lock()
            .expect("progress lock")
            .insert(key.to_string(), Instant::now());
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

    /// The objects of `resource` in `namespace`.
    pub fn api(&self, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, resource)
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
            .api(&machine.namespace, &crate::machine::api_resource())
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
        let api = self.api(&machine.namespace, &crate::machine::api_resource());
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
        let reference = machine.object_ref(&crate::machine::api_resource());
        self.event(&reference, event).await;
    }

    /// Publishes an event about a Machine after the caller has moved on: the Machine
    /// controller's next step (its attempt, the parent's next start) waits on no event's
    /// round trip. Events are published in the order they were queued, and SIGTERM waits for
    /// those queued before it.
    pub fn publish_machine_event(self: &Arc<Self>, machine: &DynamicObject, event: Event) {
        let reference = machine.object_ref(&crate::machine::api_resource());
        let queued = (reference, event, self.shutdown.running());
        let queue = self.machine_events.get_or_init(|| {
            let (queue, mut waiting) = tokio::sync::mpsc::unbounded_channel::<QueuedEvent>();
            // Weak: the queue lives in the context, so the task ends with it.
            let ctx = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some((reference, event, _running)) = waiting.recv().await {
                    let Some(ctx) = ctx.upgrade() else { break };
                    ctx.event(&reference, event).await;
                }
            });
            queue
        });
        // Fails only once the task has ended with the context, when nothing is published.
        let _ = queue.send(queued);
    }

    /// Publishes an events.k8s.io/v1 Event; a failure to publish is logged, never fatal.
    ///
    /// Every call creates a new Event. kube-rs's `Recorder` folds events with the same reason
    /// into one series that keeps the first note, which would hide, say, the second bad
    /// trigger value; each of these notes matters.
    pub async fn event(&self, regarding: &ObjectReference, event: Event) {
        let Event {
            type_,
            reason,
            note,
            action,
        } = event;
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let now = time_now();
        let event = KubeEvent {
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
            action: Some(action.into()),
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
        let events: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        let params = PostParams::default();
        if let Err(e) = create_for_metadata(&self.client, &events, &params, &event).await {
            tracing::warn!(reason, error = %e, "cannot publish an event");
        }
    }
}

/// Creates `object` through `api`, answered with its metadata alone ([`send_for_metadata`]).
pub(crate) async fn create_for_metadata<K: Resource + serde::Serialize>(
    client: &Client,
    api: &Api<K>,
    params: &PostParams,
    object: &K,
) -> Result<PartialObjectMeta<K>, kube::Error> {
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(api.resource_url())
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    send_for_metadata(client, request, "create").await
}

/// Sends `request` (a single-object request; `verb` names it for the client's metrics) asking
/// for the answer's metadata alone, as kube-apiserver serves any such answer: writers that only
/// look at the answer's resourceVersion (events, status, Secret patches) would otherwise read
/// the whole object back, each one encoded, sent and decoded for nothing.
pub(crate) async fn send_for_metadata<K: Resource>(
    client: &Client,
    mut request: http::Request<Vec<u8>>,
    verb: &'static str,
) -> Result<PartialObjectMeta<K>, kube::Error> {
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    request.extensions_mut().insert(verb);
    client.request(request).await
}

/// The `Accept` value that asks for a single object's metadata alone.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

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
