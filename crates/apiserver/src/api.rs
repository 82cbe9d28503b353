//! The API's verbs on stored objects, independent of HTTP: handlers call these after parsing a
//! request, the garbage collector and namespace controller call them too.
//!
//! A write goes: decode checks → storage form (Events) → kind-specific preparation (Secrets'
//! stringData, Namespace phase, CRD status) → pruning and defaulting (custom resources) →
//! mutating admission → metadata (uid, generation, managedFields) → validation → validating
//! admission → compare-and-swap in storage.

use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use crate::admission::{Admission, Operation, Request as AdmissionRequest};
use crate::apply::{self, Writer};
use crate::error::{ApiError, FieldError, FieldErrorKind};
use crate::meta::{
    self, finalizers_of, is_deleting, metadata_mut, name_of, resource_version_of, uid_of,
};
use crate::patch::{self, PatchType};
use crate::registry::{Flavor, Registry, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::storage::{ObjectKey, Store, WriteError};
use crate::{crd, events, schema};

/// What `fieldValidation` asks of unknown and duplicate fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}: supported values are \"Ignore\", \"Warn\", \"Strict\""
            ))),
        }
    }
}

/// Per-request options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: String,
    pub field_validation: FieldValidation,
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PropagationPolicy {
    Orphan,
    #[default]
    Background,
    Foreground,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Option<PropagationPolicy>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<u64>,
    pub dry_run: bool,
}

/// Which part of an object a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    /// namespaces/{name}/finalize: only spec.finalizers.
    Finalize,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    pub object: Value,
    pub warnings: Vec<String>,
    pub created: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// Everything the verbs need: storage, the served resources and admission.
pub struct ApiState {
    pub store: Store,
    pub registry: Registry,
    pub admission: Admission,
}

const CRD_STORAGE_KEY: &str = "apiextensions.k8s.io/customresourcedefinitions";
const NAMESPACE_STORAGE_KEY: &str = "/namespaces";

/// Top-level fields of built-in kinds; anything else is unknown (dropped, like Go's decoder does).
fn known_builtin_fields(def: &ResourceDef) -> Option<&'static [&'static str]> {
    Some(match (def.flavor, def.plural.as_str()) {
        (Flavor::Generic, "configmaps") => &["data", "binaryData", "immutable"],
        (Flavor::Secret, _) => &["data", "stringData", "type", "immutable"],
        (Flavor::Namespace, _) => &["spec", "status"],
        (Flavor::CoreEvent, _) => &[
            "involvedObject",
            "reason",
            "message",
            "source",
            "firstTimestamp",
            "lastTimestamp",
            "count",
            "type",
            "eventTime",
            "series",
            "action",
            "related",
            "reportingComponent",
            "reportingInstance",
        ],
        (Flavor::EventsV1Event, _) => &[
            "regarding",
            "note",
            "reason",
            "type",
            "action",
            "related",
            "eventTime",
            "series",
            "reportingController",
            "reportingInstance",
            "deprecatedSource",
            "deprecatedFirstTimestamp",
            "deprecatedLastTimestamp",
            "deprecatedCount",
        ],
        (Flavor::Generic, "leases") => &["spec"],
        (Flavor::Generic, "validatingwebhookconfigurations" | "mutatingwebhookconfigurations") => {
            &["webhooks"]
        }
        (Flavor::CustomResourceDefinition, _) | (Flavor::Generic, "apiservices") => {
            &["spec", "status"]
        }
        _ => return None,
    })
}

const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// What Go's `omitempty` leaves out: null, "", [] and {}.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

fn is_string_map(v: Option<&Value>) -> bool {
    v.is_none_or(|v| {
        v.is_null()
            || v.as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
    })
}

