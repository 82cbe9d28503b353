//! Watch semantics, with kube-rs's watcher and Controller as the clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use caretaker_apiserver::{ApiServer, TestServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

mod common;
use common::RawHttp;

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": value}})).unwrap()
}

/// Collects (type, name, data.v) from a watcher until `done` says stop.
async fn observe(
    stream: impl futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>>,
    mut done: impl FnMut(&[(String, String, String)]) -> bool,
) -> Vec<(String, String, String)> {
    let mut seen = Vec::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("watch stalled")
    {
        let Ok(event) = event else { continue };
        let (kind, obj) = match event {
            Event::Apply(o) | Event::InitApply(o) => ("apply", o),
            Event::Delete(o) => ("delete", o),
            Event::Init | Event::InitDone => continue,
        };
        let v = obj
            .data
            .as_ref()
            .and_then(|d| d.get("v").cloned())
            .unwrap_or_default();
        seen.push((kind.to_string(), obj.metadata.name.unwrap_or_default(), v));
        if done(&seen) {
            break;
        }
    }
    seen
}

#[tokio::test]
async fn watcher_sees_every_change_in_order() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let stream = watcher::watcher(cms.clone(), watcher::Config::default());
    let writer = tokio::spawn({
        let cms = cms.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for i in 0..20 {
                cms.create(&PostParams::default(), &cm(&format!("c{i}"), "1"))
                    .await
                    .unwrap();
            }
            let mut c = cms.get("c3").await.unwrap();
            c.data = Some([("v".to_string(), "2".to_string())].into());
            cms.replace("c3", &PostParams::default(), &c).await.unwrap();
            cms.delete("c7", &DeleteParams::default()).await.unwrap();
        }
    });
    let seen = observe(stream, |s| {
        s.iter().any(|(k, n, _)| k == "delete" && n == "c7")
    })
    .await;
    writer.await.unwrap();
    let applied: Vec<_> = seen
        .iter()
        .filter(|(k, _, v)| k == "apply" && v == "1")
        .map(|(_, n, _)| n.clone())
        .collect();
    assert_eq!(
        applied,
        (0..20).map(|i| format!("c{i}")).collect::<Vec<_>>()
    );
    assert!(seen.contains(&("apply".into(), "c3".into(), "2".into())));
}

#[tokio::test]
async fn watch_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = ApiServer::builder()
        .data_dir(dir.path())
        .start()
        .await
        .unwrap();
    let addr = first.addr();
    let client = first.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let before = cms
        .create(&PostParams::default(), &cm("before", "1"))
        .await
        .unwrap();
    let rv_before = before.metadata.resource_version.unwrap();

    let stream = watcher::watcher(cms.clone(), watcher::Config::default());
    let observer = tokio::spawn(observe(stream, |s| s.iter().any(|(_, n, _)| n == "after")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A change after rv_before that only the first server's change log records: a resumed watch
    // can only report it if that log survived the restart.
    let mut changed = cms.get("before").await.unwrap();
    changed.data = Some([("v".to_string(), "1b".to_string())].into());
    cms.replace("before", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv_at_shutdown = first.resource_version();
    first.shutdown().await;

    // Same data directory, same address: objects and the resourceVersion sequence carry on.
    let second = ApiServer::builder()
        .data_dir(dir.path())
        .listen(addr)
        .start()
        .await
        .unwrap();
    assert_eq!(second.resource_version(), rv_at_shutdown);
    let cms2: Api<ConfigMap> = Api::namespaced(second.client(), "default");
    assert_eq!(cms2.get("before").await.unwrap().data.unwrap()["v"], "1b");
    cms2.create(&PostParams::default(), &cm("after", "2"))
        .await
        .unwrap();

    // kube-rs's watcher recovers, but it may do so by re-listing, which proves nothing about
    // resuming; it only shows that a client carries on.
    let seen = tokio::time::timeout(Duration::from_secs(30), observer)
        .await
        .expect("watcher recovered")
        .unwrap();
    assert!(seen.contains(&("apply".into(), "after".into(), "2".into())));

    // The resume itself: a raw watch from the first server's resourceVersion gets exactly the
    // changes after it, in order, from both sides of the restart, and nothing from before it.
    let path = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv_before}&timeoutSeconds=1"
    );
    let events: Vec<(String, String, String)> = RawHttp::new(second.url())
        .stream_lines(&path)
        .await
        .iter()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            let field = |p: &str| {
                e.pointer(p)
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            (
                field("/type"),
                field("/object/metadata/name"),
                field("/object/data/v"),
            )
        })
        .collect();
    assert_eq!(
        events,
        [("MODIFIED", "before", "1b"), ("ADDED", "after", "2")].map(|(t, n, v)| (
            t.to_string(),
            n.to_string(),
            v.to_string()
        ))
    );
}

/// Raw watch requests: resume from a resourceVersion, bookmarks, timeout and 410.
#[tokio::test]
async fn raw_watch_protocol() {
    let server = ApiServer::builder()
        .watch_history(10)
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = cms
        .create(&PostParams::default(), &cm("w0", "0"))
        .await
        .unwrap();
    let rv0 = first.metadata.resource_version.unwrap();
    cms.create(&PostParams::default(), &cm("w1", "1"))
        .await
        .unwrap();

    // Resume after rv0: only w1, then a bookmark, then the stream ends at timeoutSeconds.
    let http = RawHttp::new(server.url());
    let lines = http
        .stream_lines(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv0}&allowWatchBookmarks=true&timeoutSeconds=1"
        ))
        .await;
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "w1");
    assert!(events.iter().any(|e| e["type"] == "BOOKMARK"), "{events:?}");

    // Push the start out of the retained history: 410 Expired as a watch event.
    for i in 0..1000 {
        cms.create(&PostParams::default(), &cm(&format!("x{i}"), "x"))
            .await
            .unwrap();
    }
    let lines = http
        .stream_lines(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv0}"
        ))
        .await;
    let event: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
}

