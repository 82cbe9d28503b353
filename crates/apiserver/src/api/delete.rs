//! Deletion: preconditions, finalizers and propagation policies, the removal itself, and the
//! cleanup some kinds need after it.

use serde_json::{Value, json};

use super::ApiState;
use super::options::{DeleteOptions, ListQuery, PropagationPolicy};
use crate::admission::Request as AdmissionRequest;
use crate::error::ApiError;
use crate::meta::{
    self, finalizers_of, is_deleting, metadata_mut, name_of, resource_version_of, uid_of,
};
use crate::store::registry::{Flavor, ResourceDef};
use crate::store::storage::{ObjectKey, WriteError};

impl ApiState {
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
                let request =
                    AdmissionRequest::delete(def, &old, opts.dry_run).by(opts.user.as_deref());
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

    /// Cleanup that must follow the removal of some kinds.
    pub(super) fn after_delete(&self, def: &ResourceDef, gone: &Value) -> Result<(), ApiError> {
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
}
