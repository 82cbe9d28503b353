//! The controllers kube-controller-manager would run for the kinds served here: the garbage
//! collector (ownerReferences; Background, Foreground and Orphan deletion), the namespace
//! controller (deleting a namespace deletes its contents first), and the ServiceAccount
//! controller and root-CA publisher (`namespace_contents`: what every namespace holds).
//!
//! They react to the store's change stream, so work happens right after the write that caused
//! it, and sweep everything at startup and whenever they fall behind.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::api::{ApiState, DeleteOptions, Part, PropagationPolicy, WriteOptions};
use crate::error::ApiError;
use crate::meta::{finalizers_of, is_deleting, name_of, namespace_of, uid_of};
use crate::store::registry::{Flavor, ResourceDef};
use crate::store::storage::{Change, ChangeType, ObjectKey};

mod namespace_contents;

const MANAGER: &str = "caretaker-controllers";

fn background() -> DeleteOptions {
    DeleteOptions {
        propagation: Some(PropagationPolicy::Background),
        ..Default::default()
    }
}

fn writer() -> WriteOptions {
    WriteOptions {
        field_manager: MANAGER.into(),
        ..Default::default()
    }
}

/// What every namespace there is now holds, made before the server answers anyone (so that a
/// client's first request finds them, as in a cluster that has been running).
pub async fn fill_namespaces(api: &ApiState, ca_pem: &str) -> Result<(), ApiError> {
    namespace_contents::ensure_everywhere(api, ca_pem).await
}

/// Runs the controllers until the store closes. `ca_pem` is what every namespace's
/// `kube-root-ca.crt` holds: the CA clients verify the server with ("" over plain HTTP).
pub async fn run(api: Arc<ApiState>, ca_pem: String) {
    let mut changes = api.store.subscribe();
    sweep(&api, &ca_pem).await;
    loop {
        match changes.recv().await {
            Ok(change) => {
                if let Err(e) = react(&api, &change).await {
                    tracing::warn!(error = %e, object = ?change.key, "controller step failed");
                }
                if let Some(namespace) = namespace_contents::namespace_to_check(&change)
                    && let Err(e) = namespace_contents::ensure(&api, namespace, &ca_pem).await
                {
                    tracing::warn!(error = %e, namespace, "namespace contents step failed");
                }
            }
            Err(RecvError::Lagged(_)) => sweep(&api, &ca_pem).await,
            Err(RecvError::Closed) => return,
        }
    }
}

async fn sweep(api: &ApiState, ca_pem: &str) {
    if let Err(e) = namespace_contents::ensure_everywhere(api, ca_pem).await {
        tracing::warn!(error = %e, "namespace contents sweep failed");
    }
    sweep_deleting(api).await;
}

async fn sweep_deleting(api: &ApiState) {
    let result: Result<(), ApiError> = async {
        for (key, obj) in api.store.deleting_objects()? {
            if let Some(def) = api.storage_def(&key.resource) {
                process_deleting(api, &def, &obj).await?;
            }
        }
        for uid in api.store.referenced_owner_uids()? {
            if !api.store.uid_exists(&uid)? {
                collect_dependents(api, &uid).await?;
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "controller sweep failed");
    }
}

async fn react(api: &ApiState, change: &Change) -> Result<(), ApiError> {
    let obj = &change.object;
    if change.kind == ChangeType::Deleted {
        collect_dependents(api, uid_of(obj)).await?;
        // A foreground-deleting owner may have been waiting for this dependent.
        for owner_uid in owner_uids(obj) {
            if let Some((key, owner)) = api.store.find_by_uid(&owner_uid)?
                && is_deleting(&owner)
                && let Some(def) = api.storage_def(&key.resource)
            {
                process_deleting(api, &def, &owner).await?;
            }
        }
        if !change.key.namespace.is_empty() {
            sync_namespace(api, &change.key.namespace).await?;
        }
    } else if is_deleting(obj)
        && let Some(def) = api.storage_def(&change.key.resource)
    {
        process_deleting(api, &def, obj).await?;
    }
    Ok(())
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The owner with `owner_uid` is gone: delete its dependents that have no other owner left, and
/// drop the dangling reference from the others.
async fn collect_dependents(api: &ApiState, owner_uid: &str) -> Result<(), ApiError> {
    if owner_uid.is_empty() {
        return Ok(());
    }
    for key in api.store.dependents(owner_uid)? {
        let (Some(def), Some(dep)) = (api.storage_def(&key.resource), api.store.get(&key)?) else {
            continue;
        };
        let mut live_owners = Vec::new();
        for r in dep
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            let uid = r["uid"].as_str().unwrap_or("");
            if uid != owner_uid && api.store.uid_exists(uid)? {
                live_owners.push(r);
            }
        }
        if live_owners.is_empty() {
            ignore_not_found(
                api.delete(&def, &key.namespace, &key.name, &background())
                    .await
                    .map(|_| ()),
            )?;
        } else {
            set_owner_references(api, &def, &key, &dep, live_owners).await?;
        }
    }
    Ok(())
}

/// An object marked for deletion: run the finalizers this server implements.
async fn process_deleting(api: &ApiState, def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    if def.flavor == Flavor::Namespace {
        return sync_namespace(api, name_of(obj)).await;
    }
    let finalizers = finalizers_of(obj);
    let uid = uid_of(obj);
    if finalizers.iter().any(|f| f == "orphan") {
        for key in api.store.dependents(uid)? {
            let (Some(dep_def), Some(dep)) = (api.storage_def(&key.resource), api.store.get(&key)?)
            else {
                continue;
            };
            let refs: Vec<Value> = dep["metadata"]["ownerReferences"]
                .as_array()
                .map(|a| a.iter().filter(|r| r["uid"] != uid).cloned().collect())
                .unwrap_or_default();
            set_owner_references(api, &dep_def, &key, &dep, refs).await?;
        }
        remove_finalizer(api, def, obj, "orphan").await?;
    } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
        let mut waiting = false;
        for key in api.store.dependents(uid)? {
            let (Some(dep_def), Some(dep)) = (api.storage_def(&key.resource), api.store.get(&key)?)
            else {
                continue;
            };
            // As kube's garbage collector: a dependent another owner still holds is not
            // deleted, only let go of.
            let others: Vec<Value> = dep["metadata"]["ownerReferences"]
                .as_array()
                .map(|a| a.iter().filter(|r| r["uid"] != uid).cloned().collect())
                .unwrap_or_default();
            if solid_owner(api, &others)? {
                set_owner_references(api, &dep_def, &key, &dep, others).await?;
                continue;
            }
            waiting = true;
            if !is_deleting(&dep) {
                let foreground = DeleteOptions {
                    propagation: Some(PropagationPolicy::Foreground),
                    ..Default::default()
                };
                ignore_not_found(
                    api.delete(&dep_def, &key.namespace, &key.name, &foreground)
                        .await
                        .map(|_| ()),
                )?;
            }
        }
        if !waiting {
            remove_finalizer(api, def, obj, "foregroundDeletion").await?;
        }
    }
    Ok(())
}

