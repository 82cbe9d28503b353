//! The etcd plan against a simulated namespace and simulated members that load
//! `etcd-all-certs` only when they restart, as etcd does. Real certificates (pki), so that
//! "member A accepts member B's peer certificate" is a real signature check.

use std::collections::BTreeMap;

use serde_json::json;
use time::OffsetDateTime;

use super::*;
use crate::authority::PkiMint;
use crate::authority::ca::AuthorityStep;
use caretaker_api::names::CA_BUNDLE_CRT;
use caretaker_api::v1alpha1::EtcdCertificatesSpec;

fn policy(members: &[&str]) -> EtcdPolicy {
    let members: Vec<_> = members
        .iter()
        .map(|m| json!({"name": m, "addresses": [format!("{m}.etcd.example")]}))
        .collect();
    let spec: EtcdCertificatesSpec = serde_json::from_value(json!({
        "members": members,
        "signer": {"trustPropagation": "0s"},
        "metricsSigner": {"trustPropagation": "0s"},
        "quorum": {"endpoints": ["https://127.0.0.1:2379"]},
    }))
    .unwrap();
    EtcdPolicy::from_spec(&spec).unwrap()
}

/// The listed members, none refused.
fn listed(policy: &EtcdPolicy) -> Membership {
    Membership {
        members: policy.members.clone(),
        refused: Vec::new(),
    }
}

/// One simulated member: the `etcd-all-certs` it loaded when it last started, and whether it
/// runs.
#[derive(Clone)]
struct Member {
    name: String,
    loaded: Option<BTreeMap<String, String>>,
    running: bool,
}

impl Member {
    fn pem(&self, key: &str) -> Option<Certificate> {
        let pem = self.loaded.as_ref()?.get(key)?;
        Certificate::parse_pem(pem).ok()?.into_iter().next()
    }

    fn serving(&self) -> Option<Certificate> {
        self.pem(&format!("{}.crt", member_secret(Role::Serving, &self.name)))
    }

    fn peer(&self) -> Option<Certificate> {
        self.pem(&format!("{}.crt", member_secret(Role::Peer, &self.name)))
    }

    /// Whether it accepts `leaf` (a peer's or a client's certificate): signed by a CA of the
    /// bundle it loaded.
    fn trusts(&self, leaf: &Certificate) -> bool {
        let Some(bundle) = self
            .loaded
            .as_ref()
            .and_then(|l| l.get(ALL_CERTS_CA_BUNDLE))
        else {
            return false;
        };
        Certificate::parse_pem(bundle)
            .unwrap()
            .iter()
            .any(|ca| caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap())
    }
}

/// The namespace and the members.
struct World {
    policy: EtcdPolicy,
    membership: Membership,
    seen: EtcdObserved,
    members: Vec<Member>,
    revisions: Vec<String>,
    minted_signers: usize,
    events: Vec<Event>,
}

impl World {
    fn new(names: &[&str]) -> Self {
        let policy = policy(names);
        Self {
            membership: listed(&policy),
            policy,
            seen: EtcdObserved {
                namespace: "etcd-system".into(),
                ..EtcdObserved::default()
            },
            members: names
                .iter()
                .map(|n| Member {
                    name: n.to_string(),
                    loaded: None,
                    running: false,
                })
                .collect(),
            revisions: Vec::new(),
            minted_signers: 0,
            events: Vec::new(),
        }
    }

    /// What the members answer now, as the glue would see it. The quorum endpoints are those
    /// of the members that have started once (a member joins the list of endpoints after
    /// it joined the cluster).
    fn ask(&mut self) {
        let next = next_signer(&self.seen);
        let bootstrapped = self.members.iter().any(|m| m.loaded.is_some());
        self.seen.health = self
            .members
            .iter()
            .filter(|m| !bootstrapped || m.loaded.is_some())
            .map(|m| EndpointHealth {
                endpoint: format!("https://{}.etcd.example:2379", m.name),
                answer: if m.running {
                    Ok(MemberAnswer {
                        healthy: true,
                        serving: m.serving(),
                        accepts_next: next.as_ref().map(|n| {
                            let probe = PkiMint
                                .issue(n, &LeafSpec::new("probe", Usage::Client))
                                .unwrap();
                            m.trusts(&probe.certificate)
                        }),
                    })
                } else {
                    Err("connect: refused".into())
                },
            })
            .collect();
    }

