//! The certificates caretaker follows and when each expires, encoded at each scrape as two
//! gauges:
//!
//! - `caretaker_certificate_expiration_seconds{kind, namespace, name}`: the notAfter, in
//!   seconds since the Unix epoch, as cert-manager's
//!   `certmanager_certificate_expiration_timestamp_seconds` gives it. Alert on
//!   `caretaker_certificate_expiration_seconds - time() < 7 * 86400`.
//! - `caretaker_certificate_renewal_seconds{kind, namespace, name}`: when caretaker means to
//!   replace it, as cert-manager's `certmanager_certificate_renewal_timestamp_seconds`, for the
//!   certificates whose controller says so: past it and not renewed is what to alert on.
//! - `caretaker_ca_expiration_days{name}`: per CertificateAuthority, the days from the scrape to
//!   its current CA's notAfter, fractional and negative once expired, as the OpenShift etcd
//!   operator's `openshift_etcd_operator_signer_expiration_days` computes them (notAfter minus
//!   now, in hours, over 24). That operator sets its gauge at each sync, once a minute; here it
//!   is computed at the scrape, from the stored notAfter, so it is never older than the scrape.
//! - `caretaker_etcd_signer_expiration_days{namespace, signer}`: the same for the two signers
//!   of each `EtcdCertificates` (`signer` is `signer-ca` or `metrics-signer-ca`, the OpenShift
//!   etcd operator's label values).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use time::OffsetDateTime;

use super::CertificateKind;

pub(super) const CERTIFICATE_EXPIRATION: &str = "caretaker_certificate_expiration_seconds";
pub(super) const CERTIFICATE_RENEWAL: &str = "caretaker_certificate_renewal_seconds";
pub(super) const CA_EXPIRATION_DAYS: &str = "caretaker_ca_expiration_days";
pub(super) const ETCD_SIGNER_EXPIRATION_DAYS: &str = "caretaker_etcd_signer_expiration_days";
pub(super) const OPENSHIFT_SIGNER_EXPIRATION_DAYS: &str =
    "openshift_etcd_operator_signer_expiration_days";

/// (kind, namespace, name): one certificate-holding object.
type Series = (CertificateKind, String, String);

/// A certificate's notAfter and, when known, when it is due to be replaced, in seconds since
/// the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Times {
    not_after: i64,
    renewal: Option<i64>,
}

/// Each followed object's times.
#[derive(Debug, Default)]
pub(super) struct Expiries(Mutex<BTreeMap<Series, Times>>);

impl Expiries {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Series, Times>> {
        // Each change is one insert or remove: a panic elsewhere leaves nothing half-written.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn set(
        &self,
        kind: CertificateKind,
        namespace: &str,
        name: &str,
        not_after: OffsetDateTime,
        renewal: Option<OffsetDateTime>,
    ) {
        let times = Times {
            not_after: not_after.unix_timestamp(),
            renewal: renewal.map(OffsetDateTime::unix_timestamp),
        };
        self.lock()
            .insert((kind, namespace.to_string(), name.to_string()), times);
    }

    pub(super) fn remove(&self, kind: CertificateKind, namespace: &str, name: &str) {
        self.lock()
            .remove(&(kind, namespace.to_string(), name.to_string()));
    }

    pub(super) fn retain(&self, keep: impl Fn(CertificateKind, &str, &str) -> bool) {
        self.lock()
            .retain(|(kind, namespace, name), _| keep(*kind, namespace, name));
    }
}

/// Encodes [`Expiries`] at each scrape, the days left counted from `clock`'s time.
#[derive(Debug)]
pub(super) struct Collector {
    pub(super) expiries: std::sync::Arc<Expiries>,
    pub(super) clock: fn() -> OffsetDateTime,
}

const SECONDS_PER_DAY: f64 = 86_400.0;

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A copy, so that no controller waits on the lock while the scrape is written.
        let expiries = self.expiries.lock().clone();
        let now = (self.clock)();
        let now = now.unix_timestamp() as f64 + f64::from(now.nanosecond()) / 1e9;
        {
            let mut family = encoder.encode_descriptor(
                CERTIFICATE_EXPIRATION,
                "When the certificate of a CertificateAuthority, IssuedCertificate or Machine expires (its notAfter), in seconds since the Unix epoch.",
                None,
                MetricType::Gauge,
            )?;
            for ((kind, namespace, name), times) in &expiries {
                let labels = [
                    ("kind", kind.as_str()),
                    ("namespace", namespace.as_str()),
                    ("name", name.as_str()),
                ];
                ConstGauge::new(times.not_after).encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                CERTIFICATE_RENEWAL,
                "When caretaker is due to replace the certificate of a CertificateAuthority or IssuedCertificate (for a CA being rotated: when the next CA signs), in seconds since the Unix epoch.",
                None,
                MetricType::Gauge,
            )?;
            for ((kind, namespace, name), times) in &expiries {
                let Some(renewal) = times.renewal else {
                    continue;
                };
                let labels = [
                    ("kind", kind.as_str()),
                    ("namespace", namespace.as_str()),
                    ("name", name.as_str()),
                ];
                ConstGauge::new(renewal).encode(family.encode_family(&labels)?)?;
            }
        }
        days_left(
            &mut encoder,
            (
                CA_EXPIRATION_DAYS,
                "Days from now until the current CA of a CertificateAuthority expires; negative once it has.",
            ),
            (&expiries, CertificateKind::CertificateAuthority, now),
            |_, name| vec![("name", name)],
        )?;
        // The OpenShift etcd operator's own name and `name` label, so that alerts written for it
        // (`etcdSignerCAExpirationWarning`) keep firing; caretaker's series follows.
        days_left(
            &mut encoder,
            (
                OPENSHIFT_SIGNER_EXPIRATION_DAYS,
                "Days from now until an etcd signer expires (the OpenShift etcd operator's name and labels); negative once it has.",
            ),
            (&expiries, CertificateKind::EtcdSigner, now),
            |namespace, signer| vec![("name", signer), ("namespace", namespace)],
        )?;
        days_left(
            &mut encoder,
            (
                ETCD_SIGNER_EXPIRATION_DAYS,
                "Days from now until an etcd signer of an EtcdCertificates expires; negative once it has.",
            ),
            (&expiries, CertificateKind::EtcdSigner, now),
            |namespace, signer| vec![("namespace", namespace), ("signer", signer)],
        )?;
        Ok(())
    }
}

/// A gauge family (`name`, `help`) of the days from `now` (seconds since the epoch) until each
/// `kind` certificate expires, labelled by `labels` from its namespace and name.
fn days_left(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    (expiries, kind, now): (&BTreeMap<Series, Times>, CertificateKind, f64),
    labels: for<'a> fn(&'a str, &'a str) -> Vec<(&'static str, &'a str)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for ((series_kind, namespace, name), times) in expiries {
        if *series_kind != kind {
            continue;
        }
        let days = (times.not_after as f64 - now) / SECONDS_PER_DAY;
        ConstGauge::new(days).encode(family.encode_family(&labels(namespace, name))?)?;
    }
    Ok(())
}
