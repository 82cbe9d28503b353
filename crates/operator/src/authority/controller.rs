//! The kube-rs glue of caretaker's own CAs: [`certificate_authority`] and
//! [`issued_certificate`] keep the CAs and the certificates they issue, from what they share
//! (`authorities`: stores kept by `authority_watch`, read through `authority_reads`);
//! `certificate_reports` writes the certificates' statuses; [`run`] starts them all.

mod authorities;
mod authority_reads;
mod authority_watch;
pub mod certificate_authority;
mod certificate_reports;
pub mod issued_certificate;

use std::sync::Arc;

use crate::context::Context;

/// Runs the CertificateAuthority and IssuedCertificate controllers and the watches they share,
/// until their streams end. While caretaker's CRDs are not installed they only watch for them
/// (the log says so once), and start by themselves when they appear. `namespace`, when given,
/// is the only namespace Secrets, ConfigMaps and IssuedCertificates are read from.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let (shared, writers, authorities, certificates) = authorities::start(ctx, namespace);
    let reports = Arc::new(certificate_reports::CertificateReports::default());
    futures::join!(
        authority_watch::run(shared.clone(), writers),
        certificate_authority::run(shared.clone(), authorities),
        issued_certificate::run(shared.clone(), certificates, reports.clone()),
        certificate_reports::run(shared, reports),
    );
}
