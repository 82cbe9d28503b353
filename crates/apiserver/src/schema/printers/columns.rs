//! The table of built-in kinds and their columns after NAME, as kube-apiserver 1.33 declares
//! them: each column's title, type, priority and where its description comes from, and the
//! functions that compute the kind's cells and row conditions.

use super::Cells;
use super::cells::*;
use serde_json::Value;

/// One column as declared; its description is resolved when the printer is built.
pub(super) struct Declared {
    pub name: &'static str,
    pub type_: &'static str,
    pub priority: i64,
    pub about: About,
}

/// Where a column's description comes from.
pub(super) enum About {
    /// Written out in kube-apiserver's printer.
    Text(&'static str),
    /// The documentation of a field in k8s-openapi's schema of (apiVersion, kind).
    Field {
        api_version: &'static str,
        kind: &'static str,
        path: &'static str,
    },
}

/// A built-in kind's printer as declared.
pub(super) struct Kind {
    pub group: &'static str,
    pub kind: &'static str,
    /// The columns after NAME, which every printer starts with.
    pub columns: &'static [Declared],
    pub cells: Cells,
    pub conditions: fn(&Value) -> Option<Value>,
}

const fn text(name: &'static str, type_: &'static str, about: &'static str) -> Declared {
    Declared {
        name,
        type_,
        priority: 0,
        about: About::Text(about),
    }
}

/// A wide column (priority 1): kubectl shows it with `-o wide`.
const fn wide_text(name: &'static str, type_: &'static str, about: &'static str) -> Declared {
    Declared {
        priority: 1,
        ..text(name, type_, about)
    }
}

const fn field(
    name: &'static str,
    type_: &'static str,
    api_version: &'static str,
    kind: &'static str,
    path: &'static str,
) -> Declared {
    Declared {
        name,
        type_,
        priority: 0,
        about: About::Field {
            api_version,
            kind,
            path,
        },
    }
}

const fn wide_field(
    name: &'static str,
    type_: &'static str,
    api_version: &'static str,
    kind: &'static str,
    path: &'static str,
) -> Declared {
    Declared {
        priority: 1,
        ..field(name, type_, api_version, kind, path)
    }
}

pub(super) const NAME: Declared = field("Name", "string", "v1", "ConfigMap", "metadata.name");
const AGE: Declared = field(
    "Age",
    "string",
    "v1",
    "ConfigMap",
    "metadata.creationTimestamp",
);
// A workload's pod template (`layoutContainerCells`), then its selector.
const CONTAINERS: Declared = wide_text(
    "Containers",
    "string",
    "Names of each container in the template.",
);
const IMAGES: Declared = wide_text(
    "Images",
    "string",
    "Images referenced by each container in the template.",
);
const fn selector(api_version: &'static str, kind: &'static str) -> Declared {
    wide_field("Selector", "string", api_version, kind, "spec.selector")
}
const READY_PODS: Declared = text("Ready", "string", "Number of the pod with ready state");

const RBAC: &str = "rbac.authorization.k8s.io/v1";
const ROLE_BINDING: &[Declared] = &[
    field("Role", "string", RBAC, "RoleBinding", "roleRef"),
    AGE,
    wide_text("Users", "string", "Users in the roleBinding"),
    wide_text("Groups", "string", "Groups in the roleBinding"),
    wide_text(
        "ServiceAccounts",
        "string",
        "ServiceAccounts in the roleBinding",
    ),
];
const CLUSTER_ROLE_BINDING: &[Declared] = &[
    field("Role", "string", RBAC, "ClusterRoleBinding", "roleRef"),
    AGE,
    wide_text("Users", "string", "Users in the clusterRoleBinding"),
    wide_text("Groups", "string", "Groups in the clusterRoleBinding"),
    wide_text(
        "ServiceAccounts",
        "string",
        "ServiceAccounts in the clusterRoleBinding",
    ),
];
/// No printer upstream: the default converter's name and creation time.
const CREATED_AT: &[Declared] = &[field(
    "Created At",
    "date",
    "v1",
    "ConfigMap",
    "metadata.creationTimestamp",
)];
const WEBHOOKS: &[Declared] = &[
    text(
        "Webhooks",
        "integer",
        "Webhooks indicates the number of webhooks registered in this configuration",
    ),
    AGE,
];

const fn kind(
    group: &'static str,
    kind: &'static str,
    cells: Cells,
    columns: &'static [Declared],
) -> Kind {
    Kind {
        group,
        kind,
        columns,
        cells,
        conditions: no_conditions,
    }
}

const PVC: &str = "PersistentVolumeClaim";
const RC: &str = "ReplicationController";

/// Every built-in kind with a printer; other kinds print from plain columns. One column a line
/// (the formatter would spread each over five).
#[rustfmt::skip]
pub(super) const KINDS: &[Kind] = &[
    Kind { conditions: pod_conditions, ..kind("", "Pod", pod_cells, &[
        text("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
        text("Status", "string", "The aggregate status of the containers in this pod."),
        text("Restarts", "string", "The number of times the containers in this pod have been \
            restarted and when the last container in this pod has restarted."),
        AGE,
        wide_field("IP", "string", "v1", "Pod", "status.podIP"),
        wide_field("Node", "string", "v1", "Pod", "spec.nodeName"),
        wide_field("Nominated Node", "string", "v1", "Pod", "status.nominatedNodeName"),
        wide_field("Readiness Gates", "string", "v1", "Pod", "spec.readinessGates"),
    ]) },
    kind("apps", "Deployment", deployment_cells, &[
        READY_PODS,
        field("Up-to-date", "string", "apps/v1", "Deployment", "status.updatedReplicas"),
        field("Available", "string", "apps/v1", "Deployment", "status.availableReplicas"),
        AGE,
        CONTAINERS,
        IMAGES,
        selector("apps/v1", "Deployment"),
    ]),
    kind("apps", "ReplicaSet", replica_set_cells, &[
        field("Desired", "integer", "apps/v1", "ReplicaSet", "spec.replicas"),
        field("Current", "integer", "apps/v1", "ReplicaSet", "status.replicas"),
        field("Ready", "integer", "apps/v1", "ReplicaSet", "status.readyReplicas"),
        AGE,
        CONTAINERS,
        IMAGES,
        selector("apps/v1", "ReplicaSet"),
    ]),
    kind("", RC, replication_controller_cells, &[
        field("Desired", "integer", "v1", RC, "spec.replicas"),
        field("Current", "integer", "v1", RC, "status.replicas"),
        field("Ready", "integer", "v1", RC, "status.readyReplicas"),
        AGE,
        CONTAINERS,
        IMAGES,
        selector("v1", RC),
    ]),
    kind("apps", "StatefulSet", stateful_set_cells, &[READY_PODS, AGE, CONTAINERS, IMAGES]),
    kind("apps", "DaemonSet", daemon_set_cells, &[
        field("Desired", "integer", "apps/v1", "DaemonSet", "status.desiredNumberScheduled"),
        field("Current", "integer", "apps/v1", "DaemonSet", "status.currentNumberScheduled"),
        field("Ready", "integer", "apps/v1", "DaemonSet", "status.numberReady"),
        field("Up-to-date", "integer", "apps/v1", "DaemonSet", "status.updatedNumberScheduled"),
        field("Available", "integer", "apps/v1", "DaemonSet", "status.numberAvailable"),
        field("Node Selector", "string", "v1", "Pod", "spec.nodeSelector"),
        AGE,
        CONTAINERS,
        IMAGES,
        selector("apps/v1", "DaemonSet"),
    ]),
    kind("batch", "Job", job_cells, &[
        text("Status", "string", "Status of the job."),
        field("Completions", "string", "batch/v1", "Job", "status.succeeded"),
        text("Duration", "string", "Time required to complete the job."),
        AGE,
        CONTAINERS,
        IMAGES,
        selector("batch/v1", "Job"),
    ]),
    kind("batch", "CronJob", cron_job_cells, &[
        field("Schedule", "string", "batch/v1", "CronJob", "spec.schedule"),
        field("Timezone", "string", "batch/v1", "CronJob", "spec.timeZone"),
        field("Suspend", "boolean", "batch/v1", "CronJob", "spec.suspend"),
        field("Active", "integer", "batch/v1", "CronJob", "status.active"),
        field("Last Schedule", "string", "batch/v1", "CronJob", "status.lastScheduleTime"),
        AGE,
        CONTAINERS,
        IMAGES,
        // The selector of the Jobs it creates.
        selector("batch/v1", "Job"),
    ]),
    kind("", "Service", service_cells, &[
        field("Type", "string", "v1", "Service", "spec.type"),
        field("Cluster-IP", "string", "v1", "Service", "spec.clusterIP"),
        field("External-IP", "string", "v1", "Service", "spec.externalIPs"),
        field("Port(s)", "string", "v1", "Service", "spec.ports"),
        AGE,
        wide_field("Selector", "string", "v1", "Service", "spec.selector"),
    ]),
    kind("", PVC, claim_cells, &[
        field("Status", "string", "v1", PVC, "status.phase"),
        field("Volume", "string", "v1", PVC, "spec.volumeName"),
        field("Capacity", "string", "v1", PVC, "status.capacity"),
        field("Access Modes", "string", "v1", PVC, "status.accessModes"),
        text("StorageClass", "string", "StorageClass of the pvc"),
        text("VolumeAttributesClass", "string", "VolumeAttributesClass of the pvc"),
        AGE,
        wide_field("VolumeMode", "string", "v1", PVC, "spec.volumeMode"),
    ]),
    kind("", "Namespace", namespace_cells, &[
        text("Status", "string", "The status of the namespace"),
        AGE,
    ]),
    kind("", "Node", node_cells, &[
        text("Status", "string", "The status of the node"),
        text("Roles", "string", "The roles of the node"),
        AGE,
        field("Version", "string", "v1", "Node", "status.nodeInfo.kubeletVersion"),
        wide_field("Internal-IP", "string", "v1", "Node", "status.addresses"),
        wide_field("External-IP", "string", "v1", "Node", "status.addresses"),
        wide_field("OS-Image", "string", "v1", "Node", "status.nodeInfo.osImage"),
        wide_field("Kernel-Version", "string", "v1", "Node", "status.nodeInfo.kernelVersion"),
        wide_field("Container-Runtime", "string", "v1", "Node",
            "status.nodeInfo.containerRuntimeVersion"),
    ]),
    kind("", "ServiceAccount", service_account_cells, &[
        field("Secrets", "string", "v1", "ServiceAccount", "secrets"),
        AGE,
    ]),
    kind("", "ConfigMap", config_map_cells, &[
        field("Data", "string", "v1", "ConfigMap", "data"),
        AGE,
    ]),
    kind("", "Secret", secret_cells, &[
        field("Type", "string", "v1", "Secret", "type"),
        field("Data", "string", "v1", "Secret", "data"),
        AGE,
    ]),
    kind("coordination.k8s.io", "Lease", lease_cells, &[
        field("Holder", "string", "coordination.k8s.io/v1", "Lease", "spec.holderIdentity"),
        AGE,
    ]),
    kind("networking.k8s.io", "Ingress", ingress_cells, &[
        text("Class", "string", "The name of the IngressClass resource that should be used for \
            additional configuration"),
        text("Hosts", "string",
            "Hosts that incoming requests are matched against before the ingress rule"),
        text("Address", "string",
            "Address is a list containing ingress points for the load-balancer"),
        text("Ports", "string", "Ports of TLS configurations that open"),
        AGE,
    ]),
    kind("networking.k8s.io", "NetworkPolicy", network_policy_cells, &[
        field("Pod-Selector", "string", "networking.k8s.io/v1", "NetworkPolicy",
            "spec.podSelector"),
        AGE,
    ]),
    kind("policy", "PodDisruptionBudget", disruption_budget_cells, &[
        text("Min Available", "string", "The minimum number of pods that must be available."),
        text("Max Unavailable", "string", "The maximum number of pods that may be unavailable."),
        text("Allowed Disruptions", "integer",
            "Calculated number of pods that may be disrupted at this time."),
        AGE,
    ]),
    kind("rbac.authorization.k8s.io", "RoleBinding", role_binding_cells, ROLE_BINDING),
    kind("rbac.authorization.k8s.io", "ClusterRoleBinding", role_binding_cells,
        CLUSTER_ROLE_BINDING),
    kind("rbac.authorization.k8s.io", "Role", created_at_cells, CREATED_AT),
    kind("rbac.authorization.k8s.io", "ClusterRole", created_at_cells, CREATED_AT),
    kind("apiextensions.k8s.io", "CustomResourceDefinition", created_at_cells, CREATED_AT),
    kind("certificates.k8s.io", "ClusterTrustBundle", trust_bundle_cells, &[
        field("SignerName", "string", "certificates.k8s.io/v1beta1", "ClusterTrustBundle",
            "spec.signerName"),
    ]),
    kind("apiregistration.k8s.io", "APIService", api_service_cells, &[
        text("Service", "string", "The reference to the service that hosts this API endpoint."),
        text("Available", "string", "Whether this service is available."),
        AGE,
    ]),
    kind("admissionregistration.k8s.io", "ValidatingWebhookConfiguration",
        webhook_configuration_cells, WEBHOOKS),
    kind("admissionregistration.k8s.io", "MutatingWebhookConfiguration",
        webhook_configuration_cells, WEBHOOKS),
];
