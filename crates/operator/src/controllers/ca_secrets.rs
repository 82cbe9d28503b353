//! Keeps the cached cluster credentials honest: when a cluster's CA Secret (`<cluster>-ca`,
//! `-etcd` or `-proxy`) changes or goes away, that cluster's credentials are dropped, so the
//! next signing reads the CA as it is now rather than as it was when first loaded.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};

use crate::context::Context;
use crate::credentials::cluster_of_ca_secret;

/// Watches `secrets` until the stream ends. Every Secret is looked at, not only those with
/// Cluster API's labels: a CA Secret written by hand must not be missed. Only names matter
/// here, so the watch is of metadata: no Secret's data crosses the wire for it (a CA rotation
/// over 10,000 certificates writes each of their Secrets).
pub async fn run(ctx: Arc<Context>, secrets: Api<PartialObjectMeta<Secret>>) {
    let events = watcher(secrets, watcher::Config::default()).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            // Also after a (re)list: a change missed while the watch was down is caught here.
            Ok(
                watcher::Event::Apply(secret)
                | watcher::Event::InitApply(secret)
                | watcher::Event::Delete(secret),
            ) => forget_if_ca(&ctx, &secret).await,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => tracing::warn!(error = %e, "watching Secrets for CA changes"),
        }
    }
}

async fn forget_if_ca(ctx: &Context, secret: &PartialObjectMeta<Secret>) {
    let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else {
        return;
    };
    if let Some(cluster) = cluster_of_ca_secret(name)
        && ctx.credentials.forget(namespace, cluster).await
    {
        tracing::info!(%namespace, secret = %name, "a cluster CA Secret changed; its credentials are reloaded on next use");
    }
}
