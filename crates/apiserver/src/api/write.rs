//! The pipeline every write ends in, written once.
//!
//! Create ([`super::create`]), update and patch ([`super::update`]) each get to the object they
//! want stored in their own way; [`ApiState::write`] then takes it through the same steps:
//! the part of it the request may write, kind-specific preparation, mutating admission,
//! server-owned metadata, managedFields, validation, validating admission, and the
//! compare-and-swap in storage.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Value, json};

use super::ApiState;
use super::options::{Part, WriteOptions};
use crate::admission::Request as AdmissionRequest;
use crate::error::ApiError;
use crate::meta::{self, finalizers_of, is_deleting, metadata_mut, name_of, resource_version_of};
use crate::patch::apply::{self, Writer};
use crate::patch::patch_meta::PatchMeta;
use crate::store::registry::{Flavor, ResourceDef};
use crate::work;

/// The result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    /// As served: shared with the store when it is served as stored (no copy).
    pub object: Arc<Value>,
    pub warnings: Vec<String>,
    pub created: bool,
}

/// What a write does to the stored object.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target<'a> {
    /// Creates it.
    New,
    /// Replaces `old`, the whole object or one part of it.
    Replace { old: &'a Value, part: Part },
}

impl<'a> Target<'a> {
    fn old(self) -> Option<&'a Value> {
        match self {
            Target::New => None,
            Target::Replace { old, .. } => Some(old),
        }
    }

    fn part(self) -> Part {
        match self {
            Target::New => Part::Main,
            Target::Replace { part, .. } => part,
        }
    }
}

/// What the pipeline does about managedFields once admission and metadata are done.
#[derive(Debug, Clone)]
pub(super) enum ManagedFields {
    /// Records the write as an `Update` by the request's field manager.
    Record,
    /// Keeps those the object carries after admission: server-side apply computed them.
    Keep,
    /// Sets these, whatever admission did to them: server-side apply computed them for a new
    /// object.
    Set(Value),
}

impl ApiState {
    /// Takes `obj` (decoded, and for a create named) through preparation, admission, metadata,
    /// validation and storage. Returns it served as stored (or as it would be, for a dry run).
    pub(super) async fn write(
        &self,
        def: &ResourceDef,
        target: Target<'_>,
        obj: Value,
        opts: &WriteOptions,
        managed_fields: ManagedFields,
        warnings: Vec<String>,
    ) -> Result<Written, ApiError> {
        // Field bookkeeping and storage of an object of tens of thousands of fields take a
        // second: long enough to keep an async worker from every other request.
        let large = work::is_large(&obj) || target.old().is_some_and(work::is_large);
        let write = self.write_now(def, target, obj, opts, managed_fields, warnings);
        if large {
            work::hand_over_worker(write).await
        } else {
            write.await
        }
    }

    async fn write_now(
        &self,
        def: &ResourceDef,
        target: Target<'_>,
        obj: Value,
        opts: &WriteOptions,
        managed_fields: ManagedFields,
        warnings: Vec<String>,
    ) -> Result<Written, ApiError> {
        let (old, part) = (target.old(), target.part());
        let mut obj = take_part(def, target, obj);
        self.prepare_kind(def, &mut obj, old)?;
        let request = AdmissionRequest::write(def, part.subresource(), &obj, old, opts.dry_run)
            .by(opts.user.as_deref());
        let (mut obj, mutating_warnings) = self.admission.mutate(&self.store, &request).await?;
        Self::stamp_metadata(def, &mut obj, old);
        match managed_fields {
            ManagedFields::Record => apply::record_update(old, &mut obj, &writer(def, part, opts)),
            ManagedFields::Keep => {}
            ManagedFields::Set(fields) => {
                metadata_mut(&mut obj).insert("managedFields".into(), fields);
            }
        }
        self.validate(def, &obj, old)?;
        // What it grants, once patched, applied, admitted and valid (RBAC objects).
        self.authorize_store(def, &obj, old, opts)?;
        let request = AdmissionRequest::write(def, part.subresource(), &obj, old, opts.dry_run)
            .by(opts.user.as_deref());
        let validating_warnings = self.admission.validate(&self.store, &request).await?;
        let mut warnings = warnings;
        warnings.extend(mutating_warnings);
        warnings.extend(validating_warnings);
        let stored = match old {
            None => self.commit_create(def, obj, opts.dry_run)?,
            Some(old) => self.commit_update(def, old, obj, opts.dry_run)?,
        };
        let object = match def.as_served(&stored) {
            Cow::Borrowed(_) => stored.clone(),
            Cow::Owned(served) => Arc::new(served),
        };
        Ok(Written {
            object,
            warnings,
            created: old.is_none(),
        })
    }

