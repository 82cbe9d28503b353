//! Writing a kubeadm-layout node PKI from a cluster's CAs: what `kubeadm init/join` would leave
//! on disk. The demo uses it to build its nodes, and tests use it to get real nodes in temp
//! directories.

use std::fs;
use std::net::IpAddr;

use caretaker_agent::{NodeLayout, kubeconfig};
use caretaker_agent_api::kubeadm::{
    APISERVER_DNS_NAMES, APISERVER_SERVICE_IP, NodeRole, SigningCa,
};
use caretaker_pki::files::{self, FileToWrite};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, PkiError, Ttl, Usage};

/// The three CAs of a kubeadm cluster.
#[derive(Debug)]
pub struct ClusterCas {
    pub cluster: CertificateAuthority,
    pub etcd: CertificateAuthority,
    pub front_proxy: CertificateAuthority,
}

impl ClusterCas {
    /// Fresh 10-year CAs named like kubeadm's.
    pub fn create() -> Result<Self, PkiError> {
        Ok(Self {
            cluster: CertificateAuthority::create(&CaSpec::new("kubernetes"))?,
            etcd: CertificateAuthority::create(&CaSpec::new("etcd-ca"))?,
            front_proxy: CertificateAuthority::create(&CaSpec::new("front-proxy-ca"))?,
        })
    }

    pub fn get(&self, ca: SigningCa) -> &CertificateAuthority {
        match ca {
            SigningCa::Cluster => &self.cluster,
            SigningCa::Etcd => &self.etcd,
            SigningCa::FrontProxy => &self.front_proxy,
        }
    }
}

/// One node to provision.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub node_name: String,
    pub addresses: Vec<IpAddr>,
    pub role: NodeRole,
    /// The control-plane endpoint host (a DNS name or IP) that apiserver certificates carry.
    pub control_plane_host: String,
    /// The API server URL written into kubeconfigs.
    pub server_url: String,
    /// Lifetime of every leaf.
    pub validity: Ttl,
}

/// The agent's serving certificate for a node, from the cluster CA: it names the node and its
/// addresses, which is how the operator knows it reached that node's agent and no other.
pub fn agent_serving_leaf(node_name: &str, addresses: &[IpAddr]) -> LeafSpec {
    LeafSpec::new(node_name, Usage::Server)
        .with_dns_names([node_name])
        .with_ip_addresses(addresses.iter().copied())
}

