//! Per-Machine in-place upgrades end to end, with real agents running real upgrade scripts.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_agent_api::upgrade::UpgradeRequest;
use caretaker_api::names::{self, upgrade_state};
use caretaker_operator::Context;
use common::unanswering::{Unanswering, assert_three_backed_off_attempts, three_attempts};
use common::{World, fast, world};

const TO: &str = names::IN_PLACE_UPGRADE_TO;
const STATUS: &str = names::IN_PLACE_UPGRADE_STATUS;

/// An upgrade script: appends the release to `release` beside it after `seconds`, unless
/// `fail-upgrade` exists beside it. It records its own pid in `script.pid` and that of the
/// child it waits for in `child.pid`, so a test can tell whether they were stopped.
fn script(dir: &Path, seconds: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("upgrade.sh");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nhere=$(dirname \"$0\")\nif [ -e \"$here/fail-upgrade\" ]; then echo \"upgrade to $1 failed: fail-upgrade exists\" >&2; exit 3; fi\necho \"upgrading to $1\"\necho $$ > \"$here/script.pid\"\nsleep {seconds} &\necho $! > \"$here/child.pid\"\nwait\necho \"$1\" >> \"$here/release\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The pid a script recorded in `file`, once it has been written in full.
async fn recorded_pid(file: &Path) -> i32 {
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(file)
            && text.ends_with('\n')
        {
            return text.trim().parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} was never written", file.display());
}

/// Whether process `pid` exits within a moment (after its kill), waited for off the runtime.
async fn has_exited(pid: i32) -> bool {
    tokio::task::spawn_blocking(move || caretaker_testkit::process::exits_soon(pid))
        .await
        .unwrap()
}

async fn machine_with_script(world: &mut World, name: &str, seconds: &str) -> PathBuf {
    let hooks = world.dir.path().join(format!("{name}-hooks"));
    let path = script(&hooks, seconds);
    let command = CommandTemplate::parse(path.to_str().unwrap()).unwrap();
    world.add_upgradable(name, NodeRole::Worker, command).await;
    hooks
}

async fn warning_containing(world: &World, name: &str, reason: &str, needle: &str) -> String {
    for _ in 0..100 {
        for event in world.events(name).await {
            let message = event.message.clone().unwrap_or_default();
            if event.reason.as_deref() == Some(reason) && message.contains(needle) {
                assert_eq!(event.type_.as_deref(), Some("Warning"));
                return message;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no {reason} event containing {needle:?}: {:?}",
        world.events(name).await
    );
}

async fn wait_for_change_id(world: &World, name: &str) -> String {
    for _ in 0..200 {
        if let Some(id) = world
            .annotations(name)
            .await
            .get(names::IN_PLACE_UPGRADE_CHANGE_ID)
        {
            return id.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never got a change id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_succeeds_and_records_the_release() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "0.2").await;
    world.annotate("m-0", TO, "channel=1.33/stable").await;
    let annotations = world.wait_for("m-0", STATUS, names::STATUS_DONE).await;
    assert_eq!(
        annotations[names::IN_PLACE_UPGRADE_RELEASE],
        "channel=1.33/stable"
    );
    assert!(!annotations.contains_key(TO), "the trigger is removed");
    assert!(annotations.contains_key(names::IN_PLACE_UPGRADE_CHANGE_ID));
    for key in names::upgrade_state::ALL {
        assert!(!annotations.contains_key(key), "{key} left behind");
    }
    assert_eq!(
        std::fs::read_to_string(hooks.join("release")).unwrap(),
        "channel=1.33/stable\n",
        "ran exactly once"
    );
    world
        .event_with("m-0", names::EVENT_UPGRADE_IN_PROGRESS)
        .await;
    let done = world.event_with("m-0", names::EVENT_UPGRADE_DONE).await;
    assert!(done.message.unwrap().contains("channel=1.33/stable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upgrade_ends_failed_with_the_reason() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "0").await;
    std::fs::write(hooks.join("fail-upgrade"), "").unwrap();
    world.annotate("m-0", TO, "revision=42").await;
    let annotations = world.wait_for("m-0", STATUS, names::STATUS_FAILED).await;
    assert!(annotations.contains_key(names::IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT));
    assert!(!annotations.contains_key(names::IN_PLACE_UPGRADE_RELEASE));
    warning_containing(
        &world,
        "m-0",
        names::EVENT_UPGRADE_FAILED,
        "fail-upgrade exists",
    )
    .await;
    assert!(!hooks.join("release").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_option_fails_at_once_listing_the_forms() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "0").await;
    world.annotate("m-0", TO, "1.33").await;
    world.wait_for("m-0", STATUS, names::STATUS_FAILED).await;
    let message = warning_containing(&world, "m-0", names::EVENT_UPGRADE_FAILED, "\"1.33\"").await;
    assert!(
        message.contains("channel=<channel>") && message.contains("localPath="),
        "{message}"
    );

    // Values that once reached the hook: each fails at once, its event naming it (escaped).
    let overlong = format!("localPath=/opt/{}.snap", "a".repeat(300));
    for value in [
        "channel=$(id)",
        "channel=--classic",
        "channel=1.33/stable\u{202e}",
        "channel=1.33/st\u{e4}ble",
        "revision=..",
        "localPath=/../../etc/shadow",
        overlong.as_str(),
    ] {
        world.annotate("m-0", TO, value).await;
        let annotations = world
            .wait_for("m-0", names::upgrade_state::TRIGGER, value)
            .await;
        assert_eq!(annotations[STATUS], names::STATUS_FAILED, "{value:?}");
        let refusal = caretaker_agent_api::upgrade::ReleaseOption::parse(value)
            .unwrap_err()
            .to_string();
        let message =
            warning_containing(&world, "m-0", names::EVENT_UPGRADE_FAILED, &refusal).await;
        if value.is_ascii() && value.len() < 80 {
            assert!(message.contains(&format!("{value:?}")), "{message}");
        }
        assert!(message.is_ascii(), "{message}");
    }
    assert!(
        !world.dir.path().join("m-0/state/operations").exists(),
        "nothing was sent to the node"
    );
    assert!(!hooks.join("release").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_trigger_cancels_a_running_upgrade() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "30").await;
    world.annotate("m-0", TO, "channel=1.34/stable").await;
    wait_for_change_id(&world, "m-0").await;
    // Both are running before the trigger goes.
    let script = recorded_pid(&hooks.join("script.pid")).await;
    let child = recorded_pid(&hooks.join("child.pid")).await;
    let body = serde_json::json!({ "metadata": { "annotations": { TO: null } } });
    world
        .machines()
        .patch("m-0", &Default::default(), &kube::api::Patch::Merge(&body))
        .await
        .unwrap();
    world.wait_for("m-0", STATUS, names::STATUS_CANCELLED).await;
    world
        .event_with("m-0", names::EVENT_UPGRADE_CANCELLED)
        .await;
    assert!(has_exited(script).await, "the upgrade script was stopped");
    assert!(has_exited(child).await, "the script's child was stopped");
    assert!(!hooks.join("release").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_follows_the_same_operation() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "1.5").await;
    world.annotate("m-0", TO, "revision=7").await;
    let change_id = wait_for_change_id(&world, "m-0").await;
    world.controller.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let ctx = Context::new(world.client.clone(), fast());
    world.controller = tokio::spawn(common::run_controllers(ctx));
    let annotations = world.wait_for("m-0", STATUS, names::STATUS_DONE).await;
    assert_eq!(annotations[names::IN_PLACE_UPGRADE_CHANGE_ID], change_id);
    assert_eq!(annotations[names::IN_PLACE_UPGRADE_RELEASE], "revision=7");
    assert_eq!(
        std::fs::read_to_string(hooks.join("release")).unwrap(),
        "revision=7\n",
        "ran exactly once"
    );
    let operations = std::fs::read_dir(world.dir.path().join("m-0/state/operations"))
        .unwrap()
        .count();
    assert_eq!(operations, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_before_recording_the_change_id_starts_no_second_upgrade() {
    let mut world = world(fast()).await;
    let hooks = machine_with_script(&mut world, "m-0", "0.5").await;
    world.controller.abort();
    // What the operator had written when it died: the request marked in progress, with its
    // request id, and no change id; the agent had been asked and had started the upgrade.
    for (key, value) in [
        (upgrade_state::TRIGGER, "revision=9"),
        (upgrade_state::REQUEST_ID, "u-killed"),
        (upgrade_state::ATTEMPTS, "0"),
        (STATUS, names::STATUS_IN_PROGRESS),
        (TO, "revision=9"),
    ] {
        world.annotate("m-0", key, value).await;
    }
    let started = world
        .operator_client("node-m-0")
        .start_upgrade(
            &world.agents[0].url,
            &UpgradeRequest {
                release: "revision=9".into(),
                request_id: Some("u-killed".into()),
            },
        )
        .await
        .unwrap();

    let ctx = Context::new(world.client.clone(), fast());
    world.controller = tokio::spawn(common::run_controllers(ctx));
    let annotations = world.wait_for("m-0", STATUS, names::STATUS_DONE).await;
    assert_eq!(
        annotations[names::IN_PLACE_UPGRADE_CHANGE_ID],
        started.id,
        "the operation the dead operator started"
    );
    assert_eq!(
        std::fs::read_to_string(hooks.join("release")).unwrap(),
        "revision=9\n",
        "the upgrade ran once"
    );
    let operations = std::fs::read_dir(world.dir.path().join("m-0/state/operations"))
        .unwrap()
        .count();
    assert_eq!(operations, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_is_asked_once_per_attempt_with_a_growing_backoff() {
    let mut world = world(three_attempts()).await;
    let agent = Unanswering::start(&world.cas, "node-m-0").await;
    world
        .add_machine("m-0", NodeRole::Worker, "cp.example", Some(&agent.url))
        .await;
    world.annotate("m-0", TO, "revision=5").await;
    world.wait_for("m-0", STATUS, names::STATUS_FAILED).await;

    // Counted at the agent, not read from the operator's message.
    let starts = agent.requests("POST /v1/upgrades");
    assert_three_backed_off_attempts(&starts);
    warning_containing(
        &world,
        "m-0",
        names::EVENT_UPGRADE_FAILED,
        "gave up after 3 attempts",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_asked_for_while_another_runs_on_the_node_waits_for_it() {
    let mut world = world(fast()).await;
    // Revision 1 runs until the test creates `go`; any other release at once.
    let hooks = world.dir.path().join("m-0-hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let path = hooks.join("upgrade.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\nhere=$(dirname \"$0\")\nif [ \"$1\" = revision=1 ]; then while [ ! -e \"$here/go\" ]; do sleep 0.05; done; fi\necho \"$1\" >> \"$here/release\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Lets revision 1 end however the test ends: a hook still running would keep the
    // runtime (which waits for the hook's thread) from shutting down after a failure.
    let _go = LetGo(hooks.join("go"));
    let command = CommandTemplate::parse(path.to_str().unwrap()).unwrap();
    world.add_upgradable("m-0", NodeRole::Worker, command).await;
    // Someone else's upgrade holds the node.
    let other = world
        .operator_client("node-m-0")
        .start_upgrade(
            &world.agents[0].url,
            &UpgradeRequest {
                release: "revision=1".into(),
                request_id: Some("someone-else".into()),
            },
        )
        .await
        .unwrap();

    world.annotate("m-0", TO, "revision=2").await;
    let waiting = wait_for_annotation(&world, "m-0", upgrade_state::LAST_ERROR, "waiting:").await;
    assert!(
        waiting[upgrade_state::LAST_ERROR].contains(&other.id),
        "{waiting:?}"
    );
    assert_eq!(waiting[STATUS], names::STATUS_IN_PROGRESS);
    assert_eq!(
        waiting[upgrade_state::ATTEMPTS],
        "0",
        "waiting uses no attempt"
    );

    std::fs::write(hooks.join("go"), "").unwrap();
    let done = world.wait_for("m-0", STATUS, names::STATUS_DONE).await;
    assert_eq!(done[names::IN_PLACE_UPGRADE_RELEASE], "revision=2");
    assert_eq!(
        std::fs::read_to_string(hooks.join("release")).unwrap(),
        "revision=1\nrevision=2\n",
        "ours ran after the other, once"
    );
    assert!(
        world
            .events("m-0")
            .await
            .iter()
            .all(|e| e.reason.as_deref() != Some(names::EVENT_UPGRADE_FAILED)),
        "waiting for the node is no failure"
    );
}

/// Creates the file that lets a gated upgrade script end, when dropped.
struct LetGo(PathBuf);

impl Drop for LetGo {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

/// Waits until annotation `key` of Machine `name` contains `needle`.
async fn wait_for_annotation(
    world: &World,
    name: &str,
    key: &str,
    needle: &str,
) -> std::collections::BTreeMap<String, String> {
    for _ in 0..200 {
        let annotations = world.annotations(name).await;
        if annotations.get(key).is_some_and(|v| v.contains(needle)) {
            return annotations;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{name}: {key} never contained {needle:?}: {:?}",
        world.annotations(name).await
    );
}
