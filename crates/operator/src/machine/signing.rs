//! What a Machine's certificates may say, decided by the operator alone.
//!
//! A node names the certificates it holds and sends a CSR for each, but a compromised node can
//! put anything on its disk. So nothing it says about a certificate is taken on trust: one fixed
//! table, keyed by the kubeadm certificate name, states which CA signs it, its exact common
//! name, organizations and usage, which SANs it may carry, and whether a worker may hold it at
//! all. The Machine's role is verified from the Cluster API objects, not from its label alone.
//! A plan that asks for anything else is refused whole, before anything is signed.

use std::collections::BTreeSet;
use std::net::IpAddr;

use caretaker_agent_api::kubeadm::{
    APISERVER_DNS_NAMES, APISERVER_SERVICE_IP, NodeRole, SigningCa,
};
use caretaker_agent_api::refresh::PlannedCertificate;
use caretaker_pki::{CertificateRequest, Refusal, SigningPolicy, Usage};

use crate::machine::{MachineView, ObjectRef};

/// The common name a certificate must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommonName {
    Fixed(&'static str),
    /// The node's name.
    Node,
    /// `system:node:<node>`, the kubelet's user.
    NodeUser,
}

/// The SANs a certificate may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sans {
    /// A client certificate: none.
    None,
    /// The node's name and its Machine's addresses.
    Node,
    /// As `Node`, plus `localhost`, 127.0.0.1 and ::1 (etcd's serving and peer certificates).
    NodeAndLoopback,
    /// As `NodeAndLoopback`, plus the in-cluster API server names and service IP, the
    /// control-plane endpoint host and the CK8sControlPlane's extra SANs.
    Apiserver,
}

/// One row of the table: everything a certificate of this name may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertificateProfile {
    /// The kubeadm name (`apiserver`, `etcd/peer`, `admin.conf`, …).
    pub name: &'static str,
    pub ca: SigningCa,
    common_name: CommonName,
    organizations: &'static [&'static str],
    pub usage: Usage,
    sans: Sans,
    /// Whether a worker may hold it; everything else is for verified control-plane Machines.
    for_workers: bool,
}

const fn profile_of(
    name: &'static str,
    ca: SigningCa,
    common_name: CommonName,
    organizations: &'static [&'static str],
    usage: Usage,
    sans: Sans,
) -> CertificateProfile {
    CertificateProfile {
        name,
        ca,
        common_name,
        organizations,
        usage,
        sans,
        for_workers: false,
    }
}

const fn client(
    name: &'static str,
    ca: SigningCa,
    common_name: &'static str,
    organizations: &'static [&'static str],
) -> CertificateProfile {
    profile_of(
        name,
        ca,
        CommonName::Fixed(common_name),
        organizations,
        Usage::Client,
        Sans::None,
    )
}

/// The certificates of a kubeadm node, as kubeadm issues them.
pub const PROFILES: [CertificateProfile; 13] = {
    use CommonName::*;
    use SigningCa::*;
    [
        // The two a worker has.
        CertificateProfile {
            for_workers: true,
            ..profile_of(
                "kubelet.conf",
                Cluster,
                NodeUser,
                &["system:nodes"],
                Usage::Client,
                Sans::None,
            )
        },
        CertificateProfile {
            for_workers: true,
            ..profile_of("kubelet", Cluster, Node, &[], Usage::Server, Sans::Node)
        },
        // Control plane only.
        profile_of(
            "apiserver",
            Cluster,
            Fixed("kube-apiserver"),
            &[],
            Usage::Server,
            Sans::Apiserver,
        ),
        client(
            "apiserver-kubelet-client",
            Cluster,
            "kube-apiserver-kubelet-client",
            &["kubeadm:cluster-admins"],
        ),
        client(
            "admin.conf",
            Cluster,
            "kubernetes-admin",
            &["kubeadm:cluster-admins"],
        ),
        client(
            "super-admin.conf",
            Cluster,
            "kubernetes-super-admin",
            &["system:masters"],
        ),
        client(
            "controller-manager.conf",
            Cluster,
            "system:kube-controller-manager",
            &[],
        ),
        client("scheduler.conf", Cluster, "system:kube-scheduler", &[]),
        client(
            "apiserver-etcd-client",
            Etcd,
            "kube-apiserver-etcd-client",
            &[],
        ),
        client(
            "etcd/healthcheck-client",
            Etcd,
            "kube-etcd-healthcheck-client",
            &[],
        ),
        profile_of(
            "etcd/server",
            Etcd,
            Node,
            &[],
            Usage::Both,
            Sans::NodeAndLoopback,
        ),
        profile_of(
            "etcd/peer",
            Etcd,
            Node,
            &[],
            Usage::Both,
            Sans::NodeAndLoopback,
        ),
        client("front-proxy-client", FrontProxy, "front-proxy-client", &[]),
    ]
};

