//! The executor of a plan's writes: each step written in order on the version of its object
//! the pass read (or wrote last), the first conflict ending the writes (the object changed
//! since it was read: its watch event brings a new pass, which starts from what is stored), the
//! first failure too. A gate step asks, right before the writes after it, whether they may
//! still go ahead.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Preconditions};

use super::Key;
use super::write::{self, Written};
use crate::Error;
use crate::changes::{AnnotationChanges, KeyChanges};
use crate::ownership::Owner;

/// The kinds of object a step writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ObjectKind {
    Secret,
    ConfigMap,
}

/// What one step of a plan does.
pub(crate) enum Step {
    /// Creates the Secret (type `kubernetes.io/tls`) or merge-patches its data and annotations
    /// ([`write::write_secret`]).
    TlsSecret {
        key: Key,
        data: KeyChanges,
        annotations: AnnotationChanges,
    },
    /// Creates the ConfigMap or merge-patches its data and annotations
    /// ([`write::write_config_map`]).
    ConfigMap {
        key: Key,
        data: BTreeMap<&'static str, String>,
        annotations: AnnotationChanges,
    },
    /// Creates the Secret (type Opaque) or replaces its data: the keys of `stored` not in
    /// `data` are removed ([`write::write_opaque_secret`]).
    OpaqueSecret {
        key: Key,
        data: BTreeMap<String, String>,
        stored: Vec<String>,
        annotations: AnnotationChanges,
    },
    /// Creates the ConfigMap or replaces its data: the keys of `stored` not in `data` are
    /// removed ([`write::write_replaced_config_map`]).
    ReplacedConfigMap {
        key: Key,
        data: BTreeMap<String, String>,
        stored: Vec<String>,
    },
    /// Deletes the Secret, only at the version read (gone already is done).
    DeleteSecret { key: Key },
    /// Asks the gate whether the writes after it may still go ahead.
    Gate,
}

impl Step {
    fn object(&self) -> Option<(ObjectKind, &Key)> {
        match self {
            Step::TlsSecret { key, .. }
            | Step::OpaqueSecret { key, .. }
            | Step::DeleteSecret { key } => Some((ObjectKind::Secret, key)),
            Step::ConfigMap { key, .. } | Step::ReplacedConfigMap { key, .. } => {
                Some((ObjectKind::ConfigMap, key))
            }
            Step::Gate => None,
        }
    }
}

/// How a plan's writes ended, and how many were made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Every step was carried out.
    All,
    /// An object changed since the pass read it; the steps before it were written.
    Conflict { written: usize },
    /// A gate said no; the steps before it were written.
    Gated { written: usize },
}

/// A write that failed, after `written` others.
#[derive(Debug)]
pub(crate) struct Failed {
    pub written: usize,
    pub error: Error,
}

/// Carries out the writes of one pass for `owner`, on the versions of its objects the pass
/// read.
pub(crate) struct StepWriter<'a> {
    client: &'a kube::Client,
    owner: &'a Owner,
    /// Each object's version as read, then as written.
    versions: HashMap<(ObjectKind, Key), String>,
}

impl<'a> StepWriter<'a> {
    pub(crate) fn new(client: &'a kube::Client, owner: &'a Owner) -> Self {
        Self {
            client,
            owner,
            versions: HashMap::new(),
        }
    }

    /// Notes the version the pass read of the `kind` at `key` (none: absent).
    pub(crate) fn read(&mut self, kind: ObjectKind, key: Key, version: Option<String>) {
        match version {
            Some(version) => self.versions.insert((kind, key), version),
            None => self.versions.remove(&(kind, key)),
        };
    }

    /// Carries out `steps` in order, each as `step_of` says; `gate` answers [`Step::Gate`];
    /// `on_written` hears of each write made with the object's version before it (none:
    /// created) and after. Stops at the first conflict, closed gate or failure.
    pub(crate) async fn apply<S, G, Fut>(
        &mut self,
        steps: &[S],
        step_of: impl Fn(&S) -> Step,
        mut gate: G,
        mut on_written: impl FnMut(&S, Option<String>, &str),
    ) -> Result<Applied, Failed>
    where
        G: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        for (written, planned) in steps.iter().enumerate() {
            let step = step_of(planned);
            if matches!(step, Step::Gate) {
                if !gate().await {
                    return Ok(Applied::Gated { written });
                }
                continue;
            }
            let before = (step.object())
                .and_then(|(kind, key)| self.versions.get(&(kind, key.clone())).cloned());
            match self.write(&step, before.as_deref()).await {
                Ok(Written::Done(after)) => {
                    on_written(planned, before, &after);
                    match step.object() {
                        Some((kind, key)) if !matches!(step, Step::DeleteSecret { .. }) => {
                            self.versions.insert((kind, key.clone()), after);
                        }
                        Some((kind, key)) => {
                            self.versions.remove(&(kind, key.clone()));
                        }
                        None => {}
                    }
                }
                Ok(Written::Conflict) => return Ok(Applied::Conflict { written }),
                Err(error) => return Err(Failed { written, error }),
            }
        }
        Ok(Applied::All)
    }

    async fn write(&self, step: &Step, version: Option<&str>) -> Result<Written, Error> {
        let (client, owner) = (self.client, self.owner);
        match step {
            Step::TlsSecret {
                key,
                data,
                annotations,
            } => write::write_secret(client, owner, key, version, data, annotations).await,
            Step::ConfigMap {
                key,
                data,
                annotations,
            } => write::write_config_map(client, owner, key, version, data, annotations).await,
            Step::OpaqueSecret {
                key,
                data,
                stored,
                annotations,
            } => {
                let written = (data, stored.as_slice(), annotations);
                write::write_opaque_secret(client, owner, key, version, written).await
            }
            Step::ReplacedConfigMap { key, data, stored } => {
                write::write_replaced_config_map(client, owner, key, version, (data, stored)).await
            }
            Step::DeleteSecret { key } => delete_secret(client, key, version).await,
            Step::Gate => Ok(Written::Done(String::new())),
        }
    }
}