    /// One pass, its writes applied.
    fn pass(&mut self) -> EtcdPlan {
        self.ask();
        let plan = plan(
            &self.seen,
            &self.policy,
            &self.membership,
            OffsetDateTime::now_utc(),
            &PkiMint,
        )
        .unwrap();
        for step in &plan.steps {
            self.apply(step);
        }
        self.events.extend(plan.events.iter().cloned());
        plan
    }

    fn apply(&mut self, step: &EtcdStep) {
        fn secret<'a>(seen: &'a mut EtcdObserved, name: &str) -> &'a mut SecretObject {
            seen.secrets.entry(name.to_string()).or_default()
        }
        match step {
            EtcdStep::Signer(signer, AuthorityStep::WriteSecret(ca)) => {
                if ca.next.is_some() || ca.current.is_some() {
                    let (data, annotations) = secret(&mut self.seen, signer.secret());
                    let before: Vec<u8> = data
                        .get(caretaker_api::names::NEXT_CRT)
                        .cloned()
                        .unwrap_or_default();
                    ca.data().apply_to(data);
                    ca.annotation_changes().apply_to(annotations);
                    let after = data
                        .get(caretaker_api::names::NEXT_CRT)
                        .cloned()
                        .unwrap_or_default();
                    if !after.is_empty() && after != before {
                        self.minted_signers += 1;
                    }
                }
            }
            EtcdStep::Signer(signer, AuthorityStep::WriteBundle(bundle)) => {
                let (data, annotations) = self
                    .seen
                    .config_maps
                    .entry(signer.bundle().to_string())
                    .or_default();
                for (k, v) in bundle.data() {
                    data.insert(k.to_string(), v);
                }
                bundle.annotation_changes().apply_to(annotations);
            }
            EtcdStep::Certificate { secret: name, step } => {
                let (data, annotations) = secret(&mut self.seen, name);
                step.data().apply_to(data);
                step.annotation_changes().apply_to(annotations);
            }
            EtcdStep::AllCerts(all) => {
                let (data, _) = secret(&mut self.seen, ALL_CERTS);
                *data = all
                    .data
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
                    .collect();
                self.revisions.push(all.revision.clone());
            }
            EtcdStep::Delete(name) => {
                self.seen.secrets.remove(name);
            }
            EtcdStep::CaConfigMap { name, bundle } => {
                let (data, _) = self.seen.config_maps.entry(name.to_string()).or_default();
                data.insert("ca-bundle.crt".to_string(), bundle.clone());
            }
            EtcdStep::Endpoints(endpoints) => {
                let (data, _) = (self.seen.config_maps)
                    .entry(crate::etcd::ENDPOINTS_CONFIG_MAP.to_string())
                    .or_default();
                *data = endpoints.clone();
            }
            EtcdStep::RecheckQuorum => {}
        }
    }

    fn stored_all(&self) -> Option<BTreeMap<String, String>> {
        self.seen.all_certs()
    }

    /// The installer, slower than the operator: restarts one member (the first not on the
    /// stored `etcd-all-certs`) per call, then checks that every running member accepts
    /// every other's peer certificate (no member is cut off).
    fn roll(&mut self) {
        let Some(all) = self.stored_all() else { return };
        let behind = self
            .members
            .iter_mut()
            .find(|m| m.running && m.loaded.as_ref() != Some(&all));
        if let Some(member) = behind {
            member.loaded = Some(all);
            self.assert_members_connected();
        }
    }

    fn start_all(&mut self) {
        let all = self.stored_all().expect("etcd-all-certs");
        for m in &mut self.members {
            m.loaded = Some(all.clone());
            m.running = true;
        }
        self.assert_members_connected();
    }

    fn assert_members_connected(&self) {
        for a in self.members.iter().filter(|m| m.running) {
            for b in self.members.iter().filter(|m| m.running) {
                let peer = b.peer().unwrap();
                assert!(
                    a.trusts(&peer),
                    "{} does not accept {}'s peer certificate (revision {:?})",
                    a.name,
                    b.name,
                    self.revisions
                );
            }
        }
    }

    /// Passes and rolls until a pass writes nothing and nothing waits on the members.
    fn settle(&mut self) -> EtcdPlan {
        for _ in 0..60 {
            let plan = self.pass();
            self.roll();
            if plan.steps.is_empty() && !plan.waits_on_members {
                return plan;
            }
        }
        panic!("did not settle; revisions {:?}", self.revisions);
    }

    fn force_rotation(&mut self) {
        let (_, annotations) = self.seen.secrets.get_mut(SIGNER_SECRET).unwrap();
        annotations.remove(caretaker_api::names::CERTIFICATE_NOT_AFTER);
    }

    fn signer_serial(&self) -> String {
        let (data, _) = &self.seen.secrets[SIGNER_SECRET];
        let pem = String::from_utf8_lossy(&data[TLS_CRT]).into_owned();
        Certificate::parse_pem(&pem).unwrap()[0]
            .serial()
            .to_string()
    }
}