/// The table row for a kubeadm certificate name.
pub fn profile(name: &str) -> Option<&'static CertificateProfile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// What the operator itself observed about a Machine, from the Cluster API objects: never from
/// the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineIdentity {
    pub machine: String,
    pub node_name: String,
    /// The Machine's `status.addresses` (IPs and host names).
    pub addresses: Vec<String>,
    /// The role verified by [`verified_role`].
    pub role: NodeRole,
    /// The Cluster's control-plane endpoint host.
    pub endpoint_host: Option<String>,
    /// The CK8sControlPlane's `extraSANs`.
    pub extra_sans: Vec<String>,
}

/// How one certificate of a plan is to be signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningDecision {
    pub name: String,
    pub ca: SigningCa,
    /// Allows exactly the table's subject and usage and the SANs the Machine may have.
    pub policy: SigningPolicy,
}

/// Why a plan was refused. Each names the certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningRefusal {
    #[error("{name:?} is not a certificate caretaker signs")]
    Unknown { name: String },
    #[error(
        "{name} is a control-plane certificate and Machine {machine} is not a verified control-plane Machine"
    )]
    ControlPlaneOnly { name: String, machine: String },
    #[error("{name} is signed by the {expected} CA, but the node asked for the {requested} CA")]
    WrongCa {
        name: String,
        expected: &'static str,
        requested: &'static str,
    },
    #[error("the CSR for {name} is invalid: {reason}")]
    InvalidCsr { name: String, reason: String },
    #[error("{name} ({subject}): {refusal}")]
    Policy {
        name: String,
        subject: String,
        refusal: Refusal,
    },
    #[error("{name} must have organizations {expected:?}, its CSR asks for {requested:?}")]
    Organizations {
        name: String,
        expected: Vec<String>,
        requested: Vec<String>,
    },
    #[error("{name} must have usage {expected}, its CSR asks for {requested}")]
    Usage {
        name: String,
        expected: Usage,
        requested: String,
    },
}

impl MachineIdentity {
    /// Decides how to sign every certificate of a plan, or refuses the whole plan with the first
    /// certificate that asks for anything the table does not give this Machine.
    pub fn signing_plan(
        &self,
        requests: &[PlannedCertificate],
    ) -> Result<Vec<SigningDecision>, SigningRefusal> {
        requests.iter().map(|r| self.decide(r)).collect()
    }

    fn decide(&self, request: &PlannedCertificate) -> Result<SigningDecision, SigningRefusal> {
        let name = request.name.clone();
        let profile =
            profile(&name).ok_or_else(|| SigningRefusal::Unknown { name: name.clone() })?;
        if self.role == NodeRole::Worker && !profile.for_workers {
            return Err(SigningRefusal::ControlPlaneOnly {
                name,
                machine: self.machine.clone(),
            });
        }
        // The CA is the table's; a node naming another one is lying or misconfigured.
        if request.ca != profile.ca {
            return Err(SigningRefusal::WrongCa {
                name,
                expected: profile.ca.name(),
                requested: request.ca.name(),
            });
        }
        let csr = CertificateRequest::from_pem(&request.csr_pem).map_err(|e| {
            SigningRefusal::InvalidCsr {
                name: name.clone(),
                reason: e.to_string(),
            }
        })?;
        let policy = self.policy(profile);
        policy
            .check(&csr)
            .map_err(|refusal| SigningRefusal::Policy {
                name: name.clone(),
                subject: csr.describe(),
                refusal,
            })?;
        // The policy allows a subset; the subject and usage must be exactly the table's.
        let expected: BTreeSet<&str> = profile.organizations.iter().copied().collect();
        let requested: BTreeSet<&str> = csr.organizations.iter().map(String::as_str).collect();
        if expected != requested {
            return Err(SigningRefusal::Organizations {
                name,
                expected: expected.into_iter().map(str::to_string).collect(),
                requested: requested.into_iter().map(str::to_string).collect(),
            });
        }
        if csr.usage != Some(profile.usage) {
            return Err(SigningRefusal::Usage {
                name,
                expected: profile.usage,
                requested: csr.usage.map_or("none".into(), |u| u.to_string()),
            });
        }
        Ok(SigningDecision {
            name,
            ca: profile.ca,
            policy,
        })
    }

