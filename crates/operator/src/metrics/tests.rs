use std::sync::atomic::{AtomicI64, Ordering};

use time::macros::datetime;

use super::*;

#[path = "../../tests/common/openmetrics.rs"]
mod openmetrics;

use openmetrics::{Exposition, parse};

fn scrape(metrics: &Metrics) -> Exposition {
    let text = metrics.encode();
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

const EXPIRATION: &str = "caretaker_certificate_expiration_seconds";
const DAYS: &str = "caretaker_ca_expiration_days";
const ETCD_DAYS: &str = "caretaker_etcd_signer_expiration_days";
const RENEWAL: &str = "caretaker_certificate_renewal_seconds";

fn fixed_now() -> OffsetDateTime {
    datetime!(2026-03-01 00:00 UTC)
}

#[test]
fn every_family_is_declared_with_its_type() {
    let types = |metrics: &Metrics| -> Vec<(String, String)> {
        scrape(metrics).types.into_iter().collect()
    };
    let declared = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, kind)| (name.to_string(), kind.to_string()))
            .collect()
    };
    // Before anything happened: the expiry gauges, empty, and the rotations of each kind at
    // 0; a family of counters by error category has no series until an error.
    let metrics = Metrics::new();
    assert_eq!(
        types(&metrics),
        declared(&[
            (DAYS, "gauge"),
            (EXPIRATION, "gauge"),
            (RENEWAL, "gauge"),
            ("caretaker_certificate_rotations", "counter"),
            (ETCD_DAYS, "gauge"),
            ("caretaker_leader", "gauge"),
            ("openshift_etcd_operator_signer_expiration_days", "gauge"),
        ])
    );
    let names: Vec<String> = scrape(&metrics)
        .samples
        .into_iter()
        .map(|s| s.name)
        .collect();
    let mut expected = vec!["caretaker_certificate_rotations_total"; 5];
    expected.push("caretaker_leader");
    assert_eq!(names, expected);

    drop(metrics.reconcile_started("machine"));
    metrics.reconcile_failed("machine", &Error::CacheStopped);
    metrics.rotation_failed(CertificateKind::Machine, &Error::CacheStopped);
    assert_eq!(
        types(&metrics),
        declared(&[
            (DAYS, "gauge"),
            (EXPIRATION, "gauge"),
            (RENEWAL, "gauge"),
            ("caretaker_certificate_rotation_failures", "counter"),
            ("caretaker_certificate_rotations", "counter"),
            (ETCD_DAYS, "gauge"),
            ("caretaker_leader", "gauge"),
            ("caretaker_reconcile", "counter"),
            ("caretaker_reconcile_duration_seconds", "histogram"),
            ("caretaker_reconcile_errors", "counter"),
            ("openshift_etcd_operator_signer_expiration_days", "gauge"),
        ])
    );
}

/// Where each parent's rollout stands, and which replica leads.
#[test]
fn rollouts_and_leadership_have_their_gauges() {
    let metrics = Metrics::new();
    assert_eq!(
        scrape(&metrics).series("caretaker_leader"),
        [(String::new(), 0.0)]
    );
    metrics.set_leader(true);
    assert_eq!(
        scrape(&metrics).series("caretaker_leader"),
        [(String::new(), 1.0)]
    );
    metrics.set_rollout_progress(
        "MachineDeployment",
        "fleet",
        "md-0",
        "in-place-upgrade",
        [("total", 5), ("done", 2), ("running", 1), ("skipped", 1)],
    );
    let series = scrape(&metrics).series("caretaker_rollout_machines");
    let labels = |state: &str| {
        format!(
            "kind=MachineDeployment,name=md-0,namespace=fleet,operation=in-place-upgrade,state={state}"
        )
    };
    for (state, value) in [
        ("done", 2.0),
        ("running", 1.0),
        ("skipped", 1.0),
        ("total", 5.0),
    ] {
        assert!(
            series.contains(&(labels(state), value)),
            "{state}: {series:?}"
        );
    }
    assert_eq!(series.len(), 4);
}

