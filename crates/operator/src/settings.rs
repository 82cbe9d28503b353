//! The operator's settings, from the command line.

use std::time::Duration;

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
