//! HTTP: parses Kubernetes API paths and query parameters, calls the verbs in `api/`, and
//! renders objects, lists, Tables, watch streams and Status errors.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::{
    ApiState, DeleteOptions, FieldValidation, ListQuery, Part, PropagationPolicy, ScaleChange,
    WriteOptions,
};
use crate::auth::{Auth, Authorization, Requester, UserInfo, reviews, token_request};
use crate::error::ApiError;
use crate::http::media::{self, BODY_MEDIA_TYPES, JSON_OR_YAML, PROTOBUF};
use crate::http::watch::{self, WatchParams};
use crate::patch::bodies::{self, PatchType};
use crate::schema::table::{self, IncludeObject};
use crate::schema::{discovery, field_labels, openapi};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::registry::{self, ResourceDef};
use crate::work;

/// Shared by every request.
pub struct ServerState {
    pub api: Arc<ApiState>,
    pub auth: Arc<Auth>,
    pub bookmark_interval: Duration,
}

pub fn json_response(code: StatusCode, body: &impl serde::Serialize) -> Response {
    // kube-apiserver's JSON encoder ends every answer with a newline.
    let mut text = serde_json::to_string(body).expect("JSON values encode");
    text.push('\n');
    json_text_response(code, text)
}

/// An answer of JSON already written out.
fn json_text_response(code: StatusCode, text: String) -> Response {
    let mut resp = Response::new(Body::from(text));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Every failed request is answered with its `Status` object, the guard's refusals included.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_text_response(code, self.status_body())
    }
}

fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        // Warning header format from RFC 7234: code, agent, quoted text.
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Query parameters, first value wins.
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    fn all(&self, key: &str) -> Vec<&str> {
        let values = self.0.iter().filter(|(k, _)| k == key);
        values.map(|(_, v)| v.as_str()).collect()
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// The resource path a request addresses.
struct Target {
    def: Arc<ResourceDef>,
    namespace: Option<String>,
    name: Option<String>,
    part: Part,
    /// `…/scale` of a custom resource whose CRD declares it.
    scale: bool,
}

/// Entry point for every request.
pub async fn dispatch(
    State(state): State<Arc<ServerState>>,
    Extension(Requester(user)): Extension<Requester>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_REQUEST_BODY}"),
            )
            .into_response();
        }
        Err(rejection) => return ApiError::bad_request(rejection.body_text()).into_response(),
    };
    // Decoding, merging and storing megabytes takes long enough to keep an async worker from
    // every other request: a large body's request is served from start to end off the workers.
    let large = body.len() >= work::LARGE_BODY;
    let answer = route(&state, &user, &method, &uri, &headers, body);
    let answer = if large {
        work::hand_over_worker(answer).await
    } else {
        answer.await
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// The largest request body, as kube-apiserver's (3 MiB): larger ones are refused with 413
/// before any of it is decoded.
pub const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;

async fn route(
    state: &ServerState,
    user: &Arc<UserInfo>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map(|q| q.0)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?,
    );
    let path = uri.path().trim_end_matches('/');
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let registry = &state.api.registry;
    let get_only = |v: Value| {
        if method == Method::GET {
            Ok(json_response(StatusCode::OK, &v))
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    match segs.as_slice() {
        ["version"] => get_only(discovery::version()),
        ["healthz" | "livez" | "readyz", ..] => Ok((StatusCode::OK, "ok").into_response()),
        ["api"] => get_only(discovery::api_versions(host)),
        ["apis"] => get_only(discovery::group_list(registry)),
        ["api", "v1"] => get_only(discovery::resource_list(registry, "", "v1")?),
        ["apis", group] => get_only(discovery::group(registry, group)?),
        ["apis", group, version] => get_only(discovery::resource_list(registry, group, version)?),
        ["openapi", "v2"] if method == Method::GET && openapi::wants_v2_protobuf(headers) => {
            let mut resp = Response::new(Body::from(openapi::v2_protobuf(registry)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                // As kube-openapi answers it: Go's mime parser refuses the `@` of the
                // protobuf type, so clients read the type they asked for from their Accept.
                HeaderValue::from_static("application/octet-stream"),
            );
            Ok(resp)
        }
        ["openapi", "v2"] => get_only(openapi::v2(registry)),
        ["openapi", "v3"] => get_only(openapi::v3_root(registry)),
        ["openapi", "v3", "api", "v1"] => get_only(openapi::v3_group_version(registry, "", "v1")?),
        ["openapi", "v3", "apis", group, version] => {
            get_only(openapi::v3_group_version(registry, group, version)?)
        }
        [
            "apis",
            reviews::GROUP,
            "v1",
            plural @ (reviews::ACCESS_REVIEWS | reviews::RULES_REVIEWS),
        ] => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let review = parse_body(headers, &body, BODY_MEDIA_TYPES)?;
            let answer = reviews::answer(&state.auth, &state.api, user, plural, review)?;
            Ok(json_response(StatusCode::CREATED, &answer))
        }
        [
            "apis",
            reviews::AUTHENTICATION_GROUP,
            "v1",
            reviews::SUBJECT_REVIEWS,
        ] => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let review = parse_body(headers, &body, BODY_MEDIA_TYPES)?;
            let answer = reviews::who_am_i(user, review)?;
            Ok(json_response(StatusCode::CREATED, &answer))
        }
        [
            "api",
            "v1",
            "namespaces",
            namespace,
            "serviceaccounts",
            name,
            "token",
        ] => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let request = parse_body(headers, &body, BODY_MEDIA_TYPES)?;
            let now = crate::auth::unix_now();
            let answer = token_request::create(
                &state.api,
                state.auth.tokens(),
                namespace,
                name,
                request,
                now,
            )?;
            Ok(json_response(StatusCode::CREATED, &answer))
        }
        ["api", "v1", rest @ ..] => {
            let by = requester(state, user);
            resource_request(state, "", "v1", rest, method, &params, headers, body, by).await
        }
        ["apis", group, version, rest @ ..] => {
            let by = requester(state, user);
            resource_request(
                state, group, version, rest, method, &params, headers, body, by,
            )
            .await
        }
        _ => Err(ApiError::unknown_resource()),
    }
}