#[test]
fn bootstrap_writes_every_certificate_and_the_first_revision_without_a_gate() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    let plan = world.pass();
    assert!(!plan.held, "nothing runs before the first revision");
    assert_eq!(world.revisions.len(), 1);
    let all = world.stored_all().unwrap();
    let mut keys: Vec<&str> = all.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys.len(), 3 * 3 * 2 + 2, "{keys:?}");
    assert!(keys.contains(&"etcd-peer-m0.crt") && keys.contains(&"etcd-serving-metrics-m2.key"));
    assert!(keys.contains(&ALL_CERTS_CA_BUNDLE) && keys.contains(&ALL_CERTS_METRICS_CA_BUNDLE));
    // Names, SANs and signers as the OpenShift operator has them.
    for name in [
        "etcd-signer",
        "etcd-metric-signer",
        "etcd-client",
        "etcd-metric-client",
        "etcd-peer-m1",
        "etcd-serving-m1",
        "etcd-serving-metrics-m1",
    ] {
        assert!(world.seen.secrets.contains_key(name), "{name}");
    }
    assert!(world.seen.config_maps.contains_key(CA_BUNDLE));
    assert!(world.seen.config_maps.contains_key(METRICS_CA_BUNDLE));
    let peer = world.members[1].clone();
    let mut loaded = peer.clone();
    loaded.loaded = Some(all.clone());
    let info = loaded.peer().unwrap().info().clone();
    assert!(info.dns_names.contains(&"localhost".to_string()));
    assert!(info.dns_names.contains(&"m1.etcd.example".to_string()));
    assert!(info.ip_addresses.contains(&"127.0.0.1".parse().unwrap()));
    let metric_ca = &world.seen.config_maps[METRICS_CA_BUNDLE].0[CA_BUNDLE_CRT];
    let metrics_leaf = loaded.pem("etcd-serving-metrics-m1.crt").unwrap();
    assert!(
        !loaded.trusts(&metrics_leaf),
        "metrics certificates come from the other signer"
    );
    assert!(
        Certificate::parse_pem(metric_ca)
            .unwrap()
            .iter()
            .any(|ca| { caretaker_pki::is_issued_by(metrics_leaf.der(), ca.der()).unwrap() })
    );
    world.start_all();
    let plan = world.settle();
    assert!(plan.status.ready.status, "{:?}", plan.status.ready);
    assert!(!plan.status.degraded.status);
    // Steady state: nothing to write.
    assert!(world.pass().steps.is_empty());
}

