//! Per-Machine certificate refresh end to end: the embedded API server with the real Cluster
//! API CRDs, real agents on loopback with kubeadm-layout nodes in temp directories, and the
//! controller.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_operator::Context;
use common::unanswering::{Unanswering, assert_three_backed_off_attempts, three_attempts};
use common::{World, fast, unreachable_agent_url, world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_and_worker_machines_are_refreshed() {
    let mut world = world(fast()).await;
    let cp = world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    let worker = world
        .add_machine("worker-0", NodeRole::Worker, "cp.example", None)
        .await;

    // The expiry is filled in for Machines that were never refreshed.
    for name in ["cp-0", "worker-0"] {
        let mut found = None;
        for _ in 0..200 {
            found = world
                .annotations(name)
                .await
                .get(names::CERTIFICATES_EXPIRY)
                .cloned();
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(found.is_some(), "{name} has no expiry annotation");
    }
    let before = caretaker_agent::inventory::discover(&cp);

    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world
        .annotate("worker-0", names::REFRESH_CERTIFICATES, "90d")
        .await;
    for (name, layout, min_days) in [("cp-0", &cp, 360), ("worker-0", &worker, 85)] {
        let annotations = world.wait_status(name, names::STATUS_DONE).await;
        assert!(
            !annotations.contains_key(names::REFRESH_CERTIFICATES),
            "the trigger is removed"
        );
        let inventory = caretaker_agent::inventory::discover(layout);
        let expiry = annotations[names::CERTIFICATES_EXPIRY].clone();
        assert_eq!(
            Some(expiry),
            inventory
                .earliest_expiry()
                .map(caretaker_operator::machine::refresh::format_time),
            "{name}: the annotation is the earliest new notAfter"
        );
        for entry in &inventory.certificates {
            let days = (entry.certificate.not_after - time::OffsetDateTime::now_utc()).whole_days();
            assert!(
                days >= min_days,
                "{name} {} expires in {days} days",
                entry.name
            );
        }
        for key in names::refresh_state::ALL {
            assert!(!annotations.contains_key(key), "{name}: {key} left behind");
        }
        let in_progress = world
            .event_with(name, names::EVENT_REFRESH_IN_PROGRESS)
            .await;
        let done = world.event_with(name, names::EVENT_REFRESH_DONE).await;
        // Machine events leave through a queue of their own, in the order they happened.
        assert!(
            in_progress.event_time < done.event_time,
            "{name}: {:?} then {:?}",
            in_progress.event_time,
            done.event_time
        );
        assert!(done.message.unwrap_or_default().contains("expire at"));
    }
    let after = caretaker_agent::inventory::discover(&cp);
    for (old, new) in before.certificates.iter().zip(&after.certificates) {
        assert_eq!(old.certificate.subject, new.certificate.subject);
        assert_eq!(old.certificate.dns_names, new.certificate.dns_names);
        assert_eq!(
            old.certificate.issuer, new.certificate.issuer,
            "{}: signed by the right CA",
            old.name
        );
    }
    world.server.url();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_triggers_fail_at_once_and_nothing_reaches_the_node() {
    let mut world = world(fast()).await;
    let layout = world
        .add_machine("m-0", NodeRole::Worker, "cp.example", None)
        .await;
    let before = caretaker_agent::inventory::discover(&layout);

    for (value, needle) in [
        ("1 year", "\"1 year\""),
        ("-5d", "\"-5d\""),
        ("20y", "cluster CA's own expiry"),
    ] {
        world
            .annotate("m-0", names::REFRESH_CERTIFICATES, value)
            .await;
        let annotations = world.wait_status("m-0", names::STATUS_FAILED).await;
        assert_eq!(annotations[names::REFRESH_CERTIFICATES], value);
        let mut message = String::new();
        for _ in 0..100 {
            let events = world.events("m-0").await;
            if let Some(e) = events.iter().find(|e| {
                e.reason.as_deref() == Some(names::EVENT_REFRESH_FAILED)
                    && e.message.as_deref().unwrap_or_default().contains(needle)
            }) {
                assert_eq!(e.type_.as_deref(), Some("Warning"));
                message = e.message.clone().unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !message.is_empty(),
            "no Warning event naming {needle}: {:?}",
            world.events("m-0").await
        );
    }
    assert_eq!(
        caretaker_agent::inventory::discover(&layout),
        before,
        "nothing changed on the node"
    );
    assert_eq!(world.staged_plans("m-0"), 0, "no plan was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_asking_for_a_foreign_san_is_refused_and_nothing_is_signed() {
    let mut world = world(fast()).await;
    // This node's apiserver certificate names a host the Cluster does not have.
    let layout = world
        .add_machine("cp-0", NodeRole::ControlPlane, "evil.example", None)
        .await;
    let before = caretaker_agent::inventory::discover(&layout);
    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("cp-0", names::STATUS_FAILED).await;
    let event = world.event_with("cp-0", names::EVENT_REFRESH_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(message.contains("evil.example"), "{message}");
    assert_eq!(caretaker_agent::inventory::discover(&layout), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agent_is_retried_then_the_refresh_fails() {
    let mut world = world(fast()).await;
    world
        .add_machine(
            "m-0",
            NodeRole::Worker,
            "cp.example",
            Some(&unreachable_agent_url()),
        )
        .await;
    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("m-0", names::STATUS_FAILED).await;
    let event = world.event_with("m-0", names::EVENT_REFRESH_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("gave up after 2 attempts") && message.contains("cannot connect"),
        "{message}"
    );
}

/// `kubectl annotate --overwrite` with an unchanged value changes nothing, so a failed request
/// is retried by removing the trigger and adding the same value again: a new request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_trigger_removed_and_added_again_retries_a_failed_refresh() {
    let mut world = world(fast()).await;
    let layout = world
        .add_machine(
            "m-0",
            NodeRole::Worker,
            "cp.example",
            Some(&unreachable_agent_url()),
        )
        .await;
    let before = caretaker_agent::inventory::discover(&layout);
    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("m-0", names::STATUS_FAILED).await;

    // The cause fixed, the trigger removed: the operator forgets the failed request's value ...
    world
        .annotate("m-0", names::AGENT_ENDPOINT, &world.agents[0].url)
        .await;
    world
        .remove_annotation("m-0", names::REFRESH_CERTIFICATES)
        .await;
    let forgotten = world.wait_gone("m-0", names::refresh_state::TRIGGER).await;
    assert_eq!(
        forgotten[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_FAILED,
        "the failure stays visible until the next request"
    );
    assert_eq!(caretaker_agent::inventory::discover(&layout), before);

    // ... so the same value set again is a new request, carried out.
    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    let done = world.wait_status("m-0", names::STATUS_DONE).await;
    assert!(!done.contains_key(names::REFRESH_CERTIFICATES));
    let expiry = caretaker_agent::inventory::discover(&layout)
        .earliest_expiry()
        .unwrap();
    let days = (expiry - time::OffsetDateTime::now_utc()).whole_days();
    assert!(days > 300, "refreshed with 1y: {days} days");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_is_asked_once_per_attempt_with_a_growing_backoff() {
    let mut world = world(three_attempts()).await;
    let agent = Unanswering::start(&world.cas, "node-m-0").await;
    world
        .add_machine("m-0", NodeRole::Worker, "cp.example", Some(&agent.url))
        .await;
    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("m-0", names::STATUS_FAILED).await;

    // Counted at the agent, not read from the operator's message.
    let plans = agent.requests("POST /v1/certificates/plan");
    assert_three_backed_off_attempts(&plans);
    let event = world.event_with("m-0", names::EVENT_REFRESH_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(message.contains("gave up after 3 attempts"), "{message}");
}

/// Plans and (optionally) applies a refresh of `node`'s agent at `url` directly, as an operator
/// that died right afterwards would have.
async fn refresh_behind_the_operators_back(
    world: &World,
    node: &str,
    url: &str,
    apply: bool,
) -> String {
    use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest};
    let agent = world.operator_client(node);
    let plan = agent.plan(url, &PlanRequest::default()).await.unwrap();
    if apply {
        let mut certificates = BTreeMap::new();
        for r in &plan.requests {
            let signed = world
                .cas
                .get(r.ca)
                .sign_request(&r.csr_pem, &r.exact_policy(), &"1y".parse().unwrap())
                .unwrap();
            certificates.insert(r.name.clone(), signed.certificate_pem);
        }
        agent
            .apply(
                url,
                &ApplyRequest {
                    plan_id: plan.plan_id.clone(),
                    certificates,
                },
            )
            .await
            .unwrap();
    }
    plan.plan_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_resumes_without_refreshing_twice() {
    let mut world = world(fast()).await;
    let applied_layout = world
        .add_machine("applied", NodeRole::Worker, "cp.example", None)
        .await;
    let staged_layout = world
        .add_machine("staged", NodeRole::Worker, "cp.example", None)
        .await;
    world.controller.abort();
    let before_staged = caretaker_agent::inventory::discover(&staged_layout);

    // One Machine's plan was applied, the other's only made, when the operator died.
    let applied_url = world.agents[0].url.clone();
    let staged_url = world.agents[1].url.clone();
    let applied_plan =
        refresh_behind_the_operators_back(&world, "node-applied", &applied_url, true).await;
    let staged_plan =
        refresh_behind_the_operators_back(&world, "node-staged", &staged_url, false).await;
    let after_apply = caretaker_agent::inventory::discover(&applied_layout);
    let started =
        caretaker_operator::machine::refresh::format_time(time::OffsetDateTime::now_utc());
    for (machine, plan) in [("applied", &applied_plan), ("staged", &staged_plan)] {
        for (key, value) in [
            (names::REFRESH_CERTIFICATES, "1y"),
            (
                names::REFRESH_CERTIFICATES_STATUS,
                names::STATUS_IN_PROGRESS,
            ),
            (names::refresh_state::TRIGGER, "1y"),
            (names::refresh_state::STARTED_AT, started.as_str()),
            (names::refresh_state::ATTEMPTS, "0"),
            (names::refresh_state::PLAN, plan.as_str()),
        ] {
            world.annotate(machine, key, value).await;
        }
    }

    let ctx = Context::new(world.client.clone(), fast());
    world.controller = tokio::spawn(common::run_controllers(ctx));
    let applied = world.wait_status("applied", names::STATUS_DONE).await;
    assert_eq!(
        caretaker_agent::inventory::discover(&applied_layout),
        after_apply,
        "not refreshed a second time"
    );
    assert_eq!(
        applied[names::CERTIFICATES_EXPIRY],
        caretaker_operator::machine::refresh::format_time(after_apply.earliest_expiry().unwrap())
    );

    world.wait_status("staged", names::STATUS_DONE).await;
    let staged_after = caretaker_agent::inventory::discover(&staged_layout);
    assert_ne!(staged_after, before_staged, "the staged plan was completed");
    assert!(
        world
            .dir
            .path()
            .join(format!("staged/state/applied/{staged_plan}.json"))
            .exists(),
        "with the same plan"
    );
    let applied_plans = std::fs::read_dir(world.dir.path().join("staged/state/applied"))
        .unwrap()
        .count();
    assert_eq!(applied_plans, 1, "and no second plan");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_agent_times_out_and_a_failing_one_is_retried_then_the_refresh_fails() {
    let settings = caretaker_operator::Settings {
        agent_timeout: Duration::from_millis(500),
        ..fast()
    };
    let mut world = world(settings).await;

    // Slow: accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("https://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    world
        .add_machine("slow", NodeRole::Worker, "cp.example", Some(&silent_url))
        .await;

    // Failing: a real agent whose state directory cannot be written answers 500.
    world
        .add_machine("failing", NodeRole::Worker, "cp.example", None)
        .await;
    let state = world.dir.path().join("failing/state");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::write(&state, "not a directory").unwrap();

    world
        .annotate("slow", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world
        .annotate("failing", names::REFRESH_CERTIFICATES, "1y")
        .await;
    for (name, needle) in [("slow", "did not answer within"), ("failing", "500")] {
        world.wait_status(name, names::STATUS_FAILED).await;
        let event = world.event_with(name, names::EVENT_REFRESH_FAILED).await;
        let message = event.message.unwrap_or_default();
        assert!(
            message.contains("gave up after 2 attempts") && message.contains(needle),
            "{name}: {message}"
        );
    }
}

/// Every file under `dir` with its contents.
fn files_under(dir: &std::path::Path) -> BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap().to_path_buf();
                found.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_hook_slower_than_the_agent_timeout_is_waited_for_not_repeated() {
    let settings = caretaker_operator::Settings {
        agent_timeout: Duration::from_secs(1),
        ..fast()
    };
    let mut world = world(settings).await;
    // The hook outlasts the operator's agent timeout several times over.
    let hooks = world.dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = hooks.join("restart.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho run >> {}\nsleep 4\n",
            hooks.join("runs").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let restart = caretaker_agent::command::CommandTemplate::parse(hook.to_str().unwrap()).unwrap();
    let layout = world
        .add_restartable("m-0", NodeRole::Worker, restart)
        .await;
    let node_dir = world.dir.path().join("m-0");
    let before = files_under(&node_dir.join("pki"))
        .into_iter()
        .map(|(p, c)| (std::path::Path::new("pki").join(p), c))
        .chain(
            files_under(&node_dir.join("kubeconfigs"))
                .into_iter()
                .map(|(p, c)| (std::path::Path::new("kubeconfigs").join(p), c)),
        )
        .collect::<BTreeMap<_, _>>();

    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    let annotations = world.wait_status("m-0", names::STATUS_DONE).await;

    let runs = std::fs::read_to_string(hooks.join("runs")).unwrap();
    assert_eq!(runs, "run\n", "the restart hook ran exactly once");
    let applied = std::fs::read_dir(node_dir.join("state/applied"))
        .unwrap()
        .count();
    assert_eq!(applied, 1, "one plan was applied");
    // The one backup holds the files as they were before the refresh.
    let backups: Vec<_> = std::fs::read_dir(node_dir.join("state/backups"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(backups.len(), 1);
    let backup = files_under(&backups[0].path());
    assert!(!backup.is_empty());
    for (path, contents) in &backup {
        assert_eq!(Some(contents), before.get(path), "{}", path.display());
    }
    // The expiry annotation is the certificates' on disk.
    let on_disk = caretaker_agent::inventory::discover(&layout);
    assert_eq!(
        Some(annotations[names::CERTIFICATES_EXPIRY].clone()),
        on_disk
            .earliest_expiry()
            .map(caretaker_operator::machine::refresh::format_time)
    );
    assert!(
        world
            .events("m-0")
            .await
            .iter()
            .all(|e| e.reason.as_deref() != Some(names::EVENT_REFRESH_FAILED)),
        "waiting for the agent is no failure"
    );
}