fn resolve(
    state: &ServerState,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Target, ApiError> {
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(*s)),
        _ => return Err(ApiError::unknown_resource()),
    };
    let def = state
        .api
        .registry
        .lookup(group, version, resource)
        .ok_or_else(ApiError::unknown_resource)?;
    if namespace.is_some() && !def.namespaced {
        return Err(ApiError::unknown_resource());
    }
    if def.namespaced && name.is_some() && namespace.is_none() {
        return Err(ApiError::unknown_resource());
    }
    let (part, scale) = match sub {
        None => (Part::Main, false),
        Some("status") if def.has_status => (Part::Status, false),
        Some("finalize") if def.flavor == registry::Flavor::Namespace => (Part::Finalize, false),
        Some("scale") if def.scale.is_some() => (Part::Main, true),
        Some(_) => return Err(ApiError::unknown_resource()),
    };
    Ok(Target {
        def,
        namespace,
        name,
        part,
        scale,
    })
}

/// Decodes a create, update or delete body. `accepted` are the media types allowed for it.
fn parse_body(headers: &HeaderMap, body: &Bytes, accepted: &[&str]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .unwrap_or_default();
    // As in kube-apiserver: parameters (charset) do not matter, and no Content-Type means JSON.
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let media = if media.is_empty() {
        "application/json"
    } else {
        media.as_str()
    };
    if !accepted.contains(&media) {
        return Err(ApiError::unsupported_media_type(&content_type, accepted));
    }
    if media == PROTOBUF {
        return crate::http::protobuf::decode(body, &content_type);
    }
    decode_json_or_yaml(media, body)
}

/// The media types an object's create and update bodies may have.
fn object_media_types(def: &ResourceDef) -> &'static [&'static str] {
    if def.flavor == registry::Flavor::CustomResource {
        JSON_OR_YAML
    } else {
        BODY_MEDIA_TYPES
    }
}

fn decode_json_or_yaml(media: &str, body: &Bytes) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(json_err) if media.contains("yaml") => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("body is not UTF-8"))?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| {
                ApiError::bad_request(format!(
                    "error decoding YAML: {e} (and as JSON: {json_err})"
                ))
            })
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))),
    }
}

/// The longest field manager kube-apiserver accepts.
const FIELD_MANAGER_MAX_BYTES: usize = 128;

/// A 422 about the options of a request, as kube-apiserver words it (`options` is
/// `CreateOptions`, `UpdateOptions`, `PatchOptions` or `DeleteOptions`).
fn invalid_options(options: &str, problem: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("{options}.meta.k8s.io \"\" is invalid: {problem}"),
    )
}

