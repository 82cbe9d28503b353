//! `IssuedCertificate`: a certificate signed by a CertificateAuthority, kept in a Secret and
//! issued again before it expires.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A certificate signed by a CertificateAuthority and written to a kubernetes.io/tls Secret
/// (`tls.crt`, `tls.key`, and `ca.crt` with the issuer's trust bundle), issued again when due.
// Clippy mistakes the printcolumns' repeated `type_ = "string"` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "caretaker.dev",
    version = "v1alpha1",
    kind = "IssuedCertificate",
    namespaced,
    status = "IssuedCertificateStatus",
    derive = "PartialEq",
    doc = "A certificate that caretaker issues from a CertificateAuthority and renews.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Not After",
        type_ = "string",
        description = "When the current certificate expires.",
        json_path = ".status.notAfter"
    ),
    printcolumn(
        name = "Next Rotation",
        type_ = "string",
        description = "When the certificate is next issued again.",
        json_path = ".status.nextRotation"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IssuedCertificateSpec {
    /// The CertificateAuthority that signs this certificate.
    pub issuer_ref: IssuerReference,
    /// The Secret, in this object's namespace, that receives the certificate.
    #[schemars(length(min = 1))]
    pub secret_name: String,
    /// Subject common name (CN).
    #[schemars(length(min = 1))]
    pub common_name: String,
    /// DNS subject alternative names; `*` may be the whole first label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// IP address subject alternative names, IPv4 or IPv6.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// What the certificate is for: `server`, `client`, or both.
    #[schemars(schema_with = "usages_schema")]
    pub usages: Vec<String>,
    /// Key algorithm of each new key: ECDSA-P256 (the default), ECDSA-P384, Ed25519, RSA-2048,
    /// RSA-3072 or RSA-4096.
    #[serde(default = "super::default_key_algorithm")]
    #[schemars(extend("enum" = ["ECDSA-P256", "ECDSA-P384", "Ed25519", "RSA-2048", "RSA-3072", "RSA-4096"]))]
    pub key_algorithm: String,
    /// Lifetime of each certificate, a TTL such as 1y (the default), 90d or 12h; cut to the
    /// issuer's own expiry.
    #[serde(default = "super::default_certificate_validity")]
    pub validity: String,
    /// Issue again once this percentage of the lifetime has passed (1 to 100). Default 80
    /// when renewBefore is not set; set only one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Issue again this long before expiry, a TTL such as 30d; shorter than validity. Set
    /// only one of renewAtPercent and renewBefore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// A CertificateAuthority, by name (they are cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IssuerReference {
    /// The CertificateAuthority's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// What caretaker last observed and did.
pub type IssuedCertificateStatus = super::CertificateStatus;

/// `usages`: at least one of `server` and `client`.
fn usages_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "items": {"type": "string", "enum": super::USAGE_NAMES},
    })
}
