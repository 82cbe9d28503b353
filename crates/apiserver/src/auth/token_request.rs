//! `authentication.k8s.io/v1` TokenRequest, the `token` subresource of a ServiceAccount
//! (`POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`, what `kubectl create token`
//! sends): issues a token for that ServiceAccount, as kube-apiserver does. Authorized as
//! `create` on `serviceaccounts/token`. Nothing is stored: the answer is the request with its
//! `status` (the token and its expiry).
//!
//! As upstream: `spec.expirationSeconds` defaults to 3600 and must be at least 600 and at most
//! 2^32; `spec.audiences` defaults to this server's ([`API_AUDIENCE`]), and a token for other
//! audiences only does not authenticate here; `spec.boundObjectRef` binds the token to a Secret
//! or a Pod of the namespace (one running as this ServiceAccount): it is valid only while that
//! object exists. Other kinds (a Node) are refused with 400.

use serde_json::{Value, json};

use super::tokens::{API_AUDIENCE, Binding, Claims, ObjectRef, TokenKey};
use crate::api::ApiState;
use crate::error::{ApiError, FieldError, FieldErrorKind};

pub const GROUP: &str = "authentication.k8s.io";
pub const KIND: &str = "TokenRequest";
/// kube-apiserver's defaults and bounds for `spec.expirationSeconds`.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

fn invalid(name: &str, field: &str, message: String) -> ApiError {
    ApiError::invalid(
        GROUP,
        KIND,
        name,
        &[FieldError::new(field, FieldErrorKind::Invalid, message)],
    )
}

/// What a TokenRequest asks for, read from its body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    audiences: Vec<String>,
    expiration_seconds: i64,
    bound_object_ref: Option<Value>,
}

/// The request body's spec, defaulted; 400 for fields of the wrong type.
fn spec_of(request: &Value) -> Result<Spec, ApiError> {
    let spec = &request["spec"];
    let audiences = match &spec["audiences"] {
        Value::Null => vec![],
        Value::Array(list) => list
            .iter()
            .map(|a| a.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad_request("spec.audiences must be a list of strings"))?,
        _ => {
            return Err(ApiError::bad_request(
                "spec.audiences must be a list of strings",
            ));
        }
    };
    let expiration_seconds = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => v
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    let bound_object_ref = match &spec["boundObjectRef"] {
        Value::Null => None,
        r if r.is_object() => Some(r.clone()),
        _ => {
            return Err(ApiError::bad_request(
                "spec.boundObjectRef must be an object",
            ));
        }
    };
    Ok(Spec {
        audiences: if audiences.is_empty() {
            vec![API_AUDIENCE.to_string()]
        } else {
            audiences
        },
        expiration_seconds,
        bound_object_ref,
    })
}

/// kube-apiserver's `ValidateTokenRequest`.
fn validate_expiration(seconds: i64) -> Result<(), ApiError> {
    if seconds < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            "spec.expirationSeconds",
            format!("{seconds}: may not specify a duration less than 10 minutes"),
        ));
    }
    if seconds > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            "spec.expirationSeconds",
            format!("{seconds}: may not specify a duration larger than 2^32 seconds"),
        ));
    }
    Ok(())
}

/// The object a token is to be bound to, checked as kube-apiserver checks it.
fn binding(
    api: &ApiState,
    namespace: &str,
    account: &str,
    reference: &Value,
) -> Result<Binding, ApiError> {
    let field = |f: &str| reference[f].as_str().unwrap_or_default().to_string();
    let (kind, api_version, name, uid) = (
        field("kind"),
        field("apiVersion"),
        field("name"),
        field("uid"),
    );
    // Only the core group's Pod and Secret (an apiVersion without a group).
    let core = !api_version.contains('/');
    let plural = match kind.as_str() {
        "Secret" if core => "secrets",
        "Pod" if core => "pods",
        _ => {
            let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount {account:?} to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    let object = super::stored_core(api, plural, namespace, &name)?
        .ok_or_else(|| ApiError::not_found("", plural, &name))?;
    let bound = ObjectRef::of(&object);
    if !uid.is_empty() && uid != bound.uid {
        return Err(ApiError::conflict_because(
            "",
            &kind,
            &name,
            &format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    if plural == "pods" {
        // The admission plugin of kube-apiserver gives a Pod without one `default`.
        let runs_as = object
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        if runs_as != account {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount {account:?} to pod running with different serviceaccount name."
            )));
        }
        return Ok(Binding::Pod(bound));
    }
    Ok(Binding::Secret(bound))
}

/// The stored ServiceAccount `namespace`/`name`; 404 if there is none.
fn service_account(api: &ApiState, namespace: &str, name: &str) -> Result<Value, ApiError> {
    super::stored_core(api, "serviceaccounts", namespace, name)?
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))
}