/// `dryRun`: only `All` is a dry run; any other value is refused (kube-apiserver's
/// `ValidateDryRun`), never taken for a real write.
fn dry_run(options: &str, values: &[&str]) -> Result<bool, ApiError> {
    if values.iter().all(|v| *v == "All") {
        return Ok(!values.is_empty());
    }
    let given = serde_json::to_string(values).unwrap_or_default();
    Err(invalid_options(
        options,
        &format!("dryRun: Unsupported value: {given}: supported values: \"All\""),
    ))
}

/// Who admission webhooks are told a request is from: its user with RBAC on; with
/// everything allowed, nobody in particular (`system:anonymous`), as before.
fn requester(state: &ServerState, user: &Arc<UserInfo>) -> Option<Arc<UserInfo>> {
    (state.auth.mode == Authorization::Rbac).then(|| user.clone())
}

fn write_options(
    options: &str,
    params: &Params,
    headers: &HeaderMap,
    user: &Option<Arc<UserInfo>>,
) -> Result<WriteOptions, ApiError> {
    // kube-apiserver's default manager: the User-Agent up to its first '/'.
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let default_manager = agent.split('/').next().unwrap_or("unknown").to_string();
    let field_manager = params
        .get("fieldManager")
        .map(String::from)
        .unwrap_or(default_manager);
    if field_manager.len() > FIELD_MANAGER_MAX_BYTES {
        return Err(invalid_options(
            options,
            &format!(
                "fieldManager: Too long: may not be more than {FIELD_MANAGER_MAX_BYTES} bytes"
            ),
        ));
    }
    Ok(WriteOptions {
        dry_run: dry_run(options, &params.all("dryRun"))?,
        field_manager,
        field_validation: FieldValidation::parse(params.get("fieldValidation").unwrap_or(""))?,
        force: params.flag("force"),
        user: user.clone(),
    })
}

fn list_query(def: &ResourceDef, params: &Params) -> Result<ListQuery, ApiError> {
    Ok(ListQuery {
        labels: params
            .get("labelSelector")
            .filter(|s| !s.is_empty())
            .map(LabelSelector::parse)
            .transpose()?,
        fields: params
            .get("fieldSelector")
            .filter(|s| !s.is_empty())
            .map(|s| FieldSelector::parse(s).and_then(|f| field_labels::convert(def, f)))
            .transpose()?,
        limit: params
            .get("limit")
            .map(|l| {
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))
            })
            .transpose()?,
        continue_token: params.get("continue").map(String::from),
    })
}

fn delete_options(
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
    user: &Option<Arc<UserInfo>>,
) -> Result<DeleteOptions, ApiError> {
    let from_body = if body.is_empty() {
        json!({})
    } else {
        parse_body(headers, body, BODY_MEDIA_TYPES)?
    };
    let policy = params
        .get("propagationPolicy")
        .map(String::from)
        .or_else(|| from_body["propagationPolicy"].as_str().map(String::from));
    let orphan_dependents = params
        .get("orphanDependents")
        .map(|v| v == "true")
        .or_else(|| from_body["orphanDependents"].as_bool());
    let propagation = match (policy.as_deref(), orphan_dependents) {
        (Some("Orphan"), _) | (None, Some(true)) => Some(PropagationPolicy::Orphan),
        (Some("Foreground"), _) => Some(PropagationPolicy::Foreground),
        (Some("Background"), _) | (None, _) => Some(PropagationPolicy::Background),
        (Some(other), _) => {
            return Err(invalid_options(
                "DeleteOptions",
                &format!(
                    "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                ),
            ));
        }
    };
    let mut dry_run_values = params.all("dryRun");
    let in_body = from_body["dryRun"].as_array().into_iter().flatten();
    dry_run_values.extend(in_body.map(|v| v.as_str().unwrap_or_default()));
    let dry_run = dry_run("DeleteOptions", &dry_run_values)?;
    Ok(DeleteOptions {
        propagation,
        precondition_uid: from_body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        precondition_rv: from_body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok()),
        dry_run,
        legacy_cascade: orphan_dependents == Some(false),
        user: user.clone(),
    })
}