/// The gate of writes that have none: they always go ahead.
pub(crate) async fn no_gate() -> bool {
    true
}

/// Deletes the Secret `key` at `version` (any version when none was read); gone already is
/// done, changed since is a conflict.
async fn delete_secret(
    client: &kube::Client,
    key: &Key,
    version: Option<&str>,
) -> Result<Written, Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: version.map(str::to_string),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &key.0);
    match secrets.delete(&key.1, &params).await {
        Ok(_) => Ok(Written::Done(String::new())),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Written::Done(String::new())),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Written::Conflict),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;

    use super::*;

    fn tls(key: &Key, value: &'static str) -> Step {
        let mut data = KeyChanges::default();
        data.set("tls.crt", value);
        Step::TlsSecret {
            key: key.clone(),
            data,
            annotations: AnnotationChanges::default(),
        }
    }

    fn bundle(key: &Key) -> Step {
        Step::ConfigMap {
            key: key.clone(),
            data: BTreeMap::from([("ca-bundle.crt", "b".to_string())]),
            annotations: AnnotationChanges::default(),
        }
    }

    /// The steps go in order, each on the version the one before it left; the first conflict
    /// or closed gate ends them, and nothing after it is written.
    #[tokio::test]
    async fn steps_stop_at_the_first_conflict_or_closed_gate() {
        let server = caretaker_apiserver::TestServer::start().await;
        let client = server.client();
        let owner = Owner::new("CertificateAuthority", None, "ca", "u1");
        let (secret, config_map) = (
            ("default".to_string(), "ca".to_string()),
            ("default".to_string(), "bundle".to_string()),
        );
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

        // Created, then patched on the version the create left.
        let mut writer = StepWriter::new(&client, &owner);
        let steps = ["one", "two"];
        let mut seen = Vec::new();
        let written = |_: &&str, before, after: &str| seen.push((before, after.to_string()));
        let applied = (writer.apply(&steps, |v| tls(&secret, v), no_gate, written))
            .await
            .unwrap();
        assert_eq!(applied, Applied::All);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, None, "created");
        assert_eq!(
            seen[1].0.as_deref(),
            Some(seen[0].1.as_str()),
            "on the version it left"
        );
        let stored = secrets.get("ca").await.unwrap();
        assert_eq!(
            stored.resource_version().as_deref(),
            Some(seen[1].1.as_str())
        );

        // A version that is no longer the stored one: a conflict, and the ConfigMap after it
        // is not written.
        let mut stale = StepWriter::new(&client, &owner);
        stale.read(ObjectKind::Secret, secret.clone(), Some(seen[0].1.clone()));
        let steps = [0, 1];
        let step_of = |i: &usize| match i {
            0 => tls(&secret, "three"),
            _ => bundle(&config_map),
        };
        let applied = stale.apply(&steps, step_of, no_gate, |_, _, _| {}).await;
        assert_eq!(applied.unwrap(), Applied::Conflict { written: 0 });
        assert!(config_maps.get_opt("bundle").await.unwrap().is_none());

        // A closed gate: what is before it is written, nothing after.
        let mut gated = StepWriter::new(&client, &owner);
        gated.read(
            ObjectKind::Secret,
            secret.clone(),
            stored.resource_version(),
        );
        let steps = [0, 1, 2];
        let step_of = |i: &usize| match i {
            0 => tls(&secret, "four"),
            1 => Step::Gate,
            _ => bundle(&config_map),
        };
        let closed = || async { false };
        let applied = gated.apply(&steps, step_of, closed, |_, _, _| {}).await;
        assert_eq!(applied.unwrap(), Applied::Gated { written: 1 });
        let data = secrets.get("ca").await.unwrap().data.unwrap();
        assert_eq!(data["tls.crt"].0, b"four");
        assert!(config_maps.get_opt("bundle").await.unwrap().is_none());
    }
}
