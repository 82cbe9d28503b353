//! What IssuedCertificate passes report, their status and their events, written after the
//! Secrets. A pass writes its certificate's Secret itself and leaves the report here; the
//! writer sends reports while no Secret is being written. When a CA rotates, thousands of
//! certificates are due at once, and what they report would otherwise take three of every
//! four requests of the rotation: each workload would wait for the reports of the
//! certificates renewed before its own.
//!
//! A report waits for a pause in the Secret writes ([`QUIET`]), at most [`MAX_WAIT`]. Reports
//! of one certificate are one entry: the events add up, the latest status wins (it is computed
//! against the status the object has when it is written). A status write that fails is kept
//! and tried again; an event that fails is logged and dropped, as every event is. A report
//! not written when the operator stops is lost; the next pass computes the same status from
//! the Secret.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use time::OffsetDateTime;

use super::authorities::{self, Shared};
use crate::authority;
use crate::changes::Event;
use crate::runtime::{Key, status};
use caretaker_api::v1alpha1::{IssuedCertificate, IssuedCertificateStatus};

/// How long the Secret writes must pause before reports are sent.
const QUIET: Duration = Duration::from_millis(250);
/// The longest a report waits for that pause.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Reports taken at once: the writer looks for Secret writes again after each batch.
const BATCH: usize = 64;
/// Reports written at once.
const CONCURRENCY: usize = 16;

/// What a pass decided the status says, before it is set on the status the object has.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StatusUpdate {
    /// The certificate as its plan leaves it.
    Planned(authority::CertificateStatus),
    /// The issuer is missing or cannot sign now: Ready false with this condition's reason.
    Waiting(authority::Condition),
    /// Not acted on: Ready false and Degraded with this reason.
    Refused {
        reason: &'static str,
        message: String,
    },
}

/// A status for the object of generation `generation`, decided at `at`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedStatus {
    pub update: StatusUpdate,
    pub generation: Option<i64>,
    pub at: OffsetDateTime,
}

impl PlannedStatus {
    /// The status to write over `old`.
    pub(crate) fn over(&self, old: &IssuedCertificateStatus) -> IssuedCertificateStatus {
        let (generation, at) = (self.generation, self.at);
        match &self.update {
            StatusUpdate::Planned(planned) => {
                authorities::certificate_status(planned, old, generation, at)
            }
            StatusUpdate::Waiting(not_ready) => {
                let conditions = status::conditions(
                    &old.conditions,
                    not_ready,
                    &authority::Condition::as_expected(),
                    generation,
                    at,
                );
                old.with_conditions(conditions, generation)
            }
            StatusUpdate::Refused { reason, message } => {
                let conditions =
                    status::refused_conditions(&old.conditions, reason, message, generation, at);
                old.with_conditions(conditions, generation)
            }
        }
    }

