//! Admission webhooks (Validating and Mutating WebhookConfigurations).

use serde_json::Value;

use crate::error::ApiError;
use crate::registry::ResourceDef;
use crate::storage::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

/// Calls admission webhooks. Not implemented yet: every request is admitted unchanged.
#[derive(Debug, Default)]
pub struct Admission {}

impl Admission {
    pub async fn mutate(
        &self,
        _store: &Store,
        _def: &ResourceDef,
        _op: Operation,
        obj: Value,
        _old: Option<&Value>,
        _dry_run: bool,
    ) -> Result<Value, ApiError> {
        Ok(obj)
    }

    pub async fn validate(
        &self,
        _store: &Store,
        _def: &ResourceDef,
        _op: Operation,
        _obj: &Value,
        _old: Option<&Value>,
        _dry_run: bool,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}