/// The equivalent of `openshift_etcd_operator_signer_expiration_days`: per namespace and
/// signer, days left at the scrape; the signers' notAfter is also an expiry series.
#[test]
fn etcd_signers_have_their_days_left() {
    let metrics = Metrics::with_clock(fixed_now);
    let at = fixed_now() + time::Duration::hours(36);
    metrics.set_certificate_expiry(CertificateKind::EtcdSigner, "etcd-system", "signer-ca", at);
    metrics.set_certificate_expiry(
        CertificateKind::EtcdCertificate,
        "etcd-system",
        "etcd-peer-m0",
        at,
    );
    let exposition = scrape(&metrics);
    assert_eq!(
        exposition.series(ETCD_DAYS),
        [("namespace=etcd-system,signer=signer-ca".into(), 1.5)]
    );
    // Issue 34: upstream's name and `name` label too, for the alerts written for OpenShift.
    assert_eq!(
        exposition.series("openshift_etcd_operator_signer_expiration_days"),
        [("name=signer-ca,namespace=etcd-system".into(), 1.5)]
    );
    assert_eq!(exposition.series(DAYS), [], "not a CertificateAuthority's");
    assert_eq!(exposition.series(EXPIRATION).len(), 2);
}

#[test]
fn expiry_series_follow_their_objects() {
    let metrics = Metrics::with_clock(fixed_now);
    let ten_days = fixed_now() + time::Duration::days(10);
    metrics.set_certificate_expiry(
        CertificateKind::CertificateAuthority,
        "",
        "webhooks",
        ten_days,
    );
    metrics.set_certificate_expiry(
        CertificateKind::IssuedCertificate,
        "demo",
        "webhook-server",
        datetime!(2027-01-01 00:00 UTC),
    );
    metrics.set_certificate_expiry(
        CertificateKind::Machine,
        "default",
        "cp-0",
        datetime!(2026-04-01 12:00 UTC),
    );
    let exposition = scrape(&metrics);
    let seconds = |t: OffsetDateTime| t.unix_timestamp() as f64;
    assert_eq!(
        exposition.series(EXPIRATION),
        [
            (
                "kind=CertificateAuthority,name=webhooks,namespace=".into(),
                seconds(ten_days)
            ),
            (
                "kind=IssuedCertificate,name=webhook-server,namespace=demo".into(),
                seconds(datetime!(2027-01-01 00:00 UTC))
            ),
            (
                "kind=Machine,name=cp-0,namespace=default".into(),
                seconds(datetime!(2026-04-01 12:00 UTC))
            ),
        ]
    );
    assert_eq!(
        exposition.series(DAYS),
        [("name=webhooks".into(), 10.0)],
        "days only for CertificateAuthorities"
    );

    // A new certificate replaces the old one's series; a deleted object drops its own.
    let rotated = fixed_now() + time::Duration::days(3650);
    metrics.set_certificate_expiry(
        CertificateKind::CertificateAuthority,
        "",
        "webhooks",
        rotated,
    );
    metrics.remove_certificate_expiry(CertificateKind::Machine, "default", "cp-0");
    metrics.remove_certificate_expiry(CertificateKind::Machine, "default", "never-seen");
    let exposition = scrape(&metrics);
    assert_eq!(
        exposition.series(EXPIRATION),
        [
            (
                "kind=CertificateAuthority,name=webhooks,namespace=".into(),
                seconds(rotated)
            ),
            (
                "kind=IssuedCertificate,name=webhook-server,namespace=demo".into(),
                seconds(datetime!(2027-01-01 00:00 UTC))
            ),
        ]
    );
    assert_eq!(exposition.series(DAYS), [("name=webhooks".into(), 3650.0)]);

    metrics.remove_certificate_expiry(CertificateKind::CertificateAuthority, "", "webhooks");
    metrics.remove_certificate_expiry(CertificateKind::IssuedCertificate, "demo", "webhook-server");
    let exposition = scrape(&metrics);
    assert!(exposition.series(EXPIRATION).is_empty());
    assert!(exposition.series(DAYS).is_empty());
    assert_eq!(
        exposition.types[DAYS], "gauge",
        "the families stay declared"
    );
}

/// Seconds since the epoch the test clock reads.
static NOW: AtomicI64 = AtomicI64::new(0);

fn test_clock() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(NOW.load(Ordering::SeqCst)).unwrap()
}

