//! Reads: get and list, with list pages' continue tokens.

use base64::Engine;
use serde_json::{Value, json};

use super::ApiState;
use super::options::ListQuery;
use crate::error::ApiError;
use crate::meta::{self, name_of};
use crate::store::registry::ResourceDef;

impl ApiState {
    pub fn get(&self, def: &ResourceDef, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let stored = self.get_stored(def, namespace, name)?;
        Ok(def.served(&stored))
    }

    pub(super) fn get_stored(
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
            // As kube-apiserver: counted only when no selector makes counting cost a scan.
            if !selective {
                let remaining = self.store.count_after(
                    &def.storage_key,
                    namespace,
                    (meta::namespace_of(last), name_of(last)),
                )?;
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
