//! What the benchmarks share: the operator in a child process (the example started again with
//! `--operator KUBECONFIG`: the same `controllers::run` that `caretaker operator` runs), whose
//! client counts its requests by kind and reports them on request, and its memory and CPU time
//! read from `/proc`, without the API server's.

// Each example uses most of this, not all of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use caretaker_operator::controllers;
use caretaker_operator::{Context, Settings};

/// Logs to stderr as `RUST_LOG` says (`RUST_LOG=info` shows the operator's progress with
/// timestamps); in operator mode (`--operator KUBECONFIG`) runs the operator until the
/// benchmark goes away and returns `None`, else returns the benchmark's arguments and a runtime.
pub fn start() -> Option<(Vec<String>, tokio::runtime::Runtime)> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--operator") {
        // As `caretaker operator` does.
        caretaker_operator::process::cap_malloc_arenas();
        caretaker_operator::process::return_free_memory();
        if std::env::var_os("BENCH_MEMORY_PEAKS").is_some() {
            report_peaks();
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if args.get(1).map(String::as_str) == Some("--operator") {
        runtime.block_on(operator(Path::new(&args[2])));
        return None;
    }
    Some((args, runtime))
}

/// With `BENCH_MEMORY_PEAKS` set: samples the operator's resident memory every 20 ms and
/// prints to stderr, at each new peak (1 MiB over the last one printed), how glibc's malloc
/// stood then: what the program holds, what is free inside malloc's heaps, and what sits in
/// memory maps of its own. The rest of the peak is the binary, the stacks and what the kernel
/// counts apart.
fn report_peaks() {
    std::thread::spawn(|| {
        let mut printed = 0.0;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
                    .unwrap_or_default()
            };
            let rss = field("VmRSS:").parse::<f64>().unwrap_or(0.0) / 1024.0;
            if rss < printed + 1.0 {
                continue;
            }
            printed = rss;
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            {
                // SAFETY: mallinfo2 only reads malloc's counters.
                let info = unsafe { libc::mallinfo2() };
                let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
                eprintln!(
                    "operator memory peak: VmRSS {rss:.1} MiB; malloc: held {:.1} MiB, free in its heaps {:.1} MiB, own maps {:.1} MiB; threads {}",
                    mib(info.uordblks + info.hblkhd),
                    mib(info.fordblks),
                    mib(info.hblkhd),
                    field("Threads:"),
                );
            }
        }
    });
}

/// The child process: the operator's controllers against the kubeconfig at `path`, with a
/// client that counts its requests by kind. Each line on stdin asks for the counts so far and
/// the controllers' passes (from the operator's own metrics), answered as one JSON line on
/// stdout.
async fn operator(path: &Path) {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let counter = counts.clone();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::util::MapRequestLayer::new(
            move |request: http::Request<kube::client::Body>| {
                *counter
                    .lock()
                    .unwrap()
                    .entry(request_kind(&request))
                    .or_default() += 1;
                request
            },
        ))
        .build();
    let settings = Settings {
        retry_base: Duration::from_secs(1),
        ..Settings::default()
    };
    let ctx = Context::new(client, settings);
    let metrics = ctx.metrics.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for _ in stdin.lock().lines() {
            let snapshot = Snapshot {
                requests: counts.lock().unwrap().clone(),
                passes: passes(&metrics.encode()),
            };
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", serde_json::to_string(&snapshot).unwrap()).unwrap();
            out.flush().unwrap();
        }
        // The benchmark went away.
        std::process::exit(0);
    });
    controllers::run(ctx, None).await;
}

/// What the operator child reports on request.
#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    requests: BTreeMap<String, u64>,
    passes: BTreeMap<String, Passes>,
}

/// One controller's reconciles so far: how many, and their time in all (seconds).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Default, Debug)]
pub struct Passes {
    pub count: f64,
    pub seconds: f64,
}

