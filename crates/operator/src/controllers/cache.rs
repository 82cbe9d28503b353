//! The Machines and MachineDeployments the controllers read, kept in memory by watches instead
//! of listed on every reconcile.
//!
//! One Machine watch fills the cache and then passes each change on to every controller (the
//! Machine controller and the three parent kinds), so a reconcile always sees at least the
//! change that woke it. After a (re)list every cached Machine is passed on once the new state
//! is complete, so nothing a reconcile decided on the old state is left waiting for an event
//! that already went by.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::{mpsc, watch};

use crate::Error;

/// Machine changes waiting for a controller to take them.
const CHANGES_BUFFER: usize = 1024;

/// The caches; cheap to clone.
#[derive(Clone)]
pub struct Caches {
    machines: Store<DynamicObject>,
    deployments: Store<DynamicObject>,
    /// Whether each cache has had its first complete list. (kube's own
    /// `Store::wait_until_ready` wakes only one of several waiting tasks.)
    ready: [watch::Receiver<bool>; 2],
}

/// A stream of Machine changes for one controller, as `Controller::for_stream` and
/// `Controller::watches_stream` take it.
pub type MachineChanges =
    std::pin::Pin<Box<dyn Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static>>;

impl Caches {
    /// The caches over what `machines` and `deployments` can see, the future that keeps them
    /// (run it beside the controllers) and `subscribers` streams of Machine changes.
    pub fn new(
        machines: Api<DynamicObject>,
        machine_resource: ApiResource,
        deployments: Api<DynamicObject>,
        deployment_resource: ApiResource,
        subscribers: usize,
    ) -> (Self, impl Future<Output = ()> + Send, Vec<MachineChanges>) {
        let machines_writer = Writer::new(machine_resource);
        let deployments_writer = Writer::new(deployment_resource);
        let (machines_ready, machines_ready_rx) = watch::channel(false);
        let (deployments_ready, deployments_ready_rx) = watch::channel(false);
        let caches = Caches {
            machines: machines_writer.as_reader(),
            deployments: deployments_writer.as_reader(),
            ready: [machines_ready_rx, deployments_ready_rx],
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..subscribers)
            .map(|_| mpsc::channel::<Arc<DynamicObject>>(CHANGES_BUFFER))
            .unzip();

        let (senders, machines_ready) = (Arc::new(senders), Arc::new(machines_ready));
        let store = caches.machines.clone();
        let keep_machines = reflector(
            machines_writer,
            watcher(machines, watcher::Config::default()),
        )
        .default_backoff()
        .for_each(move |event| {
            let (senders, ready, store) = (senders.clone(), machines_ready.clone(), store.clone());
            async move {
                let changed = match event {
                    Ok(watcher::Event::Apply(m) | watcher::Event::Delete(m)) => vec![Arc::new(m)],
                    Ok(watcher::Event::InitDone) => {
                        ready.send_replace(true);
                        store.state()
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching Machines failed; retrying");
                        Vec::new()
                    }
                };
                for m in changed {
                    for sender in senders.iter() {
                        let _ = sender.send(m.clone()).await;
                    }
                }
            }
        });
        let deployments_ready = Arc::new(deployments_ready);
        let keep_deployments = reflector(
            deployments_writer,
            watcher(deployments, watcher::Config::default()),
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

    /// The cached Machines of a namespace.
    pub fn machines_in(&self, namespace: Option<&str>) -> Vec<Arc<DynamicObject>> {
        self.machines
            .state()
            .into_iter()
            .filter(|m| m.metadata.namespace.as_deref() == namespace)
            .collect()
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::machine;

    #[tokio::test]
    async fn every_waiting_reconcile_wakes_when_the_caches_are_ready() {
        let (machines_ready, machines_rx) = watch::channel(false);
        let (deployments_ready, deployments_rx) = watch::channel(false);
        let caches = Caches {
            machines: Writer::new(machine::api_resource()).as_reader(),
            deployments: Writer::new(machine::machine_deployment_api_resource()).as_reader(),
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