#[test]
fn days_left_are_computed_at_each_scrape() {
    let start = fixed_now();
    NOW.store(start.unix_timestamp(), Ordering::SeqCst);
    let metrics = Metrics::with_clock(test_clock);
    metrics.set_certificate_expiry(
        CertificateKind::CertificateAuthority,
        "",
        "etcd-signer",
        start + time::Duration::days(2),
    );
    let days = |metrics: &Metrics| scrape(metrics).get(DAYS, &[("name", "etcd-signer")]);
    assert_eq!(days(&metrics), Some(2.0));
    // Nothing is set again: only time passes.
    NOW.store(
        (start + time::Duration::hours(12)).unix_timestamp(),
        Ordering::SeqCst,
    );
    assert_eq!(days(&metrics), Some(1.5));
    NOW.store(
        (start + time::Duration::days(3)).unix_timestamp(),
        Ordering::SeqCst,
    );
    assert_eq!(days(&metrics), Some(-1.0), "negative once expired");
    // The notAfter itself does not move.
    assert_eq!(
        scrape(&metrics).get(
            EXPIRATION,
            &[
                ("kind", "CertificateAuthority"),
                ("namespace", ""),
                ("name", "etcd-signer")
            ]
        ),
        Some((start + time::Duration::days(2)).unix_timestamp() as f64)
    );
}

#[test]
fn days_left_follow_the_real_clock() {
    let metrics = Metrics::default();
    let not_after = OffsetDateTime::now_utc() + time::Duration::days(30);
    metrics.set_certificate_expiry(CertificateKind::CertificateAuthority, "", "ca", not_after);
    let days = scrape(&metrics).get(DAYS, &[("name", "ca")]).unwrap();
    assert!((29.99..=30.0).contains(&days), "{days}");
}

#[test]
fn rotations_and_their_failures_are_counted_by_kind_and_category() {
    let metrics = Metrics::default();
    metrics.rotated(CertificateKind::Machine);
    metrics.rotated(CertificateKind::Machine);
    metrics.rotated(CertificateKind::CertificateAuthority);
    metrics.rotation_failed(
        CertificateKind::Machine,
        &Error::NoNode {
            machine: "cp-0".into(),
        },
    );
    metrics.rotation_failed(CertificateKind::IssuedCertificate, &Error::CacheStopped);
    let exposition = scrape(&metrics);
    assert_eq!(
        exposition.series("caretaker_certificate_rotations_total"),
        [
            ("kind=CertificateAuthority".into(), 1.0),
            ("kind=EtcdCertificate".into(), 0.0),
            ("kind=EtcdSigner".into(), 0.0),
            ("kind=IssuedCertificate".into(), 0.0),
            ("kind=Machine".into(), 2.0),
        ]
    );
    assert_eq!(
        exposition.series("caretaker_certificate_rotation_failures_total"),
        [
            ("category=cache_stopped,kind=IssuedCertificate".into(), 1.0),
            ("category=no_node,kind=Machine".into(), 1.0),
        ],
        "the category only, never the error's message (it names the Machine)"
    );
}

