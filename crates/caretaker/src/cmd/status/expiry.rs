//! `caretaker status certificates`, the pure part: one row per certificate caretaker keeps or
//! follows, from the objects as read ([`Observed`]), sorted by what expires first, and the
//! table or document that shows them. Reading the objects is `super::certificates`'s.
//!
//! Only certificates go in: [`Observed`] holds no Secret but the PEM of their `*.crt` keys, and
//! a row holds a name, times and a state, never key material.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use caretaker_api::names;
use caretaker_api::v1alpha1::{self, CertificateAuthority, EtcdCertificates, IssuedCertificate};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// What the table is made from, as read from the API server.
#[derive(Debug, Default)]
pub struct Observed {
    pub authorities: Vec<CertificateAuthority>,
    pub certificates: Vec<IssuedCertificate>,
    pub etcd: Vec<ObservedEtcd>,
    pub machines: Vec<DynamicObject>,
    pub bundles: Vec<ObservedBundle>,
}

/// An EtcdCertificates and the certificates of its `etcd-all-certs`.
#[derive(Debug)]
pub struct ObservedEtcd {
    pub object: EtcdCertificates,
    /// `etcd-all-certs`'s certificate keys (`etcd-peer-<member>.crt`, ...; not its bundles')
    /// and their PEM. Its `.key` entries are never read into this.
    pub certificates: BTreeMap<String, String>,
}

/// A trust-manager Bundle or ClusterBundle and what one of its targets holds.
#[derive(Debug)]
pub struct ObservedBundle {
    /// `Bundle` or `ClusterBundle`.
    pub kind: &'static str,
    pub name: String,
    /// The `Synced` condition: its status and reason.
    pub synced: Option<(String, String)>,
    /// The data of one target ConfigMap (a bundle's targets hold the same certificates), if
    /// one was found.
    pub target: Option<BTreeMap<String, String>>,
}

/// One certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// CertificateAuthority, IssuedCertificate, EtcdSigner, EtcdCertificate, Machine, Bundle
    /// or ClusterBundle.
    pub kind: &'static str,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
    /// When it expires: a Machine's earliest node certificate, a bundle's earliest CA.
    #[serde(with = "time::serde::rfc3339::option")]
    pub not_after: Option<OffsetDateTime>,
    /// When caretaker replaces it, where caretaker decides that.
    #[serde(with = "time::serde::rfc3339::option")]
    pub renewal_time: Option<OffsetDateTime>,
    /// Its object's state: Ready, Degraded (and why), a refresh's status.
    pub state: String,
}

/// Every certificate of `observed`, the first to expire first (those with no expiry last).
pub fn rows(observed: &Observed) -> Vec<Row> {
    let mut rows = Vec::new();
    for ca in &observed.authorities {
        let status = ca.status.as_ref().map(|s| &s.certificate);
        rows.push(certificate_row(
            "CertificateAuthority",
            String::new(),
            ca.name_any(),
            status,
        ));
    }
    for certificate in &observed.certificates {
        rows.push(certificate_row(
            "IssuedCertificate",
            certificate.namespace().unwrap_or_default(),
            certificate.name_any(),
            certificate.status.as_ref(),
        ));
    }
    for etcd in &observed.etcd {
        rows.extend(etcd_rows(etcd));
    }
    for machine in &observed.machines {
        let annotations = machine.annotations();
        let get = |key: &str| annotations.get(key).map(String::as_str);
        rows.push(Row {
            kind: "Machine",
            namespace: machine.namespace().unwrap_or_default(),
            name: machine.name_any(),
            not_after: get(names::CERTIFICATES_EXPIRY).and_then(parse_time),
            renewal_time: None,
            state: match get(names::REFRESH_CERTIFICATES_STATUS) {
                Some(status) => format!("refresh {status}"),
                None => "-".into(),
            },
        });
    }
    for bundle in &observed.bundles {
        rows.push(bundle_row(bundle));
    }
    sort(&mut rows);
    rows
}

/// The first to expire first; those without an expiry after every other; then by kind,
/// namespace and name, so that the order never depends on the order objects were listed in.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        let expiry = |r: &Row| (r.not_after.is_none(), r.not_after);
        (expiry(a), a.kind, &a.namespace, &a.name).cmp(&(expiry(b), b.kind, &b.namespace, &b.name))
    });
}

fn certificate_row(
    kind: &'static str,
    namespace: String,
    name: String,
    status: Option<&v1alpha1::CertificateStatus>,
) -> Row {
    let status = status.cloned().unwrap_or_default();
    Row {
        kind,
        namespace,
        name,
        not_after: status.not_after.as_deref().and_then(parse_time),
        renewal_time: status.next_rotation.as_deref().and_then(parse_time),
        state: state_of(&status.conditions, v1alpha1::CONDITION_DEGRADED),
    }
}

