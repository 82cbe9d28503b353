//! The Machines and MachineDeployments the controllers read, kept in memory by watches instead
//! of listed on every reconcile.
//!
//! One Machine watch fills the cache and then passes each change on to every controller (the
//! Machine controller and the three parent kinds), so a reconcile always sees at least the
//! change that woke it. After a (re)list every cached Machine is passed on once the new state
//! is complete, so nothing a reconcile decided on the old state is left waiting for an event
//! that already went by; so is every Machine the relist found gone (deleted while the watch
//! was down), as it was last seen, so that what was kept about it (its metrics) goes too.
//!
//! Beside the objects, the cache keeps each Machine's [`MachineView`], made once per version:
//! a rollout pass reads every Machine its parent covers, and converting them all on every pass
//! was most of the operator's work with a thousand Machines.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::machine::MachineView;

/// Machine changes waiting for a controller to take them.
const CHANGES_BUFFER: usize = 1024;

/// The caches; cheap to clone.
#[derive(Clone)]
pub struct Caches {
    machines: Store<DynamicObject>,
    deployments: Store<DynamicObject>,
    /// What fills the Machine cache and its views, and tells the controllers.
    feed: Arc<Feed>,
    /// Whether each cache has had its first complete list. (kube's own
    /// `Store::wait_until_ready` wakes only one of several waiting tasks.)
    ready: [watch::Receiver<bool>; 2],
}

/// Whether a controller hears of a Machine's change from the first view to the second. Every
/// controller hears of new and deleted Machines and of every Machine after a (re)list.
pub type ChangeFilter = fn(&MachineView, &MachineView) -> bool;

/// The filter of a controller that hears of every change.
pub fn every_change(_old: &MachineView, _new: &MachineView) -> bool {
    true
}

/// A stream of Machine changes for one controller, as `Controller::for_stream` and
/// `Controller::watches_stream` take it.
pub type MachineChanges =
    std::pin::Pin<Box<dyn Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static>>;

impl Caches {
    /// The caches over what `machines` and `deployments` can see, the future that keeps them
    /// (run it beside the controllers) and one stream of Machine changes per filter in
    /// `subscribers`.
    pub fn new(
        machines: Api<DynamicObject>,
        machine_resource: ApiResource,
        deployments: Api<DynamicObject>,
        deployment_resource: ApiResource,
        subscribers: Vec<ChangeFilter>,
    ) -> (Self, impl Future<Output = ()> + Send, Vec<MachineChanges>) {
        let machines_writer = Writer::new(machine_resource);
        let deployments_writer = Writer::new(deployment_resource);
        let (machines_ready, machines_ready_rx) = watch::channel(false);
        let (deployments_ready, deployments_ready_rx) = watch::channel(false);
        let caches = Caches {
            machines: machines_writer.as_reader(),
            deployments: deployments_writer.as_reader(),
            feed: Arc::new(Feed::new(machines_writer)),
            ready: [machines_ready_rx, deployments_ready_rx],
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = subscribers
            .into_iter()
            .map(|filter| {
                let (sender, receiver) = mpsc::channel::<Arc<DynamicObject>>(CHANGES_BUFFER);
                ((filter, sender), receiver)
            })
            .unzip();

        let feed = caches.feed.clone();
        feed.senders
            .set(senders)
            .unwrap_or_else(|_| unreachable!("a new cache has no subscribers yet"));
        let machines_ready = Arc::new(machines_ready);
        let keep_machines = watcher(machines, watcher::Config::default())
            .modify(forget_managed_fields)
            .default_backoff()
            .for_each(move |event| {
                let (feed, ready) = (feed.clone(), machines_ready.clone());
                async move {
                    match event {
                        Ok(watcher::Event::Apply(m)) => {
                            if let Some(change) = feed.take(m, Source::Watch) {
                                feed.tell(change).await;
                            }
                        }
                        Ok(watcher::Event::Delete(m)) => {
                            feed.delete(&m);
                            feed.tell_everyone(vec![Arc::new(m)]).await;
                        }
                        Ok(event @ (watcher::Event::Init | watcher::Event::InitApply(_))) => {
                            feed.relist(&event);
                        }
                        Ok(event @ watcher::Event::InitDone) => {
                            // The views change before anyone hears of the change, as the
                            // store does.
                            let everyone = feed.relist(&event);
                            ready.send_replace(true);
                            feed.tell_everyone(everyone).await;
                        }
                        Err(e) => tracing::warn!(error = %e, "watching Machines failed; retrying"),
                    }
                }
            });
        let deployments_ready = Arc::new(deployments_ready);
        let keep_deployments = reflector(
            deployments_writer,
            watcher(deployments, watcher::Config::default()).modify(forget_managed_fields),
        )
        .default_backoff()
        .for_each(move |event| {
            let ready = deployments_ready.clone();
            async move {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        ready.send_replace(true);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "watching MachineDeployments failed; retrying")
                    }
                }
            }
        });
        let keep = async move {
            futures::join!(keep_machines, keep_deployments);
        };
        let changes = receivers
            .into_iter()
            .map(|receiver| {
                futures::stream::unfold(receiver, |mut receiver| async move {
                    let change = receiver.recv().await?;
                    Some((Ok(DynamicObject::clone(&change)), receiver))
                })
                .boxed()
            })
            .collect();
        (caches, keep, changes)
    }

    /// The Machine cache.
    pub fn machines(&self) -> Store<DynamicObject> {
        self.machines.clone()
    }

    /// Waits until both caches have had their first complete list: before, an empty cache
    /// would read as a rollout with no Machines, and so as done.
    pub async fn wait_until_ready(&self) -> Result<(), Error> {
        for ready in &self.ready {
            ready
                .clone()
                .wait_for(|ready| *ready)
                .await
                .map_err(|_| Error::CacheStopped)?;
        }
        Ok(())
    }

    /// Takes a Machine as this process's own write left it (the API server's answer to the
    /// write), so that every controller sees the write at once rather than a watch round trip
    /// later; a version the watch has already brought, or gone past, is left alone.
    pub async fn record_write(&self, mut machine: DynamicObject) {
        forget_managed_fields(&mut machine);
        if let Some(change) = self.feed.take(machine, Source::OwnWrite) {
            self.feed.tell(change).await;
        }
    }

    /// The cached Machines of a namespace, as views shared with every other reader.
    pub fn machines_in(&self, namespace: &str) -> Vec<Arc<MachineView>> {
        read(&self.feed.views)
            .by_namespace
            .get(namespace)
            .map(|machines| machines.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The cached MachineDeployments of a Cluster.
    pub fn deployments_of(&self, cluster: &DynamicObject) -> Vec<Arc<DynamicObject>> {
        self.deployments
            .state()
            .into_iter()
            .filter(|d| {
                d.metadata.namespace == cluster.metadata.namespace
                    && d.data["spec"]["clusterName"].as_str() == cluster.metadata.name.as_deref()
            })
            .collect()
    }
}

/// Where a Machine's version comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The Machine watch.
    Watch,
    /// The API server's answer to a write of this process.
    OwnWrite,
}

