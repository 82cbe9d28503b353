//! The watch protocol: a stream of `{"type": ..., "object": ...}` lines.
//!
//! A watch first subscribes to the store's live changes, then reads its starting point (the
//! current objects, or the change log after the requested resourceVersion), then streams live
//! changes newer than what it already sent. Subscribing first means nothing committed in
//! between can be missed; the resourceVersion check drops what would be sent twice.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::api::ApiState;
use crate::error::{ApiError, FieldError, FieldErrorKind};
use crate::http::media::{self, Representation};
use crate::schema::table::{self, IncludeObject};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::registry::ResourceDef;
use crate::store::storage::{Change, ChangeType};

#[derive(Debug, Clone)]
pub struct WatchParams {
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    pub send_initial_events: Option<bool>,
    pub allow_bookmarks: bool,
    pub timeout: Duration,
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
    /// Objects, Table objects (`kubectl get -w`) or metadata only (metadata informers).
    pub representation: Representation,
    /// How much of each object a Table row carries.
    pub include: IncludeObject,
    pub bookmark_interval: Duration,
}

/// kube-apiserver's checks of a watch's `sendInitialEvents` and `resourceVersionMatch`
/// (`validateWatchOptions`), refused as it refuses them: 422 on `ListOptions`.
pub fn check_options(
    send_initial_events: Option<bool>,
    resource_version_match: Option<&str>,
    continuing: bool,
) -> Result<(), ApiError> {
    const NOT_OLDER_THAN: &str = "NotOlderThan";
    let matching = resource_version_match.filter(|m| !m.is_empty());
    let forbidden =
        |message: &str| FieldError::new("resourceVersionMatch", FieldErrorKind::Forbidden, message);
    let mut errs = Vec::new();
    if send_initial_events.is_some() && matching != Some(NOT_OLDER_THAN) {
        errs.push(forbidden(
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if let Some(m) = matching {
        if send_initial_events.is_none() {
            errs.push(forbidden(
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if m != NOT_OLDER_THAN {
            errs.push(FieldError::new(
                "resourceVersionMatch",
                FieldErrorKind::NotSupported,
                format!("{m:?}: supported values: \"{NOT_OLDER_THAN}\""),
            ));
        }
        if continuing {
            errs.push(forbidden(
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", &errs))
    }
}

struct Watcher {
    state: Arc<ApiState>,
    def: Arc<ResourceDef>,
    params: WatchParams,
    out: mpsc::Sender<Bytes>,
    /// Newest resourceVersion this watch has accounted for (sent or filtered out).
    seen_rv: u64,
    /// The name under which watches share the encoding of a change's object in this watch's
    /// form (see [`Change::encoded`]); none for Tables, whose rows are this watch's own.
    shared_form: Option<String>,
}

impl Watcher {
    fn in_namespace(&self, change: &Change) -> bool {
        change.key.resource == self.def.storage_key
            && (self.params.namespace.as_deref()).is_none_or(|ns| ns == change.key.namespace)
    }

    fn matches(&self, change: &Change, served: &Value) -> bool {
        self.in_namespace(change)
            && self
                .params
                .labels
                .as_ref()
                .is_none_or(|s| s.matches(served))
            && self
                .params
                .fields
                .as_ref()
                .is_none_or(|s| s.matches(served))
    }

    fn encode(&self, kind: &str, object: Value) -> Bytes {
        let object = serde_json::to_vec(&self.form(kind, object)).expect("JSON values encode");
        event_line(kind, &object)
    }

    /// `object` (served) in the form this watch asked for.
    fn form(&self, kind: &str, object: Value) -> Value {
        match self.params.representation {
            Representation::Table if kind != "BOOKMARK" => table::table(
                &self.def,
                std::slice::from_ref(&object),
                json!({}),
                self.params.include,
            ),
            // Bookmarks too, as kube-apiserver transforms every event's object.
            Representation::Metadata { version } => media::partial_object(&object, version),
            _ => object,
        }
    }

    async fn send(&self, kind: &str, object: Value) -> bool {
        self.out.send(self.encode(kind, object)).await.is_ok()
    }

    /// The `ERROR` event that ends a watch: its `Status` as every other answer writes one.
    async fn send_error(&self, error: ApiError) {
        let status = error.status_body();
        let line = event_line("ERROR", status.trim_end().as_bytes());
        let _ = self.out.send(line).await;
    }

    async fn send_change(&mut self, change: &Change) -> bool {
        if change.rv <= self.seen_rv {
            return true;
        }
        self.seen_rv = change.rv;
        if change.key.resource != self.def.storage_key {
            return true;
        }
        let kind = if self.params.labels.is_none() && self.params.fields.is_none() {
            // Nothing to match but the namespace: no copy of the object needed.
            if !self.in_namespace(change) {
                return true;
            }
            change.kind.as_str()
        } else {
            let now_matches = self.matches(change, &self.def.served(&change.object));
            // With a selector, an object that starts or stops matching is ADDED or DELETED for
            // this watch, as kube-apiserver's watch cache reports it.
            let was_matching = change
                .previous
                .as_deref()
                .and_then(|p| serde_json::from_str(p).ok())
                .map(|p: Value| self.matches(change, &self.def.served(&p)));
            match (change.kind, was_matching, now_matches) {
                (ChangeType::Modified, Some(true), false) => "DELETED",
                (ChangeType::Modified, Some(false), true) => "ADDED",
                (_, _, false) => return true,
                (kind, _, true) => kind.as_str(),
            }
        };
        let encode = || {
            let encoded = match self.params.representation {
                // Metadata alone: encoded from the object's own, without a copy of anything.
                Representation::Metadata { version } => {
                    serde_json::to_vec(&media::PartialObject::of(&change.object, version))
                }
                _ => serde_json::to_vec(&self.form(kind, self.def.served(&change.object))),
            };
            Bytes::from(encoded.expect("JSON values encode"))
        };
        let stored = change.encoded.as_stored();
        let object = match (&self.params.representation, stored, &self.shared_form) {
            // Served as stored: the store's JSON is this watch's, with nothing to encode.
            (Representation::Object, Some(stored), _)
                if self.def.serves_as_stored(&change.object) =>
            {
                stored.clone()
            }
            (_, _, Some(form)) => change.encoded.get_or_encode(form, encode),
            (_, _, None) => encode(),
        };
        self.out.send(event_line(kind, &object)).await.is_ok()
    }

    async fn bookmark(&self, initial_events_end: bool) -> bool {
        let mut metadata = json!({ "resourceVersion": self.seen_rv.to_string() });
        if initial_events_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object = json!({ "kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": metadata });
        self.send("BOOKMARK", object).await
    }

    async fn run(mut self, mut live: broadcast::Receiver<Arc<Change>>) {
        let deadline = tokio::time::sleep(self.params.timeout);
        tokio::pin!(deadline);
        if !self.start().await {
            return;
        }
        let mut ticks = tokio::time::interval(self.params.bookmark_interval);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = self.out.closed() => return,
                _ = ticks.tick(), if self.params.allow_bookmarks => {
                    if !self.bookmark(false).await { return; }
                }
                received = live.recv() => match received {
                    Ok(change) => {
                        if !self.send_change(&change).await { return; }
                    }
                    // Too slow to keep up: end the stream; the client resumes from the last
                    // resourceVersion it saw, served from the change log.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    /// Sends the starting point. Returns false if the stream is over.
    async fn start(&mut self) -> bool {
        let rv = self.params.resource_version.clone().unwrap_or_default();
        let from_state =
            rv.is_empty() || rv == "0" || self.params.send_initial_events == Some(true);
        if from_state {
            let listed = self.state.store.list(
                &self.def.storage_key,
                self.params.namespace.as_deref(),
                None,
            );
            let (objects, list_rv) = match listed {
                Ok(x) => x,
                Err(e) => {
                    self.send_error(ApiError::from(e)).await;
                    return false;
                }
            };
            for object in objects {
                let served = self.def.served(&object);
                let fake = Change {
                    rv: 0,
                    key: ApiState::key(
                        &self.def,
                        crate::meta::namespace_of(&object),
                        crate::meta::name_of(&object),
                    ),
                    kind: ChangeType::Added,
                    object: Arc::new(object),
                    previous: None,
                    encoded: Default::default(),
                };
                if self.matches(&fake, &served) && !self.send("ADDED", served).await {
                    return false;
                }
            }
            self.seen_rv = list_rv;
            if self.params.send_initial_events == Some(true) && self.params.allow_bookmarks {
                return self.bookmark(true).await;
            }
            return true;
        }
        let Ok(since) = rv.parse::<u64>() else {
            let err = ApiError::bad_request(format!("invalid resource version: {rv:?}"));
            self.send_error(err).await;
            return false;
        };
        match self.state.store.changes_since(&self.def.storage_key, since) {
            Ok(Ok(changes)) => {
                self.seen_rv = since;
                for change in changes {
                    if !self.send_change(&change).await {
                        return false;
                    }
                }
                true
            }
            Ok(Err(oldest)) => {
                self.send_error(ApiError::expired(since, oldest)).await;
                false
            }
            Err(e) => {
                self.send_error(ApiError::from(e)).await;
                false
            }
        }
    }
}

/// One event of the stream, `type` first as kube-apiserver writes it, from its object's JSON.
fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(br#"","object":"#);
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// Starts a watch; the returned stream yields newline-delimited JSON events until the timeout,
/// the client going away, or an error event.
pub fn start(
    state: Arc<ApiState>,
    def: Arc<ResourceDef>,
    params: WatchParams,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let live = state.store.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let shared_form = match params.representation {
        Representation::Object => Some(def.api_version()),
        Representation::Metadata { version } => Some(format!("meta.k8s.io/{version}")),
        Representation::Table => None,
    };
    let watcher = Watcher {
        state,
        def,
        params,
        out: tx,
        seen_rv: 0,
        shared_form,
    };
    tokio::spawn(watcher.run(live));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}
