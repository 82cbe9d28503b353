//! Two replicas of the operator with leader election against one API server: only the
//! Lease's holder reconciles; when it dies mid-rollout the standby takes the Lease once it
//! expires and finishes the rollout, and no Machine is done twice; a replica told to stop
//! (SIGTERM) gives the Lease up, so the standby takes over at once; a leader cut off from the
//! API server (its calls stall) stops on its own clock before the standby takes over.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_operator::Context;
use caretaker_operator::leader::{DEFAULT_LEASE, Election, LeaseSettings};
use caretaker_operator::replica::{self, Stopped};
use common::hooks::{concurrency, logging_scripts};
use common::{NS, World, fast, world};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Replica {
    ctx: Arc<Context>,
    task: JoinHandle<Result<(), Stopped>>,
    stop: Option<oneshot::Sender<()>>,
    identity: String,
}

async fn replica(world: &World, name: &str, lease_duration: Duration) -> Replica {
    replica_on(world.client.clone(), name, lease_duration).await
}

/// A replica whose every call to the API server goes through `client`.
async fn replica_on(client: kube::Client, name: &str, lease_duration: Duration) -> Replica {
    let identity = LeaseSettings::identity(name);
    let election = Election::join(
        client.clone(),
        LeaseSettings {
            namespace: NS.into(),
            name: DEFAULT_LEASE.into(),
            identity: identity.clone(),
            duration: lease_duration,
        },
    )
    .await
    .unwrap();
    let ctx = Context::new(client, fast());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(replica::run(ctx.clone(), None, Some(election), async {
        let _ = stopped.await;
    }));
    Replica {
        ctx,
        task,
        stop: Some(stop),
        identity,
    }
}