#[tokio::test]
async fn controller_reconciles_and_recovers_from_conflicts() {
    let server = TestServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    struct Ctx {
        api: Api<ConfigMap>,
        conflicts: AtomicUsize,
        interfered: AtomicUsize,
    }
    #[derive(Debug, thiserror::Error)]
    #[error(transparent)]
    struct ReconcileError(#[from] kube::Error);

    async fn reconcile(obj: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
        let name = obj.metadata.name.clone().unwrap();
        let v = obj
            .data
            .as_ref()
            .and_then(|d| d.get("v").cloned())
            .unwrap_or_default();
        if obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("seen"))
            == Some(&v)
        {
            return Ok(Action::await_change());
        }
        // The first time, someone else writes between our read and our write: a real 409.
        if ctx.interfered.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut other = ctx.api.get(&name).await?;
            other.metadata.labels = Some([("touched".to_string(), "yes".to_string())].into());
            ctx.api
                .replace(&name, &PostParams::default(), &other)
                .await?;
        }
        let mut mine = (*obj).clone();
        mine.metadata.managed_fields = None;
        mine.metadata
            .annotations
            .get_or_insert_default()
            .insert("seen".into(), v);
        match ctx.api.replace(&name, &PostParams::default(), &mine).await {
            Err(kube::Error::Api(s)) if s.code == 409 => {
                ctx.conflicts.fetch_add(1, Ordering::SeqCst);
                Err(ReconcileError(kube::Error::Api(s)))
            }
            other => other.map(|_| Action::await_change()).map_err(Into::into),
        }
    }
    fn error_policy(_: Arc<ConfigMap>, _: &ReconcileError, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_millis(50))
    }

    cms.create(&PostParams::default(), &cm("target", "1"))
        .await
        .unwrap();
    let ctx = Arc::new(Ctx {
        api: cms.clone(),
        conflicts: AtomicUsize::new(0),
        interfered: AtomicUsize::new(0),
    });
    let controller = tokio::spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| async {}),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = cms.get("target").await.unwrap();
        if c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("seen"))
            .map(String::as_str)
            == Some("1")
        {
            assert_eq!(c.metadata.labels.unwrap()["touched"], "yes");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller never converged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A change is seen and reconciled too.
    let mut c = cms.get("target").await.unwrap();
    c.data = Some([("v".to_string(), "2".to_string())].into());
    cms.replace("target", &PostParams::default(), &c)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while cms
        .get("target")
        .await
        .unwrap()
        .metadata
        .annotations
        .and_then(|a| a.get("seen").cloned())
        .as_deref()
        != Some("2")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change was never reconciled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ctx.conflicts.load(Ordering::SeqCst) >= 1,
        "the interfering write must have caused a 409"
    );
    controller.abort();
}

#[tokio::test]
async fn label_selected_watch_sees_objects_enter_and_leave() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let stream = watcher::watcher(cms.clone(), watcher::Config::default().labels("team=a"));
    let writer = tokio::spawn({
        let cms = cms.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut c = cms
                .create(&PostParams::default(), &cm("moving", "1"))
                .await
                .unwrap();
            c.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
            let mut c = cms
                .replace("moving", &PostParams::default(), &c)
                .await
                .unwrap();
            c.metadata.labels = Some([("team".to_string(), "b".to_string())].into());
            cms.replace("moving", &PostParams::default(), &c)
                .await
                .unwrap();
        }
    });
    let seen = observe(stream, |s| s.iter().any(|(k, _, _)| k == "delete")).await;
    writer.await.unwrap();
    assert_eq!(
        seen,
        vec![
            ("apply".to_string(), "moving".to_string(), "1".to_string()),
            ("delete".to_string(), "moving".to_string(), "1".to_string())
        ]
    );
}

#[tokio::test]
async fn streaming_list_watch() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..3 {
        cms.create(&PostParams::default(), &cm(&format!("s{i}"), "1"))
            .await
            .unwrap();
    }
    // sendInitialEvents=true: initial objects as ADDED, then a bookmark marking their end.
    let stream = watcher::watcher(cms.clone(), watcher::Config::default().streaming_lists());
    let mut stream = std::pin::pin!(stream);
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("stalled")
            .unwrap()
            .unwrap()
        {
            // The namespace's kube-root-ca.crt aside.
            Event::InitApply(o) if o.metadata.name.as_deref() != Some("kube-root-ca.crt") => {
                initial.push(o.metadata.name.unwrap())
            }
            Event::InitDone => break,
            _ => {}
        }
    }
    initial.sort();
    assert_eq!(initial, vec!["s0", "s1", "s2"]);
    cms.create(&PostParams::default(), &cm("later", "2"))
        .await
        .unwrap();
    loop {
        if let Event::Apply(o) = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("stalled")
            .unwrap()
            .unwrap()
        {
            assert_eq!(o.metadata.name.as_deref(), Some("later"));
            break;
        }
    }
}
