//! The operator's metrics, in one registry per process ([`Metrics`], held by the
//! [`crate::Context`]), and the servers of `/metrics` (plain HTTP, or mutual TLS), `/healthz`
//! and `/readyz` ([`server`]).
//!
//! | family | type | labels |
//! |---|---|---|
//! | `caretaker_certificate_expiration_seconds` | gauge | `kind`, `namespace`, `name` |
//! | `caretaker_certificate_renewal_seconds` | gauge | `kind`, `namespace`, `name` |
//! | `caretaker_ca_expiration_days` | gauge | `name` |
//! | `caretaker_etcd_signer_expiration_days` | gauge | `namespace`, `signer` |
//! | `caretaker_certificate_rotations_total` | counter | `kind` |
//! | `caretaker_certificate_rotation_failures_total` | counter | `kind`, `category` |
//! | `caretaker_reconcile_total` | counter | `controller` |
//! | `caretaker_reconcile_errors_total` | counter | `controller`, `category` |
//! | `caretaker_reconcile_duration_seconds` | histogram | `controller` |
//! | `caretaker_leader` | gauge | |
//! | `caretaker_rollout_machines` | gauge | `kind`, `namespace`, `name`, `operation`, `state` |
//! | `caretaker_rollout_status` | gauge | `kind`, `namespace`, `name`, `operation`, `status` |
//! | `caretaker_degraded` | gauge | `kind`, `namespace`, `name` |
//!
//! The expiry and renewal gauges come from one table of certificates and their notAfter
//! ([`expiry`]), read at each scrape: the days left are computed then, never stored, so they
//! cannot go stale between two reconciles. Every label value is bounded: a kind, a controller,
//! an [`Error::metric_label`] category, or the name of an object caretaker manages (whose
//! series goes when the object does). Nothing secret is in any of them.

mod expiry;
pub mod server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use time::OffsetDateTime;

use crate::Error;

pub use server::{
    Limits, Readiness, TlsConfig, mutual_tls, serve_health, serve_metrics, serve_metrics_tls,
};

/// The `Content-Type` of `/metrics`: the OpenMetrics text format prometheus-client writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The kinds of object whose certificates the expiry gauge follows.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
pub enum CertificateKind {
    /// A `CertificateAuthority` (cluster-scoped: its namespace is empty): its current CA.
    CertificateAuthority,
    /// An `IssuedCertificate`: the leaf in its Secret.
    IssuedCertificate,
    /// A Cluster API Machine: the earliest notAfter of its node's certificates.
    Machine,
    /// An etcd signer of an `EtcdCertificates` (its name: `signer-ca` or `metrics-signer-ca`).
    EtcdSigner,
    /// A certificate of an `EtcdCertificates` (its name: the Secret's).
    EtcdCertificate,
}

impl CertificateKind {
    pub const ALL: [CertificateKind; 5] = [
        CertificateKind::CertificateAuthority,
        CertificateKind::IssuedCertificate,
        CertificateKind::Machine,
        CertificateKind::EtcdSigner,
        CertificateKind::EtcdCertificate,
    ];

    /// The kind as the `kind` label writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CertificateKind::CertificateAuthority => "CertificateAuthority",
            CertificateKind::IssuedCertificate => "IssuedCertificate",
            CertificateKind::Machine => "Machine",
            CertificateKind::EtcdSigner => "EtcdSigner",
            CertificateKind::EtcdCertificate => "EtcdCertificate",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: CertificateKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindErrorLabels {
    kind: CertificateKind,
    category: &'static str,
}

/// One object caretaker reconciles.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    kind: &'static str,
    namespace: String,
    name: String,
}

/// One parent's rollout of one operation, and the status its annotation shows.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutStatusLabels {
    kind: String,
    namespace: String,
    name: String,
    operation: &'static str,
    status: &'static str,
}

/// The values of the upstream `*-status` annotations a parent's rollout series may show. A
/// status annotation is anyone's to write: any other value shows no series, so the label
/// stays bounded.
pub const ROLLOUT_STATUSES: [&str; 4] = ["in-progress", "done", "failed", "cancelled"];

/// One parent's rollout of one operation, and a state of its Machines.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    kind: String,
    namespace: String,
    name: String,
    operation: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerErrorLabels {
    controller: &'static str,
    category: &'static str,
}