/// The answer to a TokenRequest `request` for the ServiceAccount `namespace`/`name`, issued
/// at `now` (seconds since the Unix epoch).
pub fn create(
    api: &ApiState,
    key: &TokenKey,
    namespace: &str,
    name: &str,
    mut request: Value,
    now: i64,
) -> Result<Value, ApiError> {
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "the TokenRequest is not a JSON object",
        ));
    }
    if let Some(kind) = request["kind"].as_str().filter(|k| *k != KIND) {
        return Err(ApiError::bad_request(format!(
            "the body is a {kind}, not a {KIND}"
        )));
    }
    // As upstream: metadata, if given, must name the ServiceAccount of the path.
    for (field, path_value, what) in [
        ("name", name, "name"),
        ("namespace", namespace, "namespace"),
    ] {
        if let Some(given) = request["metadata"][field]
            .as_str()
            .filter(|g| !g.is_empty())
            && given != path_value
        {
            return Err(invalid(
                name,
                &format!("metadata.{field}"),
                format!("{given:?}: must match the service account {what} if specified"),
            ));
        }
    }
    let account = service_account(api, namespace, name)?;
    let spec = spec_of(&request)?;
    validate_expiration(spec.expiration_seconds)?;
    let binding = spec
        .bound_object_ref
        .as_ref()
        .map(|r| binding(api, namespace, name, r))
        .transpose()?;
    let claims = Claims::new(
        &account,
        spec.audiences.clone(),
        now,
        spec.expiration_seconds,
        binding,
    );
    let token = key.sign(&claims);
    request["apiVersion"] = json!(format!("{GROUP}/v1"));
    request["kind"] = json!(KIND);
    request["metadata"] = json!({
        "name": name,
        "namespace": namespace,
        "creationTimestamp": timestamp(now),
    });
    request["spec"] = json!({
        "audiences": spec.audiences,
        "expirationSeconds": spec.expiration_seconds,
        "boundObjectRef": spec.bound_object_ref,
    });
    request["status"] = json!({
        "token": token,
        "expirationTimestamp": timestamp(claims.exp),
    });
    Ok(request)
}

/// A token for the ServiceAccount `namespace`/`name` with this server's audience, valid for
/// `lifetime_seconds` from `now`: what the kubeconfigs the server writes carry. No minimum
/// lifetime, unlike a TokenRequest's.
pub fn issue(
    api: &ApiState,
    key: &TokenKey,
    namespace: &str,
    name: &str,
    now: i64,
    lifetime_seconds: i64,
) -> Result<String, ApiError> {
    let account = service_account(api, namespace, name)?;
    let claims = Claims::new(
        &account,
        vec![API_AUDIENCE.into()],
        now,
        lifetime_seconds,
        None,
    );
    Ok(key.sign(&claims))
}

/// `seconds` since the Unix epoch as a Kubernetes `Time`.
fn timestamp(seconds: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_defaulted_as_upstream() {
        let spec = spec_of(&json!({"spec": {}})).unwrap();
        assert_eq!(
            spec,
            Spec {
                audiences: vec![API_AUDIENCE.into()],
                expiration_seconds: 3600,
                bound_object_ref: None,
            }
        );
        let spec =
            spec_of(&json!({"spec": {"audiences": ["vault"], "expirationSeconds": 600}})).unwrap();
        assert_eq!(
            (spec.audiences, spec.expiration_seconds),
            (vec!["vault".to_string()], 600)
        );
        assert_eq!(spec_of(&json!({})).unwrap().expiration_seconds, 3600);
        for bad in [
            json!({"spec": {"audiences": "vault"}}),
            json!({"spec": {"audiences": [1]}}),
            json!({"spec": {"expirationSeconds": "600"}}),
            json!({"spec": {"boundObjectRef": "secret"}}),
        ] {
            assert_eq!(spec_of(&bad).unwrap_err().code, 400, "{bad}");
        }
    }

    #[test]
    fn lifetimes_are_bounded_as_upstream() {
        assert!(validate_expiration(600).is_ok());
        assert!(validate_expiration(1 << 32).is_ok());
        let short = validate_expiration(599).unwrap_err();
        assert_eq!(
            (short.code, short.message.as_str()),
            (
                422,
                "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
            )
        );
        assert_eq!(validate_expiration((1 << 32) + 1).unwrap_err().code, 422);
        assert_eq!(validate_expiration(-1).unwrap_err().code, 422);
    }

    #[test]
    fn timestamps_are_kubernetes_times() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_800_000_000), "2027-01-15T08:00:00Z");
    }
}
