//! Fixtures for running caretaker without a real cluster: the demo, the integration tests and
//! the benchmarks use them, production code never does.
//!
//! - [`provision`]: a kubeadm-layout node PKI in a directory, from a cluster's CAs.
//! - [`local`]: a real agent serving such a directory on loopback, inside this process.
//! - [`process`]: whether a process a test started has gone.
//! - [`etcd`]: a real three-member etcd cluster on loopback (members installed as a static-pod
//!   installer would), a client over its v3 JSON gateway and a writer that reads each write back;
//!   [`etcd_agents`]: the same members, each installed and restarted only by its own agent.
//! - [`kubectl`]: the real kubectl, against one server, for tests of what users see.
//! - [`ports`]: loopback ports for listeners in other processes, bound again after restarts.
//! - [`capi_objects`]: the Cluster API objects (Clusters, CA Secrets, control planes,
//!   MachineDeployments, Machines) that Cluster API and its providers would write, and their
//!   upstream CRDs.
//!
//! This crate sits above the crates it builds fixtures for; none of them may depend on it except
//! as a dev-dependency of their integration tests (`tests/`), never from their unit tests
//! (`#[cfg(test)]` in `src/`), which would see a second, incompatible copy of their own types.

pub mod capi_objects;
pub mod etcd;
pub mod etcd_agents;
pub mod kubectl;
pub mod local;
pub mod ports;
pub mod process;
pub mod provision;