#[test]
fn a_signer_rotation_takes_three_revisions_and_never_cuts_a_member_off() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    let before = world.signer_serial();
    let first = world.revisions.len();
    world.force_rotation();
    world.settle();
    assert_ne!(world.signer_serial(), before, "the signer was replaced");
    assert_eq!(world.minted_signers, 1, "one new signer");
    // Trust, then certificates, then the old signer's removal: each its own revision, and
    // every member accepted every other's certificate after each restart (`roll`).
    assert_eq!(world.revisions.len() - first, 3, "{:?}", world.revisions);
    let (bundle, _) = &world.seen.config_maps[CA_BUNDLE];
    assert_eq!(
        Certificate::parse_pem(&bundle[CA_BUNDLE_CRT])
            .unwrap()
            .len(),
        1,
        "the old signer left the bundle"
    );
    let reasons: Vec<&str> = world.events.iter().map(|e| e.reason).collect();
    for reason in [
        "SignerUpdateRequired",
        "TargetUpdateRequired",
        "CABundleUpdateRequired",
        "RevisionTriggered",
    ] {
        assert!(reasons.contains(&reason), "{reason} in {reasons:?}");
    }
}

#[test]
fn the_gate_holds_a_revision_while_a_member_is_down_and_lets_it_through_after() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    let revision = world.stored_all();
    world.members[2].running = false;
    world.force_rotation();
    let plan = world.pass();
    assert!(plan.held);
    assert_eq!(world.stored_all(), revision, "etcd-all-certs unchanged");
    // Adding trust restarts nothing: the bundle ConfigMap already holds the next signer.
    let (bundle, _) = &world.seen.config_maps[CA_BUNDLE];
    assert_eq!(
        Certificate::parse_pem(&bundle[CA_BUNDLE_CRT])
            .unwrap()
            .len(),
        2
    );
    assert!(plan.status.degraded.status);
    assert_eq!(plan.status.degraded.reason, REASON_INSUFFICIENT_QUORUM);
    assert!(
        plan.status
            .degraded
            .message
            .starts_with(SKIPPING_FOR_QUORUM)
            && plan
                .status
                .degraded
                .message
                .contains("member m2 at https://m2.etcd.example:2379"),
        "{}",
        plan.status.degraded.message
    );
    assert!(plan.waits_on_members);
    let warnings = plan
        .events
        .iter()
        .filter(|e| e.reason == REASON_INSUFFICIENT_QUORUM)
        .count();
    assert_eq!(warnings, 1);
    // Said once: the next pass, with the status saying it, warns no more.
    world.seen.reported_degraded = Some(plan.status.degraded.message.clone());
    let again = world.pass();
    assert!(
        again.held
            && again
                .events
                .iter()
                .all(|e| e.reason != REASON_INSUFFICIENT_QUORUM)
    );
    assert_eq!(world.stored_all(), revision);
    // The member comes back: the rotation goes on by itself.
    world.members[2].running = true;
    world.seen.reported_degraded = None;
    let plan = world.settle();
    assert!(!plan.status.degraded.status);
    assert_ne!(world.stored_all(), revision);
    assert_eq!(world.minted_signers, 1);
}

#[test]
fn quorum_needs_one_member_to_spare() {
    let health = |up: &[bool]| -> Vec<EndpointHealth> {
        up.iter()
            .enumerate()
            .map(|(i, up)| EndpointHealth {
                endpoint: format!("https://10.0.0.{i}:2379"),
                answer: if *up {
                    Ok(MemberAnswer {
                        healthy: true,
                        serving: None,
                        accepts_next: None,
                    })
                } else {
                    Err("down".into())
                },
            })
            .collect()
    };
    let open = |up: &[bool]| Quorum::of(&health(up), &[]).open();
    assert!(open(&[true, true, true]));
    assert!(!open(&[true, true, false]), "three members: all three");
    assert!(open(&[true, true, true, true, false]), "five: four");
    assert!(!open(&[true, true, true, false, false]));
    assert!(open(&[true]) && !open(&[false]) && !open(&[]));
    assert!(!open(&[true, false]));
}

