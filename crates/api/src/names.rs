//! User-facing names. Those under `v1beta2.k8sd.io` and `machine.cluster.x-k8s.io` come from
//! the Cluster API providers for Canonical Kubernetes and must match them exactly.

/// The type of the Secrets caretaker writes keys and certificates in.
pub const SECRET_TYPE_TLS: &str = "kubernetes.io/tls";

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
}

/// The label Cluster API puts on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// The label Cluster API puts on a MachineDeployment's Machines: the deployment's name.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// The label the control-plane provider puts on its Machines: the control plane's name.
pub const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";
/// The label Cluster API puts on a cluster's objects: the Cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

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
    /// The trigger value of the parent's last request, kept after it ended: a failed request's
    /// trigger is removed (as upstream does), and this says what was asked for.
    pub const REFRESH_REQUESTED: &str = "caretaker.dev/refresh-requested";
    pub const UPGRADE_REQUESTED: &str = "caretaker.dev/upgrade-requested";
    /// The object (`Kind/name`) of an older request this parent's request waits for, because
    /// that request runs on Machines this one covers.
    pub const WAITING_FOR: &str = "caretaker.dev/waiting-for";
    /// A trigger value refused because the parent's request for another value runs, so that
    /// the refusal is reported once.
    pub const REFUSED_TRIGGER: &str = "caretaker.dev/refused-trigger";
    /// On a CK8sControlPlane or MachineDeployment: the id of the Cluster request that placed
    /// its trigger there, so that the child's request is told apart from one a user made on it
    /// (and removing the Cluster's trigger cancels only the Cluster's).
    pub const REFRESH_CLUSTER_REQUEST: &str = "caretaker.dev/refresh-cluster-request";
    pub const UPGRADE_CLUSTER_REQUEST: &str = "caretaker.dev/upgrade-cluster-request";
    /// On a MachineDeployment a Cluster request placed its trigger on: how many of its workers
    /// the Cluster's `max-parallel` allows at once (its own limit still holds if stricter).
    pub const CLUSTER_MAX_PARALLEL: &str = "caretaker.dev/cluster-max-parallel";
    /// The malformed `max-parallel` values the rollout has reported (`Kind/name=value`, comma
    /// separated), so each is reported once, whenever the rollout first reads it.
    pub const LIMITS_REPORTED: &str = "caretaker.dev/malformed-limits-reported";
}

// Self-managed CAs (`CertificateAuthority`, `IssuedCertificate`; see `authority`).

/// library-go's annotations on every Secret and bundle ConfigMap caretaker manages, exactly as
/// openshift/library-go `pkg/operator/certrotation/annotations.go` names them. Times are RFC
/// 3339; the issuer is the signing CA's common name; hostnames (serving certificates only) are
/// the sorted DNS names and IP addresses joined with `,`.
pub const CERTIFICATE_NOT_BEFORE: &str = "auth.openshift.io/certificate-not-before";
pub const CERTIFICATE_NOT_AFTER: &str = "auth.openshift.io/certificate-not-after";
pub const CERTIFICATE_ISSUER: &str = "auth.openshift.io/certificate-issuer";
pub const CERTIFICATE_HOSTNAMES: &str = "auth.openshift.io/certificate-hostnames";

/// library-go's event reasons: a CA needs a new key pair (a rotation starts, or its Secret is
/// gone).
pub const EVENT_SIGNER_UPDATE_REQUIRED: &str = "SignerUpdateRequired";
/// A certificate needs a new key pair.
pub const EVENT_TARGET_UPDATE_REQUIRED: &str = "TargetUpdateRequired";
/// A bundle (the ConfigMap, or a certificate Secret's `ca.crt`) needs new content.
pub const EVENT_CA_BUNDLE_UPDATE_REQUIRED: &str = "CABundleUpdateRequired";
/// caretaker's own: the next CA, trusted everywhere for `trustPropagation`, now signs.
pub const EVENT_SIGNER_PROMOTED: &str = "SignerPromoted";
/// caretaker's own (Warning): a CA Secret is unreadable or was tampered with; nothing was
/// regenerated.
pub const EVENT_CA_SECRET_INVALID: &str = "CASecretInvalid";

// The keys of the Secrets and ConfigMaps caretaker writes (kubernetes.io/tls's, and
// library-go's and cainjector's for bundles).