/// Whether the cache takes a Machine at version `incoming` from `source`, holding it at
/// `cached` (`None`: not cached).
///
/// The watch is the source of truth: it brings every version, in order, and is taken unless it
/// brings a version the cache already holds or has gone past (one this process's own write put
/// there first). An own write is taken only over an older cached version of a Machine the
/// watch has brought, so it can never put back a version the watch has moved past, nor bring
/// a Machine the watch has not. Versions are compared as numbers, as both kube-apiserver (etcd
/// revisions) and the embedded API server write them; where either is not a number, nothing
/// is compared: the watch is always taken and own writes never are, as without this shortcut.
fn takes(source: Source, cached: Option<&str>, incoming: Option<&str>) -> bool {
    let number = |version: Option<&str>| version.and_then(|v| v.parse::<u64>().ok());
    let newer = match (number(cached), number(incoming)) {
        (Some(cached), Some(incoming)) => Some(incoming > cached),
        _ => None,
    };
    match source {
        Source::Watch => newer != Some(false),
        Source::OwnWrite => newer == Some(true),
    }
}

/// A Machine's change as the controllers hear of it: the object, and its old and new views.
struct Change {
    machine: Arc<DynamicObject>,
    old: Option<Arc<MachineView>>,
    new: Arc<MachineView>,
}

/// Fills the Machine cache (the objects and their views) from the watch and from this
/// process's own writes, one version at a time, and tells the controllers of each change.
///
/// Own writes are the shortcut on a rollout's critical path: the Machine controller's `done`
/// reaches the parent's pass, and the parent's start reaches the Machine controller, as soon as
/// the API server answers the write, not a watch round trip later. The watch event of the same
/// version then changes nothing and wakes nobody.
struct Feed {
    /// The objects, as [`Caches::machines`] serves them. Also orders every change: whoever
    /// holds it decides and applies one version.
    store: Mutex<Writer<DynamicObject>>,
    views: Arc<RwLock<MachineViews>>,
    /// Each controller's filter and channel; set once, when the cache is made.
    senders: OnceLock<Vec<(ChangeFilter, mpsc::Sender<Arc<DynamicObject>>)>>,
}

