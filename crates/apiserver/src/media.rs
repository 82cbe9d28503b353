//! The media types request bodies may have. Handlers check them; the protobuf decoder names
//! the ones to use instead when a kind has no protobuf form here.

/// Kubernetes' protobuf encoding (`kubectl create namespace|configmap|secret` sends it).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What kube-apiserver decodes request bodies from (CBOR only behind a feature gate).
/// Anything else is refused, in particular the `text/plain`, form and multipart types a web
/// page may post cross-origin without asking.
pub const BODY_MEDIA_TYPES: &[&str] = &["application/json", "application/yaml", PROTOBUF];

/// What custom resources take: they have no protobuf form.
pub const JSON_OR_YAML: &[&str] = &["application/json", "application/yaml"];
