//! Updates and patches of stored objects (a server-side apply to a missing object creates it).

use std::sync::Arc;

use serde_json::Value;

use super::ApiState;
use super::options::{Part, WriteOptions};
use super::write::{ManagedFields, Target, Written, writer};
use crate::error::ApiError;
use crate::meta::{name_of, resource_version_of};
use crate::patch::apply;
use crate::patch::bodies::{self, PatchType};
use crate::patch::patch_meta::PatchMeta;
use crate::store::registry::ResourceDef;
use crate::work::{self, Deadline};

impl ApiState {
    pub async fn update(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        body: Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let (new, warnings) = self.decode(def, namespace, Some(name), body, opts)?;
        let old = self.get_stored(def, namespace, name)?;
        check_precondition(def, &old, resource_version_of(&new))?;
        let target = Target::Replace { old: &old, part };
        self.write(def, target, new, opts, ManagedFields::Record, warnings)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        body: Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        // Merging is the heavy part of a patch: it runs off the async workers, within a budget
        // for all the attempts.
        let deadline = Deadline::from_now();
        let body = Arc::new(body);
        // Retry on a conflict this server caused itself (a concurrent write between our read and
        // write); a resourceVersion precondition inside the patch is the client's and is honoured.
        for _ in 0..10 {
            let old = match self.store.get(&Self::key(def, namespace, name))? {
                Some(o) => o,
                None if patch_type == PatchType::Apply && part == Part::Main => {
                    return self.apply_create(def, namespace, name, &body, opts).await;
                }
                None => return Err(ApiError::not_found(&def.group, &def.plural, name)),
            };
            let (patched, managed_fields, old) = if patch_type == PatchType::Apply {
                // The configuration as decoded (unknown fields pruned), in the served form.
                let (cfg, _) = self.decode(def, namespace, Some(name), (*body).clone(), opts)?;
                let mut cfg = def.served(&cfg);
                if let Some(m) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("namespace");
                }
                let (def, opts) = (def.clone(), opts.clone());
                let (merged, old) = work::run(deadline, move |_| {
                    let merged = apply::apply(
                        Some(&def.as_served(&old)),
                        &cfg,
                        &writer(&def, part, &opts),
                        opts.force,
                        &def.group,
                        &def.plural,
                    )?;
                    Ok((merged, old))
                })
                .await?;
                (merged, ManagedFields::Keep, old)
            } else {
                let (def, body) = (def.clone(), body.clone());
                let (patched, old) = work::run(deadline, move |deadline| {
                    let patched = bodies::apply_patch(
                        patch_type,
                        &def.as_served(&old),
                        &body,
                        PatchMeta::of(&def.group, &def.version, &def.kind),
                        deadline,
                    )?;
                    Ok((patched, old))
                })
                .await?;
                (patched, ManagedFields::Record, old)
            };
            let (new, warnings) = self.decode(def, namespace, Some(name), patched, opts)?;
            check_precondition(def, &old, resource_version_of(&new))?;
            let target = Target::Replace { old: &old, part };
            match self
                .write(def, target, new, opts, managed_fields, warnings)
                .await
            {
                Err(e)
                    if e.code == 409
                        && e.reason == "Conflict"
                        && !e.message.starts_with("Apply failed") =>
                {
                    continue;
                }
                result => return result,
            }
        }
        Err(ApiError::conflict(&def.group, &def.plural, name))
    }
}

/// The client's resourceVersion precondition: 409 unless `old` is still at `expected`.
fn check_precondition(
    def: &ResourceDef,
    old: &Value,
    expected: Option<u64>,
) -> Result<(), ApiError> {
    match expected {
        Some(rv) if Some(rv) != resource_version_of(old) => {
            Err(ApiError::conflict(&def.group, &def.plural, name_of(old)))
        }
        _ => Ok(()),
    }
}
