//! `authorization.k8s.io/v1` SelfSubjectAccessReview ("may I do this?") and
//! SelfSubjectRulesReview ("what may I do here?"), which `kubectl auth can-i` and
//! `kubectl auth can-i --list` create, and `authentication.k8s.io/v1` SelfSubjectReview ("who
//! am I?", `kubectl auth whoami`). Nothing is stored: the answer is the created object.

use serde_json::{Value, json};

use super::attributes::{Attributes, ResourceAttributes};
use super::rbac::Decision;
use super::{Auth, Authorization, UserInfo};
use crate::api::ApiState;
use crate::error::ApiError;

pub const GROUP: &str = "authorization.k8s.io";
pub const ACCESS_REVIEWS: &str = "selfsubjectaccessreviews";
pub const RULES_REVIEWS: &str = "selfsubjectrulesreviews";
pub const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
pub const SUBJECT_REVIEWS: &str = "selfsubjectreviews";

/// The answer to a SelfSubjectReview `body` from `user`: who the server takes it for.
pub fn who_am_i(user: &UserInfo, body: Value) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the review is not a JSON object"));
    }
    let mut user_info = json!({"username": user.name});
    if !user.uid.is_empty() {
        user_info["uid"] = json!(user.uid);
    }
    user_info["groups"] = json!(user.groups);
    if !user.extra.is_empty() {
        user_info["extra"] = json!(user.extra);
    }
    let metadata = body.get("metadata").filter(|m| m.is_object());
    Ok(json!({
        "kind": "SelfSubjectReview",
        "apiVersion": format!("{AUTHENTICATION_GROUP}/v1"),
        "metadata": metadata.cloned().unwrap_or_else(|| json!({})),
        "status": {"userInfo": user_info},
    }))
}

fn string(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}

/// The answer to a review `body` of `plural` from `user`.
pub fn answer(
    auth: &Auth,
    api: &ApiState,
    user: &UserInfo,
    plural: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the review is not a JSON object"));
    }
    let kind = match plural {
        ACCESS_REVIEWS => {
            let status = access(auth, api, user, &body["spec"])?;
            body["status"] = status;
            "SelfSubjectAccessReview"
        }
        RULES_REVIEWS => {
            let namespace = string(&body["spec"], "namespace");
            if namespace.is_empty() {
                return Err(ApiError::bad_request("no namespace on request"));
            }
            // The answer is the status alone, as kube-apiserver's.
            body = json!({"spec": {}, "status": rules(auth, api, user, &namespace)?});
            "SelfSubjectRulesReview"
        }
        _ => return Err(ApiError::unknown_resource()),
    };
    body["apiVersion"] = json!(format!("{GROUP}/v1"));
    body["kind"] = json!(kind);
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    Ok(body)
}

fn access(auth: &Auth, api: &ApiState, user: &UserInfo, spec: &Value) -> Result<Value, ApiError> {
    let request = match (&spec["resourceAttributes"], &spec["nonResourceAttributes"]) {
        (r, Value::Null) if r.is_object() => Attributes::Resource(ResourceAttributes {
            verb: string(r, "verb"),
            group: string(r, "group"),
            version: string(r, "version"),
            resource: string(r, "resource"),
            subresource: string(r, "subresource"),
            namespace: string(r, "namespace"),
            name: string(r, "name"),
        }),
        (Value::Null, n) if n.is_object() => Attributes::NonResource {
            verb: string(n, "verb"),
            path: string(n, "path"),
        },
        _ => {
            return Err(ApiError::new(
                422,
                "Invalid",
                "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    Ok(match auth.authorize(api, user, &request) {
        Decision::Allow(reason) if reason.is_empty() => json!({"allowed": true}),
        Decision::Allow(reason) => json!({"allowed": true, "reason": reason}),
        Decision::Deny(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::Deny(reason) => json!({"allowed": false, "reason": reason}),
    })
}

fn rules(auth: &Auth, api: &ApiState, user: &UserInfo, namespace: &str) -> Result<Value, ApiError> {
    let everything = || {
        json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        })
    };
    if auth.mode == Authorization::AlwaysAllow {
        return Ok(everything());
    }
    let (granted, incomplete) = auth.rules_for(api, user, namespace)?;
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule in granted {
        if let Some(urls) = rule.non_resource_urls.filter(|u| !u.is_empty()) {
            non_resource_rules.push(json!({"verbs": rule.verbs, "nonResourceURLs": urls}));
        }
        if let Some(resources) = rule.resources.filter(|r| !r.is_empty()) {
            let mut r = json!({"verbs": rule.verbs, "apiGroups": rule.api_groups.unwrap_or_default(), "resources": resources});
            if let Some(names) = rule.resource_names.filter(|n| !n.is_empty()) {
                r["resourceNames"] = json!(names);
            }
            resource_rules.push(r);
        }
    }
    Ok(json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": incomplete,
    }))
}