fn spec_like(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

impl ApiState {
    pub fn new(store: Store) -> Result<Self, ApiError> {
        let state = ApiState {
            store,
            registry: Registry::new(),
            admission: Admission::default(),
        };
        let (crds, _) = state.store.list(CRD_STORAGE_KEY, None, None)?;
        for crd in &crds {
            state.serve_crd(crd);
        }
        Ok(state)
    }

    /// Serves (or re-serves) the resources a stored CRD defines.
    fn serve_crd(&self, crd: &Value) {
        if let Some(name) = crd.pointer("/metadata/name").and_then(Value::as_str) {
            self.registry.apply_crd(name, crd::served_resources(crd));
        }
    }

    pub fn key(def: &ResourceDef, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            resource: def.storage_key.clone(),
            namespace: if def.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    fn write_error(def: &ResourceDef, name: &str, e: WriteError) -> ApiError {
        match e {
            WriteError::NotFound => ApiError::not_found(&def.group, &def.plural, name),
            WriteError::AlreadyExists => ApiError::already_exists(&def.group, &def.plural, name),
            WriteError::Conflict => ApiError::conflict(&def.group, &def.plural, name),
            WriteError::Store(s) => s.into(),
        }
    }

    pub fn get(&self, def: &ResourceDef, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let stored = self.get_stored(def, namespace, name)?;
        Ok(def.served(&stored))
    }

    fn get_stored(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.store
            .get(&Self::key(def, namespace, name))?
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }

    pub fn list(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        q: &ListQuery,
    ) -> Result<Value, ApiError> {
        let (after, token_rv) = match &q.continue_token {
            Some(t) if !t.is_empty() => {
                let (rv, ns, name) = decode_continue(t)?;
                (Some((ns, name)), Some(rv))
            }
            _ => (None, None),
        };
        let namespace = namespace.filter(|_| def.namespaced);
        // Without selectors, storage can stop after one more object than the page needs (enough
        // to know whether to hand out a continue token). With them, every object is looked at.
        let selective = q.labels.is_some() || q.fields.is_some();
        let fetch = q
            .limit
            .filter(|l| *l > 0 && !selective)
            .map(|l| l.saturating_add(1));
        let (items, rv) = self.store.list_page(
            &def.storage_key,
            namespace,
            after.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
            fetch,
        )?;
        let mut matching = items.into_iter().filter(|o| {
            q.labels.as_ref().is_none_or(|s| s.matches(o))
                && q.fields.as_ref().is_none_or(|s| s.matches(&def.served(o)))
        });
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let page: Vec<Value> = matching
            .by_ref()
            .take(limit)
            .map(|o| def.served(&o))
            .collect();
        let remaining = matching.count();
        // Later pages report the first page's resourceVersion: a watch started from it may replay
        // changes already seen (harmless), but can never miss one made while paging.
        let list_rv = token_rv.unwrap_or(rv);
        let mut metadata = json!({ "resourceVersion": list_rv.to_string() });
        if remaining > 0
            && let Some(last) = page.last()
        {
            metadata["continue"] = json!(encode_continue(
                list_rv,
                meta::namespace_of(last),
                name_of(last)
            ));
            if !selective && fetch.is_none() {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
        Ok(json!({
            "kind": def.list_kind(),
            "apiVersion": def.api_version(),
            "metadata": metadata,
            "items": page,
        }))
    }

    /// Checks shared by every write of a full object; returns it in storage form with unknown fields dropped.
    fn decode(
        &self,
        def: &ResourceDef,
        namespace: &str,
        url_name: Option<&str>,
        mut obj: Value,
        validation: FieldValidation,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let Some(map) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "the body of the request must be a {} object",
                def.kind
            )));
        };
        let expected = def.api_version();
        if let Some(v) = map.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != expected
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        if let Some(k) = map.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != def.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
        map.insert("apiVersion".into(), json!(expected));
        map.insert("kind".into(), json!(def.kind));
        // kube-apiserver's words for a body that does not decode into the kind's Go type.
        let undecodable = |why: &str| {
            ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
                kind = def.kind,
                version = def.version
            ))
        };
        let mut unknown = Vec::new();
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        for k in meta
            .keys()
            .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
            .cloned()
            .collect::<Vec<_>>()
        {
            meta.remove(&k);
            unknown.push(format!("metadata.{k}"));
        }
        // Go's omitempty: kube-apiserver never returns empty metadata fields, even when a
        // request sent them (protobuf bodies, as kubectl's generators send, always carry an
        // empty generateName). An empty managedFields list is kept: it asks for a reset.
        meta.retain(|k, v| k == "managedFields" || !is_empty(v));
        if !is_string_map(meta.get("labels")) || !is_string_map(meta.get("annotations")) {
            return Err(undecodable(
                "metadata labels and annotations must be maps of strings",
            ));
        }
        if let Some(managed) = meta.get_mut("managedFields") {
            apply::check_managed_fields(managed, &mut unknown).map_err(|e| undecodable(&e))?;
        }
        if meta.get("finalizers").is_some_and(|f| {
            !f.is_null() && !f.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }) {
            return Err(ApiError::bad_request(
                "metadata.finalizers must be a list of strings",
            ));
        }
        if let Some(url_name) = url_name {
            match meta.get("name").and_then(Value::as_str) {
                Some(n) if n != url_name => {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({url_name})"
                    )));
                }
                Some(_) => {}
                None => {
                    meta.insert("name".into(), json!(url_name));
                }
            }
        }
        if def.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != namespace => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    meta.insert("namespace".into(), json!(namespace));
                }
            }
        } else {
            meta.remove("namespace");
        }
        if let Some(fields) = known_builtin_fields(def) {
            for k in map
                .keys()
                .filter(|k| {
                    !fields.contains(&k.as_str())
                        && !["apiVersion", "kind", "metadata"].contains(&k.as_str())
                })
                .cloned()
                .collect::<Vec<_>>()
            {
                map.remove(&k);
                unknown.push(k);
            }
        }
        if matches!(def.plural.as_str(), "configmaps" | "secrets")
            && (!is_string_map(map.get("data"))
                || !is_string_map(map.get("binaryData"))
                || !is_string_map(map.get("stringData")))
        {
            return Err(undecodable("data values must be strings"));
        }
        if let Some(s) = def.schema.as_deref() {
            schema::prune(s, &mut obj, "", true, &mut unknown);
            schema::apply_defaults(s, &mut obj);
        }
        let obj = if def.flavor == Flavor::EventsV1Event {
            events::v1_to_core(&obj)
        } else {
            obj
        };
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            let described: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
            match validation {
                FieldValidation::Strict => {
                    return Err(undecodable(&format!(
                        "strict decoding error: {}",
                        described.join(", ")
                    )));
                }
                FieldValidation::Warn => warnings = described,
                FieldValidation::Ignore => {}
            }
        }
        Ok((obj, warnings))
    }

    /// Kind-specific rules and schema validation of the object about to be stored.
    fn validate(
        &self,
        def: &ResourceDef,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let creating = old.is_none();
        let name = name_of(obj);
        let mut errs: Vec<FieldError> = Vec::new();
        let name_problem = match def.flavor {
            Flavor::Namespace => meta::check_dns_label(name),
            Flavor::CustomResource => {
                (name.contains('/') || name.contains('%') || name == "." || name == "..")
                    .then(|| "may not contain '/' or '%' and may not be '.' or '..'".to_string())
            }
            _ => meta::check_dns_subdomain(name),
        };
        errs.extend(metadata_errors(obj));
        // Immutable ConfigMaps and Secrets keep their data (and stay immutable).
        if matches!(def.plural.as_str(), "configmaps" | "secrets")
            && let Some(old) = old
            && old.get("immutable") == Some(&Value::Bool(true))
        {
            for field in ["data", "binaryData", "immutable"] {
                if old.get(field) != obj.get(field) {
                    errs.push(FieldError::new(
                        field,
                        FieldErrorKind::Forbidden,
                        "field is immutable when `immutable` is set",
                    ));
                }
            }
        }
        // kube-apiserver's limit on the total size of annotations (keys and values).
        const ANNOTATIONS_LIMIT: usize = 256 * 1024;
        let annotations_size: usize = obj
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|a| {
                a.iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum()
            })
            .unwrap_or(0);
        if annotations_size > ANNOTATIONS_LIMIT {
            errs.push(FieldError::new(
                "metadata.annotations",
                FieldErrorKind::TooLong,
                format!("must have at most {ANNOTATIONS_LIMIT} bytes"),
            ));
        }
        if creating && let Some(p) = name_problem {
            errs.push(FieldError::new(
                "metadata.name",
                FieldErrorKind::Invalid,
                format!("{name:?}: {p}"),
            ));
        }
        if def.flavor == Flavor::CustomResourceDefinition {
            errs.extend(crd::validate(obj));
        }
        if let Some(s) = def.schema.as_deref() {
            let mut body = obj.clone();
            if let Some(m) = body.as_object_mut() {
                m.remove("metadata");
                m.remove("apiVersion");
                m.remove("kind");
            }
            schema::validate(s, &body, "", &mut errs);
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&def.group, &def.kind, name, &errs))
        }
    }

    /// Kind-specific defaults and conversions applied to every stored write.
    fn prepare_kind(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        match def.flavor {
            Flavor::Secret => {
                if let Some(Value::Object(string_data)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    let data = obj
                        .as_object_mut()
                        .expect("checked in decode")
                        .entry("data")
                        .or_insert_with(|| json!({}));
                    if !data.is_object() {
                        *data = json!({});
                    }
                    for (k, v) in string_data {
                        let encoded = base64::engine::general_purpose::STANDARD
                            .encode(v.as_str().unwrap_or(""));
                        data[k] = json!(encoded);
                    }
                }
                if let Some(data) = obj.get("data").and_then(Value::as_object) {
                    for (k, v) in data {
                        if base64::engine::general_purpose::STANDARD
                            .decode(v.as_str().unwrap_or(""))
                            .is_err()
                        {
                            return Err(ApiError::bad_request(format!(
                                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{k}"
                            )));
                        }
                    }
                }
                if obj.get("type").is_none_or(|t| t.is_null() || t == "") {
                    obj["type"] = json!("Opaque");
                }
            }
            Flavor::Namespace => {
                if obj.pointer("/spec/finalizers").is_none() && old.is_none() {
                    obj["spec"] = json!({ "finalizers": ["kubernetes"] });
                }
                let phase = if is_deleting(obj) {
                    "Terminating"
                } else {
                    "Active"
                };
                if obj.get("status").is_none_or(|s| !s.is_object()) {
                    obj["status"] = json!({});
                }
                obj["status"]["phase"] = json!(phase);
                let name = name_of(obj).to_string();
                let labels = metadata_mut(obj)
                    .entry("labels")
                    .or_insert_with(|| json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
            }
            Flavor::CustomResourceDefinition => {
                let name = name_of(obj).to_string();
                let group = obj
                    .pointer("/spec/group")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let plural = obj
                    .pointer("/spec/names/plural")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let accepted = !self.registry.plural_taken(&name, &group, &plural);
                crd::set_status(obj, accepted, &meta::now());
            }
            _ => {}
        }
        Ok(())
    }

    /// Sets server-owned metadata: on create from scratch, on update carried over from `old`.
    fn stamp_metadata(def: &ResourceDef, obj: &mut Value, old: Option<&Value>) {
        let spec_changed = old.is_some_and(|o| spec_like(o) != spec_like(obj));
        let m = metadata_mut(obj);
        m.remove("selfLink");
        match old
            .and_then(|o| o.get("metadata"))
            .and_then(Value::as_object)
        {
            None => {
                m.insert("uid".into(), json!(meta::new_uid()));
                m.insert("creationTimestamp".into(), json!(meta::now()));
                m.remove("deletionTimestamp");
                m.remove("deletionGracePeriodSeconds");
                m.remove("resourceVersion");
                if def.tracks_generation() {
                    m.insert("generation".into(), json!(1));
                } else {
                    m.remove("generation");
                }
            }
            Some(old_meta) => {
                for k in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "generateName",
                ] {
                    match old_meta.get(k) {
                        Some(v) => m.insert(k.into(), v.clone()),
                        None => m.remove(k),
                    };
                }
                if def.tracks_generation() && spec_changed {
                    let g = old_meta
                        .get("generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    m.insert("generation".into(), json!(g + 1));
                }
            }
        }
    }

    /// Fails unless `namespace` exists and is not terminating (for creating namespaced objects).
    fn check_namespace_open(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        if !def.namespaced {
            return Ok(());
        }
        let key = ObjectKey {
            resource: NAMESPACE_STORAGE_KEY.into(),
            namespace: String::new(),
            name: namespace.into(),
        };
        match self.store.get(&key)? {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if is_deleting(&ns) => Err(ApiError {
                details: Some(
                    json!({"name": name, "kind": def.plural, "group": def.group, "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {namespace} is being terminated"), "field": "metadata.namespace"}]}),
                ),
                ..ApiError::forbidden(format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                    crate::error::qualified(&def.group, &def.plural)
                ))
            }),
            Some(_) => Ok(()),
        }
    }

    pub async fn create(
        &self,
        def: &ResourceDef,
        namespace: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let (mut obj, warnings) = self.decode(def, namespace, None, body, opts.field_validation)?;
        let m = metadata_mut(&mut obj);
        let name = match (
            m.get("name").and_then(Value::as_str),
            m.get("generateName").and_then(Value::as_str),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) if !prefix.is_empty() => {
                let n = format!("{prefix}{}", meta::name_suffix());
                m.insert("name".into(), json!(n));
                n
            }
            _ => {
                return Err(ApiError::invalid(
                    &def.group,
                    &def.kind,
                    "",
                    &[FieldError::new(
                        "metadata.name",
                        FieldErrorKind::Required,
                        "name or generateName is required",
                    )],
                ));
            }
        };
        self.check_namespace_open(def, namespace, &name)?;
        if def.has_status
            && def.flavor == Flavor::CustomResource
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        metadata_mut(&mut obj).remove("managedFields");
        self.prepare_kind(def, &mut obj, None)?;
        let obj = self
            .admission
            .mutate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Create,
                    subresource: None,
                    object: &obj,
                    old: None,
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        let mut obj = obj;
        Self::stamp_metadata(def, &mut obj, None);
        let writer = Writer {
            manager: &opts.field_manager,
            api_version: &def.api_version(),
            subresource: None,
            now: &meta::now(),
            schema: def.schema.as_deref(),
        };
        apply::record_update(None, &mut obj, &writer);
        self.validate(def, &obj, None)?;
        self.admission
            .validate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Create,
                    subresource: None,
                    object: &obj,
                    old: None,
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        self.commit_create(def, obj, opts.dry_run, warnings)
    }

    fn commit_create(
        &self,
        def: &ResourceDef,
        obj: Value,
        dry_run: bool,
        warnings: Vec<String>,
    ) -> Result<Written, ApiError> {
        let name = name_of(&obj).to_string();
        let key = Self::key(def, meta::namespace_of(&obj), &name);
        if dry_run {
            if self.store.get(&key)?.is_some() {
                return Err(ApiError::already_exists(&def.group, &def.plural, &name));
            }
            return Ok(Written {
                object: def.served(&obj),
                warnings,
                created: true,
            });
        }
        let stored = self
            .store
            .create(&key, obj)
            .map_err(|e| Self::write_error(def, &name, e))?;
        self.after_write(def, &stored);
        Ok(Written {
            object: def.served(&stored),
            warnings,
            created: true,
        })
    }

    pub async fn update(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        body: Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let (new, warnings) =
            self.decode(def, namespace, Some(name), body, opts.field_validation)?;
        let expected_rv = resource_version_of(&new);
        let old = self.get_stored(def, namespace, name)?;
        let mut w = self
            .write_over(def, &old, new, part, expected_rv, opts, None)
            .await?;
        w.warnings.extend(warnings);
        Ok(w)
    }

    /// Replaces `old` with `new` (already decoded). `expected_rv` is the client's precondition.
    #[allow(clippy::too_many_arguments)]
    async fn write_over(
        &self,
        def: &ResourceDef,
        old: &Value,
        new: Value,
        part: Part,
        expected_rv: Option<u64>,
        opts: &WriteOptions,
        applied: Option<Value>,
    ) -> Result<Written, ApiError> {
        let name = name_of(old).to_string();
        if let Some(rv) = expected_rv
            && Some(rv) != resource_version_of(old)
        {
            return Err(ApiError::conflict(&def.group, &def.plural, &name));
        }
        let mut obj = match part {
            Part::Main => {
                let mut o = new;
                if def.has_status {
                    match old.get("status") {
                        Some(s) => o["status"] = s.clone(),
                        None => {
                            if let Some(m) = o.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                o
            }
            Part::Status => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(s) => o["status"] = s.clone(),
                    None => {
                        if let Some(m) = o.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                if let Some(mf) = new.pointer("/metadata/managedFields") {
                    metadata_mut(&mut o).insert("managedFields".into(), mf.clone());
                }
                o
            }
            Part::Finalize => {
                let mut o = old.clone();
                o["spec"]["finalizers"] = new
                    .pointer("/spec/finalizers")
                    .cloned()
                    .unwrap_or(json!([]));
                o
            }
        };
        self.prepare_kind(def, &mut obj, Some(old))?;
        let subresource = match part {
            Part::Main => None,
            Part::Status => Some("status"),
            Part::Finalize => Some("finalize"),
        };
        let mut obj = self
            .admission
            .mutate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Update,
                    subresource,
                    object: &obj,
                    old: Some(old),
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        Self::stamp_metadata(def, &mut obj, Some(old));
        let api_version = def.api_version();
        let now = meta::now();
        let writer = Writer {
            manager: &opts.field_manager,
            api_version: &api_version,
            subresource: (part == Part::Status).then_some("status"),
            now: &now,
            schema: def.schema.as_deref(),
        };
        match applied {
            // Server-side apply computed managedFields already.
            Some(_) => {}
            None => apply::record_update(Some(old), &mut obj, &writer),
        }
        self.validate(def, &obj, Some(old))?;
        self.admission
            .validate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Update,
                    subresource,
                    object: &obj,
                    old: Some(old),
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        let key = Self::key(def, meta::namespace_of(old), &name);
        if opts.dry_run {
            return Ok(Written {
                object: def.served(&obj),
                warnings: vec![],
                created: false,
            });
        }
        // The last finalizer of a deleting object is gone: the object goes away now.
        let spec_finalizers_left = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
            && def.flavor == Flavor::Namespace;
        if is_deleting(&obj) && finalizers_of(&obj).is_empty() && !spec_finalizers_left {
            let gone = self
                .store
                .delete(&key, resource_version_of(old))
                .map_err(|e| Self::write_error(def, &name, e))?;
            self.after_delete(def, &gone)?;
            return Ok(Written {
                object: def.served(&gone),
                warnings: vec![],
                created: false,
            });
        }
        let stored = self
            .store
            .update(&key, resource_version_of(old), obj)
            .map_err(|e| Self::write_error(def, &name, e))?;
        self.after_write(def, &stored);
        Ok(Written {
            object: def.served(&stored),
            warnings: vec![],
            created: false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        body: &Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        // Retry on a conflict this server caused itself (a concurrent write between our read and
        // write); a resourceVersion precondition inside the patch is the client's and is honoured.
        for _ in 0..10 {
            let old = match self.store.get(&Self::key(def, namespace, name))? {
                Some(o) => o,
                None if patch_type == PatchType::Apply && part == Part::Main => {
                    return self.apply_create(def, namespace, name, body, opts).await;
                }
                None => return Err(ApiError::not_found(&def.group, &def.plural, name)),
            };
            let served_old = def.served(&old);
            let (patched, applied) = if patch_type == PatchType::Apply {
                // The configuration as decoded (unknown fields pruned), in the served form.
                let (cfg, _) = self.decode(
                    def,
                    namespace,
                    Some(name),
                    body.clone(),
                    opts.field_validation,
                )?;
                let mut cfg = def.served(&cfg);
                let api_version = def.api_version();
                let now = meta::now();
                let writer = Writer {
                    manager: &opts.field_manager,
                    api_version: &api_version,
                    subresource: (part == Part::Status).then_some("status"),
                    now: &now,
                    schema: def.schema.as_deref(),
                };
                if let Some(m) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("namespace");
                }
                let merged = apply::apply(
                    Some(&served_old),
                    &cfg,
                    &writer,
                    opts.force,
                    &def.group,
                    &def.plural,
                )?;
                (merged, Some(cfg))
            } else {
                (patch::apply_patch(patch_type, &served_old, body)?, None)
            };
            let (new, warnings) =
                self.decode(def, namespace, Some(name), patched, opts.field_validation)?;
            let precondition =
                resource_version_of(&new).filter(|rv| Some(*rv) != resource_version_of(&old));
            match self
                .write_over(
                    def,
                    &old,
                    new,
                    part,
                    precondition.or(resource_version_of(&old)),
                    opts,
                    applied,
                )
                .await
            {
                Err(e)
                    if e.code == 409
                        && e.reason == "Conflict"
                        && precondition.is_none()
                        && !e.message.starts_with("Apply failed") =>
                {
                    continue;
                }
                Err(e) => return Err(e),
                Ok(mut w) => {
                    w.warnings.extend(warnings);
                    return Ok(w);
                }
            }
        }
        Err(ApiError::conflict(&def.group, &def.plural, name))
    }

    async fn apply_create(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        body: &Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let (cfg, warnings) = self.decode(
            def,
            namespace,
            Some(name),
            body.clone(),
            opts.field_validation,
        )?;
        self.check_namespace_open(def, namespace, name)?;
        let api_version = def.api_version();
        let now = meta::now();
        let writer = Writer {
            manager: &opts.field_manager,
            api_version: &api_version,
            subresource: None,
            now: &now,
            schema: def.schema.as_deref(),
        };
        let mut obj = apply::apply(None, &cfg, &writer, opts.force, &def.group, &def.plural)?;
        let mf = obj.pointer("/metadata/managedFields").cloned();
        if def.has_status
            && def.flavor == Flavor::CustomResource
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        self.prepare_kind(def, &mut obj, None)?;
        let mut obj = self
            .admission
            .mutate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Create,
                    subresource: None,
                    object: &obj,
                    old: None,
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        Self::stamp_metadata(def, &mut obj, None);
        if let Some(mf) = mf {
            metadata_mut(&mut obj).insert("managedFields".into(), mf);
        }
        self.validate(def, &obj, None)?;
        self.admission
            .validate(
                &self.store,
                &AdmissionRequest {
                    def,
                    operation: Operation::Create,
                    subresource: None,
                    object: &obj,
                    old: None,
                    dry_run: opts.dry_run,
                },
            )
            .await?;
        self.commit_create(def, obj, opts.dry_run, warnings)
    }

    /// Deletes an object, or marks it for deletion when finalizers (or the propagation policy)
    /// require it. Returns the object and whether it is gone.
    pub async fn delete(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Value, bool), ApiError> {
        for _ in 0..10 {
            let old = self.get_stored(def, namespace, name)?;
            if let Some(uid) = &opts.precondition_uid
                && uid != uid_of(&old)
            {
                return Err(ApiError::conflict_because(
                    &def.group,
                    &def.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        uid_of(&old)
                    ),
                ));
            }
            if let Some(rv) = opts.precondition_rv
                && Some(rv) != resource_version_of(&old)
            {
                return Err(ApiError::conflict_because(
                    &def.group,
                    &def.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        resource_version_of(&old).unwrap_or(0)
                    ),
                ));
            }
            let mut finalizers = finalizers_of(&old);
            match opts.propagation {
                Some(PropagationPolicy::Orphan) if !finalizers.iter().any(|f| f == "orphan") => {
                    finalizers.push("orphan".into())
                }
                Some(PropagationPolicy::Foreground)
                    if !finalizers.iter().any(|f| f == "foregroundDeletion") =>
                {
                    finalizers.push("foregroundDeletion".into())
                }
                _ => {}
            }
            // Webhooks see the first DELETE of an object, not the finalizer bookkeeping after it.
            if !is_deleting(&old) {
                let request = AdmissionRequest {
                    def,
                    operation: Operation::Delete,
                    subresource: None,
                    object: &old,
                    old: Some(&old),
                    dry_run: opts.dry_run,
                };
                // Mutations of a deletion have nothing to apply to; mutating webhooks may still deny.
                self.admission.mutate(&self.store, &request).await?;
                self.admission.validate(&self.store, &request).await?;
            }
            let namespace_pending = def.flavor == Flavor::Namespace
                && old
                    .pointer("/spec/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
            let key = Self::key(def, namespace, name);
            if finalizers.is_empty() && !namespace_pending {
                if opts.dry_run {
                    return Ok((def.served(&old), true));
                }
                match self.store.delete(&key, resource_version_of(&old)) {
                    Ok(gone) => {
                        self.after_delete(def, &gone)?;
                        return Ok((def.served(&gone), true));
                    }
                    Err(WriteError::Conflict) => continue,
                    Err(e) => return Err(Self::write_error(def, name, e)),
                }
            }
            // Graceful: mark and let finalizers (or the namespace controller) finish.
            if is_deleting(&old) && finalizers == finalizers_of(&old) {
                return Ok((def.served(&old), false));
            }
            let mut marked = old.clone();
            let m = metadata_mut(&mut marked);
            m.entry("deletionTimestamp")
                .or_insert_with(|| json!(meta::now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("finalizers".into(), json!(finalizers));
            if finalizers.is_empty() {
                m.remove("finalizers");
            }
            if def.flavor == Flavor::Namespace {
                marked["status"]["phase"] = json!("Terminating");
            }
            if opts.dry_run {
                return Ok((def.served(&marked), false));
            }
            match self.store.update(&key, resource_version_of(&old), marked) {
                Ok(stored) => return Ok((def.served(&stored), false)),
                Err(WriteError::Conflict) => continue,
                Err(e) => return Err(Self::write_error(def, name, e)),
            }
        }
        Err(ApiError::conflict(&def.group, &def.plural, name))
    }

    /// Caches that follow some kinds: served CRDs, webhook configurations.
    fn after_write(&self, def: &ResourceDef, stored: &Value) {
        if def.flavor == Flavor::CustomResourceDefinition {
            self.serve_crd(stored);
        }
        if def.group == "admissionregistration.k8s.io" {
            self.admission.invalidate();
        }
    }

    /// Cleanup that must follow the removal of some kinds.
    fn after_delete(&self, def: &ResourceDef, gone: &Value) -> Result<(), ApiError> {
        if def.group == "admissionregistration.k8s.io" {
            self.admission.invalidate();
        }
        if def.flavor == Flavor::CustomResourceDefinition {
            let storage_key = format!(
                "{}/{}",
                gone.pointer("/spec/group")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                gone.pointer("/spec/names/plural")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            );
            self.registry.remove_crd(name_of(gone));
            // Unless another CRD now serves the same storage, its objects go with the CRD.
            if self.registry.by_storage_key(&storage_key).is_none() {
                let (objects, _) = self.store.list(&storage_key, None, None)?;
                for o in objects {
                    let key = ObjectKey {
                        resource: storage_key.clone(),
                        namespace: meta::namespace_of(&o).into(),
                        name: name_of(&o).into(),
                    };
                    match self.store.delete(&key, None) {
                        Ok(_) | Err(WriteError::NotFound) => {}
                        Err(e) => return Err(Self::write_error(def, name_of(&o), e)),
                    }
                }
            }
        }
        Ok(())
    }

    pub async fn delete_collection(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        q: &ListQuery,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let q = ListQuery {
            limit: None,
            continue_token: None,
            ..q.clone()
        };
        let list = self.list(def, namespace, &q)?;
        let mut deleted = Vec::new();
        for item in list["items"].as_array().cloned().unwrap_or_default() {
            match self
                .delete(def, meta::namespace_of(&item), name_of(&item), opts)
                .await
            {
                Ok((o, _)) => deleted.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": def.list_kind(),
            "apiVersion": def.api_version(),
            "metadata": { "resourceVersion": self.store.current_rv()?.to_string() },
            "items": deleted,
        }))
    }

    pub fn storage_def(&self, storage_key: &str) -> Option<Arc<ResourceDef>> {
        self.registry.by_storage_key(storage_key)
    }
}

/// ObjectMeta rules every kind shares: label and annotation keys, label values, owner references.
fn metadata_errors(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["labels", "annotations"] {
        for (k, v) in obj
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let Some(p) = meta::check_qualified_name(k) {
                errs.push(FieldError::new(
                    format!("metadata.{field}"),
                    FieldErrorKind::Invalid,
                    format!("{k:?}: {p}"),
                ));
            }
            if field == "labels"
                && let Some(p) = meta::check_label_value(v.as_str().unwrap_or(""))
            {
                errs.push(FieldError::new(
                    "metadata.labels",
                    FieldErrorKind::Invalid,
                    format!("{v}: {p}"),
                ));
            }
        }
    }
    for (i, r) in obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for field in ["apiVersion", "kind", "name", "uid"] {
            if r.get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::new(
                    format!("metadata.ownerReferences[{i}].{field}"),
                    FieldErrorKind::Invalid,
                    format!("\"\": {field} must not be empty"),
                ));
            }
        }
    }
    errs
}

fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    let token = json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": format!("{namespace}/{name}") });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let (ns, name) = v["start"]
        .as_str()
        .and_then(|s| s.split_once('/'))
        .ok_or_else(bad)?;
    Ok((rv, ns.to_string(), name.to_string()))
}

impl ApiState {
    /// The namespaces every Kubernetes cluster has.
    pub async fn ensure_default_namespaces(&self) -> Result<(), ApiError> {
        let def = self
            .registry
            .lookup("", "v1", "namespaces")
            .expect("namespaces are built in");
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if self.store.get(&Self::key(&def, "", name))?.is_none() {
                let opts = WriteOptions {
                    field_manager: "caretaker-apiserver".into(),
                    ..Default::default()
                };
                match self
                    .create(&def, "", json!({"metadata": {"name": name}}), &opts)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}