/// Writes the node's CA certificates (no CA keys), leaf pairs and kubeconfigs.
pub fn provision_node(
    layout: &NodeLayout,
    cas: &ClusterCas,
    spec: &NodeSpec,
) -> Result<(), ProvisionError> {
    fs::create_dir_all(layout.pki_dir.join("etcd"))?;
    fs::create_dir_all(&layout.kubeconfig_dir)?;
    let node = spec.node_name.as_str();
    let cas_on_node: &[SigningCa] = match spec.role {
        NodeRole::ControlPlane => &SigningCa::ALL,
        NodeRole::Worker => &[SigningCa::Cluster],
    };
    for ca in cas_on_node {
        let pem = cas.get(*ca).certificate_pem();
        files::write_atomic(
            &ca.certificate_path(&layout.pki_dir),
            pem.as_bytes(),
            files::CERTIFICATE_MODE,
        )?;
    }

    let leaf = |cn: &str, usage: Usage| LeafSpec::new(cn, usage).with_validity(spec.validity);
    let mut node_dns = vec![node.to_string()];
    let mut node_ips = spec.addresses.clone();
    write_pair(
        layout,
        "kubelet",
        cas.get(SigningCa::Cluster),
        &leaf(node, Usage::Server)
            .with_dns_names(node_dns.clone())
            .with_ip_addresses(node_ips.clone()),
    )?;
    write_kubeconfig(
        layout,
        "kubelet.conf",
        cas,
        spec,
        &leaf(&format!("system:node:{node}"), Usage::Client).with_organizations(["system:nodes"]),
    )?;
    if spec.role == NodeRole::Worker {
        return Ok(());
    }

    let mut apiserver_dns: Vec<String> =
        APISERVER_DNS_NAMES.iter().map(|s| s.to_string()).collect();
    apiserver_dns.push(node.to_string());
    let mut apiserver_ips = vec![APISERVER_SERVICE_IP.parse::<IpAddr>().expect("a valid IP")];
    apiserver_ips.extend(&spec.addresses);
    match spec.control_plane_host.parse::<IpAddr>() {
        Ok(ip) if !apiserver_ips.contains(&ip) => apiserver_ips.push(ip),
        Ok(_) => {}
        Err(_) => apiserver_dns.push(spec.control_plane_host.clone()),
    }
    write_pair(
        layout,
        "apiserver",
        &cas.cluster,
        &leaf("kube-apiserver", Usage::Server)
            .with_dns_names(apiserver_dns)
            .with_ip_addresses(apiserver_ips),
    )?;
    write_pair(
        layout,
        "apiserver-kubelet-client",
        &cas.cluster,
        &leaf("kube-apiserver-kubelet-client", Usage::Client)
            .with_organizations(["kubeadm:cluster-admins"]),
    )?;
    write_pair(
        layout,
        "apiserver-etcd-client",
        &cas.etcd,
        &leaf("kube-apiserver-etcd-client", Usage::Client),
    )?;
    write_pair(
        layout,
        "front-proxy-client",
        &cas.front_proxy,
        &leaf("front-proxy-client", Usage::Client),
    )?;
    node_dns.push("localhost".into());
    node_ips.extend([
        "127.0.0.1".parse::<IpAddr>().expect("valid"),
        "::1".parse().expect("valid"),
    ]);
    for name in ["etcd/server", "etcd/peer"] {
        write_pair(
            layout,
            name,
            &cas.etcd,
            &leaf(node, Usage::Both)
                .with_dns_names(node_dns.clone())
                .with_ip_addresses(node_ips.clone()),
        )?;
    }
    write_pair(
        layout,
        "etcd/healthcheck-client",
        &cas.etcd,
        &leaf("kube-etcd-healthcheck-client", Usage::Client),
    )?;
    for (file, cn, org) in [
        (
            "admin.conf",
            "kubernetes-admin",
            Some("kubeadm:cluster-admins"),
        ),
        (
            "super-admin.conf",
            "kubernetes-super-admin",
            Some("system:masters"),
        ),
        (
            "controller-manager.conf",
            "system:kube-controller-manager",
            None,
        ),
        ("scheduler.conf", "system:kube-scheduler", None),
    ] {
        write_kubeconfig(
            layout,
            file,
            cas,
            spec,
            &leaf(cn, Usage::Client).with_organizations(org),
        )?;
    }
    Ok(())
}

/// Writes `<stem>.crt` and `<stem>.key` (0600) under the PKI directory, issued by `ca`.
pub fn write_pair(
    layout: &NodeLayout,
    stem: &str,
    ca: &CertificateAuthority,
    spec: &LeafSpec,
) -> Result<(), ProvisionError> {
    let issued = ca.issue(spec)?;
    let key = issued.key.as_ref().expect("issue() returns a key").to_pem();
    let certificate = layout.pki_dir.join(format!("{stem}.crt"));
    let dir = certificate.parent().expect("has a parent");
    let base = certificate
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("UTF-8 stem");
    files::write_all(
        dir,
        &[
            FileToWrite {
                name: &format!("{base}.crt"),
                contents: issued.certificate_pem.as_bytes(),
                mode: files::CERTIFICATE_MODE,
            },
            FileToWrite {
                name: &format!("{base}.key"),
                contents: key.as_bytes(),
                mode: files::PRIVATE_KEY_MODE,
            },
        ],
    )?;
    Ok(())
}

fn write_kubeconfig(
    layout: &NodeLayout,
    file: &str,
    cas: &ClusterCas,
    node: &NodeSpec,
    spec: &LeafSpec,
) -> Result<(), ProvisionError> {
    let issued = cas.cluster.issue(spec)?;
    let key = issued.key.as_ref().expect("issue() returns a key").to_pem();
    let text = kubeconfig::render(
        "kubernetes",
        &node.server_url,
        &cas.cluster.certificate_pem(),
        &spec.common_name,
        &issued.certificate_pem,
        &key,
    );
    files::write_atomic(
        &layout.kubeconfig_dir.join(file),
        text.as_bytes(),
        files::PRIVATE_KEY_MODE,
    )?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
