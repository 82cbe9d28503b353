//! The kube-rs glue. [`machines`] runs one Controller over Cluster API Machines whose reconcile
//! carries out each per-Machine capability in turn: [`machine_refresh`] and
//! [`machine_upgrade`].

pub mod machine_refresh;
pub mod machine_upgrade;
pub mod machines;
pub mod rollout;

use std::time::Duration;

/// When a capability wants to look at a Machine again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// When the Machine changes (its watch wakes the controller).
    AwaitChange,
    /// After this long, changed or not.
    After(Duration),
}

impl Next {
    /// The sooner of two wishes.
    pub fn sooner(self, other: Next) -> Next {
        match (self, other) {
            (Next::After(a), Next::After(b)) => Next::After(a.min(b)),
            (Next::After(a), Next::AwaitChange) | (Next::AwaitChange, Next::After(a)) => {
                Next::After(a)
            }
            (Next::AwaitChange, Next::AwaitChange) => Next::AwaitChange,
        }
    }
}
