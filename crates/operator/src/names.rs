//! User-facing names. Those under `v1beta2.k8sd.io` and `machine.cluster.x-k8s.io` come from
//! the Cluster API providers for Canonical Kubernetes and must match them exactly.

/// Trigger: the TTL of the new certificates.
pub const REFRESH_CERTIFICATES: &str = "v1beta2.k8sd.io/refresh-certificates";
/// `in-progress`, `done` or `failed`.
pub const REFRESH_CERTIFICATES_STATUS: &str = "v1beta2.k8sd.io/refresh-certificates-status";
/// The earliest notAfter of the Machine's certificates, RFC 3339.
pub const CERTIFICATES_EXPIRY: &str = "machine.cluster.x-k8s.io/certificates-expiry";

pub const STATUS_IN_PROGRESS: &str = "in-progress";
pub const STATUS_DONE: &str = "done";
pub const STATUS_FAILED: &str = "failed";

pub const EVENT_REFRESH_IN_PROGRESS: &str = "CertificatesRefreshInProgress";
pub const EVENT_REFRESH_DONE: &str = "CertificatesRefreshDone";
pub const EVENT_REFRESH_FAILED: &str = "CertificatesRefreshFailed";

/// caretaker's own: the agent URL, overriding `https://<address>:<agent-port>`.
pub const AGENT_ENDPOINT: &str = "caretaker.dev/agent-endpoint";

/// The annotations a capability keeps its retry state in.
#[derive(Debug, Clone, Copy)]
pub struct RetryKeys {
    pub attempts: &'static str,
    pub retry_at: &'static str,
    pub last_error: &'static str,
}

/// Bookkeeping of a refresh in progress, so a restarted operator resumes it.
pub mod refresh_state {
    /// The trigger value this request is for.
    pub const TRIGGER: &str = "caretaker.dev/refresh-trigger";
    /// When the request started (RFC 3339): certificates issued after it are this request's.
    pub const STARTED_AT: &str = "caretaker.dev/refresh-started-at";
    /// Failed attempts so far.
    pub const ATTEMPTS: &str = "caretaker.dev/refresh-attempts";
    /// Not before this time (RFC 3339) is the next attempt made.
    pub const RETRY_AT: &str = "caretaker.dev/refresh-retry-at";
    /// The last error, for people reading the Machine.
    pub const LAST_ERROR: &str = "caretaker.dev/refresh-last-error";
    /// The agent's plan for this request: a resumed attempt continues it (or learns it was
    /// applied) instead of refreshing the node a second time.
    pub const PLAN: &str = "caretaker.dev/refresh-plan";

    pub const ALL: [&str; 6] = [TRIGGER, STARTED_AT, ATTEMPTS, RETRY_AT, LAST_ERROR, PLAN];

    pub const RETRY: super::RetryKeys = super::RetryKeys {
        attempts: ATTEMPTS,
        retry_at: RETRY_AT,
        last_error: LAST_ERROR,
    };
}

/// The label Cluster API puts on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Trigger: the release option (`channel=…`, `revision=…`, `localPath=…`).
pub const IN_PLACE_UPGRADE_TO: &str = "v1beta2.k8sd.io/in-place-upgrade-to";
/// `in-progress`, `done`, `failed`, or `cancelled` when the trigger was removed while it ran.
pub const IN_PLACE_UPGRADE_STATUS: &str = "v1beta2.k8sd.io/in-place-upgrade-status";
/// The release the Machine runs after its last successful upgrade.
pub const IN_PLACE_UPGRADE_RELEASE: &str = "v1beta2.k8sd.io/in-place-upgrade-release";
/// The agent's operation id of the upgrade in progress.
pub const IN_PLACE_UPGRADE_CHANGE_ID: &str = "v1beta2.k8sd.io/in-place-upgrade-change-id";
/// When the last attempt failed, RFC 3339.
pub const IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT: &str =
    "v1beta2.k8sd.io/in-place-upgrade-last-failed-attempt-at";

