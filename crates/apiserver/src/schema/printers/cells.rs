//! Each built-in kind's cells, computed from the object as kube-apiserver's printer computes
//! them, with fields read as Go's zero values would read them.

use serde_json::{Value, json};

use crate::meta::{human_duration, parse_time};

pub(super) fn no_conditions(_: &Value) -> Option<Value> {
    None
}

/// kube-apiserver marks the rows of finished Pods `Completed`.
pub(super) fn pod_conditions(pod: &Value) -> Option<Value> {
    let (reason, message) = match pod.pointer("/status/phase").and_then(Value::as_str) {
        Some("Succeeded") => ("Succeeded", "The pod has completed successfully."),
        Some("Failed") => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
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

pub(super) fn pod_cells(pod: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn deployment_cells(d: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn replica_set_cells(rs: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn replication_controller_cells(rc: &Value, now: i64) -> Vec<Value> {
    let mut cells = replica_set_cells(rc, now);
    cells[7] = json!(format_labels(rc.pointer("/spec/selector")));
    cells
}

pub(super) fn stateful_set_cells(sts: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn daemon_set_cells(ds: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn job_cells(job: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn cron_job_cells(cj: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn service_cells(svc: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn claim_cells(pvc: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn namespace_cells(ns: &Value, now: i64) -> Vec<Value> {
    vec![name(ns), json!(text(ns, "/status/phase")), age(ns, now)]
}

pub(super) fn node_cells(node: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn service_account_cells(sa: &Value, now: i64) -> Vec<Value> {
    vec![name(sa), json!(items(sa, "/secrets").len()), age(sa, now)]
}

fn entries(object: &Value, field: &str) -> usize {
    object
        .get(field)
        .and_then(Value::as_object)
        .map_or(0, |m| m.len())
}

pub(super) fn config_map_cells(cm: &Value, now: i64) -> Vec<Value> {
    let data = entries(cm, "data") + entries(cm, "binaryData");
    vec![name(cm), json!(data), age(cm, now)]
}

pub(super) fn secret_cells(secret: &Value, now: i64) -> Vec<Value> {
    vec![
        name(secret),
        json!(text(secret, "/type")),
        json!(entries(secret, "data")),
        age(secret, now),
    ]
}

pub(super) fn lease_cells(lease: &Value, now: i64) -> Vec<Value> {
    vec![
        name(lease),
        json!(text(lease, "/spec/holderIdentity")),
        age(lease, now),
    ]
}

pub(super) fn ingress_cells(ingress: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn network_policy_cells(policy: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn disruption_budget_cells(pdb: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn role_binding_cells(binding: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn created_at_cells(object: &Value, _now: i64) -> Vec<Value> {
    let created = match text(object, "/metadata/creationTimestamp") {
        "" => "0001-01-01T00:00:00Z",
        given => given,
    };
    vec![name(object), json!(created)]
}

pub(super) fn trust_bundle_cells(bundle: &Value, _now: i64) -> Vec<Value> {
    vec![
        name(bundle),
        json!(or_none(text(bundle, "/spec/signerName"))),
    ]
}

pub(super) fn api_service_cells(service: &Value, now: i64) -> Vec<Value> {
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

pub(super) fn webhook_configuration_cells(config: &Value, now: i64) -> Vec<Value> {
    vec![
        name(config),
        json!(items(config, "/webhooks").len()),
        age(config, now),
    ]
}
