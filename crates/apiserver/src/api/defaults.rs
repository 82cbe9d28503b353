//! The defaults kube-apiserver gives built-in kinds that a client would notice: a Pod's
//! `restartPolicy`, a Deployment's `replicas` and rollout strategy, a Job's `backoffLimit`, and
//! the Pod defaults of every workload's Pod template. Applied to every write, as Go's decoding
//! applies them, and only where the field is missing.

use serde_json::{Value, json};

/// A Pod: its spec's defaults, `Pending` until something reports on it, and the QoS class
/// kube-apiserver computes from its containers' resources.
pub(super) fn pod(obj: &mut Value) {
    pod_spec(child(obj, "spec"));
    let qos = qos_class(&obj["spec"]);
    let status = child(obj, "status");
    fill(
        status,
        &[("phase", json!("Pending")), ("qosClass", json!(qos))],
    );
}

/// kube's `ComputePodQOS`: `BestEffort` without any cpu or memory request or limit,
/// `Guaranteed` when every container (init containers too) limits both and the requests
/// (a missing one is its limit, as defaulting makes it) equal the limits, else `Burstable`.
fn qos_class(spec: &Value) -> &'static str {
    const COMPUTE: [&str; 2] = ["cpu", "memory"];
    let (mut requests, mut limits) = ([0.0f64; 2], [0.0f64; 2]);
    let (mut any_request, mut any_limit) = ([false; 2], [false; 2]);
    let mut guaranteed = true;
    let containers = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|list| spec.get(list).and_then(Value::as_array))
        .flatten();
    for container in containers {
        let resources = &container["resources"];
        for (i, name) in COMPUTE.into_iter().enumerate() {
            let limit = quantity(&resources["limits"][name]).filter(|q| *q > 0.0);
            let request = quantity(&resources["requests"][name])
                .or(limit)
                .filter(|q| *q > 0.0);
            if let Some(q) = request {
                requests[i] += q;
                any_request[i] = true;
            }
            match limit {
                Some(q) => {
                    limits[i] += q;
                    any_limit[i] = true;
                }
                None => guaranteed = false,
            }
        }
    }
    if any_request == [false; 2] && any_limit == [false; 2] {
        return "BestEffort";
    }
    let equal = (0..2).all(|i| any_request[i] == any_limit[i] && requests[i] == limits[i]);
    if guaranteed && equal {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// A resource quantity (`100m`, `1.5Gi`, `2e3`, `4`) as a number; None when it is none.
fn quantity(value: &Value) -> Option<f64> {
    if let Some(n) = value.as_f64() {
        return Some(n);
    }
    let text = value.as_str()?.trim();
    const SUFFIXES: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((text, 1.0));
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// The workload kinds' defaults (apps/v1, batch/v1 and core/v1's `SetDefaults_…`); other
/// kinds are left as they are.
pub(super) fn workload(group: &str, plural: &str, obj: &mut Value) {
    match (group, plural) {
        ("apps", "deployments") => {
            let spec = child(obj, "spec");
            fill(
                spec,
                &[
                    ("replicas", json!(1)),
                    ("revisionHistoryLimit", json!(10)),
                    ("progressDeadlineSeconds", json!(600)),
                ],
            );
            let strategy = child(spec, "strategy");
            fill(strategy, &[("type", json!("RollingUpdate"))]);
            if strategy["type"] == "RollingUpdate" {
                let rolling = child(strategy, "rollingUpdate");
                fill(
                    rolling,
                    &[("maxUnavailable", json!("25%")), ("maxSurge", json!("25%"))],
                );
            }
            template(spec);
        }
        ("apps", "statefulsets") => {
            let spec = child(obj, "spec");
            fill(
                spec,
                &[
                    ("replicas", json!(1)),
                    ("podManagementPolicy", json!("OrderedReady")),
                    ("revisionHistoryLimit", json!(10)),
                    (
                        "persistentVolumeClaimRetentionPolicy",
                        json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
                    ),
                ],
            );
            let strategy = child(spec, "updateStrategy");
            fill(strategy, &[("type", json!("RollingUpdate"))]);
            if strategy["type"] == "RollingUpdate" {
                fill(strategy, &[("rollingUpdate", json!({"partition": 0}))]);
            }
            template(spec);
        }
        ("apps", "daemonsets") => {
            let spec = child(obj, "spec");
            fill(spec, &[("revisionHistoryLimit", json!(10))]);
            let strategy = child(spec, "updateStrategy");
            fill(strategy, &[("type", json!("RollingUpdate"))]);
            if strategy["type"] == "RollingUpdate" {
                let rolling = child(strategy, "rollingUpdate");
                fill(
                    rolling,
                    &[("maxUnavailable", json!(1)), ("maxSurge", json!(0))],
                );
            }
            template(spec);
        }
        ("apps", "replicasets") | ("", "replicationcontrollers") => {
            let spec = child(obj, "spec");
            fill(spec, &[("replicas", json!(1))]);
            template(spec);
        }
        ("batch", "jobs") => job_spec(child(obj, "spec")),
        ("batch", "cronjobs") => {
            let spec = child(obj, "spec");
            fill(
                spec,
                &[
                    ("concurrencyPolicy", json!("Allow")),
                    ("suspend", json!(false)),
                    ("successfulJobsHistoryLimit", json!(3)),
                    ("failedJobsHistoryLimit", json!(1)),
                ],
            );
            job_spec(child(child(spec, "jobTemplate"), "spec"));
        }
        ("", "persistentvolumeclaims") => {
            fill(child(obj, "spec"), &[("volumeMode", json!("Filesystem"))]);
            fill(child(obj, "status"), &[("phase", json!("Pending"))]);
        }
        _ => {}
    }
}

/// A Service spec's `type: ClusterIP` and `sessionAffinity: None`, the traffic policies
/// (`Cluster`) of the types that have them, and each port's `TCP` and `targetPort` (its
/// `port`). Its cluster IP and IP families are allocated apart.
pub(super) fn service_spec(spec: &mut Value) {
    fill(
        spec,
        &[
            ("type", json!("ClusterIP")),
            ("sessionAffinity", json!("None")),
        ],
    );
    match spec["type"].as_str() {
        Some("ExternalName") => {}
        Some("NodePort" | "LoadBalancer") => fill(
            spec,
            &[
                ("internalTrafficPolicy", json!("Cluster")),
                ("externalTrafficPolicy", json!("Cluster")),
            ],
        ),
        _ => fill(spec, &[("internalTrafficPolicy", json!("Cluster"))]),
    }
    let ports = spec.get_mut("ports").and_then(Value::as_array_mut);
    for port in ports.into_iter().flatten() {
        let target = port.get("port").cloned().unwrap_or(Value::Null);
        fill(port, &[("protocol", json!("TCP")), ("targetPort", target)]);
    }
}

fn job_spec(spec: &mut Value) {
    let parallelism = spec.get("parallelism").is_some_and(|p| !p.is_null());
    if !parallelism && spec.get("completions").is_none_or(Value::is_null) {
        spec["completions"] = json!(1);
    }
    let backoff = if spec
        .get("backoffLimitPerIndex")
        .is_some_and(|b| !b.is_null())
    {
        i32::MAX
    } else {
        6
    };
    let replacement = if spec.get("podFailurePolicy").is_some_and(|p| !p.is_null()) {
        "Failed"
    } else {
        "TerminatingOrFailed"
    };
    fill(
        spec,
        &[
            ("parallelism", json!(1)),
            ("backoffLimit", json!(backoff)),
            ("completionMode", json!("NonIndexed")),
            ("suspend", json!(false)),
            ("podReplacementPolicy", json!(replacement)),
        ],
    );
    template(spec);
}

/// The Pod defaults of a workload's `template`, when it has one.
fn template(spec: &mut Value) {
    if let Some(pod_spec_value) = spec.pointer_mut("/template/spec")
        && pod_spec_value.is_object()
    {
        pod_spec(pod_spec_value);
    }
}

/// A Pod spec's `restartPolicy`, `dnsPolicy`, `schedulerName`, `terminationGracePeriodSeconds`
/// and `securityContext`; each container's `imagePullPolicy` (`Always` for `:latest` or no
/// tag) and termination message settings.
fn pod_spec(spec: &mut Value) {
    fill(
        spec,
        &[
            ("restartPolicy", json!("Always")),
            ("dnsPolicy", json!("ClusterFirst")),
            ("schedulerName", json!("default-scheduler")),
            ("terminationGracePeriodSeconds", json!(30)),
            ("securityContext", json!({})),
        ],
    );
    for list in ["initContainers", "containers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            let image = container["image"].as_str().unwrap_or_default();
            let tag = image.rsplit('/').next().unwrap_or_default();
            let latest =
                !image.contains('@') && tag.split_once(':').is_none_or(|(_, tag)| tag == "latest");
            let pull = if latest { "Always" } else { "IfNotPresent" };
            fill(
                container,
                &[
                    ("imagePullPolicy", json!(pull)),
                    ("terminationMessagePath", json!("/dev/termination-log")),
                    ("terminationMessagePolicy", json!("File")),
                ],
            );
        }
    }
}

/// A Service's IP families, as kube-apiserver's allocator sets them on a single-stack (IPv4)
/// cluster: `SingleStack`, or for a headless Service without a selector `RequireDualStack`
/// (every family the cluster has); ExternalName Services have none.
pub(super) fn service_ip_families(spec: &mut Value) {
    if spec["type"] == "ExternalName" {
        return;
    }
    let selectorless = spec
        .get("selector")
        .and_then(Value::as_object)
        .is_none_or(|s| s.is_empty());
    let policy = if spec["clusterIP"] == "None" && selectorless {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    fill(
        spec,
        &[
            ("ipFamilyPolicy", json!(policy)),
            ("ipFamilies", json!(["IPv4"])),
        ],
    );
}

/// The object at `field` of `parent`, made an empty object when missing or not an object.
fn child<'a>(parent: &'a mut Value, field: &str) -> &'a mut Value {
    if !parent.get(field).is_some_and(Value::is_object) {
        parent[field] = json!({});
    }
    &mut parent[field]
}