/// The reconcile counts and durations by controller, from the metrics text.
fn passes(text: &str) -> BTreeMap<String, Passes> {
    let mut passes: BTreeMap<String, Passes> = BTreeMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((family, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(controller) = labels
            .strip_prefix("controller=\"")
            .and_then(|l| l.split_once('"'))
            .map(|(c, _)| c)
        else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let entry = passes.entry(controller.to_string()).or_default();
        match family {
            "caretaker_reconcile_total" => entry.count = value,
            "caretaker_reconcile_duration_seconds_sum" => entry.seconds = value,
            _ => {}
        }
    }
    passes
}

/// The passes made between two snapshots, by controller.
pub fn passes_made(
    before: &BTreeMap<String, Passes>,
    after: &BTreeMap<String, Passes>,
) -> BTreeMap<String, Passes> {
    after
        .iter()
        .map(|(controller, p)| {
            let b = before.get(controller).copied().unwrap_or_default();
            let made = Passes {
                count: p.count - b.count,
                seconds: p.seconds - b.seconds,
            };
            (controller.clone(), made)
        })
        .filter(|(_, p)| p.count > 0.0)
        .collect()
}

/// `METHOD resource[/NAME][/SUBRESOURCE][ (watch)]`, e.g. `PATCH machines/NAME` or
/// `PATCH issuedcertificates/NAME/status`.
fn request_kind<B>(request: &http::Request<B>) -> String {
    let segments: Vec<&str> = request.uri().path().split('/').skip(1).collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest = match segments.first() {
        Some(&"api") => &segments[2.min(segments.len())..],
        _ => &segments[3.min(segments.len())..],
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let mut kind = format!(
        "{} {}",
        request.method(),
        rest.first().copied().unwrap_or("?")
    );
    if rest.len() > 1 {
        kind.push_str("/NAME");
    }
    if let [_, _, subresource, ..] = rest {
        kind.push('/');
        kind.push_str(subresource);
    }
    if request.uri().query().unwrap_or("").contains("watch=true") {
        kind.push_str(" (watch)");
    }
    kind
}

/// Whether a request kind of [`request_kind`] writes.
pub fn is_write(kind: &str) -> bool {
    ["POST ", "PUT ", "PATCH ", "DELETE "]
        .iter()
        .any(|verb| kind.starts_with(verb))
}

/// The requests of each kind made between two snapshots, those with none left out.
pub fn made(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(kind, n)| (kind.clone(), n - before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The operator child process.
pub struct Operator {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Operator {
    /// Starts the operator; under the command in `BENCH_OPERATOR_UNDER`, if set (a profiler
    /// such as `heaptrack`, whose arguments follow it, separated by spaces).
    pub fn start(kubeconfig: &Path) -> Self {
        let wrapper = std::env::var("BENCH_OPERATOR_UNDER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut command = Command::new(program);
                command.args(words).arg(std::env::current_exe().unwrap());
                command
            }
            None => Command::new(std::env::current_exe().unwrap()),
        };
        let mut child = command
            .arg("--operator")
            .arg(kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Operator {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The requests the operator made so far, by kind.
    pub fn requests(&mut self) -> BTreeMap<String, u64> {
        self.snapshot().requests
    }

    /// The operator's reconciles so far, by controller.
    pub fn passes(&mut self) -> BTreeMap<String, Passes> {
        self.snapshot().passes
    }

    fn snapshot(&mut self) -> Snapshot {
        writeln!(self.stdin).unwrap();
        self.stdin.flush().unwrap();
        // Lines that are not a snapshot are the wrapper's (`BENCH_OPERATOR_UNDER`): skipped.
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the operator exited"
            );
            if line.starts_with('{') {
                return serde_json::from_str(&line).unwrap();
            }
        }
    }

    /// VmRSS and VmHWM in MiB.
    pub fn memory(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
                / 1024.0
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User and system CPU time of process `pid` so far, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime, fields 14 and
    // 15 of the line, are the 12th and 13th after it; in clock ticks of 1/100 s on Linux.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// "met" or "missed".
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}

/// The embedded API server's raw write rate in this run, to divide a fan-out's rate by so
/// that figures compare across machines: ConfigMaps of `payload` bytes (sized like the
/// fan-out's own objects) created in a namespace of their own by 8 concurrent clients from
/// this process, per second. Measured with the operator gone, so that it measures the server.
pub async fn raw_create_rate(client: &kube::Client, payload: usize) -> f64 {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::{Api, PostParams};

    const NAMESPACE: &str = "raw-writes";
    const CLIENTS: usize = 8;
    const TOTAL: usize = 4_000;
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": NAMESPACE } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let data = "x".repeat(payload);
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (api, data) = (api.clone(), data.clone());
            tokio::spawn(async move {
                for i in (c..TOTAL).step_by(CLIENTS) {
                    let object: ConfigMap = serde_json::from_value(serde_json::json!({
                        "metadata": { "name": format!("raw-{i}") },
                        "data": { "payload": data },
                    }))
                    .unwrap();
                    api.create(&PostParams::default(), &object).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    TOTAL as f64 / started.elapsed().as_secs_f64()
}