/// `Degraded (reason)` when the condition `degraded` is True, else `Ready`, `NotReady
/// (reason)`, or `-` before the operator has said anything.
fn state_of(conditions: &[v1alpha1::Condition], degraded: &str) -> String {
    let find = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
    match (find(degraded), find(v1alpha1::CONDITION_READY)) {
        (Some(d), _) if d.status == "True" => format!("Degraded ({})", d.reason),
        (_, Some(r)) if r.status == "True" => "Ready".into(),
        (_, Some(r)) => format!("NotReady ({})", r.reason),
        _ => "-".into(),
    }
}

fn etcd_rows(etcd: &ObservedEtcd) -> Vec<Row> {
    let namespace = etcd.object.namespace().unwrap_or_default();
    let status = etcd.object.status.clone().unwrap_or_default();
    let state = state_of(&status.conditions, "EtcdCertSignerControllerDegraded");
    let mut rows = Vec::new();
    // The OpenShift etcd operator's names for its two signers.
    let signers = [
        ("signer-ca", &status.signer),
        ("metrics-signer-ca", &status.metrics_signer),
    ];
    for (name, signer) in signers {
        let signer = signer.clone().unwrap_or_default();
        rows.push(Row {
            kind: "EtcdSigner",
            namespace: namespace.clone(),
            name: name.into(),
            not_after: signer.not_after.as_deref().and_then(parse_time),
            renewal_time: signer.next_rotation.as_deref().and_then(parse_time),
            state: state.clone(),
        });
    }
    for (key, pem) in &etcd.certificates {
        let name = key.strip_suffix(".crt").unwrap_or(key);
        rows.push(Row {
            kind: "EtcdCertificate",
            namespace: namespace.clone(),
            name: name.into(),
            not_after: earliest_not_after(pem),
            renewal_time: None,
            state: state.clone(),
        });
    }
    rows
}

fn bundle_row(bundle: &ObservedBundle) -> Row {
    let not_after = (bundle.target.iter())
        .flat_map(|data| data.values())
        .filter_map(|value| earliest_not_after(value))
        .min();
    let state = match (&bundle.synced, &bundle.target) {
        (_, None) => "no target found".into(),
        (Some((status, _)), _) if status == "True" => "Synced".into(),
        (Some((_, reason)), _) => format!("NotSynced ({reason})"),
        (None, _) => "-".into(),
    };
    Row {
        kind: bundle.kind,
        namespace: String::new(),
        name: bundle.name.clone(),
        not_after,
        renewal_time: None,
        state,
    }
}

/// The earliest notAfter of the certificates of a PEM text; none when it holds none, or
/// anything but certificates (the strict bundle parser refuses a key, and says nothing of it).
fn earliest_not_after(pem: &str) -> Option<OffsetDateTime> {
    let certificates = caretaker_pki::bundle::parse(pem).ok()?;
    certificates.iter().map(|c| c.info().not_after).min()
}

fn parse_time(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

fn format_time(t: Option<OffsetDateTime>) -> String {
    t.and_then(|t| t.replace_nanosecond(0).ok()?.format(&Rfc3339).ok())
        .unwrap_or_else(|| "-".into())
}

/// What is left until `t`, as kubeadm's RESIDUAL TIME says it: `364d`, `23h`, `59m`, or
/// `expired`.
fn residual(t: Option<OffsetDateTime>, now: OffsetDateTime) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let left = t - now;
    if left.is_negative() {
        return "expired".into();
    }
    match (left.whole_days(), left.whole_hours(), left.whole_minutes()) {
        (days, _, _) if days > 0 => format!("{days}d"),
        (_, hours, _) if hours > 0 => format!("{hours}h"),
        (_, _, minutes) => format!("{minutes}m"),
    }
}

/// The renewal time, and `overdue` once it has passed at `now`.
fn renewal(t: Option<OffsetDateTime>, now: OffsetDateTime) -> String {
    match t {
        Some(t) if t < now => format!("{} (overdue)", format_time(Some(t))),
        t => format_time(t),
    }
}