impl Feed {
    fn new(store: Writer<DynamicObject>) -> Self {
        Self {
            store: Mutex::new(store),
            views: Default::default(),
            senders: OnceLock::new(),
        }
    }

    /// Takes Machine `m` from `source` if it is news (see [`takes`]); returns the change.
    fn take(&self, m: DynamicObject, source: Source) -> Option<Change> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let cached = read(&self.views)
            .get(&m)
            .and_then(|view| view.resource_version.clone());
        if !takes(source, cached.as_deref(), m.metadata.resource_version.as_deref()) {
            return None;
        }
        let event = watcher::Event::Apply(m);
        store.apply_watcher_event(&event);
        let watcher::Event::Apply(m) = event else {
            unreachable!("made above")
        };
        let (old, new) = write(&self.views).apply(&m);
        Some(Change {
            machine: Arc::new(m),
            old,
            new,
        })
    }

    fn delete(&self, m: &DynamicObject) {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store.apply_watcher_event(&watcher::Event::Delete(m.clone()));
        write(&self.views).delete(m);
    }

    /// Passes on a relist's event; once it is complete (`InitDone`), the views follow the new
    /// state, and what everyone must hear of is returned: every Machine, and those found gone.
    fn relist(&self, event: &watcher::Event<DynamicObject>) -> Vec<Arc<DynamicObject>> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store.apply_watcher_event(event);
        if !matches!(event, watcher::Event::InitDone) {
            return Vec::new();
        }
        let mut state = store.as_reader().state();
        let gone = write(&self.views).replace(MachineViews::of(&state));
        state.extend(gone);
        state
    }

    /// Tells each controller whose filter passes the change.
    async fn tell(&self, change: Change) {
        for (filter, sender) in self.senders.get().into_iter().flatten() {
            let hears = match &change.old {
                Some(old) => filter(old, &change.new),
                None => true,
            };
            if hears {
                let _ = sender.send(change.machine.clone()).await;
            }
        }
    }

    async fn tell_everyone(&self, machines: Vec<Arc<DynamicObject>>) {
        for m in machines {
            for (_, sender) in self.senders.get().into_iter().flatten() {
                let _ = sender.send(m.clone()).await;
            }
        }
    }
}

/// One [`MachineView`] per cached Machine, by namespace and name.
#[derive(Debug, Default)]
struct MachineViews {
    by_namespace: HashMap<String, BTreeMap<String, Arc<MachineView>>>,
}

impl MachineViews {
    fn of(machines: &[Arc<DynamicObject>]) -> Self {
        let mut views = Self::default();
        for m in machines {
            views.apply(m);
        }
        views
    }

    /// The view of Machine `m`, if it is cached.
    fn get(&self, m: &DynamicObject) -> Option<&Arc<MachineView>> {
        let (namespace, name) = (m.metadata.namespace.as_ref()?, m.metadata.name.as_ref()?);
        self.by_namespace.get(namespace)?.get(name)
    }

    /// Records the Machine's new version; returns the view it replaces and the new one.
    fn apply(&mut self, machine: &DynamicObject) -> (Option<Arc<MachineView>>, Arc<MachineView>) {
        let view = Arc::new(MachineView::from_object(machine));
        let old = self
            .by_namespace
            .entry(view.namespace.clone())
            .or_default()
            .insert(view.name.clone(), view.clone());
        (old, view)
    }

    /// Replaces every view with `fresh`'s; returns the Machines only the old views had, as
    /// objects with their last known name, namespace, labels and cluster (enough to say who
    /// they concerned).
    fn replace(&mut self, fresh: MachineViews) -> Vec<Arc<DynamicObject>> {
        let old = std::mem::replace(self, fresh);
        let mut gone = Vec::new();
        for (namespace, machines) in old.by_namespace {
            let now = self.by_namespace.get(&namespace);
            for (name, view) in machines {
                if now.is_some_and(|now| now.contains_key(&name)) {
                    continue;
                }
                let mut object = DynamicObject::new(&name, &crate::machine::api_resource())
                    .within(&namespace)
                    .data(serde_json::json!({ "spec": { "clusterName": view.cluster_name } }));
                object.metadata.labels = Some(view.labels.clone());
                gone.push(Arc::new(object));
            }
        }
        gone
    }