    /// The policy of one table row for this Machine.
    fn policy(&self, profile: &CertificateProfile) -> SigningPolicy {
        let node = &self.node_name;
        let mut policy = SigningPolicy {
            common_names: vec![match profile.common_name {
                CommonName::Fixed(cn) => cn.to_string(),
                CommonName::Node => node.clone(),
                CommonName::NodeUser => format!("system:node:{node}"),
            }],
            organizations: profile
                .organizations
                .iter()
                .map(|o| o.to_string())
                .collect(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usage: Some(profile.usage),
        };
        let mut allow = |name: &str| match name.parse::<IpAddr>() {
            Ok(ip) => policy.ip_addresses.push(ip),
            Err(_) => policy.dns_names.push(name.to_string()),
        };
        if profile.sans != Sans::None {
            allow(node);
            self.addresses.iter().for_each(|a| allow(a));
        }
        if matches!(profile.sans, Sans::NodeAndLoopback | Sans::Apiserver) {
            ["localhost", "127.0.0.1", "::1"]
                .into_iter()
                .for_each(&mut allow);
        }
        if profile.sans == Sans::Apiserver {
            APISERVER_DNS_NAMES.into_iter().for_each(&mut allow);
            allow(APISERVER_SERVICE_IP);
            self.endpoint_host.iter().for_each(|h| allow(h));
            self.extra_sans.iter().for_each(|s| allow(s));
        }
        policy
    }
}

/// Why a Machine's control-plane role could not be verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleMismatch {
    #[error(
        "Machine {machine} is labelled {label} but is not controlled by the Cluster's control plane {control_plane}"
    )]
    LabelWithoutOwner {
        machine: String,
        label: &'static str,
        control_plane: String,
    },
    #[error(
        "Machine {machine} is controlled by the Cluster's control plane {control_plane} but is not labelled {label}"
    )]
    OwnerWithoutLabel {
        machine: String,
        label: &'static str,
        control_plane: String,
    },
}

