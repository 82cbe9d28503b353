//! The Cluster API kinds caretaker reads and writes, as the real CRDs serve them
//! (cluster.x-k8s.io/v1beta2).

use kube::api::ApiResource;
use kube::core::GroupVersionKind;

/// The Machine kind.
pub fn machine_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    )
}

/// The Cluster kind.
pub fn cluster_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
        "clusters",
    )
}

/// The MachineDeployment kind.
pub fn machine_deployment_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"),
        "machinedeployments",
    )
}

/// The API group of control-plane providers (CK8sControlPlane, KubeadmControlPlane, ...): a
/// Machine a controller of this group owns is a control-plane Machine.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";

/// The CK8sControlPlane kind.
pub fn control_plane_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CONTROL_PLANE_GROUP, "v1beta2", "CK8sControlPlane"),
        "ck8scontrolplanes",
    )
}