    fn delete(&mut self, machine: &DynamicObject) {
        let (Some(namespace), Some(name)) = (&machine.metadata.namespace, &machine.metadata.name)
        else {
            return;
        };
        if let Some(machines) = self.by_namespace.get_mut(namespace) {
            machines.remove(name);
            if machines.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
    }
}

/// The views for writing; a panic elsewhere while holding them leaves nothing half-written
/// (each change is one insert or remove), so a poisoned lock is still good.
fn read(views: &RwLock<MachineViews>) -> std::sync::RwLockReadGuard<'_, MachineViews> {
    views.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(views: &RwLock<MachineViews>) -> std::sync::RwLockWriteGuard<'_, MachineViews> {
    views
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Drops what no controller reads and the API server adds to every object it serves: its
/// `managedFields`, one entry per writer and often larger than the rest of a Machine. Nothing
/// the controllers write is computed from the cached objects' `managedFields`.
fn forget_managed_fields(object: &mut DynamicObject) {
    object.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::machine;

    fn machine_object(namespace: &str, name: &str, version: &str) -> DynamicObject {
        let mut m = DynamicObject::new(name, &machine::api_resource()).within(namespace);
        m.metadata.resource_version = Some(version.to_string());
        m
    }

    #[test]
    fn the_views_follow_every_change_by_namespace() {
        let versions = |views: &MachineViews, namespace: &str| -> Vec<(String, String)> {
            let machines = views
                .by_namespace
                .get(namespace)
                .cloned()
                .unwrap_or_default();
            machines
                .values()
                .map(|m| (m.name.clone(), m.resource_version.clone().unwrap()))
                .collect()
        };
        let mut views = MachineViews::of(&[
            Arc::new(machine_object("a", "m-1", "1")),
            Arc::new(machine_object("a", "m-2", "2")),
            Arc::new(machine_object("b", "m-1", "3")),
        ]);
        views.apply(&machine_object("a", "m-1", "4"));
        assert_eq!(
            versions(&views, "a"),
            [("m-1".into(), "4".into()), ("m-2".into(), "2".into())],
            "a new version replaces the old, in its own namespace only"
        );
        assert_eq!(versions(&views, "b"), [("m-1".into(), "3".into())]);
        views.delete(&machine_object("b", "m-1", "5"));
        assert!(!views.by_namespace.contains_key("b"));
        views.delete(&machine_object("a", "m-9", "6"));
        assert_eq!(
            versions(&views, "a").len(),
            2,
            "deleting an unknown Machine is harmless"
        );
    }

    #[test]
    fn a_relist_names_the_machines_it_found_gone() {
        let mut kept = machine_object("a", "m-1", "1");
        kept.metadata.labels = Some([("role".to_string(), "worker".to_string())].into());
        let mut gone = machine_object("a", "m-2", "2");
        gone.metadata.labels = Some([("role".to_string(), "control-plane".to_string())].into());
        gone.data = serde_json::json!({ "spec": { "clusterName": "c1" } });
        let mut views = MachineViews::of(&[
            Arc::new(kept.clone()),
            Arc::new(gone),
            Arc::new(machine_object("b", "m-1", "3")),
        ]);
        let found_gone = views.replace(MachineViews::of(&[Arc::new(kept)]));
        let mut found_gone: Vec<MachineView> = found_gone
            .iter()
            .map(|m| MachineView::from_object(m))
            .collect();
        found_gone.sort_by(|x, y| (&x.namespace, &x.name).cmp(&(&y.namespace, &y.name)));
        let names: Vec<(&str, &str)> = found_gone
            .iter()
            .map(|m| (m.namespace.as_str(), m.name.as_str()))
            .collect();
        assert_eq!(names, [("a", "m-2"), ("b", "m-1")]);
        assert_eq!(found_gone[0].cluster_name, "c1", "its parents can be found");
        assert_eq!(found_gone[0].labels["role"], "control-plane");
        assert_eq!(views.by_namespace.len(), 1);
        assert!(views.replace(MachineViews::default()).len() == 1);
    }

    #[tokio::test]
    async fn every_waiting_reconcile_wakes_when_the_caches_are_ready() {
        let (machines_ready, machines_rx) = watch::channel(false);
        let (deployments_ready, deployments_rx) = watch::channel(false);
        let machines = Writer::new(machine::api_resource());
        let caches = Caches {
            machines: machines.as_reader(),
            deployments: Writer::new(machine::machine_deployment_api_resource()).as_reader(),
            feed: Arc::new(Feed::new(machines)),
            ready: [machines_rx, deployments_rx],
        };
        // One waiter per parent kind, as when all three reconcile before the first list ends.
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.wait_until_ready().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        machines_ready.send_replace(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "nobody reads a half-ready set of caches"
        );
        deployments_ready.send_replace(true);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("every waiter wakes")
                .unwrap()
                .unwrap();
        }
    }