/// The Machine's role: a control-plane Machine only when its `cluster.x-k8s.io/control-plane`
/// label agrees with a controller owner reference to the Cluster's `spec.controlPlaneRef`
/// object. A label is easy to set; an owner reference to the control plane is what Cluster
/// API itself relies on. Either one without the other is refused.
pub fn verified_role(
    machine: &MachineView,
    control_plane_ref: Option<&ObjectRef>,
) -> Result<NodeRole, RoleMismatch> {
    let labelled = machine.control_plane;
    let owned = match (control_plane_ref, &machine.controller) {
        (Some(wanted), Some(controller)) => controller == wanted,
        _ => false,
    };
    let control_plane = || control_plane_ref.map_or_else(|| "(none)".into(), ObjectRef::describe);
    match (labelled, owned) {
        (true, true) => Ok(NodeRole::ControlPlane),
        (false, false) => Ok(NodeRole::Worker),
        (true, false) => Err(RoleMismatch::LabelWithoutOwner {
            machine: machine.name.clone(),
            label: caretaker_api::names::CONTROL_PLANE_LABEL,
            control_plane: control_plane(),
        }),
        (false, true) => Err(RoleMismatch::OwnerWithoutLabel {
            machine: machine.name.clone(),
            label: caretaker_api::names::CONTROL_PLANE_LABEL,
            control_plane: control_plane(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_machine;
    use caretaker_pki::{CsrSubject, KeyAlgorithm, PrivateKey};

    fn identity(role: NodeRole) -> MachineIdentity {
        MachineIdentity {
            machine: "m-0".into(),
            node_name: "node-0".into(),
            addresses: vec!["10.0.0.5".into(), "node-0.internal".into()],
            role,
            endpoint_host: Some("cp.example".into()),
            extra_sans: vec!["api.example".into(), "192.168.1.1".into()],
        }
    }

    struct Ask<'a> {
        name: &'a str,
        ca: SigningCa,
        cn: &'a str,
        orgs: &'a [&'a str],
        dns: &'a [&'a str],
        ips: &'a [&'a str],
        usage: Usage,
    }

    impl Ask<'_> {
        fn planned(&self) -> PlannedCertificate {
            let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
            let subject = CsrSubject {
                common_name: self.cn.into(),
                organizations: self.orgs.iter().map(|s| s.to_string()).collect(),
                dns_names: self.dns.iter().map(|s| s.to_string()).collect(),
                ip_addresses: self.ips.iter().map(|s| s.parse().unwrap()).collect(),
                usage: self.usage,
            };
            PlannedCertificate {
                name: self.name.into(),
                ca: self.ca,
                csr_pem: subject.to_csr_pem(&key).unwrap(),
                common_name: subject.common_name,
                organizations: subject.organizations,
                dns_names: subject.dns_names,
                ip_addresses: subject.ip_addresses,
                usage: subject.usage,
            }
        }
    }

    /// What a kubeadm node of this role has, exactly as kubeadm (and `provision_node`) issue it.
    fn kubeadm_node(role: NodeRole) -> Vec<PlannedCertificate> {
        let node = Ask {
            name: "kubelet",
            ca: SigningCa::Cluster,
            cn: "node-0",
            orgs: &[],
            dns: &["node-0"],
            ips: &["10.0.0.5"],
            usage: Usage::Server,
        };
        let mut asks = vec![
            Ask {
                name: "kubelet.conf",
                cn: "system:node:node-0",
                orgs: &["system:nodes"],
                dns: &[],
                ips: &[],
                usage: Usage::Client,
                ..node
            },
            Ask { ..node },
        ];
        if role == NodeRole::ControlPlane {
            let client = |name, ca, cn, orgs| Ask {
                name,
                ca,
                cn,
                orgs,
                dns: &[],
                ips: &[],
                usage: Usage::Client,
            };
            asks.extend([
                Ask {
                    name: "apiserver",
                    cn: "kube-apiserver",
                    dns: &[
                        "kubernetes",
                        "kubernetes.default.svc",
                        "node-0",
                        "cp.example",
                    ],
                    ips: &["10.96.0.1", "10.0.0.5", "192.168.1.1"],
                    ..node
                },
                client(
                    "apiserver-kubelet-client",
                    SigningCa::Cluster,
                    "kube-apiserver-kubelet-client",
                    &["kubeadm:cluster-admins"],
                ),
                client(
                    "admin.conf",
                    SigningCa::Cluster,
                    "kubernetes-admin",
                    &["kubeadm:cluster-admins"],
                ),
                client(
                    "super-admin.conf",
                    SigningCa::Cluster,
                    "kubernetes-super-admin",
                    &["system:masters"],
                ),
                client(
                    "controller-manager.conf",
                    SigningCa::Cluster,
                    "system:kube-controller-manager",
                    &[],
                ),
                client(
                    "scheduler.conf",
                    SigningCa::Cluster,
                    "system:kube-scheduler",
                    &[],
                ),
                client(
                    "apiserver-etcd-client",
                    SigningCa::Etcd,
                    "kube-apiserver-etcd-client",
                    &[],
                ),
                client(
                    "etcd/healthcheck-client",
                    SigningCa::Etcd,
                    "kube-etcd-healthcheck-client",
                    &[],
                ),
                client(
                    "front-proxy-client",
                    SigningCa::FrontProxy,
                    "front-proxy-client",
                    &[],
                ),
            ]);
            for name in ["etcd/server", "etcd/peer"] {
                asks.push(Ask {
                    name,
                    ca: SigningCa::Etcd,
                    dns: &["node-0", "localhost"],
                    ips: &["10.0.0.5", "127.0.0.1", "::1"],
                    usage: Usage::Both,
                    ..node
                });
            }
        }
        asks.iter().map(Ask::planned).collect()
    }

    #[test]
    fn the_table_covers_every_kubeadm_slot_once() {
        let names: BTreeSet<&str> = PROFILES.iter().map(|p| p.name).collect();
        let slots: BTreeSet<&str> = caretaker_agent_api::kubeadm::SLOTS
            .iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, slots);
        assert_eq!(names.len(), PROFILES.len());
        for p in PROFILES {
            let slot = caretaker_agent_api::kubeadm::slot(p.name).unwrap();
            assert_eq!(
                slot.ca, p.ca,
                "{}: the agent's layout and the table agree",
                p.name
            );
        }
    }

    #[test]
    fn what_kubeadm_issues_is_signed_with_the_tables_ca() {
        for role in [NodeRole::ControlPlane, NodeRole::Worker] {
            let plan = kubeadm_node(role);
            let decisions = identity(role).signing_plan(&plan).unwrap();
            assert_eq!(
                decisions.len(),
                if role == NodeRole::Worker { 2 } else { 13 }
            );
            for d in &decisions {
                assert_eq!(d.ca, profile(&d.name).unwrap().ca);
            }
        }
    }

    /// The attack from the review: a worker's root user plants control-plane certificates (an
    /// etcd client with the kubelet's subject, an admin kubeconfig) and asks for them. Every
    /// control-plane certificate is refused for a worker, whatever its subject says.
    #[test]
    fn a_worker_gets_no_control_plane_certificate() {
        let worker = identity(NodeRole::Worker);
        for planned in kubeadm_node(NodeRole::ControlPlane) {
            let name = planned.name.clone();
            let result = worker.signing_plan(&[planned]);
            if profile(&name).unwrap().for_workers {
                assert!(result.is_ok(), "{name}: {result:?}");
            } else {
                assert_eq!(
                    result,
                    Err(SigningRefusal::ControlPlaneOnly {
                        name,
                        machine: "m-0".into()
                    })
                );
            }
        }
        let disguised = Ask {
            name: "etcd/healthcheck-client",
            ca: SigningCa::Etcd,
            cn: "system:node:node-0",
            orgs: &["system:nodes"],
            dns: &[],
            ips: &[],
            usage: Usage::Client,
        };
        let refusal = worker.signing_plan(&[disguised.planned()]).unwrap_err();
        assert!(
            refusal.to_string().contains("etcd/healthcheck-client"),
            "{refusal}"
        );
    }

    #[test]
    fn the_node_cannot_choose_the_ca() {
        // The kubelet's client certificate, asked for from the etcd or front-proxy CA.
        for ca in [SigningCa::Etcd, SigningCa::FrontProxy] {
            let ask = Ask {
                name: "kubelet.conf",
                ca,
                cn: "system:node:node-0",
                orgs: &["system:nodes"],
                dns: &[],
                ips: &[],
                usage: Usage::Client,
            };
            assert_eq!(
                identity(NodeRole::ControlPlane).signing_plan(&[ask.planned()]),
                Err(SigningRefusal::WrongCa {
                    name: "kubelet.conf".into(),
                    expected: "ca",
                    requested: ca.name(),
                })
            );
        }
    }

    #[test]
    fn subjects_usages_and_sans_are_exactly_the_tables() {
        let cp = identity(NodeRole::ControlPlane);
        let base = Ask {
            name: "admin.conf",
            ca: SigningCa::Cluster,
            cn: "kubernetes-admin",
            orgs: &["kubeadm:cluster-admins"],
            dns: &[],
            ips: &[],
            usage: Usage::Client,
        };
        let refuse = |ask: Ask| cp.signing_plan(&[ask.planned()]).unwrap_err();
        // admin.conf may not become system:masters, nor another CP identity.
        assert!(matches!(
            refuse(Ask { orgs: &["system:masters"], ..base }),
            SigningRefusal::Policy { refusal: Refusal::Organization(o), .. } if o == "system:masters"
        ));
        assert!(matches!(
            refuse(Ask {
                cn: "kubernetes-super-admin",
                ..base
            }),
            SigningRefusal::Policy {
                refusal: Refusal::CommonName(_),
                ..
            }
        ));
        // A missing organization is refused too: the subject is exact, not a subset.
        assert!(matches!(
            refuse(Ask { orgs: &[], ..base }),
            SigningRefusal::Organizations { .. }
        ));
        // A client certificate cannot become a server certificate, or carry SANs.
        assert!(matches!(
            refuse(Ask {
                usage: Usage::Both,
                ..base
            }),
            SigningRefusal::Policy {
                refusal: Refusal::Usage { .. },
                ..
            }
        ));
        assert!(matches!(
            refuse(Ask {
                dns: &["node-0"],
                ..base
            }),
            SigningRefusal::Policy {
                refusal: Refusal::DnsName(_),
                ..
            }
        ));
        // A serving certificate asked for with client usage only is not the table's either.
        let etcd = Ask {
            name: "etcd/server",
            ca: SigningCa::Etcd,
            cn: "node-0",
            orgs: &[],
            dns: &["node-0"],
            ips: &[],
            usage: Usage::Server,
        };
        assert!(matches!(refuse(etcd), SigningRefusal::Usage { .. }));
        // Foreign names, by name.
        let apiserver = Ask {
            name: "apiserver",
            cn: "kube-apiserver",
            dns: &["evil.example"],
            usage: Usage::Server,
            orgs: &[],
            ..base
        };
        assert!(matches!(
            refuse(apiserver),
            SigningRefusal::Policy { refusal: Refusal::DnsName(d), .. } if d == "evil.example"
        ));
        let kubelet = Ask {
            name: "kubelet",
            cn: "node-0",
            orgs: &[],
            ips: &["10.96.0.1"],
            usage: Usage::Server,
            ..base
        };
        // The service IP is the apiserver's, not the kubelet's.
        assert!(matches!(
            refuse(kubelet),
            SigningRefusal::Policy {
                refusal: Refusal::IpAddress(_),
                ..
            }
        ));
        let other_node = Ask {
            name: "kubelet.conf",
            cn: "system:node:node-1",
            orgs: &["system:nodes"],
            ..base
        };
        assert!(matches!(
            refuse(other_node),
            SigningRefusal::Policy { refusal: Refusal::CommonName(c), .. } if c == "system:node:node-1"
        ));
        assert_eq!(
            refuse(Ask {
                name: "../../ca",
                ..base
            }),
            SigningRefusal::Unknown {
                name: "../../ca".into()
            }
        );
    }

    #[test]
    fn one_refused_certificate_refuses_the_whole_plan() {
        let mut plan = kubeadm_node(NodeRole::Worker);
        plan.push(
            Ask {
                name: "front-proxy-client",
                ca: SigningCa::FrontProxy,
                cn: "front-proxy-client",
                orgs: &[],
                dns: &[],
                ips: &[],
                usage: Usage::Client,
            }
            .planned(),
        );
        let refusal = identity(NodeRole::Worker).signing_plan(&plan).unwrap_err();
        assert!(
            matches!(refusal, SigningRefusal::ControlPlaneOnly { name, .. } if name == "front-proxy-client")
        );
    }

    fn control_plane_ref() -> ObjectRef {
        ObjectRef {
            group: "controlplane.cluster.x-k8s.io".into(),
            kind: "CK8sControlPlane".into(),
            name: "c1-control-plane".into(),
        }
    }

    fn machine(labelled: bool, controller: Option<ObjectRef>) -> MachineView {
        let mut m = test_machine(&[]);
        m.control_plane = labelled;
        m.controller = controller;
        m
    }

    #[test]
    fn the_control_plane_role_needs_the_label_and_the_owner() {
        let cp = control_plane_ref();
        let wanted = Some(&cp);
        assert_eq!(
            verified_role(&machine(true, Some(cp.clone())), wanted),
            Ok(NodeRole::ControlPlane)
        );
        assert_eq!(
            verified_role(&machine(false, None), wanted),
            Ok(NodeRole::Worker)
        );
        // A MachineSet-owned worker is a worker.
        let machine_set = ObjectRef {
            group: "cluster.x-k8s.io".into(),
            kind: "MachineSet".into(),
            name: "md-0-abc".into(),
        };
        assert_eq!(
            verified_role(&machine(false, Some(machine_set.clone())), wanted),
            Ok(NodeRole::Worker)
        );
        // The attack: a worker labelled control-plane.
        assert!(matches!(
            verified_role(&machine(true, Some(machine_set)), wanted),
            Err(RoleMismatch::LabelWithoutOwner { .. })
        ));
        assert!(matches!(
            verified_role(&machine(true, None), wanted),
            Err(RoleMismatch::LabelWithoutOwner { .. })
        ));
        // Owned by a control plane of the same name but another kind or group, or another name.
        for other in [
            ObjectRef {
                kind: "KubeadmControlPlane".into(),
                ..cp.clone()
            },
            ObjectRef {
                group: "evil.example".into(),
                ..cp.clone()
            },
            ObjectRef {
                name: "c2-control-plane".into(),
                ..cp.clone()
            },
        ] {
            assert!(matches!(
                verified_role(&machine(true, Some(other)), wanted),
                Err(RoleMismatch::LabelWithoutOwner { .. })
            ));
        }
        // Without a Cluster control plane, no Machine is a control-plane Machine.
        assert!(verified_role(&machine(true, Some(cp.clone())), None).is_err());
        assert!(matches!(
            verified_role(&machine(false, Some(cp.clone())), wanted),
            Err(RoleMismatch::OwnerWithoutLabel { .. })
        ));
    }
}