/// Secret key: the certificate (the CA that signs now, or the leaf alone).
pub const TLS_CRT: &str = "tls.crt";
/// Secret key: the private key of `tls.crt`.
pub const TLS_KEY: &str = "tls.key";
/// Certificate Secret key: the issuer's trust bundle.
pub const CA_CRT: &str = "ca.crt";
/// CA Secret key: the CA a rotation introduces.
pub const NEXT_CRT: &str = "next.crt";
/// CA Secret key: the private key of `next.crt`.
pub const NEXT_KEY: &str = "next.key";
/// CA Secret key: older CAs still trusted (certificates only).
pub const PREVIOUS_CRT: &str = "previous.crt";
/// Bundle ConfigMap key (library-go's and cainjector's name).
pub const CA_BUNDLE_CRT: &str = "ca-bundle.crt";

/// The label on every object caretaker creates (the webhook bootstrap's objects, and every
/// CA Secret, bundle ConfigMap and certificate Secret). It says who made an object, for
/// people and selectors; it gives no right to write it ([`OWNER`] does).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "caretaker");

/// The mark on every Secret and ConfigMap caretaker writes for an object: that object's kind,
/// namespace and name, and UID (the operator's `ownership`). caretaker writes an existing object
/// only for the object its mark names.
pub const OWNER: &str = "caretaker.dev/owner";

/// Set on a Secret or ConfigMap by someone who can write it, to hand it over to the object it
/// names (`Kind/namespace/name`, or `Kind/name` when cluster-scoped): caretaker then adopts it
/// once, setting [`OWNER`] and removing this annotation (the operator's `ownership`).
pub const ADOPT: &str = "caretaker.dev/adopt";

/// Set on the Secret an EtcdCertificates' `spec.agents.caSecretName` names, by someone who can
/// write that Secret, to let that object (named as [`ADOPT`] names one:
/// `EtcdCertificates/namespace/name`) issue the operator's client certificate for the agents
/// from its CA. Without it the Secret is refused: naming a Secret in the spec is not consent
/// from whoever keeps the CA. caretaker only reads the Secret.
pub const ETCD_AGENTS_CA_FOR: &str = "caretaker.dev/etcd-agents-ca-for";

/// Bookkeeping of a CertificateAuthority's rotation, on its CA Secret.
pub mod authority_state {
    /// When the next CA was first seen in the bundle and every injection point (RFC 3339).
    pub const NEXT_TRUSTED_AT: &str = "caretaker.dev/next-trusted-at";
    /// Older CAs no managed certificate is signed by, and since when:
    /// `<SHA-256 fingerprint>=<RFC 3339>`, comma separated.
    pub const UNUSED_SINCE: &str = "caretaker.dev/unused-since";
}

/// Condition types of CertificateAuthority and IssuedCertificate.
pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_DEGRADED: &str = "Degraded";
/// Condition reasons. Ready: a CA signs / a certificate is in place.
pub const REASON_SIGNING: &str = "Signing";
/// Ready false: a re-created CA waits to be trusted everywhere before it signs.
pub const REASON_WAITING_FOR_TRUST: &str = "WaitingForTrust";
/// Ready false: the CA expired and its successor is not trusted long enough yet.
pub const REASON_EXPIRED: &str = "Expired";
/// Degraded (and Ready false when no last good CA is known): see [`EVENT_CA_SECRET_INVALID`].
pub const REASON_CA_SECRET_INVALID: &str = "CASecretInvalid";
/// Degraded false.
pub const REASON_AS_EXPECTED: &str = "AsExpected";
/// Ready: the certificate Secret holds a valid certificate from a trusted CA.
pub const REASON_ISSUED: &str = "Issued";
/// Ready false: no usable certificate, and its issuer cannot sign one now.
pub const REASON_WAITING_FOR_ISSUER: &str = "WaitingForIssuer";
/// Degraded: a certificate needs a new key pair and its issuer is degraded.
pub const REASON_ISSUER_DEGRADED: &str = "IssuerDegraded";
/// Ready false and Degraded (and a Warning event of the same reason, once per message): the
/// spec does not validate; nothing is written.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// Ready false and Degraded: the spec names a Secret or ConfigMap outside the one namespace
/// the operator watches (`--namespace`); nothing is written.
pub const REASON_OUTSIDE_WATCHED_NAMESPACE: &str = "OutsideWatchedNamespace";
/// Ready false and Degraded (and a Warning event of the same reason, once per message): the
/// object's Secret or ConfigMap belongs to another object (its [`OWNER`] mark names another
/// CertificateAuthority, IssuedCertificate or EtcdCertificates, or an earlier object of the
/// same name); nothing is written, rather than the two overwriting each other forever.
pub const REASON_OBJECT_IN_USE: &str = "ObjectInUse";
/// Reason: the IssuedCertificate's namespace is not among its CertificateAuthority's
/// `spec.allowedNamespaces`.
pub const REASON_NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
/// Ready false and Degraded (and a Warning event of the same reason, once per message): the
/// Secret or ConfigMap the spec names exists and carries no [`OWNER`] mark; nothing is
/// written to it.
pub const REASON_OBJECT_NOT_MANAGED: &str = "ObjectNotManaged";
/// Ready false: the IssuedCertificate's `issuerRef` names no CertificateAuthority.
pub const REASON_ISSUER_NOT_FOUND: &str = "IssuerNotFound";
/// Ready false: the IssuedCertificate's CertificateAuthority cannot be acted on (its spec is
/// invalid, or names objects outside the watched namespace).
pub const REASON_ISSUER_INVALID: &str = "IssuerInvalid";

