//! What a Machine's certificates may say. Every CSR from a node is checked against this before
//! it is signed: a node cannot get a certificate for another node, an extra name, or (for a
//! worker) an administrator identity.

use std::net::IpAddr;

use caretaker_agent::provision::{APISERVER_DNS_NAMES, APISERVER_SERVICE_IP};
use caretaker_pki::{SigningPolicy, Usage};

use crate::machine::MachineView;

/// Common names of a kubeadm control-plane node's certificates (besides its own node names).
const CONTROL_PLANE_COMMON_NAMES: [&str; 9] = [
    "kube-apiserver",
    "kube-apiserver-kubelet-client",
    "kube-apiserver-etcd-client",
    "front-proxy-client",
    "kube-etcd-healthcheck-client",
    "kubernetes-admin",
    "kubernetes-super-admin",
    "system:kube-controller-manager",
    "system:kube-scheduler",
];

/// The policy for one Machine: its node name, its addresses, the control-plane endpoint host,
/// the in-cluster API server names and service IP, and the CK8sControlPlane's extra SANs.
pub fn machine_policy(
    machine: &MachineView,
    endpoint_host: Option<&str>,
    extra_sans: &[String],
) -> SigningPolicy {
    let node = machine
        .node_name
        .clone()
        .unwrap_or_else(|| machine.name.clone());
    let mut policy = SigningPolicy {
        common_names: vec![node.clone(), format!("system:node:{node}")],
        organizations: vec!["system:nodes".into()],
        dns_names: vec![node],
        ip_addresses: Vec::new(),
        usage: Some(Usage::Both),
    };
    let add_name = |name: &str, policy: &mut SigningPolicy| match name.parse::<IpAddr>() {
        Ok(ip) => policy.ip_addresses.push(ip),
        Err(_) => policy.dns_names.push(name.to_string()),
    };
    for address in &machine.addresses {
        add_name(address, &mut policy);
    }
    if machine.control_plane {
        policy
            .common_names
            .extend(CONTROL_PLANE_COMMON_NAMES.map(str::to_string));
        policy.organizations.extend([
            "kubeadm:cluster-admins".to_string(),
            "system:masters".to_string(),
        ]);
        policy
            .dns_names
            .extend(APISERVER_DNS_NAMES.map(str::to_string));
        policy.dns_names.push("localhost".into());
        for ip in [APISERVER_SERVICE_IP, "127.0.0.1", "::1"] {
            add_name(ip, &mut policy);
        }
        if let Some(host) = endpoint_host {
            add_name(host, &mut policy);
        }
        for san in extra_sans {
            add_name(san, &mut policy);
        }
    }
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use caretaker_pki::{CertificateRequest, CsrSubject, KeyAlgorithm, PrivateKey, Refusal};

    fn view(control_plane: bool) -> MachineView {
        MachineView {
            name: "m-0".into(),
            namespace: "default".into(),
            cluster_name: "c1".into(),
            node_name: Some("node-0".into()),
            addresses: vec!["10.0.0.5".into(), "node-0.internal".into()],
            control_plane,
            being_deleted: false,
            labels: Default::default(),
            annotations: Default::default(),
            resource_version: None,
        }
    }

    fn request(cn: &str, orgs: &[&str], dns: &[&str], ips: &[&str]) -> CertificateRequest {
        let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let pem = CsrSubject {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            ip_addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            usage: Usage::Server,
        }
        .to_csr_pem(&key)
        .unwrap();
        CertificateRequest::from_pem(&pem).unwrap()
    }

    #[test]
    fn a_control_plane_may_hold_the_apiserver_names() {
        let policy = machine_policy(
            &view(true),
            Some("cp.example"),
            &["api.example".into(), "192.168.1.1".into()],
        );
        let apiserver = request(
            "kube-apiserver",
            &[],
            &[
                "kubernetes.default.svc",
                "node-0",
                "cp.example",
                "api.example",
            ],
            &["10.96.0.1", "10.0.0.5", "192.168.1.1"],
        );
        assert_eq!(policy.check(&apiserver), Ok(()));
        assert_eq!(
            policy.check(&request(
                "kubernetes-super-admin",
                &["system:masters"],
                &[],
                &[]
            )),
            Ok(())
        );
    }

    #[test]
    fn foreign_names_are_refused_by_name() {
        let policy = machine_policy(&view(true), Some("cp.example"), &[]);
        assert_eq!(
            policy.check(&request("kube-apiserver", &[], &["evil.example"], &[])),
            Err(Refusal::DnsName("evil.example".into()))
        );
        assert_eq!(
            policy.check(&request("kube-apiserver", &[], &[], &["10.0.0.99"])),
            Err(Refusal::IpAddress("10.0.0.99".parse().unwrap()))
        );
        assert_eq!(
            policy.check(&request("system:node:node-1", &["system:nodes"], &[], &[])),
            Err(Refusal::CommonName("system:node:node-1".into()))
        );
    }

    #[test]
    fn a_worker_gets_no_control_plane_identities() {
        let policy = machine_policy(&view(false), Some("cp.example"), &["api.example".into()]);
        assert_eq!(
            policy.check(&request("system:node:node-0", &["system:nodes"], &[], &[])),
            Ok(())
        );
        assert_eq!(
            policy.check(&request(
                "node-0",
                &[],
                &["node-0", "node-0.internal"],
                &["10.0.0.5"]
            )),
            Ok(())
        );
        assert_eq!(
            policy.check(&request(
                "kubernetes-admin",
                &["kubeadm:cluster-admins"],
                &[],
                &[]
            )),
            Err(Refusal::CommonName("kubernetes-admin".into()))
        );
        assert_eq!(
            policy.check(&request("node-0", &[], &["kubernetes.default"], &[])),
            Err(Refusal::DnsName("kubernetes.default".into()))
        );
        assert_eq!(
            policy.check(&request(
                "system:node:node-0",
                &["system:masters"],
                &[],
                &[]
            )),
            Err(Refusal::Organization("system:masters".into()))
        );
    }
}