/// Whether one of `refs` names an owner that exists and is not itself being deleted.
fn solid_owner(api: &ApiState, refs: &[Value]) -> Result<bool, ApiError> {
    for r in refs {
        let uid = r["uid"].as_str().unwrap_or_default();
        if let Some((_, owner)) = api.store.find_by_uid(uid)?
            && !is_deleting(&owner)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Gives the dependent `dep` (stored at `key`) the owner references `refs`.
async fn set_owner_references(
    api: &ApiState,
    def: &ResourceDef,
    key: &ObjectKey,
    dep: &Value,
    refs: Vec<Value>,
) -> Result<(), ApiError> {
    let mut updated = def.served(dep);
    updated["metadata"]["ownerReferences"] = json!(refs);
    ignore_conflict(
        api.update(
            def,
            &key.namespace,
            &key.name,
            updated,
            Part::Main,
            &writer(),
        )
        .await,
    )
}

async fn remove_finalizer(
    api: &ApiState,
    def: &ResourceDef,
    obj: &Value,
    finalizer: &str,
) -> Result<(), ApiError> {
    let mut updated = def.served(obj);
    let remaining: Vec<String> = finalizers_of(obj)
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    updated["metadata"]["finalizers"] = json!(remaining);
    ignore_conflict(
        api.update(
            def,
            namespace_of(obj),
            name_of(obj),
            updated,
            Part::Main,
            &writer(),
        )
        .await,
    )
}

/// Deletes the contents of a terminating namespace, then the namespace itself.
async fn sync_namespace(api: &ApiState, namespace: &str) -> Result<(), ApiError> {
    let key = ObjectKey {
        resource: "/namespaces".into(),
        namespace: String::new(),
        name: namespace.into(),
    };
    let Some(ns) = api.store.get(&key)? else {
        return Ok(());
    };
    if !is_deleting(&ns) {
        return Ok(());
    }
    let contents = api.store.keys_in_namespace(namespace)?;
    for key in &contents {
        match api.storage_def(&key.resource) {
            Some(def) => {
                if api.store.get(key)?.is_some_and(|o| !is_deleting(&o)) {
                    ignore_not_found(
                        api.delete(&def, &key.namespace, &key.name, &background())
                            .await
                            .map(|_| ()),
                    )?;
                }
            }
            // Left over from a deleted CRD: nothing serves it, nothing can finalize it.
            None => {
                let _ = api.store.delete(key, None);
            }
        }
    }
    if contents.is_empty()
        && let Some(def) = api.registry.lookup("", "v1", "namespaces")
    {
        let mut finalized = def.served(&ns);
        finalized["spec"]["finalizers"] = json!([]);
        ignore_conflict(
            api.update(&def, "", namespace, finalized, Part::Finalize, &writer())
                .await,
        )?;
    }
    Ok(())
}

fn ignore_not_found(r: Result<(), ApiError>) -> Result<(), ApiError> {
    match r {
        Err(e) if e.code == 404 => Ok(()),
        other => other,
    }
}

/// Conflicts and disappearances mean someone else changed the object; the change stream brings
/// it back here with its new state.
fn ignore_conflict<T>(r: Result<T, ApiError>) -> Result<(), ApiError> {
    match r {
        Err(e) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}