/// `text` with control characters (newlines, terminal escapes) shown as `?`: a state comes
/// from annotations and conditions that the objects' authors write, and must not forge rows
/// or drive the reader's terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The table, at `now`: a line per row, columns aligned.
pub fn table(rows: &[Row], now: OffsetDateTime) -> String {
    let header = [
        "KIND",
        "NAMESPACE",
        "NAME",
        "EXPIRES",
        "RESIDUAL",
        "RENEWAL",
        "STATE",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.kind.to_string(),
                if r.namespace.is_empty() {
                    "-".into()
                } else {
                    r.namespace.clone()
                },
                r.name.clone(),
                format_time(r.not_after),
                residual(r.not_after, now),
                renewal(r.renewal_time, now),
                printable(&r.state),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}   ", width = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(&header.map(String::from));
    for row in &cells {
        line(row);
    }
    if rows.is_empty() {
        out.push_str("(no certificates: no CertificateAuthority, IssuedCertificate, EtcdCertificates, Machine or trust bundle found)\n");
    }
    out
}

/// The rows as a document for scripts (`-o json|yaml`): `{"certificates": [...]}`, times in
/// RFC 3339, absent ones null.
#[derive(Serialize)]
pub struct Document<'a> {
    pub certificates: &'a [Row],
}

