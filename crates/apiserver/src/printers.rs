//! kube-apiserver's table printers for the built-in kinds (`pkg/printers/internalversion` of
//! Kubernetes 1.33, the version this server reports): the columns `kubectl get` shows and how
//! each cell is computed from the object, the computed ones included (a Pod's READY, STATUS and
//! RESTARTS, a Deployment's READY, a Service's EXTERNAL-IP and PORT(S)).
//!
//! As in kube-apiserver, the wide columns (priority 1) are always sent; kubectl hides them
//! unless `-o wide`. Cells keep Go's types: some columns declared `string` hold numbers.

use serde_json::{Value, json};

use crate::builtin_schemas;
use crate::meta::{human_duration, parse_time};

/// One column definition of a Table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub format: &'static str,
    pub priority: i64,
    pub description: String,
}

type Cells = fn(&Value, i64) -> Vec<Value>;

/// How a built-in kind prints: its columns, each object's cells in their order (from the
/// object and the time now, in Unix seconds), and the row's conditions.
#[derive(Debug, Clone)]
pub struct Printer {
    pub columns: Vec<Column>,
    pub cells: Cells,
    pub conditions: fn(&Value) -> Option<Value>,
}

fn no_conditions(_: &Value) -> Option<Value> {
    None
}

/// kube-apiserver marks the rows of finished Pods `Completed`.
fn pod_conditions(pod: &Value) -> Option<Value> {
    let (reason, message) = match pod.pointer("/status/phase").and_then(Value::as_str) {
        Some("Succeeded") => ("Succeeded", "The pod has completed successfully."),
        Some("Failed") => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

/// The printer of a built-in kind; `None` for kinds printed from plain columns (custom
/// resources, Events).
pub fn of(group: &str, kind: &str) -> Option<Printer> {
    let docs = Docs;
    let name = docs.column("Name", "string", 0, "v1", "ConfigMap", "metadata.name");
    let age = docs.column(
        "Age",
        "string",
        0,
        "v1",
        "ConfigMap",
        "metadata.creationTimestamp",
    );
    let template = |api: &str, kind: &str| {
        let selector = docs.text(api, kind, "spec.selector");
        [
            plain(
                "Containers",
                "string",
                1,
                "Names of each container in the template.",
            ),
            plain(
                "Images",
                "string",
                1,
                "Images referenced by each container in the template.",
            ),
            Column {
                description: selector,
                ..plain("Selector", "string", 1, "")
            },
        ]
    };
    let printer = |mut columns: Vec<Column>, cells: Cells| {
        columns.insert(0, name.clone());
        Some(Printer {
            columns,
            cells,
            conditions: no_conditions,
        })
    };
    let d = |title: &'static str, type_: &'static str, api: &str, kind: &str, path: &str| {
        docs.column(title, type_, 0, api, kind, path)
    };
    match (group, kind) {
        ("", "Pod") => printer(
            vec![
                plain(
                    "Ready",
                    "string",
                    0,
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                plain(
                    "Status",
                    "string",
                    0,
                    "The aggregate status of the containers in this pod.",
                ),
                plain(
                    "Restarts",
                    "string",
                    0,
                    "The number of times the containers in this pod have been restarted and when \
                     the last container in this pod has restarted.",
                ),
                age.clone(),
                docs.column("IP", "string", 1, "v1", "Pod", "status.podIP"),
                docs.column("Node", "string", 1, "v1", "Pod", "spec.nodeName"),
                docs.column(
                    "Nominated Node",
                    "string",
                    1,
                    "v1",
                    "Pod",
                    "status.nominatedNodeName",
                ),
                docs.column(
                    "Readiness Gates",
                    "string",
                    1,
                    "v1",
                    "Pod",
                    "spec.readinessGates",
                ),
            ],
            pod_cells,
        )
        .map(|pod| Printer {
            conditions: pod_conditions,
            ..pod
        }),
        ("apps", "Deployment") => printer(
            [
                vec![
                    plain("Ready", "string", 0, "Number of the pod with ready state"),
                    d(
                        "Up-to-date",
                        "string",
                        "apps/v1",
                        "Deployment",
                        "status.updatedReplicas",
                    ),
                    d(
                        "Available",
                        "string",
                        "apps/v1",
                        "Deployment",
                        "status.availableReplicas",
                    ),
                    age.clone(),
                ],
                template("apps/v1", "Deployment").to_vec(),
            ]
            .concat(),
            deployment_cells,
        ),
        ("apps", "ReplicaSet") | ("", "ReplicationController") => {
            let api = if group == "apps" { "apps/v1" } else { "v1" };
            printer(
                [
                    vec![
                        d("Desired", "integer", api, kind, "spec.replicas"),
                        d("Current", "integer", api, kind, "status.replicas"),
                        d("Ready", "integer", api, kind, "status.readyReplicas"),
                        age.clone(),
                    ],
                    template(api, kind).to_vec(),
                ]
                .concat(),
                if group == "apps" {
                    replica_set_cells
                } else {
                    replication_controller_cells
                },
            )
        }
        ("apps", "StatefulSet") => printer(
            vec![
                plain("Ready", "string", 0, "Number of the pod with ready state"),
                age.clone(),
                template("apps/v1", kind)[0].clone(),
                template("apps/v1", kind)[1].clone(),
            ],
            stateful_set_cells,
        ),
        ("apps", "DaemonSet") => {
            let status = |title, field: &str| {
                d(
                    title,
                    "integer",
                    "apps/v1",
                    "DaemonSet",
                    &format!("status.{field}"),
                )
            };
            printer(
                [
                    vec![
                        status("Desired", "desiredNumberScheduled"),
                        status("Current", "currentNumberScheduled"),
                        status("Ready", "numberReady"),
                        status("Up-to-date", "updatedNumberScheduled"),
                        status("Available", "numberAvailable"),
                        d("Node Selector", "string", "v1", "Pod", "spec.nodeSelector"),
                        age.clone(),
                    ],
                    template("apps/v1", kind).to_vec(),
                ]
                .concat(),
                daemon_set_cells,
            )
        }
        ("batch", "Job") => printer(
            [
                vec![
                    plain("Status", "string", 0, "Status of the job."),
                    d(
                        "Completions",
                        "string",
                        "batch/v1",
                        "Job",
                        "status.succeeded",
                    ),
                    plain(
                        "Duration",
                        "string",
                        0,
                        "Time required to complete the job.",
                    ),
                    age.clone(),
                ],
                template("batch/v1", kind).to_vec(),
            ]
            .concat(),
            job_cells,
        ),
        ("batch", "CronJob") => printer(
            [
                vec![
                    d("Schedule", "string", "batch/v1", "CronJob", "spec.schedule"),
                    d("Timezone", "string", "batch/v1", "CronJob", "spec.timeZone"),
                    d("Suspend", "boolean", "batch/v1", "CronJob", "spec.suspend"),
                    d("Active", "integer", "batch/v1", "CronJob", "status.active"),
                    d(
                        "Last Schedule",
                        "string",
                        "batch/v1",
                        "CronJob",
                        "status.lastScheduleTime",
                    ),
                    age.clone(),
                ],
                template("batch/v1", "Job").to_vec(),
            ]
            .concat(),
            cron_job_cells,
        ),
        ("", "Service") => {
            let spec = |title, field: &str| d(title, "string", "v1", "Service", field);
            printer(
                vec![
                    spec("Type", "spec.type"),
                    spec("Cluster-IP", "spec.clusterIP"),
                    spec("External-IP", "spec.externalIPs"),
                    spec("Port(s)", "spec.ports"),
                    age.clone(),
                    docs.column("Selector", "string", 1, "v1", "Service", "spec.selector"),
                ],
                service_cells,
            )
        }
        ("", "PersistentVolumeClaim") => {
            let pvc = |title, field: &str| d(title, "string", "v1", kind, field);
            printer(
                vec![
                    pvc("Status", "status.phase"),
                    pvc("Volume", "spec.volumeName"),
                    pvc("Capacity", "status.capacity"),
                    pvc("Access Modes", "status.accessModes"),
                    plain("StorageClass", "string", 0, "StorageClass of the pvc"),
                    plain(
                        "VolumeAttributesClass",
                        "string",
                        0,
                        "VolumeAttributesClass of the pvc",
                    ),
                    age.clone(),
                    docs.column("VolumeMode", "string", 1, "v1", kind, "spec.volumeMode"),
                ],
                claim_cells,
            )
        }
        ("", "Namespace") => printer(
            vec![
                plain("Status", "string", 0, "The status of the namespace"),
                age.clone(),
            ],
            namespace_cells,
        ),
        ("", "Node") => {
            let info = |title, field: &str| {
                docs.column(
                    title,
                    "string",
                    1,
                    "v1",
                    "Node",
                    &format!("status.nodeInfo.{field}"),
                )
            };
            printer(
                vec![
                    plain("Status", "string", 0, "The status of the node"),
                    plain("Roles", "string", 0, "The roles of the node"),
                    age.clone(),
                    d(
                        "Version",
                        "string",
                        "v1",
                        "Node",
                        "status.nodeInfo.kubeletVersion",
                    ),
                    docs.column("Internal-IP", "string", 1, "v1", "Node", "status.addresses"),
                    docs.column("External-IP", "string", 1, "v1", "Node", "status.addresses"),
                    info("OS-Image", "osImage"),
                    info("Kernel-Version", "kernelVersion"),
                    info("Container-Runtime", "containerRuntimeVersion"),
                ],
                node_cells,
            )
        }
        ("", "ServiceAccount") => printer(
            vec![d("Secrets", "string", "v1", kind, "secrets"), age.clone()],
            service_account_cells,
        ),
        ("", "ConfigMap") => printer(
            vec![d("Data", "string", "v1", kind, "data"), age.clone()],
            config_map_cells,
        ),
        ("", "Secret") => printer(
            vec![
                d("Type", "string", "v1", kind, "type"),
                d("Data", "string", "v1", kind, "data"),
                age.clone(),
            ],
            secret_cells,
        ),
        ("coordination.k8s.io", "Lease") => printer(
            vec![
                d(
                    "Holder",
                    "string",
                    "coordination.k8s.io/v1",
                    kind,
                    "spec.holderIdentity",
                ),
                age.clone(),
            ],
            lease_cells,
        ),
        ("networking.k8s.io", "Ingress") => printer(
            vec![
                plain(
                    "Class",
                    "string",
                    0,
                    "The name of the IngressClass resource that should be used for additional \
                     configuration",
                ),
                plain(
                    "Hosts",
                    "string",
                    0,
                    "Hosts that incoming requests are matched against before the ingress rule",
                ),
                plain(
                    "Address",
                    "string",
                    0,
                    "Address is a list containing ingress points for the load-balancer",
                ),
                plain(
                    "Ports",
                    "string",
                    0,
                    "Ports of TLS configurations that open",
                ),
                age.clone(),
            ],
            ingress_cells,
        ),
        ("networking.k8s.io", "NetworkPolicy") => printer(
            vec![
                d(
                    "Pod-Selector",
                    "string",
                    "networking.k8s.io/v1",
                    kind,
                    "spec.podSelector",
                ),
                age.clone(),
            ],
            network_policy_cells,
        ),
        ("policy", "PodDisruptionBudget") => printer(
            vec![
                plain(
                    "Min Available",
                    "string",
                    0,
                    "The minimum number of pods that must be available.",
                ),
                plain(
                    "Max Unavailable",
                    "string",
                    0,
                    "The maximum number of pods that may be unavailable.",
                ),
                plain(
                    "Allowed Disruptions",
                    "integer",
                    0,
                    "Calculated number of pods that may be disrupted at this time.",
                ),
                age.clone(),
            ],
            disruption_budget_cells,
        ),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            let of = if kind == "RoleBinding" {
                "roleBinding"
            } else {
                "clusterRoleBinding"
            };
            let subjects = |title: &'static str, what: &str| Column {
                description: format!("{what} in the {of}"),
                ..plain(title, "string", 1, "")
            };
            printer(
                vec![
                    d(
                        "Role",
                        "string",
                        "rbac.authorization.k8s.io/v1",
                        kind,
                        "roleRef",
                    ),
                    age.clone(),
                    subjects("Users", "Users"),
                    subjects("Groups", "Groups"),
                    subjects("ServiceAccounts", "ServiceAccounts"),
                ],
                role_binding_cells,
            )
        }
        // No printer upstream: the default converter's name and creation time.
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole")
        | ("apiextensions.k8s.io", "CustomResourceDefinition") => printer(
            vec![Column {
                name: "Created At",
                type_: "date",
                ..age.clone()
            }],
            created_at_cells,
        ),
        ("certificates.k8s.io", "ClusterTrustBundle") => printer(
            vec![d(
                "SignerName",
                "string",
                "certificates.k8s.io/v1beta1",
                kind,
                "spec.signerName",
            )],
            trust_bundle_cells,
        ),
        ("apiregistration.k8s.io", "APIService") => printer(
            vec![
                plain(
                    "Service",
                    "string",
                    0,
                    "The reference to the service that hosts this API endpoint.",
                ),
                plain(
                    "Available",
                    "string",
                    0,
                    "Whether this service is available.",
                ),
                age.clone(),
            ],
            api_service_cells,
        ),
        (
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration",
        ) => printer(
            vec![
                plain(
                    "Webhooks",
                    "integer",
                    0,
                    "Webhooks indicates the number of webhooks registered in this configuration",
                ),
                age.clone(),
            ],
            webhook_configuration_cells,
        ),
        _ => None,
    }
}

fn plain(name: &'static str, type_: &'static str, priority: i64, text: &str) -> Column {
    Column {
        name,
        type_,
        format: if name == "Name" { "name" } else { "" },
        priority,
        description: text.to_string(),
    }
}

/// Column descriptions from the documentation of the fields they show, in k8s-openapi's schemas.
struct Docs;

impl Docs {
    fn column(
        &self,
        name: &'static str,
        type_: &'static str,
        priority: i64,
        api_version: &str,
        kind: &str,
        path: &str,
    ) -> Column {
        Column {
            description: self.text(api_version, kind, path),
            ..plain(name, type_, priority, "")
        }
    }

    fn text(&self, api_version: &str, kind: &str, path: &str) -> String {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let Some(schema) = builtin_schemas::of(group, version, kind) else {
            return String::new();
        };
        let fields: Vec<&str> = path.split('.').collect();
        schema
            .root()
            .and_then(|root| schema.field(root, &fields))
            .and_then(|f| f.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }
}

// Reading fields as Go's zero values would read them.

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn number(object: &Value, pointer: &str) -> i64 {
    object
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

fn items<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s.into()
    }
}

/// `translateTimestampSince`: how long ago, `<unknown>` without a time.
fn since(timestamp: &str, now: i64) -> String {
    match parse_time(timestamp) {
        Some(at) => human_duration(now - at),
        None => "<unknown>".into(),
    }
}

fn age(object: &Value, now: i64) -> Value {
    json!(since(text(object, "/metadata/creationTimestamp"), now))
}

fn name(object: &Value) -> Value {
    json!(text(object, "/metadata/name"))
}

/// `layoutContainerCells`: the names and images of a Pod spec's containers.
fn containers(object: &Value, pod_spec: &str) -> [Value; 2] {
    let containers = items(object, &format!("{pod_spec}/containers"));
    let joined = |field: &str| {
        containers
            .iter()
            .map(|c| text(c, &format!("/{field}")))
            .collect::<Vec<_>>()
            .join(",")
    };
    [json!(joined("name")), json!(joined("image"))]
}

/// `labels.FormatLabels`: `k=v` pairs sorted as strings, `<none>` when empty.
fn format_labels(map: Option<&Value>) -> String {
    let mut pairs: Vec<String> = map
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    pairs.sort();
    or_none(&pairs.join(","))
}

/// A label selector as `labels.Selector.String()` writes it; `Err` for an invalid one.
fn selector_string(selector: Option<&Value>) -> Result<String, ()> {
    let Some(selector) = selector.filter(|s| s.is_object()) else {
        return Ok(String::new());
    };
    let mut requirements: Vec<(String, String)> = Vec::new();
    for (key, value) in selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        requirements.push((key.clone(), format!("{key}={}", value.as_str().ok_or(())?)));
    }
    for expression in items(selector, "/matchExpressions") {
        let key = text(expression, "/key").to_string();
        let mut values: Vec<&str> = items(expression, "/values")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let list = |values: &[&str]| match values {
            [one] => one.to_string(),
            many => many.join(","),
        };
        let written = match (text(expression, "/operator"), values.is_empty()) {
            ("In", false) => format!("{key} in ({})", list(&values)),
            ("NotIn", false) => format!("{key} notin ({})", list(&values)),
            ("Exists", true) => key.clone(),
            ("DoesNotExist", true) => format!("!{key}"),
            _ => return Err(()),
        };
        requirements.push((key, written));
    }
    requirements.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(requirements
        .into_iter()
        .map(|(_, written)| written)
        .collect::<Vec<_>>()
        .join(","))
}

