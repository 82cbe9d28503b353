//! Who a Secret or ConfigMap caretaker writes belongs to, and whether caretaker may write it
//! for a given object.
//!
//! Every Secret and ConfigMap caretaker writes for an object (a CertificateAuthority's CA
//! Secret and bundle, an IssuedCertificate's Secret, an EtcdCertificates' Secrets and
//! bundles) carries that object's mark: the annotation [`names::OWNER`], naming its kind,
//! namespace and name, and UID. caretaker writes an object for `owner` only when it is absent
//! (and is then created, never overwritten: a create that meets an object made meanwhile
//! fails) or carries `owner`'s own mark. Anything else is refused, and nothing is written:
//!
//! - an object carrying another object's mark (the etcd signer named as a
//!   CertificateAuthority's Secret, another certificate's Secret): `ObjectInUse`, naming the
//!   owner. An earlier object of the same kind and name (deleted, then created again) is
//!   another object: its UID differs.
//! - an existing object carrying no mark: someone's data (or written by a caretaker before
//!   the mark), `ObjectNotManaged`.
//! - an object with a controller owner reference, whatever it carries: another controller
//!   took it (a Bundle applies its target over a CA's bundle made first at its name),
//!   `ObjectInUse`, naming it.
//!
//! The mark is no permission by itself: whoever may write a Secret may also write its
//! annotations, and so hand it over. That is what [`names::ADOPT`] is for: set on the object
//! by someone who can write it, naming an object (`Kind/namespace/name`, or `Kind/name` when
//! cluster-scoped, without UID), it lets caretaker take the object over for that one object,
//! once; the write that adopts it sets the mark and removes the request. Nothing that an
//! object's author writes in the object itself (a spec's Secret name, a label) makes caretaker
//! write what the author could not.

use std::collections::BTreeMap;
use std::fmt;

use caretaker_api::names;

/// The object a Secret or ConfigMap is written for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    kind: String,
    /// `None` for a cluster-scoped owner.
    namespace: Option<String>,
    name: String,
    uid: String,
}

impl Owner {
    pub fn new(
        kind: impl Into<String>,
        namespace: Option<&str>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// The value of [`names::OWNER`]: `Kind/namespace/name/uid`, or `Kind/name/uid` for a
    /// cluster-scoped owner. No part of it can hold a `/` (Kubernetes names and UIDs cannot).
    pub fn mark(&self) -> String {
        format!("{}/{}", self.reference(), self.uid)
    }

    /// How [`names::ADOPT`] names it: `Kind/namespace/name`, or `Kind/name`.
    pub fn reference(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{}/{namespace}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }

    /// Reads a mark back; `None` when it is not one.
    pub fn parse(mark: &str) -> Option<Self> {
        let parts: Vec<&str> = mark.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        match parts[..] {
            [kind, name, uid] => Some(Self::new(kind, None, name, uid)),
            [kind, namespace, name, uid] => Some(Self::new(kind, Some(namespace), name, uid)),
            _ => None,
        }
    }

    /// The same kind, namespace and name: `self` or an earlier object of its name.
    fn same_name(&self, other: &Owner) -> bool {
        self.reference() == other.reference()
    }
}

impl fmt::Display for Owner {
    /// `IssuedCertificate demo/web (uid …)`, `CertificateAuthority webhooks (uid …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name)?,
            None => write!(f, "{} {}", self.kind, self.name)?,
        }
        write!(f, " (uid {})", self.uid)
    }
}

/// Whether `owner` may write an object, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Absent: created with the mark.
    Create,
    /// It carries `owner`'s mark.
    Own,
    /// Handed over to `owner` ([`names::ADOPT`]): the write sets the mark.
    Adopt,
    /// Not `owner`'s: nothing is written. `reason` is the condition's and event's reason.
    Refused {
        reason: &'static str,
        message: String,
    },
}

impl Claim {
    /// Whether `owner` may write the object.
    pub fn allowed(&self) -> bool {
        !matches!(self, Claim::Refused { .. })
    }

    /// Whether the object holds what `owner` wrote (so its content may be trusted as
    /// `owner`'s: a CA to sign with, a certificate it issued).
    pub fn owned(&self) -> bool {
        matches!(self, Claim::Own)
    }
}

/// Whether `owner` may write the existing `kind` `object` (`namespace/name`, for messages)
/// whose annotations are `annotations`; `None` when it does not exist.
pub fn claim(
    owner: &Owner,
    kind: &str,
    object: &str,
    annotations: Option<&BTreeMap<String, String>>,
) -> Claim {
    let Some(annotations) = annotations else {
        return Claim::Create;
    };
    claim_by(owner, kind, object, None, |key| {
        annotations.get(key).map(String::as_str)
    })
}