#[cfg(test)]
mod tests {
    use super::*;
    use caretaker_pki::{CaSpec, CertificateAuthority as Ca};
    use serde_json::json;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-06-01 00:00 UTC);

    fn ca(name: &str, status: serde_json::Value) -> CertificateAuthority {
        serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
            "metadata": {"name": name},
            "spec": {
                "commonName": name,
                "secret": {"name": name, "namespace": "caretaker-system"},
                "bundle": {"name": name, "namespace": "caretaker-system"},
            },
            "status": status,
        }))
        .unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn machine(name: &str, expiry: Option<&str>, refresh: Option<&str>) -> DynamicObject {
        let mut annotations = serde_json::Map::new();
        if let Some(expiry) = expiry {
            annotations.insert(names::CERTIFICATES_EXPIRY.into(), json!(expiry));
        }
        if let Some(refresh) = refresh {
            annotations.insert(names::REFRESH_CERTIFICATES_STATUS.into(), json!(refresh));
        }
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        }))
        .unwrap()
    }

    fn self_signed(days: i64) -> Ca {
        let spec = CaSpec {
            validity: format!("{days}d").parse().unwrap(),
            ..CaSpec::new("test-ca")
        };
        Ca::create(&spec).unwrap()
    }

    fn observed() -> Observed {
        let issued: IssuedCertificate = serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
            "metadata": {"name": "web", "namespace": "demo"},
            "spec": {"issuerRef": {"name": "webhooks"}, "secretName": "web-tls",
                     "commonName": "web.demo.svc", "usages": ["server"]},
            "status": {
                "notAfter": "2026-06-20T00:00:00Z", "nextRotation": "2026-05-30T00:00:00Z",
                "conditions": [condition("Ready", "True", "Issued"),
                               condition("Degraded", "True", "SigningFailed")],
            },
        }))
        .unwrap();
        let etcd: EtcdCertificates = serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
            "metadata": {"name": "etcd", "namespace": "etcd-system"},
            "spec": {"members": [], "quorum": {"endpoints": ["https://10.0.0.1:2379"]}},
            "status": {
                "signer": {"notAfter": "2031-01-01T00:00:00Z", "nextRotation": "2030-01-01T00:00:00Z"},
                "conditions": [condition("Ready", "True", "CertificatesInPlace"),
                               condition("EtcdCertSignerControllerDegraded", "False", "AsExpected")],
            },
        }))
        .unwrap();
        let peer = self_signed(400);
        Observed {
            authorities: vec![
                ca(
                    "webhooks",
                    json!({"notAfter": "2036-01-01T00:00:00Z", "nextRotation": "2035-01-01T00:00:00Z",
                           "conditions": [condition("Ready", "True", "Signing")]}),
                ),
                ca("new", json!({})),
            ],
            certificates: vec![issued],
            etcd: vec![ObservedEtcd {
                object: etcd,
                certificates: BTreeMap::from([(
                    "etcd-peer-m0.crt".to_string(),
                    peer.certificate_pem().to_string(),
                )]),
            }],
            machines: vec![
                machine("cp-0", Some("2026-06-10T12:00:00Z"), Some("failed")),
                machine("w-0", None, None),
            ],
            bundles: vec![ObservedBundle {
                kind: "ClusterBundle",
                name: "fleet-roots".into(),
                synced: Some(("True".into(), "Synced".into())),
                target: Some(BTreeMap::from([(
                    "ca.crt".to_string(),
                    format!(
                        "{}{}",
                        self_signed(30).certificate_pem(),
                        self_signed(900).certificate_pem()
                    ),
                )])),
            }],
        }
    }

    #[test]
    fn every_kind_is_a_row_and_the_first_to_expire_comes_first() {
        let rows = rows(&observed());
        let order: Vec<(&str, &str)> = rows.iter().map(|r| (r.kind, r.name.as_str())).collect();
        assert_eq!(
            order,
            [
                ("Machine", "cp-0"),
                ("IssuedCertificate", "web"),
                // The earliest of the bundle's CAs: 30 days from when the test runs.
                ("ClusterBundle", "fleet-roots"),
                ("EtcdCertificate", "etcd-peer-m0"),
                ("EtcdSigner", "signer-ca"),
                ("CertificateAuthority", "webhooks"),
                // Nothing known yet: last, by kind and name.
                ("CertificateAuthority", "new"),
                ("EtcdSigner", "metrics-signer-ca"),
                ("Machine", "w-0"),
            ]
        );
        let web = &rows[1];
        assert_eq!(web.state, "Degraded (SigningFailed)");
        assert_eq!(web.renewal_time, Some(datetime!(2026-05-30 00:00 UTC)));
        assert_eq!(rows[0].state, "refresh failed");
        assert_eq!(rows[2].state, "Synced");
        assert_eq!(rows[4].state, "Ready");
        assert_eq!(rows[4].renewal_time, Some(datetime!(2030-01-01 00:00 UTC)));
        assert_eq!(rows[6].state, "-");
    }

    /// The attack: a Machine's author writes a status with a newline and a terminal escape,
    /// to forge a row or drive the reader's terminal; the table shows them as `?`.
    #[test]
    fn a_state_written_by_an_objects_author_cannot_forge_rows_or_escapes() {
        let forged = Row {
            kind: "Machine",
            namespace: "team".into(),
            name: "w-9".into(),
            not_after: None,
            renewal_time: None,
            state: "done\nCertificateAuthority   -   root   2099-01-01\u{1b}]52;c;aGk=\u{7}".into(),
        };
        let table = table(&[forged], NOW);
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(
            !table.chars().any(|c| c.is_control() && c != '\n'),
            "{table:?}"
        );
        assert!(table.contains("done?CertificateAuthority"), "{table}");
    }

    #[test]
    fn the_table_says_what_is_left_and_what_is_overdue() {
        let rows = rows(&observed());
        let table = table(&rows, NOW);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("KIND "), "{table}");
        assert!(lines[0].contains("EXPIRES") && lines[0].ends_with("STATE"));
        assert!(
            lines[1].contains("2026-06-10T12:00:00Z") && lines[1].contains(" 9d "),
            "{table}"
        );
        // web's renewal time has passed and it was not renewed.
        assert!(
            lines[2].contains("2026-05-30T00:00:00Z (overdue)"),
            "{table}"
        );
        assert_eq!(lines.len(), 1 + rows.len());
        // Columns are aligned: every line's NAME starts where the header's does.
        let column = lines[0].find("NAME ").unwrap();
        assert!(lines[1..].iter().all(|l| l[column - 3..column] == *"   "));
        assert_eq!(
            residual(Some(NOW - time::Duration::hours(1)), NOW),
            "expired"
        );
        assert_eq!(residual(Some(NOW + time::Duration::hours(5)), NOW), "5h");
    }

    #[test]
    fn a_bundle_with_a_key_in_it_shows_no_expiry_and_never_the_key() {
        let key = caretaker_pki::PrivateKey::generate(caretaker_pki::KeyAlgorithm::EcdsaP256)
            .unwrap()
            .to_pem();
        let mut observed = Observed::default();
        observed.bundles.push(ObservedBundle {
            kind: "Bundle",
            name: "leaky".into(),
            synced: None,
            target: Some(BTreeMap::from([("ca.crt".to_string(), key.clone())])),
        });
        let rows = rows(&observed);
        assert_eq!(rows[0].not_after, None);
        let shown = format!(
            "{}{}",
            table(&rows, NOW),
            serde_json::to_string(&Document {
                certificates: &rows
            })
            .unwrap()
        );
        let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(!shown.contains(&body[..40]), "{shown}");
    }

    #[test]
    fn the_document_has_rfc3339_times_and_nulls() {
        let rows = rows(&observed());
        let document = serde_json::to_value(Document {
            certificates: &rows,
        })
        .unwrap();
        let first = &document["certificates"][0];
        assert_eq!(first["kind"], "Machine");
        assert_eq!(first["notAfter"], "2026-06-10T12:00:00Z");
        assert_eq!(first["renewalTime"], serde_json::Value::Null);
        assert_eq!(first["namespace"], "default");
    }
}