    fn commit_create(
        &self,
        def: &ResourceDef,
        obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let name = name_of(&obj).to_string();
        let key = Self::key(def, meta::namespace_of(&obj), &name);
        if dry_run {
            if self.store.get(&key)?.is_some() {
                return Err(ApiError::already_exists(&def.group, &def.plural, &name));
            }
            return Ok(Arc::new(obj));
        }
        let stored = self
            .store
            .create(&key, obj)
            .map_err(|e| Self::write_error(def, &name, e))?;
        self.after_write(def, &stored);
        Ok(stored)
    }

    /// Stores `obj` over `old`, unless it lost its last finalizer while being deleted: then
    /// it goes away now (and that is what is returned).
    fn commit_update(
        &self,
        def: &ResourceDef,
        old: &Value,
        obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let name = name_of(old);
        let key = Self::key(def, meta::namespace_of(old), name);
        if dry_run {
            return Ok(Arc::new(obj));
        }
        let spec_finalizers_left = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
            && def.flavor == Flavor::Namespace;
        if is_deleting(&obj) && finalizers_of(&obj).is_empty() && !spec_finalizers_left {
            let gone = self
                .store
                .delete(&key, resource_version_of(old))
                .map_err(|e| Self::write_error(def, name, e))?;
            self.after_delete(def, &gone)?;
            return Ok(gone);
        }
        // As kube-apiserver: a write that changes nothing but the times of managedFields is not
        // stored, so the resourceVersion stays and no watch event is sent.
        if same_but_times(old, &obj) {
            return Ok(Arc::new(old.clone()));
        }
        let stored = self
            .store
            .update(&key, resource_version_of(old), obj)
            .map_err(|e| Self::write_error(def, name, e))?;
        self.after_write(def, &stored);
        Ok(stored)
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
}

/// Whether `new` is `old` apart from its resourceVersion and the times of its managedFields.
/// Compared in place: this runs on every update.
fn same_but_times(old: &Value, new: &Value) -> bool {
    same_fields(old, new, None, |key, old, new| match key {
        "metadata" => same_fields(old, new, Some("resourceVersion"), |key, old, new| {
            match (key, old.as_array(), new.as_array()) {
                ("managedFields", Some(old), Some(new)) => {
                    old.len() == new.len()
                        && old
                            .iter()
                            .zip(new)
                            .all(|(old, new)| same_fields(old, new, Some("time"), |_, a, b| a == b))
                }
                _ => old == new,
            }
        }),
        _ => old == new,
    })
}

/// Whether objects `a` and `b` have the same fields but the `ignored` one, `same` judging each field
/// (plain equality for values that are not objects).
fn same_fields(
    a: &Value,
    b: &Value,
    ignored: Option<&str>,
    same: impl Fn(&str, &Value, &Value) -> bool,
) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept = |key: &String| Some(key.as_str()) != ignored;
    let count = |object: &serde_json::Map<String, Value>| object.keys().filter(|k| kept(k)).count();
    count(a) == count(b)
        && a.iter()
            .filter(|(key, _)| kept(key))
            .all(|(key, value)| b.get(key).is_some_and(|other| same(key, value, other)))
}

/// What of `new` a write takes. A create takes it whole, except a custom resource's status when
/// it has a status subresource; a write to a part of `old` takes that part and keeps the rest.
fn take_part(def: &ResourceDef, target: Target, mut new: Value) -> Value {
    match target {
        Target::New => {
            if def.has_status
                && def.flavor == Flavor::CustomResource
                && let Some(m) = new.as_object_mut()
            {
                m.remove("status");
            }
            new
        }
        Target::Replace {
            old,
            part: Part::Main,
        } => {
            if def.has_status {
                copy_status(&mut new, old);
            }
            new
        }
        Target::Replace {
            old,
            part: Part::Status,
        } => {
            let mut obj = old.clone();
            copy_status(&mut obj, &new);
            if let Some(mf) = new.pointer("/metadata/managedFields") {
                metadata_mut(&mut obj).insert("managedFields".into(), mf.clone());
            }
            obj
        }
        Target::Replace {
            old,
            part: Part::Finalize,
        } => {
            let mut obj = old.clone();
            obj["spec"]["finalizers"] = new
                .pointer("/spec/finalizers")
                .cloned()
                .unwrap_or(json!([]));
            obj
        }
    }
}

/// Gives `obj` the status of `from`, or none if `from` has none.
fn copy_status(obj: &mut Value, from: &Value) {
    match from.get("status") {
        Some(s) => obj["status"] = s.clone(),
        None => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    }
}

/// Who writes, for managedFields: the request's field manager, at `def`'s version, now.
pub(super) fn writer<'a>(def: &'a ResourceDef, part: Part, opts: &'a WriteOptions) -> Writer<'a> {
    Writer {
        manager: &opts.field_manager,
        api_version: def.api_version(),
        // Entries name the status subresource; finalize writes count as the main resource.
        subresource: (part == Part::Status).then_some("status"),
        now: meta::now(),
        // Custom resources' list types come from their schema, built-in kinds' from their merge.
        schema: def
            .schema
            .as_deref()
            .or_else(|| PatchMeta::of(&def.group, &def.version, &def.kind).apply_schema()),
    }
}
