//! Creating objects: from a body (named, or named by `generateName`), or by a server-side apply
//! to an object that does not exist yet.

use serde_json::{Value, json};

use super::ApiState;
use super::options::{Part, WriteOptions};
use super::write::{ManagedFields, Target, Written, writer};
use crate::error::{self, ApiError, FieldError, FieldErrorKind};
use crate::meta::{self, is_deleting, metadata_mut};
use crate::patch::apply;
use crate::store::registry::ResourceDef;
use crate::store::storage::ObjectKey;

const NAMESPACE_STORAGE_KEY: &str = "/namespaces";

impl ApiState {
    pub async fn create(
        &self,
        def: &ResourceDef,
        namespace: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let (mut obj, warnings) = self.decode(def, namespace, None, body, opts)?;
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
        // The field manager records a new object's managedFields; what the client sent is dropped.
        metadata_mut(&mut obj).remove("managedFields");
        self.write(def, Target::New, obj, opts, ManagedFields::Record, warnings)
            .await
    }

    /// Server-side apply of `body` where nothing is stored yet: the configuration, with the
    /// managedFields of its manager, is the new object.
    pub(super) async fn apply_create(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        body: &Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        // A patch becomes a create here, once nothing was found: this is where it must be
        // allowed to create (before the request was read, the object may have existed), and
        // the store refuses to create over an object that appeared since.
        self.authorize_create(def, namespace, name, opts)?;
        let (cfg, warnings) = self.decode(def, namespace, Some(name), body.clone(), opts)?;
        self.check_namespace_open(def, namespace, name)?;
        let obj = apply::apply(
            None,
            &cfg,
            &writer(def, Part::Main, opts),
            opts.force,
            &def.group,
            &def.plural,
        )?;
        let managed_fields = match obj.pointer("/metadata/managedFields") {
            Some(fields) => ManagedFields::Set(fields.clone()),
            None => ManagedFields::Keep,
        };
        self.write(def, Target::New, obj, opts, managed_fields, warnings)
            .await
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
                    error::qualified(&def.group, &def.plural)
                ))
            }),
            Some(_) => Ok(()),
        }
    }
}