#[test]
fn a_member_added_costs_one_revision_and_a_member_removed_loses_its_certificates() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    let first = world.revisions.len();
    world.policy = policy(&["m0", "m1", "m2", "m3"]);
    world.membership = listed(&world.policy);
    world.members.push(Member {
        name: "m3".into(),
        loaded: None,
        running: false,
    });
    world.pass();
    world.roll();
    world.members[3].loaded = world.stored_all();
    world.members[3].running = true;
    world.settle();
    assert_eq!(world.revisions.len() - first, 1, "{:?}", world.revisions);
    assert!(world.stored_all().unwrap().contains_key("etcd-peer-m3.crt"));

    world.policy = policy(&["m0", "m1", "m2"]);
    world.membership = listed(&world.policy);
    world.members.pop();
    world.settle();
    assert!(!world.stored_all().unwrap().contains_key("etcd-peer-m3.crt"));
    for gone in ["etcd-peer-m3", "etcd-serving-m3", "etcd-serving-metrics-m3"] {
        assert!(!world.seen.secrets.contains_key(gone), "{gone}");
    }
    assert!(world.seen.secrets.contains_key("etcd-peer-m2"));
}

/// A new `etcd-all-certs` replacing a stored one is written only after the members are asked
/// again (a member may have gone since the pass began): the re-check is the step right before
/// it. The first one replaces nothing, and is written without one.
#[test]
fn a_revision_replacing_a_stored_one_waits_on_the_members_asked_again() {
    let rechecks = |plan: &EtcdPlan| {
        (plan.steps.iter())
            .filter(|s| **s == EtcdStep::RecheckQuorum)
            .count()
    };
    let mut world = World::new(&["m0", "m1", "m2"]);
    let first = world.pass();
    assert!(
        first
            .steps
            .iter()
            .any(|s| matches!(s, EtcdStep::AllCerts(_)))
    );
    assert_eq!(rechecks(&first), 0);
    world.start_all();
    world.settle();
    world.policy = policy(&["m0", "m1", "m2", "m3"]);
    world.membership = listed(&world.policy);
    world.members.push(Member {
        name: "m3".into(),
        loaded: None,
        running: false,
    });
    let plan = world.pass();
    let at = (plan.steps.iter())
        .position(|s| matches!(s, EtcdStep::AllCerts(_)))
        .expect("a new revision for the new member");
    assert_eq!(plan.steps[at - 1], EtcdStep::RecheckQuorum);
    assert_eq!(rechecks(&plan), 1);
}

/// A delete needs the object's mark, so the pass deletes only what it read: a removed
/// member's Secret absent when read is not deleted (the delete would carry no version, and
/// take whatever was created there meanwhile, whoever's it is).
#[test]
fn a_removed_members_secret_absent_when_read_is_not_deleted() {
    let mut world = World::new(&["m0", "m1", "m2", "m3"]);
    world.pass();
    world.start_all();
    world.settle();
    world.policy = policy(&["m0", "m1", "m2"]);
    world.membership = listed(&world.policy);
    world.members.pop();
    world.seen.secrets.remove("etcd-serving-m3");
    let mut deleted = Vec::new();
    for _ in 0..60 {
        let plan = world.pass();
        world.roll();
        deleted.extend(plan.steps.iter().filter_map(|step| match step {
            EtcdStep::Delete(name) => Some(name.clone()),
            _ => None,
        }));
        if plan.steps.is_empty() && !plan.waits_on_members {
            break;
        }
    }
    assert_eq!(deleted, ["etcd-peer-m3", "etcd-serving-metrics-m3"]);
}

#[test]
fn a_pass_cut_short_anywhere_makes_no_second_signer_and_no_second_revision() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    world.force_rotation();
    // Every pass of the rotation is cut after its first write, as an operator killed there.
    for _ in 0..60 {
        world.ask();
        let plan = plan(
            &world.seen,
            &world.policy,
            &world.membership,
            OffsetDateTime::now_utc(),
            &PkiMint,
        )
        .unwrap();
        // The first write: a re-check of the quorum writes nothing.
        let first = plan.steps.iter().find(|s| **s != EtcdStep::RecheckQuorum);
        let Some(first) = first else {
            if !plan.waits_on_members {
                break;
            }
            world.roll();
            continue;
        };
        world.apply(first);
        world.roll();
    }
    assert_eq!(world.minted_signers, 1);
    let distinct: std::collections::BTreeSet<&String> = world.revisions.iter().collect();
    assert_eq!(
        distinct.len(),
        world.revisions.len(),
        "a revision written twice: {:?}",
        world.revisions
    );
    assert_eq!(
        world.revisions.len(),
        4,
        "bootstrap and three: {:?}",
        world.revisions
    );
}