/// [`claim`], with the annotations read through `annotation` (a cache keeps them as slices),
/// and the object's `controller` (the kind and name of its controller owner reference).
/// caretaker never sets one: an object that has one was taken by another controller (a
/// Bundle applies its target over a CA's bundle ConfigMap made first at its name), and is
/// that controller's whatever it carries, so that the two never write it in turn.
pub fn claim_by<'a>(
    owner: &Owner,
    kind: &str,
    object: &str,
    controller: Option<(&str, &str)>,
    annotation: impl Fn(&str) -> Option<&'a str>,
) -> Claim {
    if let Some((controller_kind, controller_name)) = controller {
        return Claim::Refused {
            reason: names::REASON_OBJECT_IN_USE,
            message: format!(
                "{kind} {object} is controlled by {controller_kind} {controller_name}; nothing was written to it"
            ),
        };
    }
    let mark = annotation(names::OWNER);
    if mark == Some(owner.mark().as_str()) {
        return Claim::Own;
    }
    if annotation(names::ADOPT) == Some(owner.reference().as_str()) {
        return Claim::Adopt;
    }
    let hand_over = format!(
        "delete it to have caretaker create it, or annotate it {}={} to hand it over",
        names::ADOPT,
        owner.reference()
    );
    match mark.map(|m| (m, Owner::parse(m))) {
        Some((_, Some(other))) if other.same_name(owner) => Claim::Refused {
            reason: names::REASON_OBJECT_IN_USE,
            message: format!(
                "{kind} {object} belongs to an earlier {other}, not to this one (uid {}); nothing was written to it: {hand_over}",
                owner.uid
            ),
        },
        Some((_, Some(other))) => Claim::Refused {
            reason: names::REASON_OBJECT_IN_USE,
            message: format!("{kind} {object} belongs to {other}; nothing was written to it"),
        },
        Some((mark, None)) => Claim::Refused {
            reason: names::REASON_OBJECT_NOT_MANAGED,
            message: format!(
                "{kind} {object} exists and its annotation {}={mark:?} names no object; nothing was written to it: {hand_over}",
                names::OWNER
            ),
        },
        None => Claim::Refused {
            reason: names::REASON_OBJECT_NOT_MANAGED,
            message: format!(
                "{kind} {object} exists and names no owner (no annotation {}); nothing was written to it: {hand_over}",
                names::OWNER
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn authority(uid: &str) -> Owner {
        Owner::new("CertificateAuthority", None, "webhooks", uid)
    }

    fn certificate(namespace: &str, name: &str, uid: &str) -> Owner {
        Owner::new("IssuedCertificate", Some(namespace), name, uid)
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn marks_name_kind_namespace_name_and_uid_and_read_back() {
        let web = certificate("demo", "web", "u1");
        assert_eq!(web.mark(), "IssuedCertificate/demo/web/u1");
        assert_eq!(web.reference(), "IssuedCertificate/demo/web");
        assert_eq!(Owner::parse(&web.mark()), Some(web.clone()));
        let ca = authority("u2");
        assert_eq!(ca.mark(), "CertificateAuthority/webhooks/u2");
        assert_eq!(Owner::parse(&ca.mark()), Some(ca));
        for bad in ["", "a", "a/b", "a//b/c", "a/b/c/d/e", "/b/c"] {
            assert_eq!(Owner::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_absent_object_is_created_and_its_own_is_written() {
        let web = certificate("demo", "web", "u1");
        assert_eq!(claim(&web, "Secret", "demo/web-tls", None), Claim::Create);
        let ours = annotations(&[(names::OWNER, &web.mark())]);
        assert_eq!(
            claim(&web, "Secret", "demo/web-tls", Some(&ours)),
            Claim::Own
        );
    }

    /// The attack of issue 31: a CertificateAuthority naming the etcd signer's Secret.
    #[test]
    fn another_objects_secret_is_refused_naming_its_owner() {
        let etcd = Owner::new("EtcdCertificates", Some("etcd-system"), "etcd", "e1");
        let signer = annotations(&[
            (names::OWNER, &etcd.mark()),
            (names::MANAGED_BY.0, names::MANAGED_BY.1),
        ]);
        let Claim::Refused { reason, message } = claim(
            &authority("a1"),
            "Secret",
            "etcd-system/etcd-signer",
            Some(&signer),
        ) else {
            panic!("written");
        };
        assert_eq!(reason, names::REASON_OBJECT_IN_USE);
        assert_eq!(
            message,
            "Secret etcd-system/etcd-signer belongs to EtcdCertificates etcd-system/etcd (uid e1); nothing was written to it"
        );
    }

    #[test]
    fn the_label_alone_makes_nothing_caretakers() {
        let labelled = annotations(&[(names::MANAGED_BY.0, names::MANAGED_BY.1)]);
        let Claim::Refused { reason, message } = claim(
            &certificate("demo", "web", "u1"),
            "Secret",
            "demo/web-tls",
            Some(&labelled),
        ) else {
            panic!("written");
        };
        assert_eq!(reason, names::REASON_OBJECT_NOT_MANAGED);
        assert!(
            message.ends_with(
                "annotate it caretaker.dev/adopt=IssuedCertificate/demo/web to hand it over"
            ),
            "{message}"
        );
    }

    #[test]
    fn an_earlier_object_of_the_same_name_is_another_object() {
        let earlier = annotations(&[(names::OWNER, &authority("old").mark())]);
        let Claim::Refused { reason, message } =
            claim(&authority("new"), "Secret", "sys/ca", Some(&earlier))
        else {
            panic!("written");
        };
        assert_eq!(reason, names::REASON_OBJECT_IN_USE);
        assert!(
            message.contains(
                "an earlier CertificateAuthority webhooks (uid old), not to this one (uid new)"
            ),
            "{message}"
        );
    }

    #[test]
    fn adoption_is_for_the_object_it_names_only() {
        let web = certificate("demo", "web", "u1");
        let handed = annotations(&[(names::ADOPT, "IssuedCertificate/demo/web")]);
        assert_eq!(
            claim(&web, "Secret", "demo/web-tls", Some(&handed)),
            Claim::Adopt
        );
        assert!(!Claim::Adopt.owned(), "its content is not caretaker's yet");
        // Another certificate of another namespace, or another kind of the same name.
        for other in [
            certificate("other", "web", "u1"),
            certificate("demo", "api", "u1"),
            Owner::new("EtcdCertificates", Some("demo"), "web", "u1"),
        ] {
            assert!(!claim(&other, "Secret", "demo/web-tls", Some(&handed)).allowed());
        }
        // A handover may take an object from its old owner: whoever wrote it said so.
        let from_earlier = annotations(&[
            (names::OWNER, "IssuedCertificate/demo/web/u0"),
            (names::ADOPT, "IssuedCertificate/demo/web"),
        ]);
        assert_eq!(
            claim(&web, "Secret", "demo/web-tls", Some(&from_earlier)),
            Claim::Adopt
        );
    }

    /// A Bundle took over a CA's bundle ConfigMap made first at its target's name: the CA
    /// leaves it, mark or not, so the two never write it in turn.
    #[test]
    fn an_object_another_controller_controls_is_refused_whatever_it_carries() {
        let ca = authority("a1");
        let ours = annotations(&[(names::OWNER, &ca.mark())]);
        let annotation = |key: &str| ours.get(key).map(String::as_str);
        let Claim::Refused { reason, message } = claim_by(
            &ca,
            "ConfigMap",
            "sys/trust",
            Some(("Bundle", "trust")),
            annotation,
        ) else {
            panic!("written");
        };
        assert_eq!(reason, names::REASON_OBJECT_IN_USE);
        assert_eq!(
            message,
            "ConfigMap sys/trust is controlled by Bundle trust; nothing was written to it"
        );
        assert_eq!(
            claim_by(&ca, "ConfigMap", "sys/trust", None, annotation),
            Claim::Own
        );
    }

    proptest! {
        /// Exclusive: of any two distinct objects, at most one may write a given object,
        /// whatever it carries (no adoption request), so no two objects ever write it in turn.
        #[test]
        fn no_two_objects_may_write_one_marked_object(
            kinds in proptest::collection::vec(
                proptest::sample::select(vec!["CertificateAuthority", "IssuedCertificate", "EtcdCertificates"]),
                2,
            ),
            names in proptest::collection::vec("[a-c]{1,2}", 2),
            uids in proptest::collection::vec("[0-2]", 2),
            marked_by in 0usize..3,
        ) {
            let namespace = |kind: &str| (kind != "CertificateAuthority").then_some("ns");
            let owners: Vec<Owner> = (0..2)
                .map(|i| Owner::new(kinds[i], namespace(kinds[i]), &names[i], &uids[i]))
                .collect();
            let existing = match marked_by {
                2 => annotations(&[]),
                i => annotations(&[(names::OWNER, &owners[i].mark())]),
            };
            let allowed: Vec<bool> = owners
                .iter()
                .map(|o| claim(o, "Secret", "ns/s", Some(&existing)).allowed())
                .collect();
            if owners[0] != owners[1] {
                prop_assert!(!(allowed[0] && allowed[1]));
            }
            if marked_by < 2 {
                prop_assert!(allowed[marked_by]);
            }
        }
    }
}
