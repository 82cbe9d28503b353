//! The API's verbs on stored objects, independent of HTTP: handlers call these after parsing a
//! request, the garbage collector and namespace controller call them too.
//!
//! A write goes: decode checks, storage form (Events), pruning and defaulting of custom
//! resources ([`decode`]) → the part of the object the request may write → kind-specific
//! preparation: Secrets' stringData, Namespace phase, CRD status ([`prepare`]) → mutating
//! admission → server-owned metadata: uid, generation ([`prepare`]) → managedFields →
//! validation ([`validate`]) → validating admission → compare-and-swap in storage.
//! [`create`] and [`update`] (update, patch, server-side apply) each get to the object in their
//! own way; from the part it may write on, they share one pipeline: [`write`].
//! [`delete`] and [`read`] hold the other verbs, [`options`] what requests ask of them,
//! [`authorize`] what authorization decides where a write is stored.

mod authorize;
mod create;
mod decode;
mod defaults;
mod delete;
mod options;
mod prepare;
mod read;
mod scale;
mod update;
mod validate;
mod write;

use std::sync::Arc;

use serde_json::{Value, json};

use crate::admission::Admission;
use crate::error::ApiError;
use crate::schema::crd;
use crate::store::registry::{Registry, ResourceDef};
use crate::store::storage::{ObjectKey, Store, WriteError};

pub use authorize::WriteAuthorizer;
pub use options::{
    DeleteOptions, FieldValidation, ListQuery, Part, PropagationPolicy, WriteOptions,
};
pub use scale::ScaleChange;

/// Everything the verbs need: storage, the served resources, admission and, with RBAC on,
/// the authorization decided where writes are stored.
pub struct ApiState {
    pub store: Store,
    pub registry: Registry,
    pub admission: Admission,
    pub authorizer: Option<Arc<dyn WriteAuthorizer>>,
}

const CRD_STORAGE_KEY: &str = "apiextensions.k8s.io/customresourcedefinitions";

impl ApiState {
    pub fn new(store: Store) -> Result<Self, ApiError> {
        let state = ApiState {
            store,
            registry: Registry::new(),
            admission: Admission::default(),
            authorizer: None,
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

    pub fn storage_def(&self, storage_key: &str) -> Option<Arc<ResourceDef>> {
        self.registry.by_storage_key(storage_key)
    }

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