#[test]
fn revisions_are_content_hashes() {
    let a = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let b = BTreeMap::from([("k".to_string(), "w".to_string())]);
    assert_eq!(revision_of(&a), revision_of(&a.clone()));
    assert_ne!(revision_of(&a), revision_of(&b));
    assert_eq!(revision_of(&a).len(), 16);
    // Key and value boundaries count.
    let c = BTreeMap::from([("kv".to_string(), String::new())]);
    assert_ne!(revision_of(&a), revision_of(&c));
}

/// library-go's forced rotation of one certificate: its annotation removed, it alone is
/// issued again, in one revision.
#[test]
fn a_removed_annotation_reissues_that_certificate_in_one_revision() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    let first = world.revisions.len();
    let before = world.seen.secrets.clone();
    let (_, annotations) = world.seen.secrets.get_mut("etcd-peer-m1").unwrap();
    annotations.remove(caretaker_api::names::CERTIFICATE_NOT_AFTER);
    let plan = world.pass();
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == "TargetUpdateRequired")
        .expect("an event");
    assert!(event.note.contains("missing notAfter"), "{}", event.note);
    world.settle();
    assert_eq!(world.revisions.len() - first, 1, "{:?}", world.revisions);
    for (name, (data, _)) in &before {
        let changed = world.seen.secrets[name].0 != *data;
        let expected = name == "etcd-peer-m1" || name == ALL_CERTS;
        assert_eq!(changed, expected, "{name}");
    }
}

/// The membership of `World`'s listed members and these Nodes (name, addresses).
fn with_nodes(world: &World, nodes: &[(&str, &[&str])]) -> Membership {
    use members::{Candidate, Origin};
    let candidate = |origin, name: &str, addresses: &[String]| {
        let at = |i: usize| format!("status.addresses[{i}].address");
        Candidate {
            name: name.to_string(),
            origin,
            checked: crate::etcd::policy::member_spec("metadata.name", name, &at, addresses),
        }
    };
    let listed = world.policy.members.iter().map(|m| {
        let addresses: Vec<String> = m.dns_names.clone();
        candidate(Origin::Listed, &m.name, &addresses)
    });
    let nodes = nodes.iter().map(|(name, addresses)| {
        let addresses: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
        candidate(Origin::Node, name, &addresses)
    });
    let incumbents = world
        .stored_all()
        .map(|all| members_in_all_certs(&all))
        .unwrap_or_default();
    members::choose(
        listed.chain(nodes).collect(),
        &incumbents,
        &members::fixed_secrets(&world.policy),
    )
}