    #[test]
    fn own_writes_only_move_a_cached_machine_forward_and_the_watch_never_back() {
        use Source::{OwnWrite, Watch};
        // (source, cached, incoming, taken)
        let table = [
            (Watch, None, Some("5"), true),
            (Watch, Some("5"), Some("6"), true),
            (Watch, Some("6"), Some("6"), false),
            (Watch, Some("7"), Some("6"), false),
            (OwnWrite, Some("5"), Some("6"), true),
            (OwnWrite, Some("6"), Some("6"), false),
            (OwnWrite, Some("7"), Some("6"), false),
            (OwnWrite, None, Some("6"), false),
            // Versions that are not numbers are never compared.
            (Watch, Some("b"), Some("a"), true),
            (Watch, Some("5"), None, true),
            (OwnWrite, Some("a"), Some("b"), false),
            (OwnWrite, Some("5"), None, false),
        ];
        for (source, cached, incoming, taken) in table {
            assert_eq!(
                takes(source, cached, incoming),
                taken,
                "{source:?} at {incoming:?} over {cached:?}"
            );
        }
    }

    fn annotated(version: &str, status: &str) -> DynamicObject {
        let mut m = machine_object("a", "m-1", version);
        m.metadata.annotations = Some([("status".to_string(), status.to_string())].into());
        m
    }

    fn cached_status(feed: &Feed) -> (String, String) {
        let views = read(&feed.views);
        let view = views.get(&machine_object("a", "m-1", "0")).unwrap();
        let from_store = feed
            .store
            .lock()
            .unwrap()
            .as_reader()
            .state()
            .into_iter()
            .map(|m| m.metadata.resource_version.clone().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(
            from_store,
            [view.resource_version.clone().unwrap()],
            "the objects and the views hold the same version"
        );
        (
            view.resource_version.clone().unwrap(),
            view.annotation("status").unwrap().to_string(),
        )
    }

    #[test]
    fn an_own_write_is_seen_at_once_and_its_watch_event_changes_nothing() {
        let feed = Feed::new(Writer::new(machine::api_resource()));
        assert!(
            feed.take(annotated("7", "done"), Source::OwnWrite).is_none(),
            "a Machine the watch has not brought is not cached from a write"
        );
        feed.take(annotated("5", "in-progress"), Source::Watch)
            .expect("the watch brings it");
        let change = feed
            .take(annotated("7", "done"), Source::OwnWrite)
            .expect("the own write moves it forward");
        assert_eq!(change.old.unwrap().annotation("status"), Some("in-progress"));
        assert_eq!(change.new.annotation("status"), Some("done"));
        assert_eq!(cached_status(&feed), ("7".into(), "done".into()));

        // The watch catches up: the version before the write, then the write's own.
        assert!(feed.take(annotated("6", "in-progress"), Source::Watch).is_none());
        assert!(feed.take(annotated("7", "done"), Source::Watch).is_none());
        assert_eq!(cached_status(&feed), ("7".into(), "done".into()));

        // Someone else's later change comes through the watch as always.
        let change = feed
            .take(annotated("8", "failed"), Source::Watch)
            .expect("a newer version");
        assert_eq!(change.old.unwrap().annotation("status"), Some("done"));
        assert!(
            feed.take(annotated("7", "done"), Source::OwnWrite).is_none(),
            "a write's answer that arrives late never puts back an older version"
        );
        assert_eq!(cached_status(&feed), ("8".into(), "failed".into()));
    }

    #[tokio::test]
    async fn each_controller_hears_of_an_own_write_through_its_filter() {
        fn status_changed(old: &MachineView, new: &MachineView) -> bool {
            old.annotation("status") != new.annotation("status")
        }
        let feed = Feed::new(Writer::new(machine::api_resource()));
        let (every, mut every_rx) = mpsc::channel(8);
        let (filtered, mut filtered_rx) = mpsc::channel(8);
        let _ = feed.senders.set(vec![
            (every_change as ChangeFilter, every),
            (status_changed as ChangeFilter, filtered),
        ]);
        let first = feed.take(annotated("1", "done"), Source::Watch).unwrap();
        feed.tell(first).await;
        let mut same_status = annotated("2", "done");
        same_status.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        let relabelled = feed.take(same_status, Source::OwnWrite).unwrap();
        feed.tell(relabelled).await;
        let versions = |rx: &mut mpsc::Receiver<Arc<DynamicObject>>| {
            std::iter::from_fn(|| rx.try_recv().ok())
                .map(|m| m.metadata.resource_version.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(versions(&mut every_rx), ["1", "2"]);
        assert_eq!(
            versions(&mut filtered_rx),
            ["1"],
            "a new Machine is heard of by all; a change only through the filter"
        );
    }
}
