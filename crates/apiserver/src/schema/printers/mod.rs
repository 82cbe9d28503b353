//! kube-apiserver's table printers for the built-in kinds (`pkg/printers/internalversion` of
//! Kubernetes 1.33, the version this server reports): the columns `kubectl get` shows and how
//! each cell is computed from the object, the computed ones included (a Pod's READY, STATUS and
//! RESTARTS, a Deployment's READY, a Service's EXTERNAL-IP and PORT(S)).
//!
//! As in kube-apiserver, the wide columns (priority 1) are always sent; kubectl hides them
//! unless `-o wide`. Cells keep Go's types: some columns declared `string` hold numbers.
//!
//! The columns of each kind are a table (`columns::KINDS`); the cells are computed by one
//! function per kind (`cells`).

mod cells;
mod columns;

use serde_json::Value;

use crate::schema::builtin_schemas;
use columns::{About, Declared};

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

/// The printer of a built-in kind; `None` for kinds printed from plain columns (custom
/// resources, Events).
pub fn of(group: &str, kind: &str) -> Option<Printer> {
    let found = columns::KINDS
        .iter()
        .find(|k| k.group == group && k.kind == kind)?;
    let columns = std::iter::once(&columns::NAME)
        .chain(found.columns)
        .map(column)
        .collect();
    Some(Printer {
        columns,
        cells: found.cells,
        conditions: found.conditions,
    })
}

/// A declared column with its description: written out, or the documentation of the field it
/// shows in k8s-openapi's schemas.
fn column(declared: &Declared) -> Column {
    let description = match declared.about {
        About::Text(text) => text.to_string(),
        About::Field {
            api_version,
            kind,
            path,
        } => field_documentation(api_version, kind, path),
    };
    Column {
        name: declared.name,
        type_: declared.type_,
        format: if declared.name == "Name" { "name" } else { "" },
        priority: declared.priority,
        description,
    }
}

fn field_documentation(api_version: &str, kind: &str, path: &str) -> String {
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::meta::parse_time;

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