/// `metav1.FormatLabelSelector`: `<error>` for an invalid selector, `<none>` for an empty one.
fn format_selector(selector: Option<&Value>) -> String {
    match selector_string(selector) {
        Ok(s) => or_none(&s),
        Err(()) => "<error>".into(),
    }
}

/// Load balancer ingress points: each one's IP, else hostname, sorted and de-duplicated.
fn load_balancer(object: &Value) -> String {
    let mut points: Vec<&str> = items(object, "/status/loadBalancer/ingress")
        .iter()
        .filter_map(|i| {
            [text(i, "/ip"), text(i, "/hostname")]
                .into_iter()
                .find(|s| !s.is_empty())
        })
        .collect();
    points.sort_unstable();
    points.dedup();
    points.join(",")
}

fn pod_cells(pod: &Value, now: i64) -> Vec<Value> {
    let spec_init = items(pod, "/spec/initContainers");
    let restartable = |name: &str| {
        spec_init
            .iter()
            .rev()
            .find(|c| text(c, "/name") == name)
            .is_some_and(|c| text(c, "/restartPolicy") == "Always")
    };
    let finished = |status: &Value| parse_time(text(status, "/lastState/terminated/finishedAt"));
    let total = items(pod, "/spec/containers").len()
        + spec_init
            .iter()
            .filter(|c| text(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut last_restart: Option<i64> = None;
    let mut sidecar_restarts = 0;
    let mut last_sidecar_restart: Option<i64> = None;
    let phase = text(pod, "/status/phase");
    let mut reason = match text(pod, "/status/reason") {
        "" => phase.to_string(),
        given => given.to_string(),
    };
    let conditions = items(pod, "/status/conditions");
    if conditions
        .iter()
        .any(|c| text(c, "/type") == "PodScheduled" && text(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }

    let mut initializing = false;
    for (i, status) in items(pod, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        restarts += number(status, "/restartCount");
        last_restart = last_restart.max(finished(status));
        let sidecar = restartable(text(status, "/name"));
        if sidecar {
            sidecar_restarts += number(status, "/restartCount");
            last_sidecar_restart = last_sidecar_restart.max(finished(status));
        }
        let terminated = status.pointer("/state/terminated");
        let waiting_reason = text(status, "/state/waiting/reason");
        if terminated.is_some_and(|t| number(t, "/exitCode") == 0) {
            continue;
        }
        if sidecar && status.get("started").and_then(Value::as_bool) == Some(true) {
            if status.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        reason = match terminated {
            Some(t) => match text(t, "/reason") {
                "" if number(t, "/signal") != 0 => format!("Init:Signal:{}", number(t, "/signal")),
                "" => format!("Init:ExitCode:{}", number(t, "/exitCode")),
                given => format!("Init:{given}"),
            },
            None if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" => {
                format!("Init:{waiting_reason}")
            }
            None => format!("Init:{i}/{}", spec_init.len()),
        };
        initializing = true;
        break;
    }

    let initialized = conditions
        .iter()
        .find(|c| text(c, "/type") == "Initialized")
        .is_some_and(|c| text(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut running = false;
        for status in items(pod, "/status/containerStatuses").iter().rev() {
            restarts += number(status, "/restartCount");
            last_restart = last_restart.max(finished(status));
            let waiting_reason = text(status, "/state/waiting/reason");
            if !waiting_reason.is_empty() {
                reason = waiting_reason.into();
            } else if let Some(t) = status.pointer("/state/terminated") {
                reason = match text(t, "/reason") {
                    "" if number(t, "/signal") != 0 => format!("Signal:{}", number(t, "/signal")),
                    "" => format!("ExitCode:{}", number(t, "/exitCode")),
                    given => given.into(),
                };
            } else if status.get("ready").and_then(Value::as_bool) == Some(true)
                && status.pointer("/state/running").is_some()
            {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let pod_ready = conditions
                .iter()
                .any(|c| text(c, "/type") == "Ready" && text(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        if text(pod, "/status/reason") == "NodeLost" {
            reason = "Unknown".into();
        } else if !matches!(phase, "Failed" | "Succeeded") {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(at) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(now - at)),
        _ => restarts.to_string(),
    };

    let pod_ip = items(pod, "/status/podIPs")
        .first()
        .map(|ip| text(ip, "/ip"))
        .filter(|ip| !ip.is_empty())
        .unwrap_or(text(pod, "/status/podIP"));
    let gates = items(pod, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let met = gates
            .iter()
            .filter(|gate| {
                conditions
                    .iter()
                    .find(|c| text(c, "/type") == text(gate, "/conditionType"))
                    .is_some_and(|c| text(c, "/status") == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    vec![
        name(pod),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        age(pod, now),
        json!(or_none(pod_ip)),
        json!(or_none(text(pod, "/spec/nodeName"))),
        json!(or_none(text(pod, "/status/nominatedNodeName"))),
        json!(readiness_gates),
    ]
}

fn deployment_cells(d: &Value, now: i64) -> Vec<Value> {
    let selector = selector_string(d.pointer("/spec/selector")).unwrap_or("<invalid>".into());
    let [names, images] = containers(d, "/spec/template/spec");
    vec![
        name(d),
        json!(format!(
            "{}/{}",
            number(d, "/status/readyReplicas"),
            number(d, "/spec/replicas")
        )),
        json!(number(d, "/status/updatedReplicas")),
        json!(number(d, "/status/availableReplicas")),
        age(d, now),
        names,
        images,
        json!(selector),
    ]
}

fn replica_set_cells(rs: &Value, now: i64) -> Vec<Value> {
    let [names, images] = containers(rs, "/spec/template/spec");
    vec![
        name(rs),
        json!(number(rs, "/spec/replicas")),
        json!(number(rs, "/status/replicas")),
        json!(number(rs, "/status/readyReplicas")),
        age(rs, now),
        names,
        images,
        json!(format_selector(rs.pointer("/spec/selector"))),
    ]
}

fn replication_controller_cells(rc: &Value, now: i64) -> Vec<Value> {
    let mut cells = replica_set_cells(rc, now);
    cells[7] = json!(format_labels(rc.pointer("/spec/selector")));
    cells
}

fn stateful_set_cells(sts: &Value, now: i64) -> Vec<Value> {
    let [names, images] = containers(sts, "/spec/template/spec");
    vec![
        name(sts),
        json!(format!(
            "{}/{}",
            number(sts, "/status/readyReplicas"),
            number(sts, "/spec/replicas")
        )),
        age(sts, now),
        names,
        images,
    ]
}

fn daemon_set_cells(ds: &Value, now: i64) -> Vec<Value> {
    let [names, images] = containers(ds, "/spec/template/spec");
    let status = |field: &str| json!(number(ds, &format!("/status/{field}")));
    vec![
        name(ds),
        status("desiredNumberScheduled"),
        status("currentNumberScheduled"),
        status("numberReady"),
        status("updatedNumberScheduled"),
        status("numberAvailable"),
        json!(format_labels(
            ds.pointer("/spec/template/spec/nodeSelector")
        )),
        age(ds, now),
        names,
        images,
        json!(format_selector(ds.pointer("/spec/selector"))),
    ]
}

fn job_cells(job: &Value, now: i64) -> Vec<Value> {
    let succeeded = number(job, "/status/succeeded");
    let completions = match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(completions) => format!("{succeeded}/{completions}"),
        None => match number(job, "/spec/parallelism") {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let start = parse_time(text(job, "/status/startTime"));
    let end = parse_time(text(job, "/status/completionTime"));
    let duration = match (start, end) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration(now - start),
        (Some(start), Some(end)) => human_duration(end - start),
    };
    let conditions = items(job, "/status/conditions");
    let holds = |kind: &str| {
        conditions
            .iter()
            .find(|c| text(c, "/type") == kind)
            .is_some_and(|c| text(c, "/status") == "True")
    };
    let status = if holds("Complete") {
        "Complete"
    } else if holds("Failed") {
        "Failed"
    } else if job.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if holds("Suspended") {
        "Suspended"
    } else if holds("FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let [names, images] = containers(job, "/spec/template/spec");
    vec![
        name(job),
        json!(status),
        json!(completions),
        json!(duration),
        age(job, now),
        names,
        images,
        json!(format_selector(job.pointer("/spec/selector"))),
    ]
}

fn cron_job_cells(cj: &Value, now: i64) -> Vec<Value> {
    let last = match cj
        .pointer("/status/lastScheduleTime")
        .and_then(Value::as_str)
    {
        Some(at) => since(at, now),
        None => "<none>".into(),
    };
    let suspend = match cj.pointer("/spec/suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let time_zone = cj
        .pointer("/spec/timeZone")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    let [names, images] = containers(cj, "/spec/jobTemplate/spec/template/spec");
    vec![
        name(cj),
        json!(text(cj, "/spec/schedule")),
        json!(time_zone),
        json!(suspend),
        json!(items(cj, "/status/active").len()),
        json!(last),
        age(cj, now),
        names,
        images,
        json!(format_selector(
            cj.pointer("/spec/jobTemplate/spec/selector")
        )),
    ]
}

fn service_cells(svc: &Value, now: i64) -> Vec<Value> {
    let cluster_ip = items(svc, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .or_else(|| svc.pointer("/spec/clusterIP").and_then(Value::as_str))
        .unwrap_or("<none>");
    let external: Vec<&str> = items(svc, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external_ip = match text(svc, "/spec/type") {
        "ClusterIP" | "NodePort" => or_none(&external.join(",")),
        "LoadBalancer" => {
            let balancer = load_balancer(svc);
            let all: Vec<&str> = balancer
                .split(',')
                .filter(|s| !s.is_empty())
                .chain(external.iter().copied())
                .collect();
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => text(svc, "/spec/externalName").into(),
        _ => "<unknown>".into(),
    };
    let ports: Vec<String> = items(svc, "/spec/ports")
        .iter()
        .map(|p| {
            let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match number(p, "/nodePort") {
                0 => format!("{}/{protocol}", number(p, "/port")),
                node => format!("{}:{node}/{protocol}", number(p, "/port")),
            }
        })
        .collect();
    vec![
        name(svc),
        json!(text(svc, "/spec/type")),
        json!(cluster_ip),
        json!(external_ip),
        json!(or_none(&ports.join(","))),
        age(svc, now),
        json!(format_labels(svc.pointer("/spec/selector"))),
    ]
}

fn claim_cells(pvc: &Value, now: i64) -> Vec<Value> {
    let phase = if pvc.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else {
        text(pvc, "/status/phase")
    };
    let volume = text(pvc, "/spec/volumeName");
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        let given: Vec<&str> = items(pvc, "/status/accessModes")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let modes: Vec<&str> = [
            ("ReadWriteOnce", "RWO"),
            ("ReadOnlyMany", "ROX"),
            ("ReadWriteMany", "RWX"),
            ("ReadWriteOncePod", "RWOP"),
        ]
        .into_iter()
        .filter(|(mode, _)| given.contains(mode))
        .map(|(_, short)| short)
        .collect();
        let capacity = match text(pvc, "/status/capacity/storage") {
            "" => "0",
            given => given,
        };
        (capacity.to_string(), modes.join(","))
    };
    let storage_class = pvc
        .pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
        .or_else(|| pvc.pointer("/spec/storageClassName"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let unset = |pointer: &str| {
        pvc.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("<unset>")
            .to_string()
    };
    vec![
        name(pvc),
        json!(phase),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(storage_class),
        json!(unset("/spec/volumeAttributesClassName")),
        age(pvc, now),
        json!(unset("/spec/volumeMode")),
    ]
}

fn namespace_cells(ns: &Value, now: i64) -> Vec<Value> {
    vec![name(ns), json!(text(ns, "/status/phase")), age(ns, now)]
}

fn node_cells(node: &Value, now: i64) -> Vec<Value> {
    let ready = items(node, "/status/conditions")
        .iter()
        .rev()
        .find(|c| text(c, "/type") == "Ready");
    let mut status = vec![match ready {
        Some(c) if text(c, "/status") == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled");
    }
    let mut roles: Vec<&str> = node
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) => Some(role),
            None if k == "kubernetes.io/role" => v.as_str(),
            None => None,
        })
        .filter(|role| !role.is_empty())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    let address = |kind: &str| {
        or_none(
            items(node, "/status/addresses")
                .iter()
                .find(|a| text(a, "/type") == kind)
                .map_or("", |a| text(a, "/address")),
        )
    };
    let info = |field: &str| match text(node, &format!("/status/nodeInfo/{field}")) {
        "" => "<unknown>".to_string(),
        given => given.to_string(),
    };
    vec![
        name(node),
        json!(status.join(",")),
        json!(or_none(&roles.join(","))),
        age(node, now),
        json!(text(node, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

fn service_account_cells(sa: &Value, now: i64) -> Vec<Value> {
    vec![name(sa), json!(items(sa, "/secrets").len()), age(sa, now)]
}

fn entries(object: &Value, field: &str) -> usize {
    object
        .get(field)
        .and_then(Value::as_object)
        .map_or(0, |m| m.len())
}

fn config_map_cells(cm: &Value, now: i64) -> Vec<Value> {
    let data = entries(cm, "data") + entries(cm, "binaryData");
    vec![name(cm), json!(data), age(cm, now)]
}

fn secret_cells(secret: &Value, now: i64) -> Vec<Value> {
    vec![
        name(secret),
        json!(text(secret, "/type")),
        json!(entries(secret, "data")),
        age(secret, now),
    ]
}

fn lease_cells(lease: &Value, now: i64) -> Vec<Value> {
    vec![
        name(lease),
        json!(text(lease, "/spec/holderIdentity")),
        age(lease, now),
    ]
}

fn ingress_cells(ingress: &Value, now: i64) -> Vec<Value> {
    let rules = items(ingress, "/spec/rules");
    const SHOWN: usize = 3;
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for rule in rules {
        more |= hosts.len() == SHOWN;
        if !more && !text(rule, "/host").is_empty() {
            hosts.push(text(rule, "/host"));
        }
    }
    let hosts = match (hosts.is_empty(), more) {
        (true, _) => "*".to_string(),
        (false, true) => format!("{} + {} more...", hosts.join(","), rules.len() - SHOWN),
        (false, false) => hosts.join(","),
    };
    let ports = if items(ingress, "/spec/tls").is_empty() {
        "80"
    } else {
        "80, 443"
    };
    vec![
        name(ingress),
        json!(
            ingress
                .pointer("/spec/ingressClassName")
                .and_then(Value::as_str)
                .unwrap_or("<none>")
        ),
        json!(hosts),
        json!(load_balancer(ingress)),
        json!(ports),
        age(ingress, now),
    ]
}

fn network_policy_cells(policy: &Value, now: i64) -> Vec<Value> {
    let selector = policy
        .pointer("/spec/podSelector")
        .cloned()
        .unwrap_or(json!({}));
    vec![
        name(policy),
        json!(format_selector(Some(&selector))),
        age(policy, now),
    ]
}

fn disruption_budget_cells(pdb: &Value, now: i64) -> Vec<Value> {
    let bound = |field: &str| match pdb.pointer(&format!("/spec/{field}")) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "N/A".into(),
    };
    vec![
        name(pdb),
        json!(bound("minAvailable")),
        json!(bound("maxUnavailable")),
        json!(number(pdb, "/status/disruptionsAllowed")),
        age(pdb, now),
    ]
}

fn role_binding_cells(binding: &Value, now: i64) -> Vec<Value> {
    let subjects = items(binding, "/subjects");
    let of_kind = |kind: &str| {
        subjects
            .iter()
            .filter(|s| text(s, "/kind") == kind)
            .map(|s| match kind {
                "ServiceAccount" => format!("{}/{}", text(s, "/namespace"), text(s, "/name")),
                _ => text(s, "/name").to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        name(binding),
        json!(format!(
            "{}/{}",
            text(binding, "/roleRef/kind"),
            text(binding, "/roleRef/name")
        )),
        age(binding, now),
        json!(of_kind("User")),
        json!(of_kind("Group")),
        json!(of_kind("ServiceAccount")),
    ]
}

fn created_at_cells(object: &Value, _now: i64) -> Vec<Value> {
    let created = match text(object, "/metadata/creationTimestamp") {
        "" => "0001-01-01T00:00:00Z",
        given => given,
    };
    vec![name(object), json!(created)]
}

fn trust_bundle_cells(bundle: &Value, _now: i64) -> Vec<Value> {
    vec![
        name(bundle),
        json!(or_none(text(bundle, "/spec/signerName"))),
    ]
}

fn api_service_cells(service: &Value, now: i64) -> Vec<Value> {
    let backend = match service.pointer("/spec/service") {
        Some(s) if s.is_object() => format!("{}/{}", text(s, "/namespace"), text(s, "/name")),
        _ => "Local".into(),
    };
    let available = items(service, "/status/conditions")
        .iter()
        .find(|c| text(c, "/type") == "Available")
        .map_or("Unknown".to_string(), |c| {
            match (text(c, "/status"), text(c, "/reason")) {
                ("True", _) | (_, "") => text(c, "/status").to_string(),
                (status, reason) => format!("{status} ({reason})"),
            }
        });
    vec![
        name(service),
        json!(backend),
        json!(available),
        age(service, now),
    ]
}

fn webhook_configuration_cells(config: &Value, now: i64) -> Vec<Value> {
    vec![
        name(config),
        json!(items(config, "/webhooks").len()),
        age(config, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-26T10:00:00Z";

    fn cells(group: &str, kind: &str, object: Value) -> Vec<Value> {
        let printer = of(group, kind).expect("a printer");
        let cells = (printer.cells)(&object, parse_time(NOW).unwrap());
        assert_eq!(
            cells.len(),
            printer.columns.len(),
            "{kind}: a cell per column"
        );
        cells
    }

    fn pod(status: Value) -> Value {
        json!({
            "metadata": {"name": "p", "creationTimestamp": "2026-11-26T09:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": status,
        })
    }

    #[test]
    fn pods_print_readiness_status_and_restarts_as_kube_apiserver() {
        let running = |name: &str, ready: bool, restarts: i64| {
            json!({"name": name, "ready": ready, "restartCount": restarts,
                   "state": {"running": {}},
                   "lastState": {"terminated": {"finishedAt": "2026-11-26T09:55:00Z", "exitCode": 1}}})
        };
        let c = cells(
            "",
            "Pod",
            pod(json!({"phase": "Running", "podIP": "10.0.0.7",
                "containerStatuses": [running("a", true, 2), running("b", false, 1)]})),
        );
        assert_eq!(
            c,
            [
                json!("p"),
                json!("1/2"),
                json!("Running"),
                json!("3 (5m ago)"),
                json!("60m"),
                json!("10.0.0.7"),
                json!("<none>"),
                json!("<none>"),
                json!("<none>")
            ]
        );
        // The first container's waiting reason wins; a new Pod is Pending with 0 restarts.
        let waiting = |name: &str, reason: &str| json!({"name": name, "ready": false, "restartCount": 0, "state": {"waiting": {"reason": reason}}});
        let c = cells(
            "",
            "Pod",
            pod(json!({"phase": "Pending", "containerStatuses":
                [waiting("a", "CrashLoopBackOff"), waiting("b", "ContainerCreating")]})),
        );
        assert_eq!(
            (c[1].clone(), c[2].clone(), c[3].clone()),
            (json!("0/2"), json!("CrashLoopBackOff"), json!("0"))
        );
        assert_eq!(
            cells("", "Pod", pod(json!({"phase": "Pending"})))[2],
            "Pending"
        );
        // Init containers: the first unfinished one names the state.
        let mut initializing = pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "state": {"terminated": {"exitCode": 0}}},
            {"name": "i2", "state": {"waiting": {"reason": "PodInitializing"}}},
        ]}));
        initializing["spec"]["initContainers"] =
            json!([{"name": "i1"}, {"name": "i2"}, {"name": "i3"}]);
        assert_eq!(cells("", "Pod", initializing.clone())[2], "Init:1/3");
        initializing["status"]["initContainerStatuses"][1]["state"] =
            json!({"terminated": {"exitCode": 2}});
        assert_eq!(cells("", "Pod", initializing)[2], "Init:ExitCode:2");
        // Deleting: Terminating, unless finished.
        let mut deleting = pod(json!({"phase": "Running"}));
        deleting["metadata"]["deletionTimestamp"] = json!(NOW);
        assert_eq!(cells("", "Pod", deleting)[2], "Terminating");
        // Finished Pods' rows are marked Completed.
        let printer = of("", "Pod").unwrap();
        let done = (printer.conditions)(&pod(json!({"phase": "Succeeded"}))).unwrap();
        assert_eq!(done[0]["type"], "Completed");
        assert_eq!(
            (printer.conditions)(&pod(json!({"phase": "Running"}))),
            None
        );
    }

    #[test]
    fn workloads_print_ready_counts_and_templates() {
        let template = json!({"spec": {"containers": [{"name": "web", "image": "nginx:1"}, {"name": "log", "image": "busybox"}]}});
        let deployment = json!({"metadata": {"name": "web"},
            "spec": {"replicas": 3, "template": template,
                     "selector": {"matchLabels": {"app": "web"},
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let c = cells("apps", "Deployment", deployment);
        assert_eq!(c[1], "2/3");
        assert_eq!(c[2], 3, "a number in a string column, as upstream");
        assert_eq!(c[4], "<unknown>", "no creationTimestamp");
        assert_eq!(c[5], "web,log");
        assert_eq!(c[6], "nginx:1,busybox");
        assert_eq!(c[7], "app=web,tier in (a,b)");
        let sts = cells("apps", "StatefulSet", json!({"spec": {"replicas": 1}}));
        assert_eq!(sts[1], "0/1");
        let rs = cells("apps", "ReplicaSet", json!({"spec": {"selector": {}}}));
        assert_eq!(rs[7], "<none>");
        let rc = cells(
            "",
            "ReplicationController",
            json!({"spec": {"selector": {"b": "2", "a": "1"}}}),
        );
        assert_eq!(rc[7], "a=1,b=2");
    }

    #[test]
    fn jobs_and_cronjobs() {
        let job = json!({"spec": {"completions": 3},
            "status": {"succeeded": 1, "startTime": "2026-11-26T09:58:00Z",
                       "conditions": [{"type": "Suspended", "status": "True"}]}});
        let c = cells("batch", "Job", job);
        assert_eq!(
            (c[1].clone(), c[2].clone(), c[3].clone()),
            (json!("Suspended"), json!("1/3"), json!("2m"))
        );
        let c = cells(
            "batch",
            "Job",
            json!({"spec": {"parallelism": 4}, "status": {
            "startTime": "2026-11-26T09:00:00Z", "completionTime": "2026-11-26T09:00:30Z",
            "conditions": [{"type": "Complete", "status": "True"}]}}),
        );
        assert_eq!(
            (c[1].clone(), c[2].clone(), c[3].clone()),
            (json!("Complete"), json!("0/1 of 4"), json!("30s"))
        );
        let c = cells(
            "batch",
            "CronJob",
            json!({"spec": {"schedule": "0 3 * * *", "suspend": false},
            "status": {"active": [{}, {}]}}),
        );
        assert_eq!(
            c[1..6],
            [
                json!("0 3 * * *"),
                json!("<none>"),
                json!("False"),
                json!(2),
                json!("<none>")
            ]
        );
    }

    #[test]
    fn services_print_their_addresses_and_ports() {
        let service = |spec: Value, status: Value| json!({"spec": spec, "status": status});
        let c = cells(
            "",
            "Service",
            service(
                json!({"type": "NodePort", "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
                   "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                   "selector": {"app": "web"}}),
                json!({}),
            ),
        );
        assert_eq!(
            c[1..5],
            [
                json!("NodePort"),
                json!("10.96.0.9"),
                json!("<none>"),
                json!("80:30080/TCP,53/UDP")
            ]
        );
        assert_eq!(c[6], "app=web");
        let lb = |ingress: Value, external: Value| {
            cells(
                "",
                "Service",
                service(
                    json!({"type": "LoadBalancer", "externalIPs": external}),
                    json!({"loadBalancer": {"ingress": ingress}}),
                ),
            )[3]
            .clone()
        };
        assert_eq!(lb(json!([]), json!([])), "<pending>");
        assert_eq!(
            lb(
                json!([{"ip": "5.6.7.8"}, {"hostname": "lb.example"}, {"ip": "1.2.3.4"}]),
                json!(["9.9.9.9"])
            ),
            "1.2.3.4,5.6.7.8,lb.example,9.9.9.9"
        );
        let external = cells(
            "",
            "Service",
            service(
                json!({"type": "ExternalName", "externalName": "db.example"}),
                json!({}),
            ),
        );
        assert_eq!(
            (
                external[2].clone(),
                external[3].clone(),
                external[4].clone()
            ),
            (json!("<none>"), json!("db.example"), json!("<none>"))
        );
    }

    #[test]
    fn cluster_and_policy_kinds() {
        let node = json!({"metadata": {"name": "n1", "labels": {
                "node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "master"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}],
                       "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0"}}});
        let c = cells("", "Node", node);
        assert_eq!(
            c[1..6],
            [
                json!("NotReady,SchedulingDisabled"),
                json!("control-plane,master"),
                json!("<unknown>"),
                json!("v1.33.0"),
                json!("192.0.2.1")
            ]
        );
        assert_eq!(c[7], "<unknown>");
        let hosts = |rules: Value| {
            cells(
                "networking.k8s.io",
                "Ingress",
                json!({"spec": {"rules": rules}}),
            )[2]
            .clone()
        };
        assert_eq!(hosts(json!([])), "*");
        assert_eq!(
            hosts(json!([{"host": "a"}, {"host": "b"}, {"host": "c"}])),
            "a,b,c"
        );
        assert_eq!(
            hosts(json!([{}, {"host": "a"}, {"host": "b"}, {"host": "c"}, {"host": "d"}])),
            "a,b,c + 2 more..."
        );
        let pdb = cells(
            "policy",
            "PodDisruptionBudget",
            json!({"spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}}),
        );
        assert_eq!(pdb[1..4], [json!("50%"), json!("N/A"), json!(1)]);
        let binding = cells(
            "rbac.authorization.k8s.io",
            "RoleBinding",
            json!({
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "ann"}, {"kind": "ServiceAccount", "namespace": "x", "name": "sa"}, {"kind": "User", "name": "bob"}]}),
        );
        assert_eq!(
            (binding[1].clone(), binding[3].clone(), binding[5].clone()),
            (json!("ClusterRole/view"), json!("ann, bob"), json!("x/sa"))
        );
        let role = cells(
            "rbac.authorization.k8s.io",
            "Role",
            json!({"metadata": {"name": "r", "creationTimestamp": "2026-01-02T03:04:05Z"}}),
        );
        assert_eq!(role, [json!("r"), json!("2026-01-02T03:04:05Z")]);
        let claim = cells(
            "",
            "PersistentVolumeClaim",
            json!({"spec": {"volumeName": "pv1", "storageClassName": "fast"},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteMany", "ReadWriteOnce"], "capacity": {"storage": "1Gi"}}}),
        );
        assert_eq!(
            claim[1..7],
            [
                json!("Bound"),
                json!("pv1"),
                json!("1Gi"),
                json!("RWO,RWX"),
                json!("fast"),
                json!("<unset>")
            ]
        );
        assert_eq!(
            cells(
                "",
                "ConfigMap",
                json!({"data": {"a": "1"}, "binaryData": {"b": ""}})
            )[1],
            2
        );
    }

    #[test]
    fn columns_carry_upstream_names_and_field_documentation() {
        let pod = of("", "Pod").unwrap();
        let names: Vec<&str> = pod.columns.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        assert_eq!(pod.columns[0].format, "name");
        assert!(
            pod.columns[0]
                .description
                .starts_with("Name must be unique within a namespace")
        );
        assert!(
            pod.columns[6].description.starts_with("NodeName"),
            "{}",
            pod.columns[6].description
        );
        assert_eq!(pod.columns.iter().filter(|c| c.priority == 1).count(), 4);
        let service = of("", "Service").unwrap();
        assert!(
            service.columns[1]
                .description
                .starts_with("type determines how the Service is exposed")
        );
        assert!(of("example.com", "Widget").is_none());
    }
}
