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
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta, PostParams};

use crate::Settings;
use crate::changes::{Event, EventType};
use crate::metrics::{Metrics, Readiness, ReconcileTimer};

use crate::credentials::CredentialStore;
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

pub struct Context {
    pub client: Client,
    reporting_instance: String,
    pub settings: Settings,
    pub credentials: CredentialStore,
    /// Machines (namespace/name) with work running in this process, and since when, so a
    /// reconcile never starts the same work twice and never waits for it.
    pub(crate) running: Mutex<HashMap<String, Instant>>,
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
    /// Events waiting to be published, in order, by one task of their own
    /// ([`Self::publish_in_order`]).
    event_queue: OnceLock<tokio::sync::mpsc::UnboundedSender<QueuedEvent>>,
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
            event_queue: OnceLock::new(),
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

    /// The objects of `resource` in `namespace`.
    pub fn api(&self, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, resource)
    }

    /// Publishes an event after the caller has moved on. Events are published in the order
    /// they were queued, by one task, and SIGTERM waits for those queued before it.
    pub fn publish_in_order(self: &Arc<Self>, regarding: ObjectReference, event: Event) {
        let queued = (regarding, event, self.shutdown.running());
        let queue = self.event_queue.get_or_init(|| {
            let (queue, mut waiting) = tokio::sync::mpsc::unbounded_channel::<QueuedEvent>();
            // Weak: the queue lives in the context, so the task ends with it.
            let ctx = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some((regarding, event, _running)) = waiting.recv().await {
                    let Some(ctx) = ctx.upgrade() else { break };
                    ctx.event(&regarding, event).await;
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