/// A watch: its parameters from the query, then the stream of events.
fn watch_request(
    state: &ServerState,
    t: &Target,
    params: &Params,
    headers: &HeaderMap,
    include: IncludeObject,
) -> Result<Response, ApiError> {
    let api = &state.api;
    let def = &t.def;
    let q = list_query(def, params)?;
    let send_initial_events = params.get("sendInitialEvents").map(|v| v == "true");
    watch::check_options(
        send_initial_events,
        params.get("resourceVersionMatch"),
        q.continue_token.is_some(),
    )?;
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1800);
    let wp = WatchParams {
        namespace: t.namespace.clone(),
        resource_version: params.get("resourceVersion").map(String::from),
        send_initial_events,
        allow_bookmarks: params.flag("allowWatchBookmarks"),
        timeout: Duration::from_secs(timeout),
        labels: q.labels,
        fields: q.fields,
        representation: representation(headers, media::Answer::Watch)?,
        include,
        bookmark_interval: state.bookmark_interval,
    };
    let stream = watch::start(api.clone(), def.clone(), wp);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

/// A PATCH of one object: the patch type its content type names, the options apply needs.
#[allow(clippy::too_many_arguments)]
async fn patch_request(
    state: &ServerState,
    t: &Target,
    name: &str,
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
    user: &Option<Arc<UserInfo>>,
    include: IncludeObject,
) -> Result<Response, ApiError> {
    let api = &state.api;
    let def = &t.def;
    let ns = t.namespace.as_deref().unwrap_or("");
    let content_type = bodies::content_type(headers);
    let custom_resource = def.flavor == registry::Flavor::CustomResource;
    // As in kube-apiserver: custom resources have no patch strategies to merge with.
    let patch_type = PatchType::from_content_type(content_type)
        .filter(|t| !(custom_resource && *t == PatchType::Strategic))
        .ok_or_else(|| {
            ApiError::unsupported_media_type(content_type, PatchType::media_types(custom_resource))
        })?;
    let patch = decode_json_or_yaml(patch_type.media_type(), body)?;
    let opts = write_options("PatchOptions", params, headers, user)?;
    let representation = representation(headers, media::Answer::Object)?;
    if patch_type == PatchType::Apply && params.get("fieldManager").is_none_or(str::is_empty) {
        return Err(invalid_options(
            "PatchOptions",
            "fieldManager: Required value: is required for apply patch",
        ));
    }
    if patch_type != PatchType::Apply && params.get("force").is_some() {
        return Err(invalid_options(
            "PatchOptions",
            "force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    let w = api
        .patch(def, ns, name, patch_type, patch, t.part, &opts)
        .await?;
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let answer = object_answer(def, &w.object, representation, include);
    Ok(with_warnings(json_response(code, &answer), &w.warnings))
}

/// `GET`, `PUT` or `PATCH` of a custom resource's `…/scale`.
async fn scale_request(
    state: &ServerState,
    t: &Target,
    method: &Method,
    params: &Params,
    headers: &HeaderMap,
    body: Bytes,
    user: &Option<Arc<UserInfo>>,
) -> Result<Response, ApiError> {
    let (api, def) = (&state.api, &t.def);
    let ns = t.namespace.as_deref().unwrap_or("");
    let Some(name) = t.name.as_deref() else {
        return Err(ApiError::unknown_resource());
    };
    let change = match *method {
        Method::GET => {
            return Ok(json_response(
                StatusCode::OK,
                &api.get_scale(def, ns, name)?,
            ));
        }
        Method::PUT => ScaleChange::Replace(parse_body(headers, &body, BODY_MEDIA_TYPES)?),
        Method::PATCH => {
            let content_type = bodies::content_type(headers);
            // JSON, merge and strategic patches of the Scale (no apply here).
            let patch_type = PatchType::from_content_type(content_type)
                .filter(|t| *t != PatchType::Apply)
                .ok_or_else(|| {
                    ApiError::unsupported_media_type(content_type, PatchType::media_types(true))
                })?;
            ScaleChange::Patch(
                patch_type,
                decode_json_or_yaml(patch_type.media_type(), &body)?,
            )
        }
        _ => return Err(ApiError::method_not_allowed()),
    };
    let options = if *method == Method::PUT {
        "UpdateOptions"
    } else {
        "PatchOptions"
    };
    let opts = write_options(options, params, headers, user)?;
    let scale = api.update_scale(def, ns, name, change, &opts).await?;
    Ok(json_response(StatusCode::OK, &scale))
}

/// `obj` in the representation the request asked for. kube-apiserver answers writes in it
/// too, not only reads: a writer that asks for metadata alone reads no more than that.
fn object_answer<'a>(
    def: &ResourceDef,
    obj: &'a Value,
    representation: media::Representation,
    include: IncludeObject,
) -> ObjectAnswer<'a> {
    match representation {
        media::Representation::Object => ObjectAnswer::Object(obj),
        media::Representation::Table => {
            let version = obj.pointer("/metadata/resourceVersion").cloned();
            let meta = json!({ "resourceVersion": version.unwrap_or(json!("")) });
            ObjectAnswer::Table(table::table(def, std::slice::from_ref(obj), meta, include))
        }
        media::Representation::Metadata { version } => {
            ObjectAnswer::Metadata(media::PartialObject::of(obj, version))
        }
    }
}

/// One object's answer, encoded from what it borrows.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum ObjectAnswer<'a> {
    Object(&'a Value),
    Table(Value),
    Metadata(media::PartialObject<'a>),
}

/// The representation the `Accept` header asks for (406 when none can be served).
fn representation(
    headers: &HeaderMap,
    answer: media::Answer,
) -> Result<media::Representation, ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    media::negotiate(accept, answer)
}

#[allow(clippy::too_many_arguments)]
async fn resource_request(
    state: &ServerState,
    group: &str,
    version: &str,
    rest: &[&str],
    method: &Method,
    params: &Params,
    headers: &HeaderMap,
    body: Bytes,
    user: Option<Arc<UserInfo>>,
) -> Result<Response, ApiError> {
    let t = resolve(state, group, version, rest)?;
    if t.def.flavor == registry::Flavor::Review {
        // Only created, at their collection's path (`route`).
        return Err(ApiError::method_not_allowed());
    }
    if t.scale {
        return scale_request(state, &t, method, params, headers, body, &user).await;
    }
    let api = &state.api;
    let def = &t.def;
    let ns = t.namespace.as_deref().unwrap_or("");
    let include = IncludeObject::parse(params.get("includeObject"));
    match (method.clone(), t.name.as_deref()) {
        (Method::GET, None) if params.flag("watch") => {
            watch_request(state, &t, params, headers, include)
        }
        (Method::GET, None) => {
            let representation = representation(headers, media::Answer::List)?;
            let list = api.list(def, t.namespace.as_deref(), &list_query(def, params)?)?;
            let answer = match representation {
                media::Representation::Object => list,
                media::Representation::Table => {
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    table::table(def, &items, list["metadata"].clone(), include)
                }
                media::Representation::Metadata { version } => media::partial_list(&list, version),
            };
            Ok(json_response(StatusCode::OK, &answer))
        }
        (Method::GET, Some(name)) => {
            let representation = representation(headers, media::Answer::Object)?;
            let obj = api.get(def, ns, name)?;
            let answer = object_answer(def, &obj, representation, include);
            Ok(json_response(StatusCode::OK, &answer))
        }
        (Method::POST, None) if t.part == Part::Main => {
            if def.namespaced && t.namespace.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let representation = representation(headers, media::Answer::Object)?;
            let w = api
                .create(
                    def,
                    ns,
                    parse_body(headers, &body, object_media_types(def))?,
                    &write_options("CreateOptions", params, headers, &user)?,
                )
                .await?;
            let answer = object_answer(def, &w.object, representation, include);
            Ok(with_warnings(
                json_response(StatusCode::CREATED, &answer),
                &w.warnings,
            ))
        }
        (Method::PUT, Some(name)) => {
            let representation = representation(headers, media::Answer::Object)?;
            let w = api
                .update(
                    def,
                    ns,
                    name,
                    parse_body(headers, &body, object_media_types(def))?,
                    t.part,
                    &write_options("UpdateOptions", params, headers, &user)?,
                )
                .await?;
            let answer = object_answer(def, &w.object, representation, include);
            Ok(with_warnings(
                json_response(StatusCode::OK, &answer),
                &w.warnings,
            ))
        }
        (Method::PATCH, Some(name)) => {
            patch_request(state, &t, name, params, headers, &body, &user, include).await
        }
        (Method::DELETE, Some(name)) if t.part == Part::Main => {
            let representation = representation(headers, media::Answer::Object)?;
            let opts = delete_options(params, headers, &body, &user)?;
            let (obj, gone) = api.delete(def, ns, name, &opts).await?;
            // kube-apiserver answers 200 with the object whether or not it is gone yet (202
            // only for the deprecated `orphanDependents=false`).
            let code = if !gone && opts.legacy_cascade {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            Ok(json_response(
                code,
                &object_answer(def, &obj, representation, include),
            ))
        }
        (Method::DELETE, None) if t.part == Part::Main => {
            let list = api
                .delete_collection(
                    def,
                    t.namespace.as_deref(),
                    &list_query(def, params)?,
                    &delete_options(params, headers, &body, &user)?,
                )
                .await?;
            Ok(json_response(StatusCode::OK, &list))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}