/// A sample of the replica's own metrics: whether it leads, and how many reconciles it ran.
fn leads_and_reconciles(replica: &Replica) -> (bool, u64) {
    let text = replica.ctx.metrics.encode();
    let leads = text.lines().any(|l| l == "caretaker_leader 1");
    let reconciles = text
        .lines()
        .filter(|l| l.starts_with("caretaker_reconcile_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    (leads, reconciles)
}

async fn holder(world: &World) -> Option<String> {
    Api::<Lease>::namespaced(world.client.clone(), NS)
        .get_opt(DEFAULT_LEASE)
        .await
        .unwrap()?
        .spec?
        .holder_identity
}

async fn wait_leading(world: &World, replica: &Replica, within: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < within {
        if leads_and_reconciles(replica).0
            && holder(world).await.as_deref() == Some(replica.identity.as_str())
        {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{} did not lead within {within:?}; the Lease's holder: {:?}",
        replica.identity,
        holder(world).await
    );
}

async fn parent_annotations(world: &World) -> std::collections::BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        NS,
        &caretaker_api::cluster_api::machine_deployment_api_resource(),
    );
    api.get("c1-md-0")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

async fn wait_parent(world: &World, key: &str, value: &str, within: Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        if parent_annotations(world).await.get(key).map(String::as_str) == Some(value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "c1-md-0 never had {key} = {value}: {:?}",
        parent_annotations(world).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_the_standby_finishes_its_rollout_when_it_dies() {
    let mut world = world(fast()).await;
    // The world's own operator is not part of this test.
    world.controller.abort();
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.5");
    for i in 0..4 {
        let name = format!("w-{i}");
        world
            .add_upgradable(&name, NodeRole::Worker, make(&name))
            .await;
    }
    let lease = Duration::from_secs(3);
    let mut first = replica(&world, "replica-a", lease).await;
    wait_leading(&world, &first, Duration::from_secs(10)).await;
    let second = replica(&world, "replica-b", lease).await;

    let api: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        NS,
        &caretaker_api::cluster_api::machine_deployment_api_resource(),
    );
    let trigger = json!({"metadata": {"annotations": {names::IN_PLACE_UPGRADE_TO: "revision=7"}}});
    api.patch("c1-md-0", &PatchParams::default(), &Patch::Merge(&trigger))
        .await
        .unwrap();
    wait_parent(&world, names::PROGRESS, "1/4", Duration::from_secs(30)).await;
    // Exactly one reconciles: the standby has run nothing.
    assert_eq!(leads_and_reconciles(&second), (false, 0));
    assert!(leads_and_reconciles(&first).1 > 0);

    // The leader dies (no SIGTERM: nothing is released).
    first.task.abort();
    let _ = first.stop.take();
    let took = wait_leading(&world, &second, Duration::from_secs(20)).await;
    assert!(
        took <= lease + Duration::from_secs(3),
        "the standby took {took:?} to lead; the Lease lasts {lease:?}"
    );
    wait_parent(
        &world,
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_DONE,
        Duration::from_secs(60),
    )
    .await;
    let (at_once, runs) = concurrency(&log);
    assert_eq!(at_once, 1, "max-parallel 1 held across the handover");
    assert_eq!(
        runs.values().copied().collect::<Vec<_>>(),
        [1, 1, 1, 1],
        "no Machine done twice: {runs:?}"
    );
    assert!(leads_and_reconciles(&second).1 > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_gives_the_lease_up_and_the_standby_leads_at_once() {
    let world = world(fast()).await;
    world.controller.abort();
    // Long enough that a takeover by expiry could not pass for a handover.
    let lease = Duration::from_secs(30);
    let mut first = replica(&world, "replica-a", lease).await;
    wait_leading(&world, &first, Duration::from_secs(10)).await;
    let second = replica(&world, "replica-b", lease).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !leads_and_reconciles(&second).0,
        "the standby does not lead"
    );

    let stopping = Instant::now();
    first.stop.take().unwrap().send(()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(35), &mut first.task)
        .await
        .expect("the replica stops within its bound")
        .unwrap();
    assert_eq!(stopped, Ok(()));
    assert!(!leads_and_reconciles(&first).0);
    let took = wait_leading(&world, &second, Duration::from_secs(15)).await;
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "handover took {:?} (the standby led after {took:?})",
        stopping.elapsed()
    );
}

/// A TCP proxy to `upstream` that forwards both ways until [`Proxy::stall`]: from then on it
/// forwards nothing more, on any connection, new or open, and keeps each open (a network that
/// drops packets, not one that resets connections).
struct Proxy {
    addr: SocketAddr,
    stalled: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stalled = stalled.clone();
            async move {
                let mut pipes = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    pipes.spawn(pipe(from_client, to_server, stalled.clone()));
                    pipes.spawn(pipe(from_server, to_client, stalled.clone()));
                }
            }
        });
        Proxy {
            addr,
            stalled,
            task,
        }
    }

    fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// A client of the world's API server through this proxy.
    fn client(&self, world: &World) -> kube::Client {
        let mut config = world.server.kube_config();
        config.cluster_url = format!("http://{}", self.addr).parse().unwrap();
        let config = caretaker_operator::context::with_timeouts(config);
        kube::Client::try_from(config).unwrap()
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.load(Ordering::SeqCst) {
            // Held, never forwarded, never closed.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Issue 31, item 15: a leader whose calls to the API server stall (here a proxy between them
/// stops forwarding) kept reconciling after a standby had taken the Lease: its renewal hung
/// with no deadline. Now it stops once its renew deadline passes on its own clock, which is
/// before the standby may take the Lease. Both replicas' leader gauges (1 only while a replica
/// reconciles) are sampled every few milliseconds throughout: never both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_the_standby_takes_over() {
    let world = world(fast()).await;
    world.controller.abort();
    let proxy = Proxy::start(world.server.addr()).await;
    let lease = Duration::from_secs(3);
    let mut first = replica_on(proxy.client(&world), "replica-a", lease).await;
    wait_leading(&world, &first, Duration::from_secs(10)).await;
    let second = replica(&world, "replica-b", lease).await;

    let both = Arc::new(AtomicBool::new(false));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (a, b) = (first.ctx.clone(), second.ctx.clone());
        let (both, sampling) = (both.clone(), sampling.clone());
        async move {
            let leads = |ctx: &Context| {
                ctx.metrics
                    .encode()
                    .lines()
                    .any(|l| l == "caretaker_leader 1")
            };
            let mut samples = 0u64;
            while sampling.load(Ordering::SeqCst) {
                if leads(&a) && leads(&b) {
                    both.store(true, Ordering::SeqCst);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        }
    });
    // The leader renews through the proxy for a while, then is cut off.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(leads_and_reconciles(&first).0 && !leads_and_reconciles(&second).0);
    proxy.stall();
    wait_leading(&world, &second, Duration::from_secs(20)).await;
    let stopped = tokio::time::timeout(Duration::from_secs(5), &mut first.task)
        .await
        .expect("the cut-off leader stopped by itself")
        .unwrap();
    assert!(
        matches!(&stopped, Err(Stopped::LeadershipLost(why)) if why.contains("renew deadline")),
        "{stopped:?}"
    );
    sampling.store(false, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    assert!(samples > 100, "{samples} samples");
    assert!(
        !both.load(Ordering::SeqCst),
        "both replicas reconciled at once"
    );
}