type Histograms = Family<ControllerLabels, Histogram, fn() -> Histogram>;

/// Reconcile durations, in seconds: from a cache read of a few microseconds to a pass that
/// waited on the API server for a minute.
const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The operator's metric families and the registry that encodes them. A family with no
/// series yet (no reconcile has failed) is left out of the text until it has one.
pub struct Metrics {
    registry: Registry,
    expiries: Arc<expiry::Expiries>,
    rotations: Family<KindLabels, Counter>,
    rotation_failures: Family<KindErrorLabels, Counter>,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ControllerErrorLabels, Counter>,
    reconcile_duration: Histograms,
    leader: Gauge,
    rollout_machines: Family<RolloutLabels, Gauge>,
    rollout_status: Family<RolloutStatusLabels, Gauge>,
    degraded: Family<ObjectLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::with_clock(OffsetDateTime::now_utc)
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Metrics whose scrape-time values (the days left of each CA) are computed at `clock`'s
    /// time.
    pub fn with_clock(clock: fn() -> OffsetDateTime) -> Self {
        let mut registry = Registry::default();
        let expiries = Arc::new(expiry::Expiries::default());
        registry.register_collector(Box::new(expiry::Collector {
            expiries: expiries.clone(),
            clock,
        }));
        let rotations = Family::<KindLabels, Counter>::default();
        registry.register(
            "caretaker_certificate_rotations",
            "Certificates caretaker replaced (a CA rotated, a leaf re-issued, a Machine's node certificates refreshed), by kind",
            rotations.clone(),
        );
        // Known from the start, so that a rate over them has a beginning.
        for kind in CertificateKind::ALL {
            let _ = rotations.get_or_create(&KindLabels { kind });
        }
        let rotation_failures = Family::<KindErrorLabels, Counter>::default();
        registry.register(
            "caretaker_certificate_rotation_failures",
            "Attempts to replace a certificate that failed, by kind and error category",
            rotation_failures.clone(),
        );
        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "caretaker_reconcile",
            "Reconciles run, by controller, whatever their result",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<ControllerErrorLabels, Counter>::default();
        registry.register(
            "caretaker_reconcile_errors",
            "Reconciles that failed, by controller and error category",
            reconcile_errors.clone(),
        );
        let reconcile_duration: Histograms = Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "caretaker_reconcile_duration",
            "How long reconciles took, by controller",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "caretaker_leader",
            "1 while this replica reconciles (it holds the leader Lease, or runs without --leader-elect), 0 while it stands by",
            leader.clone(),
        );
        let rollout_machines = Family::<RolloutLabels, Gauge>::default();
        registry.register(
            "caretaker_rollout_machines",
            "Machines of each parent's rollout (the running one, else the last), by state: total (those it covers), done, running, skipped",
            rollout_machines.clone(),
        );
        let rollout_status = Family::<RolloutStatusLabels, Gauge>::default();
        registry.register(
            "caretaker_rollout_status",
            "1 for the status (in-progress, done, failed, cancelled) each parent's status annotation shows for an operation; no series without one",
            rollout_status.clone(),
        );
        let degraded = Family::<ObjectLabels, Gauge>::default();
        registry.register(
            "caretaker_degraded",
            "1 while the last pass of an object caretaker reconciles left its Degraded condition True; no series otherwise",
            degraded.clone(),
        );
        Metrics {
            leader,
            rollout_machines,
            rollout_status,
            degraded,
            registry,
            expiries,
            rotations,
            rotation_failures,
            reconciles,
            reconcile_errors,
            reconcile_duration,
        }
    }

    /// Records when the certificate of a `kind` object expires (`namespace` empty for a
    /// CertificateAuthority), replacing what was recorded for it.
    pub fn set_certificate_expiry(
        &self,
        kind: CertificateKind,
        namespace: &str,
        name: &str,
        not_after: OffsetDateTime,
    ) {
        self.expiries.set(kind, namespace, name, not_after, None);
    }

    /// Records when the certificate of a `kind` object expires and when caretaker is due to
    /// replace it (`renewal`, none when it has no such time), replacing what was recorded.
    pub fn set_certificate_expiry_and_renewal(
        &self,
        kind: CertificateKind,
        namespace: &str,
        name: &str,
        not_after: OffsetDateTime,
        renewal: Option<OffsetDateTime>,
    ) {
        self.expiries.set(kind, namespace, name, not_after, renewal);
    }

    /// Forgets the certificate of a `kind` object (deleted, or no longer with a certificate):
    /// its series leave both expiry gauges.
    pub fn remove_certificate_expiry(&self, kind: CertificateKind, namespace: &str, name: &str) {
        self.expiries.remove(kind, namespace, name);
    }

    /// Keeps only the expiry series `keep` says yes to, given their kind, namespace and name:
    /// a controller forgets at once every series of what it no longer follows.
    pub fn retain_certificate_expiries(&self, keep: impl Fn(CertificateKind, &str, &str) -> bool) {
        self.expiries.retain(keep);
    }

    /// Whether this replica is the one that reconciles.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Records where the rollout of `operation` (`refresh-certificates`, `in-place-upgrade`)
    /// over the parent `kind` `namespace`/`name` stands.
    pub fn set_rollout_progress(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        operation: &'static str,
        machines_by_state: [(&'static str, usize); 4],
    ) {
        for (state, machines) in machines_by_state {
            let labels = RolloutLabels {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                operation,
                state,
            };
            self.rollout_machines
                .get_or_create(&labels)
                .set(i64::try_from(machines).unwrap_or(i64::MAX));
        }
    }

    /// Records the status annotation of `operation` on the parent `kind` `namespace`/`name`:
    /// its series shows `status` when it is one of [`ROLLOUT_STATUSES`], else (none, or
    /// something else) the parent has no series for the operation.
    pub fn set_rollout_status(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        operation: &'static str,
        status: Option<&str>,
    ) {
        for known in ROLLOUT_STATUSES {
            let labels = RolloutStatusLabels {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                operation,
                status: known,
            };
            if status == Some(known) {
                self.rollout_status.get_or_create(&labels).set(1);
            } else {
                self.rollout_status.remove(&labels);
            }
        }
    }

    /// Forgets every rollout series of the parent `kind` `namespace`/`name` (deleted).
    pub fn remove_rollout(&self, kind: &str, namespace: &str, name: &str, operation: &'static str) {
        self.set_rollout_status(kind, namespace, name, operation, None);
        for state in ["total", "done", "running", "skipped"] {
            self.rollout_machines.remove(&RolloutLabels {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                operation,
                state,
            });
        }
    }

    /// Records whether the last pass over the `kind` object `namespace`/`name` left its
    /// Degraded condition True: a series of 1 while it does, none otherwise (also once the
    /// object is gone).
    pub fn set_degraded(&self, kind: &'static str, namespace: &str, name: &str, degraded: bool) {
        let labels = ObjectLabels {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if degraded {
            self.degraded.get_or_create(&labels).set(1);
        } else {
            self.degraded.remove(&labels);
        }
    }

    /// Counts a certificate of `kind` replaced.
    pub fn rotated(&self, kind: CertificateKind) {
        self.rotations.get_or_create(&KindLabels { kind }).inc();
    }

    /// Counts a failed attempt to replace a certificate of `kind`.
    pub fn rotation_failed(&self, kind: CertificateKind, error: &Error) {
        self.rotation_failures
            .get_or_create(&KindErrorLabels {
                kind,
                category: error.metric_label(),
            })
            .inc();
    }

    /// Starts timing one reconcile of `controller`: counted, with its duration, when the
    /// returned guard is dropped (also when the reconcile was cancelled or failed).
    #[must_use = "the reconcile is recorded when the guard is dropped"]
    pub fn reconcile_started(self: &Arc<Self>, controller: &'static str) -> ReconcileTimer {
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            started: Instant::now(),
        }
    }

    /// Records one reconcile of `controller` that took `took`.
    pub fn reconciled(&self, controller: &'static str, took: Duration) {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile of `controller`, by the error's category.
    pub fn reconcile_failed(&self, controller: &'static str, error: &Error) {
        self.reconcile_errors
            .get_or_create(&ControllerErrorLabels {
                controller,
                category: error.metric_label(),
            })
            .inc();
    }

    /// Every family in the OpenMetrics text format (served as [`CONTENT_TYPE`]), ending in
    /// `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

/// One reconcile being timed; recorded when dropped.
pub struct ReconcileTimer {
    metrics: Arc<Metrics>,
    controller: &'static str,
    started: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics
            .reconciled(self.controller, self.started.elapsed());
    }
}

#[cfg(test)]
mod tests;
