//! Which Node watch events may change the members of an EtcdCertificates that selects Nodes
//! ([`NodeChanges`]): a Node appearing, going, or changing its labels or addresses; not its
//! heartbeats.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::watcher;

/// Which Node watch events may change the members: a Node appearing, going (deleted, or gone
/// while the watch was down and missing from the list that follows), or changing its labels
/// or addresses. Not its heartbeats, which change neither.
#[derive(Default)]
pub(crate) struct NodeChanges {
    /// Each Node's labels and addresses, hashed, by name.
    known: HashMap<String, u64>,
    /// During a relist: the Nodes listed so far.
    listed: Option<BTreeSet<String>>,
}

impl NodeChanges {
    /// The Node to wake the controller with, if `event` may change the members.
    pub(crate) fn wakes(&mut self, event: watcher::Event<Node>) -> Option<Node> {
        match event {
            watcher::Event::Apply(node) => self.changed(node),
            watcher::Event::InitApply(node) => {
                (self.listed.get_or_insert_default()).insert(node.name_any());
                self.changed(node)
            }
            watcher::Event::Delete(node) => {
                self.known.remove(&node.name_any());
                Some(node)
            }
            watcher::Event::Init => {
                self.listed = Some(BTreeSet::new());
                None
            }
            watcher::Event::InitDone => {
                let listed = self.listed.take().unwrap_or_default();
                let gone: Vec<String> = (self.known.keys())
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in &gone {
                    self.known.remove(name);
                }
                // Any Node wakes every object that selects Nodes: one for all that went.
                gone.into_iter().next().map(|name| Node {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            }
        }
    }

    fn changed(&mut self, node: Node) -> Option<Node> {
        let hash = membership_hash(&node);
        let before = self.known.insert(node.name_any(), hash);
        (before != Some(hash)).then_some(node)
    }
}

/// A Node's labels and addresses, hashed: a change of either may change the members.
fn membership_hash(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut hash);
    for address in node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
    {
        address.address.hash(&mut hash);
    }
    hash.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use watcher::Event;

    use super::*;

    fn node(name: &str, address: &str, heartbeat: &str) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(heartbeat.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: address.into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn woken(changes: &mut NodeChanges, event: Event<Node>) -> Option<String> {
        changes.wakes(event).map(|n| n.name_any())
    }

    /// A deleted Node wakes the controller though its labels and addresses did not change (the
    /// predicate that filtered Node events hid every deletion).
    #[test]
    fn a_node_going_wakes_and_a_heartbeat_does_not() {
        let mut changes = NodeChanges::default();
        let a = Some("a".to_string());
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.1", "1"))),
            a
        );
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.1", "2"))),
            None
        );
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.2", "3"))),
            a
        );
        assert_eq!(
            woken(&mut changes, Event::Delete(node("a", "10.0.0.2", "3"))),
            a
        );
        // Back with the same name, labels and addresses: a new member again.
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.2", "4"))),
            a
        );
    }

    /// A Node deleted while the watch was down is missing from the relist: that wakes too.
    #[test]
    fn a_node_missing_from_a_relist_wakes() {
        let mut changes = NodeChanges::default();
        for name in ["a", "b"] {
            changes.wakes(Event::Apply(node(name, "10.0.0.1", "1")));
        }
        assert_eq!(woken(&mut changes, Event::Init), None);
        let unchanged = Event::InitApply(node("a", "10.0.0.1", "5"));
        assert_eq!(woken(&mut changes, unchanged), None);
        assert_eq!(woken(&mut changes, Event::InitDone), Some("b".into()));
        // Relisted with nothing gone: no wake.
        changes.wakes(Event::Init);
        changes.wakes(Event::InitApply(node("a", "10.0.0.1", "6")));
        assert_eq!(woken(&mut changes, Event::InitDone), None);
    }
}