/// The two operations a trigger asks for, on a Machine or on a rollout's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    RefreshCertificates,
    InPlaceUpgrade,
}

impl Operation {
    pub const ALL: [Operation; 2] = [Operation::RefreshCertificates, Operation::InPlaceUpgrade];

    /// The operation as the `operation` label of caretaker's metrics writes it.
    pub fn metric_label(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => "refresh-certificates",
            Operation::InPlaceUpgrade => "in-place-upgrade",
        }
    }

    /// The names this operation reads and writes.
    pub fn names(self) -> &'static OperationNames {
        match self {
            Operation::RefreshCertificates => &REFRESH,
            Operation::InPlaceUpgrade => &UPGRADE,
        }
    }
}

/// Everything that tells the two operations apart by name: one row per operation, so code
/// that serves both reads the row instead of matching on the operation for each name.
#[derive(Debug)]
pub struct OperationNames {
    /// The trigger, on Machines and parents.
    pub trigger: &'static str,
    /// `in-progress`, `done`, `failed` (and `cancelled`), on Machines and parents.
    pub status: &'static str,
    /// Where a parent whose upgrade is done records the release it reached.
    pub release: Option<&'static str>,
    /// When a Machine's last attempt failed (upstream records it for upgrades only).
    pub last_failed_attempt_at: Option<&'static str>,
    /// The event on a Machine whose request failed (the other Machine events are each
    /// capability's own).
    pub machine_failed_event: &'static str,
    /// The request id of a rollout, on its parent and on every Machine it touched.
    pub rollout_request: &'static str,
    /// The trigger value the parent's request is for.
    pub rollout_trigger: &'static str,
    /// The trigger value of the parent's last request, kept after it ended.
    pub rollout_requested: &'static str,
    /// On a Cluster's child: the Cluster request that placed the trigger there.
    pub cluster_request: &'static str,
    /// Names this operation's work running in the operator process.
    pub work: &'static str,
    pub rollout_events: RolloutEvents,
    /// A Machine's bookkeeping of its request.
    pub state: RequestBookkeeping,
}

/// Event reasons on a rollout's parent.
#[derive(Debug)]
pub struct RolloutEvents {
    /// A request started, or waits (for nodes, for healthy agents, for running work after a
    /// failure).
    pub in_progress: &'static str,
    /// Every covered Machine is done.
    pub done: &'static str,
    /// A Machine failed, or the trigger value is unusable.
    pub failed: &'static str,
    /// The trigger was removed and running work has finished.
    pub cancelled: &'static str,
}

/// The annotations a Machine keeps its request's bookkeeping in ([`refresh_state`],
/// [`upgrade_state`]).
#[derive(Debug)]
pub struct RequestBookkeeping {
    /// All of them, removed when a request starts or ends.
    pub all: &'static [&'static str],
    /// The trigger value the request is for.
    pub trigger: &'static str,
    /// When it was marked in progress.
    pub started_at: &'static str,
    /// Failed attempts so far.
    pub attempts: &'static str,
    /// No attempt before this time.
    pub retry_at: &'static str,
    /// The last error, or what the request waits for.
    pub last_error: &'static str,
}

