//! `CertificateAuthority`: a CA that lives in the cluster and rotates before it expires.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NamespacedName;

/// A certificate authority kept in a Secret, published in a trust bundle ConfigMap, and
/// replaced before it expires: a new CA is trusted everywhere for `trustPropagation` before
/// it signs anything, and an old one stays in the bundle while it may still be needed.
// Clippy mistakes the printcolumns' repeated `type_ = "string"` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "caretaker.dev",
    version = "v1alpha1",
    kind = "CertificateAuthority",
    plural = "certificateauthorities",
    status = "CertificateAuthorityStatus",
    derive = "PartialEq",
    doc = "A certificate authority that caretaker creates, publishes and rotates.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Not After",
        type_ = "string",
        description = "When the current CA certificate expires.",
        json_path = ".status.notAfter"
    ),
    printcolumn(
        name = "Next Rotation",
        type_ = "string",
        description = "When the CA is next replaced.",
        json_path = ".status.nextRotation"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthoritySpec {
    /// Subject common name (CN) of each CA certificate.
    #[schemars(length(min = 1))]
    pub common_name: String,
    /// The Secret (type kubernetes.io/tls) that holds the CA's certificate and key.
    pub secret: NamespacedName,
    /// The ConfigMap the trust bundle is published in, under the key `ca-bundle.crt`: the
    /// current CA and every older one still trusted.
    pub bundle: NamespacedName,
    /// Key algorithm of each new CA: ECDSA-P256 (the default), ECDSA-P384, Ed25519, RSA-2048,
    /// RSA-3072 or RSA-4096.
    #[serde(default = "super::default_key_algorithm")]
    #[schemars(extend("enum" = ["ECDSA-P256", "ECDSA-P384", "Ed25519", "RSA-2048", "RSA-3072", "RSA-4096"]))]
    pub key_algorithm: String,
    /// Lifetime of each CA certificate, a TTL such as 10y (the default), 1y6mo, 90d or 12h.
    #[serde(default = "super::default_ca_validity")]
    pub validity: String,
    /// Rotate once this percentage of the lifetime has passed (1 to 100). Default 80 when
    /// renewBefore is not set; set only one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Rotate this long before expiry, a TTL such as 60d; shorter than validity. Set only one
    /// of renewAtPercent and renewBefore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    /// How long a new CA is published in the bundle and every injection point before it
    /// signs anything, a TTL such as 5m (the default); 0s signs at once.
    #[serde(default = "super::default_trust_propagation")]
    pub trust_propagation: String,
    /// The namespaces whose IssuedCertificates this CA signs; empty or absent: every
    /// namespace. An IssuedCertificate elsewhere gets nothing (reason NamespaceNotAllowed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_namespaces: Vec<String>,
}

/// What caretaker last observed and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthorityStatus {
    /// What an IssuedCertificate's status says too, of the CA that signs now.
    #[serde(flatten)]
    pub certificate: super::CertificateStatus,
    /// During a rotation: when the next CA was first seen in the bundle and every injection
    /// point, RFC 3339; it signs from trustPropagation later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub trusted_since: Option<String>,
    /// Older CA certificates still in the trust bundle.
    #[serde(rename = "previousCAs", default, skip_serializing_if = "Vec::is_empty")]
    pub previous_cas: Vec<PreviousCa>,
}

/// An older CA certificate that is still trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousCa {
    /// Its serial number, colon-separated hex.
    pub serial_number: String,
    /// When it expires, RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub not_after: String,
}

impl CertificateAuthoritySpec {
    /// Whether this CA signs IssuedCertificates of `namespace` (`spec.allowedNamespaces`).
    pub fn issues_to(&self, namespace: &str) -> bool {
        self.allowed_namespaces.is_empty() || self.allowed_namespaces.iter().any(|n| n == namespace)
    }
}
