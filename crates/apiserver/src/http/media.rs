//! Media types: those request bodies may have (handlers check them; the protobuf decoder names
//! the ones to use instead when a kind has no protobuf form here), and the representations
//! answers are given in (`Accept: …;as=Table` or `;as=PartialObjectMetadata`).

/// Kubernetes' protobuf encoding (`kubectl create namespace|configmap|secret` sends it).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What kube-apiserver decodes request bodies from (CBOR only behind a feature gate).
/// Anything else is refused, in particular the `text/plain`, form and multipart types a web
/// page may post cross-origin without asking.
pub const BODY_MEDIA_TYPES: &[&str] = &["application/json", "application/yaml", PROTOBUF];

/// What custom resources take: they have no protobuf form.
pub const JSON_OR_YAML: &[&str] = &["application/json", "application/yaml"];

/// What a GET, list or watch answers with, as the request's `Accept` header asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The objects themselves.
    Object,
    /// A `meta.k8s.io/v1` Table (kubectl).
    Table,
    /// `PartialObjectMetadata` (and `…List`) of `meta.k8s.io/<version>`: metadata only, as
    /// metadata informers ask for it.
    Metadata { version: &'static str },
}

/// What is being answered: one object, a list, or a watch (whose events carry single objects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Object,
    List,
    Watch,
}

/// The first representation in `accept` (comma-separated media ranges, in the client's order of
/// preference) this server can give; 406 when none, as kube-apiserver answers. A range without
/// `as=` is the object itself; a range with `as=` is taken only for JSON and when its
/// `as`, `g` and `v` name something served here.
pub fn negotiate(
    accept: Option<&str>,
    answer: Answer,
) -> Result<Representation, crate::error::ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Representation::Object);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or_default();
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let Some(as_) = param("as") else {
            return Ok(Representation::Object);
        };
        let json = matches!(media_type, "application/json" | "application/*" | "*/*");
        let version = match param("v") {
            Some("v1") => "v1",
            Some("v1beta1") => "v1beta1",
            _ => continue,
        };
        if !json || param("g") != Some("meta.k8s.io") {
            continue;
        }
        let metadata = match answer {
            Answer::Object | Answer::Watch => "PartialObjectMetadata",
            Answer::List => "PartialObjectMetadataList",
        };
        if as_ == "Table" {
            return Ok(Representation::Table);
        }
        if as_ == metadata {
            return Ok(Representation::Metadata { version });
        }
    }
    Err(crate::error::ApiError::new(
        406,
        "NotAcceptable",
        format!(
            "only the following media types are accepted: {}",
            BODY_MEDIA_TYPES.join(", ")
        ),
    ))
}

/// `object` as `PartialObjectMetadata`: its metadata alone.
pub fn partial_object(object: &serde_json::Value, version: &str) -> serde_json::Value {
    serde_json::to_value(PartialObject::of(object, version)).expect("JSON values encode")
}

/// An object's `PartialObjectMetadata`, borrowing its metadata: encoded without a copy of it
/// (a Secret's managedFields are most of what a metadata answer holds). Its fields encode in
/// the order a JSON value's keys do.
#[derive(serde::Serialize)]
pub struct PartialObject<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a serde_json::Value,
}

impl<'a> PartialObject<'a> {
    pub fn of(object: &'a serde_json::Value, version: &str) -> Self {
        static EMPTY: std::sync::LazyLock<serde_json::Value> =
            std::sync::LazyLock::new(|| serde_json::json!({}));
        Self {
            api_version: match version {
                "v1beta1" => "meta.k8s.io/v1beta1",
                _ => "meta.k8s.io/v1",
            },
            kind: "PartialObjectMetadata",
            metadata: object.get("metadata").unwrap_or(&EMPTY),
        }
    }
}

/// `list` as `PartialObjectMetadataList`: its list metadata, and each item's metadata alone.
pub fn partial_list(list: &serde_json::Value, version: &str) -> serde_json::Value {
    let items: Vec<serde_json::Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| partial_object(item, version))
        .collect();
    serde_json::json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": list.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_range_that_can_be_served_wins() {
        let metadata = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        assert_eq!(
            negotiate(Some(metadata), Answer::List).unwrap(),
            Representation::Metadata { version: "v1" }
        );
        // client-go's metadata client: protobuf first, which is not served here.
        let client_go = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(
            negotiate(Some(client_go), Answer::Watch).unwrap(),
            Representation::Metadata { version: "v1" }
        );
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(kubectl), Answer::List).unwrap(),
            Representation::Table
        );
        assert_eq!(
            negotiate(None, Answer::Object).unwrap(),
            Representation::Object
        );
        assert_eq!(
            negotiate(Some("application/json, */*"), Answer::Object).unwrap(),
            Representation::Object
        );
        // A list is not a PartialObjectMetadata.
        let single = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
        assert_eq!(negotiate(Some(single), Answer::List).unwrap_err().code, 406);
    }

    #[test]
    fn what_cannot_be_served_is_406() {
        for accept in [
            "application/json;as=Foo;g=meta.k8s.io;v=v1",
            "application/json;as=Table;g=example.com;v=v1",
            "application/json;as=Table;g=meta.k8s.io;v=v2",
            "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1",
        ] {
            let refused = negotiate(Some(accept), Answer::Object).unwrap_err();
            assert_eq!(
                (refused.code, refused.reason),
                (406, "NotAcceptable"),
                "{accept}"
            );
        }
    }
}