pub const REFRESH: OperationNames = OperationNames {
    trigger: REFRESH_CERTIFICATES,
    status: REFRESH_CERTIFICATES_STATUS,
    release: None,
    last_failed_attempt_at: None,
    machine_failed_event: EVENT_REFRESH_FAILED,
    rollout_request: rollout_state::REFRESH_REQUEST,
    rollout_trigger: rollout_state::REFRESH_TRIGGER,
    rollout_requested: rollout_state::REFRESH_REQUESTED,
    cluster_request: rollout_state::REFRESH_CLUSTER_REQUEST,
    work: "refresh",
    rollout_events: RolloutEvents {
        in_progress: EVENT_REFRESH_CERTS_IN_PROGRESS,
        done: EVENT_REFRESH_CERTS_DONE,
        failed: EVENT_REFRESH_CERTS_FAILED,
        cancelled: EVENT_REFRESH_CERTS_CANCELLED,
    },
    state: RequestBookkeeping {
        all: &refresh_state::ALL,
        trigger: refresh_state::TRIGGER,
        started_at: refresh_state::STARTED_AT,
        attempts: refresh_state::ATTEMPTS,
        retry_at: refresh_state::RETRY_AT,
        last_error: refresh_state::LAST_ERROR,
    },
};

pub const UPGRADE: OperationNames = OperationNames {
    trigger: IN_PLACE_UPGRADE_TO,
    status: IN_PLACE_UPGRADE_STATUS,
    release: Some(IN_PLACE_UPGRADE_RELEASE),
    last_failed_attempt_at: Some(IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT),
    machine_failed_event: EVENT_UPGRADE_FAILED,
    rollout_request: rollout_state::UPGRADE_REQUEST,
    rollout_trigger: rollout_state::UPGRADE_TRIGGER,
    rollout_requested: rollout_state::UPGRADE_REQUESTED,
    cluster_request: rollout_state::UPGRADE_CLUSTER_REQUEST,
    work: "upgrade",
    // Upstream names the parent's upgrade events as the Machine's.
    rollout_events: RolloutEvents {
        in_progress: EVENT_UPGRADE_IN_PROGRESS,
        done: EVENT_UPGRADE_DONE,
        failed: EVENT_UPGRADE_FAILED,
        cancelled: EVENT_UPGRADE_CANCELLED,
    },
    state: RequestBookkeeping {
        all: &upgrade_state::ALL,
        trigger: upgrade_state::TRIGGER,
        started_at: upgrade_state::STARTED_AT,
        attempts: upgrade_state::ATTEMPTS,
        retry_at: upgrade_state::RETRY_AT,
        last_error: upgrade_state::LAST_ERROR,
    },
};

/// CA-bundle injection into webhook configurations, CRD conversion webhooks and APIServices
/// (see `injection`). The `cert-manager.io` names are cert-manager's cainjector's, exactly as
/// `pkg/apis/certmanager/v1/types.go` spells them, so manifests written for it work unchanged.
pub mod injection {
    /// On a target: the name of the CertificateAuthority whose trust bundle it holds.
    pub const INJECT_CA_FROM: &str = "caretaker.dev/inject-ca-from";
    /// On a target: `<namespace>/<name>` of a Secret whose `ca.crt` it holds (cainjector's).
    pub const INJECT_CA_FROM_SECRET: &str = "cert-manager.io/inject-ca-from-secret";
    /// On that Secret: must be `"true"`, or nothing is injected from it (cainjector's).
    pub const ALLOW_DIRECT_INJECTION: &str = "cert-manager.io/allow-direct-injection";
    /// The key of the CA certificates in such a Secret.
    pub const SECRET_CA_KEY: &str = "ca.crt";

    /// Normal, on a target: caretaker wrote its caBundle fields.
    pub const EVENT_INJECTED: &str = "CABundleInjected";
    /// Warning, on a target: what it names to inject from is not there (CertificateAuthority,
    /// bundle ConfigMap or its key, Secret or its `ca.crt`); the target was left untouched.
    pub const EVENT_SOURCE_MISSING: &str = "CABundleSourceMissing";
    /// Warning, on a target: caretaker will not inject what it asks for (a malformed or
    /// ambiguous annotation, a Secret that does not allow direct injection, a source outside
    /// the namespace the operator watches, a source that is not a bundle of certificates);
    /// the target was left untouched.
    pub const EVENT_REFUSED: &str = "CABundleInjectionRefused";
}