pub const STATUS_CANCELLED: &str = "cancelled";

pub const EVENT_UPGRADE_IN_PROGRESS: &str = "InPlaceUpgradeInProgress";
pub const EVENT_UPGRADE_DONE: &str = "InPlaceUpgradeDone";
pub const EVENT_UPGRADE_FAILED: &str = "InPlaceUpgradeFailed";
pub const EVENT_UPGRADE_CANCELLED: &str = "InPlaceUpgradeCancelled";

/// Bookkeeping of an upgrade in progress.
pub mod upgrade_state {
    /// The trigger value this request is for.
    pub const TRIGGER: &str = "caretaker.dev/upgrade-trigger";
    /// The idempotency key sent to the agent: starting twice returns the same operation.
    pub const REQUEST_ID: &str = "caretaker.dev/upgrade-request-id";
    /// When the request was marked in progress (RFC 3339): how long a wait for a busy agent
    /// has lasted, so it looks again less and less often.
    pub const STARTED_AT: &str = "caretaker.dev/upgrade-started-at";
    /// Failed attempts to reach the agent so far.
    pub const ATTEMPTS: &str = "caretaker.dev/upgrade-attempts";
    /// Not before this time (RFC 3339) is the next attempt made.
    pub const RETRY_AT: &str = "caretaker.dev/upgrade-retry-at";
    /// The last error, in words.
    pub const LAST_ERROR: &str = "caretaker.dev/upgrade-last-error";

    pub const ALL: [&str; 6] = [
        TRIGGER, REQUEST_ID, STARTED_AT, ATTEMPTS, RETRY_AT, LAST_ERROR,
    ];

    pub const RETRY: super::RetryKeys = super::RetryKeys {
        attempts: ATTEMPTS,
        retry_at: RETRY_AT,
        last_error: LAST_ERROR,
    };
}

/// Cluster-wide rollouts: events on the parent (proposal 004 names for certificates).
pub const EVENT_REFRESH_CERTS_IN_PROGRESS: &str = "RefreshCertsInProgress";
pub const EVENT_REFRESH_CERTS_DONE: &str = "RefreshCertsDone";
pub const EVENT_REFRESH_CERTS_FAILED: &str = "RefreshCertsFailed";
pub const EVENT_REFRESH_CERTS_CANCELLED: &str = "RefreshCertsCancelled";

/// `DONE/TOTAL` on the parent of a rollout.
pub const PROGRESS: &str = "caretaker.dev/progress";
/// Workers allowed in progress at once, on a MachineDeployment or Cluster.
pub const MAX_PARALLEL: &str = "caretaker.dev/max-parallel";

/// Opt-in automatic refresh on a Cluster: `"ttl=1y,before=30d"`.
pub const AUTO_REFRESH_CERTIFICATES: &str = "caretaker.dev/auto-refresh-certificates";

/// Bookkeeping of a rollout, on the parent and (the request tag) on every Machine it touched.
pub mod rollout_state {
    /// The request id of the certificate rollout in progress (parent) / that touched it (Machine).
    pub const REFRESH_REQUEST: &str = "caretaker.dev/refresh-request";
    /// The request id of the upgrade rollout.
    pub const UPGRADE_REQUEST: &str = "caretaker.dev/upgrade-request";
    /// The trigger value the parent's request is for.
    pub const REFRESH_TRIGGER: &str = "caretaker.dev/refresh-rollout-trigger";
    pub const UPGRADE_TRIGGER: &str = "caretaker.dev/upgrade-rollout-trigger";
    /// What the rollout waits for, so the same wait is reported once.
    pub const WAITING: &str = "caretaker.dev/rollout-waiting";
    /// A malformed auto-refresh value already reported, so it is reported once.
    pub const AUTO_REFRESH_REPORTED: &str = "caretaker.dev/auto-refresh-reported";
}
