//! The policies of caretaker's CAs and of the certificates they issue, read from the specs
//! users write (`caretaker_api::v1alpha1`): every field checked, every bad one reported.

use caretaker_api::v1alpha1::{CertificateAuthoritySpec, IssuedCertificateSpec};
use caretaker_pki::{CaSpec, LeafSpec};

use super::{AuthorityPolicy, CertificatePolicy};
use crate::validation::{Problems, SpecError};

impl AuthorityPolicy {
    /// What a CertificateAuthority's spec asks for, validated; or every field that is wrong.
    pub fn from_spec(spec: &CertificateAuthoritySpec) -> Result<Self, SpecError> {
        let mut problems = Problems::default();
        let common_name = problems.non_empty("spec.commonName", &spec.common_name);
        let algorithm = problems.key_algorithm("spec.keyAlgorithm", &spec.key_algorithm);
        problems.object_name("spec.secret.name", "Secret", &spec.secret.name);
        problems.namespace_name("spec.secret.namespace", &spec.secret.namespace);
        problems.object_name("spec.bundle.name", "ConfigMap", &spec.bundle.name);
        problems.namespace_name("spec.bundle.namespace", &spec.bundle.namespace);
        for (i, namespace) in spec.allowed_namespaces.iter().enumerate() {
            problems.namespace_name(&format!("spec.allowedNamespaces[{i}]"), namespace);
        }
        let (validity, rotation) = problems.lifetime(
            "spec",
            &spec.validity,
            spec.renew_at_percent,
            spec.renew_before.as_deref(),
        );
        let trust_propagation =
            problems.duration_or_zero("spec.trustPropagation", &spec.trust_propagation);
        if let (Some(propagation), Some(rotation), Some(validity)) =
            (trust_propagation, rotation, validity)
        {
            problems.propagation_fits(
                "spec.trustPropagation",
                &spec.trust_propagation,
                propagation,
                rotation,
                validity,
            );
        }
        problems.finish((|| {
            Some(AuthorityPolicy {
                ca: CaSpec {
                    validity: validity?,
                    algorithm: algorithm?,
                    ..CaSpec::new(common_name?)
                },
                rotation: rotation?,
                trust_propagation: trust_propagation?,
            })
        })())
    }
}

impl CertificatePolicy {
    /// What an IssuedCertificate's spec asks for, validated; or every field that is wrong.
    /// Whether `issuerRef` names an existing CertificateAuthority is not checked here: that
    /// needs the cluster.
    pub fn from_spec(spec: &IssuedCertificateSpec) -> Result<Self, SpecError> {
        let mut problems = Problems::default();
        problems.object_name(
            "spec.issuerRef.name",
            "CertificateAuthority",
            &spec.issuer_ref.name,
        );
        problems.object_name("spec.secretName", "Secret", &spec.secret_name);
        let common_name = problems.non_empty("spec.commonName", &spec.common_name);
        let dns_names = problems.dns_names("spec.dnsNames", &spec.dns_names);
        let ip_addresses = problems.ip_addresses("spec.ipAddresses", &spec.ip_addresses);
        let usage = problems.usage("spec.usages", &spec.usages);
        let algorithm = problems.key_algorithm("spec.keyAlgorithm", &spec.key_algorithm);
        let (validity, rotation) = problems.lifetime(
            "spec",
            &spec.validity,
            spec.renew_at_percent,
            spec.renew_before.as_deref(),
        );
        problems.finish((|| {
            Some(CertificatePolicy {
                leaf: LeafSpec::new(common_name?, usage?)
                    .with_dns_names(dns_names?)
                    .with_ip_addresses(ip_addresses?)
                    .with_validity(validity?)
                    .with_algorithm(algorithm?),
                rotation: rotation?,
            })
        })())
    }
}

#[cfg(test)]
mod tests;
