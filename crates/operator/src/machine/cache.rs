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
use std::sync::{Arc, RwLock};

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
    views: Arc<RwLock<MachineViews>>,
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
            views: Default::default(),
            ready: [machines_ready_rx, deployments_ready_rx],
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = subscribers
            .into_iter()
            .map(|filter| {
                let (sender, receiver) = mpsc::channel::<Arc<DynamicObject>>(CHANGES_BUFFER);
                ((filter, sender), receiver)
            })
            .unzip();

        let (senders, machines_ready) = (Arc::new(senders), Arc::new(machines_ready));
        let (store, views) = (caches.machines.clone(), caches.views.clone());
        let keep_machines = reflector(
            machines_writer,
            watcher(machines, watcher::Config::default()).modify(|m| {
                forget_managed_fields(m);
                MachineView::keep_what_views_read(m);
            }),
        )
        .default_backoff()
        .for_each(move |event| {
            let (senders, ready) = (senders.clone(), machines_ready.clone());
            let (store, views) = (store.clone(), views.clone());
            async move {
                // The views change before anyone hears of the change, as the store does.
                // (old, new) views of a changed Machine; `None` tells everyone.
                let (changed, views_changed) = match event {
                    Ok(watcher::Event::Apply(m)) => {
                        let views_changed = write(&views).apply(&m);
                        (vec![Arc::new(m)], Some(views_changed))
                    }
                    Ok(watcher::Event::Delete(m)) => {
                        write(&views).delete(&m);
                        (vec![Arc::new(m)], None)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let mut state = store.state();
                        let gone = write(&views).replace(MachineViews::of(&state));
                        ready.send_replace(true);
                        state.extend(gone);
                        (state, None)
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => (Vec::new(), None),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching Machines failed; retrying");
                        (Vec::new(), None)
                    }
                };
                for m in changed {
                    for (filter, sender) in senders.iter() {
                        let hears = match &views_changed {
                            Some((Some(old), new)) => filter(old, new),
                            Some((None, _)) | None => true,
                        };
                        if hears {
                            let _ = sender.send(m.clone()).await;
                        }
                    }
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

    /// The cached Machines of a namespace, as views shared with every other reader.
    pub fn machines_in(&self, namespace: &str) -> Vec<Arc<MachineView>> {
        let views = self
            .views
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        views
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
                let mut object =
                    DynamicObject::new(&name, &caretaker_api::cluster_api::machine_api_resource())
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

    fn machine_object(namespace: &str, name: &str, version: &str) -> DynamicObject {
        let mut m = DynamicObject::new(name, &caretaker_api::cluster_api::machine_api_resource())
            .within(namespace);
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
        let caches = Caches {
            machines: Writer::new(caretaker_api::cluster_api::machine_api_resource()).as_reader(),
            deployments: Writer::new(caretaker_api::cluster_api::machine_deployment_api_resource())
                .as_reader(),
            views: Default::default(),
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
}