/// Sets each field that is missing or null.
fn fill(object: &mut Value, defaults: &[(&str, Value)]) {
    for (field, value) in defaults {
        if object.get(*field).is_none_or(Value::is_null) {
            object[*field] = value.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pod_gets_the_defaults_clients_notice() {
        let mut pod_object = json!({"spec": {"containers": [
            {"name": "a", "image": "nginx"},
            {"name": "b", "image": "registry.local:5000/app:1.2"},
            {"name": "c", "image": "app:latest", "imagePullPolicy": "Never"},
        ], "restartPolicy": "OnFailure"}});
        pod(&mut pod_object);
        assert_eq!(
            pod_object["spec"]["restartPolicy"], "OnFailure",
            "given values stay"
        );
        assert_eq!(pod_object["spec"]["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod_object["spec"]["terminationGracePeriodSeconds"], 30);
        let pulls: Vec<&str> = pod_object["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["imagePullPolicy"].as_str().unwrap())
            .collect();
        assert_eq!(pulls, ["Always", "IfNotPresent", "Never"]);
        assert_eq!(pod_object["status"]["phase"], "Pending");
    }

    #[test]
    fn a_pods_qos_class_is_computed_as_kube_does() {
        let class = |containers: Value| qos_class(&json!({"containers": containers}));
        let resources = |r: Value| json!([{"name": "c", "resources": r}]);
        assert_eq!(class(json!([{"name": "c"}])), "BestEffort");
        // Quantities compare as numbers: 1 CPU is 1000m, 1Gi is 1024Mi.
        let same = json!({"requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": "1000m", "memory": "1024Mi"}});
        assert_eq!(class(resources(same)), "Guaranteed");
        let memory_unlimited = json!({"limits": {"cpu": "1"}});
        assert_eq!(class(resources(memory_unlimited)), "Burstable");
        // Every container counts, init containers too.
        let spec = json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],
            "initContainers": [{"name": "b"}]});
        assert_eq!(qos_class(&spec), "Burstable");
        let zero = json!({"requests": {"cpu": "0"}});
        assert_eq!(class(resources(zero)), "BestEffort");
    }

    #[test]
    fn workloads_get_their_defaults_and_their_templates_the_pods() {
        let template = json!({"spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        let mut deployment = json!({"spec": {"template": template.clone()}});
        workload("apps", "deployments", &mut deployment);
        let spec = &deployment["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(
            spec["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );

        // A Recreate strategy gets no rolling update; given replicas stay.
        let mut recreate = json!({"spec": {"replicas": 0, "strategy": {"type": "Recreate"}, "template": template}});
        workload("apps", "deployments", &mut recreate);
        assert_eq!(recreate["spec"]["replicas"], 0);
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));

        let mut job =
            json!({"spec": {"parallelism": 3, "template": {"spec": {"restartPolicy": "Never"}}}});
        workload("batch", "jobs", &mut job);
        assert_eq!(
            job["spec"].get("completions"),
            None,
            "parallel jobs have none"
        );
        assert_eq!(job["spec"]["backoffLimit"], 6);
        assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");

        let mut cronjob = json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {}}}});
        workload("batch", "cronjobs", &mut cronjob);
        assert_eq!(cronjob["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(cronjob["spec"]["jobTemplate"]["spec"]["completions"], 1);

        let mut config = json!({"data": {}});
        workload("", "configmaps", &mut config);
        assert_eq!(config, json!({"data": {}}), "other kinds are left alone");
    }
}