/// Issue 31's Node attacks: a non-ASCII address and a Node named `metrics-m0`. Every other
/// member is issued and keeps its certificates; the two are named in Degraded and in one
/// Warning each.
#[test]
fn a_refused_member_blocks_no_other_and_is_named_once() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.membership = with_nodes(
        &world,
        &[
            ("n-bad", &["10.0.0.9", "nœud.example"]),
            ("metrics-m0", &["10.0.0.10"]),
        ],
    );
    world.pass();
    world.start_all();
    let plan = world.settle();
    let all = world.stored_all().unwrap();
    assert_eq!(
        members_in_all_certs(&all),
        ["m0", "m1", "m2"].map(String::from).into()
    );
    for name in ["etcd-client", "etcd-peer-m0", "etcd-serving-metrics-m0"] {
        assert!(world.seen.secrets.contains_key(name), "{name}");
    }
    let metrics = Certificate::parse_pem(&all["etcd-serving-metrics-m0.crt"]).unwrap();
    assert_eq!(
        metrics[0].info().common_name.as_deref(),
        Some("system:etcd-metric:m0")
    );
    assert!(!world.seen.secrets.contains_key("etcd-peer-metrics-m0"));

    let degraded = &plan.status.degraded;
    assert_eq!(
        (degraded.status, degraded.reason),
        (true, REASON_MEMBER_REFUSED)
    );
    assert!(
        degraded
            .message
            .contains("Node \"n-bad\" is not a member: status.addresses[1].address")
            && degraded.message.contains(
                "Node \"metrics-m0\" is not a member: its Secret \"etcd-serving-metrics-m0\" is \
                 already listed member \"m0\"'s"
            ),
        "{}",
        degraded.message
    );
    assert_eq!(
        (plan.status.ready.status, plan.status.ready.reason),
        (false, REASON_MEMBER_REFUSED)
    );
    let warnings = |events: &[Event]| {
        events
            .iter()
            .filter(|e| e.reason == REASON_MEMBER_REFUSED)
            .count()
    };
    assert_eq!(warnings(&plan.events), 2, "one per refused member");
    world.seen.reported_degraded = Some(degraded.message.clone());
    assert_eq!(warnings(&world.pass().events), 0, "said once");

    // Gone: the conditions clear, and nothing else changes.
    let before = world.seen.secrets.clone();
    world.membership = with_nodes(&world, &[]);
    let plan = world.settle();
    assert!(!plan.status.degraded.status && plan.status.ready.status);
    assert_eq!(world.seen.secrets, before);
}

/// A bad member while the quorum gate is closed: the status names both, not only the gate.
#[test]
fn a_refused_member_is_named_beside_the_quorum_gate() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    world.members[2].running = false;
    world.membership = with_nodes(&world, &[("n0", &["10.0.0.9"]), ("n-bad", &["a b"])]);
    let plan = world.pass();
    assert!(plan.held);
    let degraded = &plan.status.degraded;
    assert_eq!(degraded.reason, REASON_INSUFFICIENT_QUORUM);
    assert!(
        degraded.message.starts_with(SKIPPING_FOR_QUORUM)
            && degraded.message.contains("Node \"n-bad\" is not a member"),
        "{}",
        degraded.message
    );
    // n0's certificates are issued all the same; only etcd-all-certs waits.
    assert!(world.seen.secrets.contains_key("etcd-peer-n0"));
    assert!(!world.stored_all().unwrap().contains_key("etcd-peer-n0.crt"));
}

/// `etcd-all-certs` left holding a member `metrics-m0` beside `m0` (as the fight between them
/// could leave it): `metrics-m0` goes, and with it its own Secrets, but not its serving Secret
/// `etcd-serving-metrics-m0`, which is `m0`'s metrics serving Secret.
#[test]
fn a_removed_member_never_takes_another_members_secret() {
    let mut world = World::new(&["m0", "m1", "m2"]);
    world.pass();
    world.start_all();
    world.settle();
    let (data, _) = world.seen.secrets.get_mut(ALL_CERTS).unwrap();
    let peer = data["etcd-peer-m0.crt"].clone();
    data.insert("etcd-peer-metrics-m0.crt".into(), peer);
    // Its own Secrets exist (a pass deletes only Secrets it read).
    for (own, like) in [
        ("etcd-peer-metrics-m0", "etcd-peer-m0"),
        ("etcd-serving-metrics-metrics-m0", "etcd-serving-metrics-m0"),
    ] {
        let copy = world.seen.secrets[like].clone();
        world.seen.secrets.insert(own.into(), copy);
    }
    let plan = world.pass();
    let deleted: Vec<&str> = (plan.steps.iter())
        .filter_map(|step| match step {
            EtcdStep::Delete(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted,
        ["etcd-peer-metrics-m0", "etcd-serving-metrics-metrics-m0"]
    );
    assert!(world.seen.secrets.contains_key("etcd-serving-metrics-m0"));
    let all = world.stored_all().unwrap();
    assert_eq!(
        members_in_all_certs(&all),
        ["m0", "m1", "m2"].map(String::from).into()
    );
}