#[test]
fn reconciles_are_counted_and_timed_by_controller() {
    let metrics = Metrics::new();
    drop(metrics.reconcile_started("machine"));
    drop(metrics.reconcile_started("machine"));
    metrics.reconciled("rollout", Duration::from_millis(30));
    metrics.reconcile_failed("machine", &Error::CacheStopped);
    let exposition = scrape(&metrics);
    assert_eq!(
        exposition.series("caretaker_reconcile_total"),
        [
            ("controller=machine".into(), 2.0),
            ("controller=rollout".into(), 1.0)
        ]
    );
    assert_eq!(
        exposition.series("caretaker_reconcile_errors_total"),
        [("category=cache_stopped,controller=machine".into(), 1.0)]
    );
    let histogram = "caretaker_reconcile_duration_seconds";
    assert_eq!(
        exposition.get(&format!("{histogram}_count"), &[("controller", "rollout")]),
        Some(1.0)
    );
    assert_eq!(
        exposition.get(&format!("{histogram}_sum"), &[("controller", "rollout")]),
        Some(0.03)
    );
    let bucket = |le: &str| {
        exposition.get(
            &format!("{histogram}_bucket"),
            &[("controller", "rollout"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.025"), Some(0.0));
    assert_eq!(bucket("0.05"), Some(1.0));
    assert_eq!(bucket("+Inf"), Some(1.0));
    assert_eq!(
        exposition.get(&format!("{histogram}_count"), &[("controller", "machine")]),
        Some(2.0)
    );
}

#[test]
fn the_reader_refuses_what_is_not_the_text_format() {
    for bad in [
        "",
        "metric 1\n",
        "# HELP a x\n# TYPE a gauge\na 1\n",
        "# HELP a x\n# TYPE a gauge\nb 1\n# EOF\n",
        "# HELP a x\n# TYPE a gauge\na{k=\"v\" 1\n# EOF\n",
        "# HELP a x\n# TYPE a gauge\na{k=v} 1\n# EOF\n",
        "# HELP a x\n# TYPE a gauge\na one\n# EOF\n",
        "# HELP a x\n# TYPE a sometimes\na 1\n# EOF\n",
        "# HELP a x\n# TYPE a gauge\na{k=\"v\",} 1\n# EOF\n",
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
    let good = "# HELP a x.\n# TYPE a gauge\na{k=\"v\\\"q\",l=\"\"} -1.5\n# EOF\n";
    assert_eq!(
        parse(good).unwrap().get("a", &[("k", "v\"q"), ("l", "")]),
        Some(-1.5)
    );
}

/// cert-manager's renewal timestamp: only for the certificates whose controller gives one,
/// replaced with the expiry, and gone with it.
#[test]
fn renewal_times_follow_their_certificates() {
    let metrics = Metrics::with_clock(fixed_now);
    let (expires, renews) = (
        fixed_now() + time::Duration::days(90),
        fixed_now() + time::Duration::days(60),
    );
    let seconds = |t: OffsetDateTime| t.unix_timestamp() as f64;
    metrics.set_certificate_expiry_and_renewal(
        CertificateKind::IssuedCertificate,
        "demo",
        "web",
        expires,
        Some(renews),
    );
    metrics.set_certificate_expiry(CertificateKind::Machine, "default", "cp-0", expires);
    let series = |metrics: &Metrics| scrape(metrics).series(RENEWAL);
    assert_eq!(
        series(&metrics),
        [(
            "kind=IssuedCertificate,name=web,namespace=demo".into(),
            seconds(renews)
        )],
        "no renewal time for a Machine"
    );
    // Renewed: both times move on.
    let later = renews + time::Duration::days(90);
    metrics.set_certificate_expiry_and_renewal(
        CertificateKind::IssuedCertificate,
        "demo",
        "web",
        expires + time::Duration::days(90),
        Some(later),
    );
    assert_eq!(series(&metrics)[0].1, seconds(later));
    metrics.remove_certificate_expiry(CertificateKind::IssuedCertificate, "demo", "web");
    assert_eq!(series(&metrics), []);
}

/// A parent's status annotation is one series, of a known status; another value is none.
#[test]
fn a_rollout_status_is_one_series_of_a_known_value() {
    let metrics = Metrics::new();
    let set = |status| {
        metrics.set_rollout_status("Cluster", "default", "c1", "refresh-certificates", status)
    };
    let series = || scrape(&metrics).series("caretaker_rollout_status");
    let labels = |status: &str| {
        format!(
            "kind=Cluster,name=c1,namespace=default,operation=refresh-certificates,status={status}"
        )
    };
    set(Some("in-progress"));
    assert_eq!(series(), [(labels("in-progress"), 1.0)]);
    set(Some("failed"));
    assert_eq!(series(), [(labels("failed"), 1.0)]);
    // Anyone may write the annotation: an unknown value adds no label value.
    set(Some("pwned-by-a-very-long-status"));
    assert_eq!(series(), []);
    set(Some("done"));
    metrics.remove_rollout("Cluster", "default", "c1", "refresh-certificates");
    assert_eq!(series(), []);
}

#[test]
fn degraded_objects_have_a_series_until_they_recover() {
    let metrics = Metrics::new();
    metrics.set_degraded("IssuedCertificate", "demo", "web", true);
    metrics.set_degraded("CertificateAuthority", "", "ok", false);
    assert_eq!(
        scrape(&metrics).series("caretaker_degraded"),
        [("kind=IssuedCertificate,name=web,namespace=demo".into(), 1.0)]
    );
    metrics.set_degraded("IssuedCertificate", "demo", "web", false);
    assert_eq!(scrape(&metrics).series("caretaker_degraded"), []);
}