    /// The Degraded message the status will carry, if any.
    pub(crate) fn degraded_message(&self) -> Option<&str> {
        match &self.update {
            StatusUpdate::Planned(planned) if planned.degraded.status => {
                Some(&planned.degraded.message)
            }
            StatusUpdate::Refused { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// One certificate's report: its events in order, and its latest status.
#[derive(Debug)]
pub(crate) struct Report {
    /// The certificate's uid: its events are about this one, not one created again.
    pub uid: Option<String>,
    pub events: Vec<Event>,
    pub status: Option<PlannedStatus>,
}

/// The reports waiting, and when the Secrets were last written.
#[derive(Default)]
pub(crate) struct CertificateReports {
    waiting: Mutex<Waiting>,
    more: tokio::sync::Notify,
}

#[derive(Default)]
struct Waiting {
    /// Boxed: the table has a slot for each of thousands of certificates during a rotation.
    reports: HashMap<Key, Box<Report>>,
    /// Since when reports have waited: none has waited longer.
    since: Option<Instant>,
    last_secret_write: Option<Instant>,
}

impl CertificateReports {
    /// Leaves `events` and `status` for the certificate `key` (of `uid`), after what it left
    /// before; `read`: the status the pass read. A status that changes nothing read is left
    /// only over one waiting, which it replaces.
    pub(crate) fn add(
        &self,
        key: Key,
        uid: Option<String>,
        events: Vec<Event>,
        status: PlannedStatus,
        read: &IssuedCertificateStatus,
    ) {
        let mut waiting = self.lock();
        let waiting = &mut *waiting;
        if let Some(report) = waiting.reports.get_mut(&key) {
            report.uid = uid;
            report.events.extend(events);
            report.status = Some(status);
        } else {
            let status = (status.over(read) != *read).then_some(status);
            if events.is_empty() && status.is_none() {
                return;
            }
            waiting.since.get_or_insert_with(Instant::now);
            let report = Report {
                uid,
                events,
                status,
            };
            waiting.reports.insert(key, Box::new(report));
        }
        self.more.notify_one();
    }

    /// A pass wrote a Secret: reports wait until the writes pause.
    pub(crate) fn secret_written(&self) {
        self.lock().last_secret_write = Some(Instant::now());
    }

    /// How long to wait before sending reports at `now`: zero when the Secret writes have
    /// paused for [`QUIET`] or the oldest report has waited [`MAX_WAIT`]; `None` when no
    /// report waits.
    fn wait_at(&self, now: Instant) -> Option<Duration> {
        let waiting = self.lock();
        let since = waiting.since?;
        let pause = waiting.last_secret_write.map_or(QUIET, |at| now - at);
        let left_quiet = QUIET.saturating_sub(pause);
        let left_max = MAX_WAIT.saturating_sub(now - since);
        Some(left_quiet.min(left_max))
    }

    /// `count` reports, out of the queue.
    fn take(&self, count: usize) -> Vec<(Key, Box<Report>)> {
        let mut waiting = self.lock();
        let keys: Vec<Key> = waiting.reports.keys().take(count).cloned().collect();
        let taken = keys
            .into_iter()
            .filter_map(|key| waiting.reports.remove_entry(&key))
            .collect();
        if waiting.reports.is_empty() {
            waiting.since = None;
        }
        taken
    }

    /// A status whose write failed, back in the queue unless a newer one came meanwhile.
    fn retry(&self, key: Key, uid: Option<String>, status: PlannedStatus) {
        let mut waiting = self.lock();
        if let Some(report) = waiting.reports.get_mut(&key) {
            report.status.get_or_insert(status);
            return;
        }
        waiting.since.get_or_insert_with(Instant::now);
        let report = Report {
            uid,
            events: Vec::new(),
            status: Some(status),
        };
        waiting.reports.insert(key, Box::new(report));
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends `reports` until the operator stops.
pub(crate) async fn run(shared: Arc<Shared>, reports: Arc<CertificateReports>) {
    let stop = shared.ctx.shutdown.signal();
    tokio::select! {
        () = write_reports(&shared, &reports) => {}
        () = stop => {}
    }
}

async fn write_reports(shared: &Shared, reports: &CertificateReports) {
    loop {
        let wait = match reports.wait_at(Instant::now()) {
            None => {
                reports.more.notified().await;
                continue;
            }
            Some(wait) => wait,
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            continue;
        }
        let failed = futures::stream::iter(reports.take(BATCH))
            .map(|(key, report)| write(shared, reports, key, report))
            .buffer_unordered(CONCURRENCY)
            .fold(false, |failed, ok| async move { failed || !ok })
            .await;
        if failed {
            tokio::time::sleep(shared.ctx.settings.retry_base).await;
        }
    }
}

/// Sends one report: its status, then its events; false when the status could not be
/// written (it waits again).
async fn write(
    shared: &Shared,
    reports: &CertificateReports,
    key: Key,
    report: Box<Report>,
) -> bool {
    let regarding = ObjectReference {
        api_version: Some(IssuedCertificate::api_version(&()).into_owned()),
        kind: Some(IssuedCertificate::kind(&()).into_owned()),
        namespace: Some(key.0.clone()),
        name: Some(key.1.clone()),
        uid: report.uid.clone(),
        ..Default::default()
    };
    // The status first: whoever reads an event then finds the status it speaks of.
    let written = match report.status {
        Some(status) => send_status(shared, reports, key, report.uid.clone(), status).await,
        None => true,
    };
    for event in report.events {
        shared.ctx.event(&regarding, event).await;
    }
    written
}

/// Writes one report's status; false when it could not (it waits again).
async fn send_status(
    shared: &Shared,
    reports: &CertificateReports,
    key: Key,
    uid: Option<String>,
    status: PlannedStatus,
) -> bool {
    let reference = ObjectRef::new(&key.1).within(&key.0);
    let Some(certificate) = shared.stores.certificates.get(&reference) else {
        return true; // deleted: no status to write
    };
    if certificate.metadata.uid != uid {
        return true; // deleted and created again: its own passes report on it
    }
    let old = certificate.status.clone().unwrap_or_default();
    let api: Api<IssuedCertificate> = Api::namespaced(shared.ctx.client.clone(), &key.0);
    match (shared
        .statuses
        .written
        .write(&api, &certificate, &status.over(&old), &old))
    .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(certificate = %format!("{}/{}", key.0, key.1), error = %e, "cannot write an IssuedCertificate's status");
            shared
                .ctx
                .metrics
                .reconcile_failed("issued_certificate", &e);
            reports.retry(key, uid, status);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caretaker_api::names;

    fn key(name: &str) -> Key {
        ("demo".to_string(), name.to_string())
    }

    fn uid(uid: &str) -> Option<String> {
        Some(uid.into())
    }

    fn read() -> IssuedCertificateStatus {
        IssuedCertificateStatus::default()
    }

    fn status(message: &str) -> PlannedStatus {
        PlannedStatus {
            update: StatusUpdate::Refused {
                reason: names::REASON_INVALID_SPEC,
                message: message.into(),
            },
            generation: Some(1),
            at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// One entry per certificate: its events add up in order, its latest
    /// status wins, even one that changes nothing read (the one before it would undo it); a
    /// report that changes nothing and says nothing is no entry.
    #[test]
    fn reports_of_one_certificate_are_one_entry() {
        let reports = CertificateReports::default();
        let event = |note: &str| Event::normal("Reason", note.to_string());
        let refused = status("one");
        let as_read = refused.over(&read());
        reports.add(
            key("a"),
            uid("1"),
            vec![event("a1")],
            status("one"),
            &read(),
        );
        reports.add(
            key("b"),
            uid("2"),
            vec![event("b1")],
            status("b"),
            &status("b").over(&read()),
        );
        reports.add(
            key("a"),
            uid("1"),
            vec![event("a2")],
            status("two"),
            &read(),
        );
        reports.add(
            key("a"),
            uid("1"),
            vec![event("a3")],
            status("one"),
            &as_read,
        );
        reports.add(
            key("c"),
            uid("3"),
            Vec::new(),
            status("c"),
            &status("c").over(&read()),
        );
        let mut taken = reports.take(10);
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&str> = taken.iter().map(|(k, _)| k.1.as_str()).collect();
        assert_eq!(names, ["a", "b"], "a report of nothing new is no entry");
        let a = &taken[0].1;
        let notes: Vec<&str> = a.events.iter().map(|e| e.note.as_str()).collect();
        assert_eq!(notes, ["a1", "a2", "a3"]);
        assert_eq!(
            a.status,
            Some(status("one")),
            "the latest, though unchanged"
        );
        assert_eq!(taken[1].1.status, None, "b's status changes nothing");
        assert!(reports.take(10).is_empty());
    }

    /// Reports wait for the Secret writes to pause, and no longer than the longest wait.
    #[test]
    fn reports_wait_for_a_pause_in_the_secret_writes() {
        let reports = CertificateReports::default();
        let start = Instant::now();
        assert_eq!(reports.wait_at(start), None, "nothing to send");
        reports.add(key("a"), uid("1"), Vec::new(), status("one"), &read());
        let now = Instant::now();
        assert_eq!(reports.wait_at(now), Some(Duration::ZERO), "no write yet");
        reports.secret_written();
        let written = reports.lock().last_secret_write.unwrap();
        assert_eq!(reports.wait_at(written), Some(QUIET));
        assert_eq!(reports.wait_at(written + QUIET), Some(Duration::ZERO));
        // Writes that never pause: the report goes at its longest wait.
        let added = reports.lock().since.unwrap();
        reports.lock().last_secret_write = Some(added + MAX_WAIT);
        assert_eq!(reports.wait_at(added + MAX_WAIT), Some(Duration::ZERO));
        assert!(reports.wait_at(added + MAX_WAIT - QUIET).unwrap() <= QUIET);
        // Once none waits, the next report's wait starts anew.
        assert_eq!(reports.take(10).len(), 1);
        assert_eq!(reports.wait_at(added + MAX_WAIT), None);
        reports.add(key("b"), uid("2"), Vec::new(), status("two"), &read());
        assert!(reports.lock().since.unwrap() > added);
    }

    /// A failed status goes back unless a newer one waits; the newer one is not replaced.
    #[test]
    fn a_failed_status_waits_again_unless_a_newer_one_does() {
        let reports = CertificateReports::default();
        reports.retry(key("a"), uid("1"), status("old"));
        assert_eq!(reports.take(10)[0].1.status, Some(status("old")));
        reports.add(key("a"), uid("1"), Vec::new(), status("new"), &read());
        reports.retry(key("a"), uid("1"), status("old"));
        let taken = reports.take(10);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].1.status, Some(status("new")));
    }

    /// The status is set on the one the object has when it is written: a refusal keeps the
    /// certificate's dates, a plan replaces them.
    #[test]
    fn a_status_is_set_on_the_objects_own() {
        let old = IssuedCertificateStatus {
            serial_number: Some("01".into()),
            ..Default::default()
        };
        let refused = status("spec.validity: \"x\" is not a duration").over(&old);
        assert_eq!(refused.serial_number.as_deref(), Some("01"));
        let degraded = refused.conditions.iter().find(|c| c.type_ == "Degraded");
        assert_eq!(degraded.map(|c| c.status.as_str()), Some("True"));
        assert_eq!(
            status("x").degraded_message(),
            Some("x"),
            "what Warnings are remembered by"
        );
    }
}
