//! The checks every kind's spec shares, on the way from what users wrote
//! (`caretaker_api::v1alpha1`) to the policies the features decide with
//! (`authority::policy`, `etcd::policy`). Each check records what is wrong under the field's
//! path and carries on, so that one pass reports every bad field (an admission webhook
//! answers with all of them, not the first).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use caretaker_pki::ttl::TtlProblem;
use caretaker_pki::{KeyAlgorithm, RotationPolicy, Ttl, TtlError, Usage};

/// What `spec.keyAlgorithm` accepts (the schema's `KEY_ALGORITHM_NAMES`), and the algorithm
/// each name stands for.
pub const KEY_ALGORITHMS: [(&str, KeyAlgorithm); 6] = [
    ("ECDSA-P256", KeyAlgorithm::EcdsaP256),
    ("ECDSA-P384", KeyAlgorithm::EcdsaP384),
    ("Ed25519", KeyAlgorithm::Ed25519),
    ("RSA-2048", KeyAlgorithm::Rsa2048),
    ("RSA-3072", KeyAlgorithm::Rsa3072),
    ("RSA-4096", KeyAlgorithm::Rsa4096),
];

/// What `spec.usages` of an IssuedCertificate accepts (the schema's `USAGE_NAMES`).
pub const USAGES: [(&str, Usage); 2] = [("server", Usage::Server), ("client", Usage::Client)];

/// Everything wrong with a spec, one entry per problem, in field order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", join(.errors))]
pub struct SpecError {
    /// Never empty.
    pub errors: Vec<FieldError>,
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(FieldError::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One bad field: its path (`spec.ipAddresses[1]`) and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    pub field: String,
    pub problem: Problem,
}

/// What is wrong with a field's value. Messages quote the value; specs hold no secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("must not be empty")]
    Empty,
    #[error(transparent)]
    Ttl(TtlError),
    #[error("{value:?} is not shorter than {at}.validity {validity:?}")]
    NotShorterThanValidity {
        value: String,
        validity: String,
        /// Where the lifetime is described: `spec`, or a part of it such as `spec.signer`.
        at: String,
    },
    #[error(
        "{value:?} is not shorter than the time between the CA's rotation and its expiry \
         ({window}): the new CA could not sign before the old one expired"
    )]
    LongerThanRenewalWindow { value: String, window: String },
    #[error("{0} is out of range; expected a whole number from 1 to 100")]
    PercentOutOfRange(i64),
    /// Both were set, in the part of the spec named (`spec`, `spec.signer`, ...).
    #[error("set only one of {0}.renewAtPercent and {0}.renewBefore")]
    BothRenewalSettings(String),
    #[error("{0:?} is not a key algorithm; accepted: {accepted}", accepted = key_algorithm_names())]
    UnknownKeyAlgorithm(String),
    #[error("no usage given; expected server, client, or both of them")]
    NoUsages,
    #[error("{0:?} is not a usage; accepted: server, client")]
    UnknownUsage(String),
    #[error("{value:?} is not a DNS name: {reason}")]
    NotADnsName { value: String, reason: &'static str },
    #[error("{0:?} is not an IP address")]
    NotAnIpAddress(String),
    #[error("{0:?} is listed twice")]
    Duplicate(String),
    #[error("{0:?} is not an https URL with a host, such as https://10.0.0.1:2379")]
    NotAnHttpsUrl(String),
    #[error("{value:?} is not a valid {kind} name: {expected}")]
    NotAnObjectName {
        value: String,
        kind: &'static str,
        expected: &'static str,
    },
}

fn key_algorithm_names() -> String {
    KEY_ALGORITHMS.map(|(name, _)| name).join(", ")
}

/// The problems found so far.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    errors: Vec<FieldError>,
}

impl Problems {
    fn add(&mut self, field: impl fmt::Display, problem: Problem) {
        self.errors.push(FieldError {
            field: field.to_string(),
            problem,
        });
    }

    /// `Ok(value)` if no problem was found, else every problem. `value` is `None` only when
    /// a check failed, and every failed check recorded why.
    pub(crate) fn finish<T>(self, value: Option<T>) -> Result<T, SpecError> {
        match value {
            Some(value) if self.errors.is_empty() => Ok(value),
            _ => {
                debug_assert!(!self.errors.is_empty(), "a check failed without saying why");
                Err(SpecError {
                    errors: self.errors,
                })
            }
        }
    }

    pub(crate) fn non_empty(&mut self, field: &str, value: &str) -> Option<String> {
        if value.trim().is_empty() {
            self.add(field, Problem::Empty);
            return None;
        }
        Some(value.to_string())
    }

    pub(crate) fn ttl(&mut self, field: &str, value: &str) -> Option<Ttl> {
        value
            .parse()
            .map_err(|e| self.add(field, Problem::Ttl(e)))
            .ok()
    }

    /// A TTL that may also be zero (`0s`, `0`).
    pub(crate) fn duration_or_zero(&mut self, field: &str, value: &str) -> Option<Duration> {
        match value.parse::<Ttl>() {
            Ok(ttl) => Some(ttl.approximate()),
            Err(TtlError {
                problem: TtlProblem::Zero,
                ..
            }) => Some(Duration::ZERO),
            Err(e) => {
                self.add(field, Problem::Ttl(e));
                None
            }
        }
    }

    pub(crate) fn key_algorithm(&mut self, field: &str, value: &str) -> Option<KeyAlgorithm> {
        let found = KEY_ALGORITHMS.iter().find(|(name, _)| *name == value);
        if found.is_none() {
            self.add(field, Problem::UnknownKeyAlgorithm(value.to_string()));
        }
        found.map(|(_, algorithm)| *algorithm)
    }

    /// `{at}.validity`, and when to renew within it: the lifetime every kind describes the
    /// same way, at `spec` or in a part of it (`spec.signer`).
    pub(crate) fn lifetime(
        &mut self,
        at: &str,
        validity: &str,
        renew_at_percent: Option<i32>,
        renew_before: Option<&str>,
    ) -> (Option<Ttl>, Option<RotationPolicy>) {
        let ttl = self.ttl(&format!("{at}.validity"), validity);
        let rotation = self.rotation(
            at,
            renew_at_percent,
            renew_before,
            ttl.map(|t| (validity, t)),
        );
        (ttl, rotation)
    }

    /// `{at}.renewAtPercent` or `{at}.renewBefore` (80% when neither is set), checked
    /// against `validity` (`None` when the validity itself is bad).
    fn rotation(
        &mut self,
        at: &str,
        renew_at_percent: Option<i32>,
        renew_before: Option<&str>,
        validity: Option<(&str, Ttl)>,
    ) -> Option<RotationPolicy> {
        match (renew_at_percent, renew_before) {
            (Some(_), Some(_)) => {
                self.add(
                    format!("{at}.renewBefore"),
                    Problem::BothRenewalSettings(at.to_string()),
                );
                None
            }
            (None, Some(value)) => {
                let before = self.ttl(&format!("{at}.renewBefore"), value)?;
                if let Some((validity_text, validity)) = validity
                    && before.approximate() >= validity.approximate()
                {
                    self.add(
                        format!("{at}.renewBefore"),
                        Problem::NotShorterThanValidity {
                            value: value.to_string(),
                            validity: validity_text.to_string(),
                            at: at.to_string(),
                        },
                    );
                    return None;
                }
                Some(RotationPolicy::Before(before.approximate()))
            }
            (percent, None) => {
                let percent = percent.unwrap_or(caretaker_api::v1alpha1::DEFAULT_RENEW_AT_PERCENT);
                match RotationPolicy::fraction(f64::from(percent) / 100.0) {
                    Ok(policy) => Some(policy),
                    Err(_) => {
                        self.add(
                            format!("{at}.renewAtPercent"),
                            Problem::PercentOutOfRange(percent.into()),
                        );
                        None
                    }
                }
            }
        }
    }

    /// Checks that a new CA could sign before the one it replaces expires: `propagation`
    /// must be shorter than the time from rotation to expiry.
    pub(crate) fn propagation_fits(
        &mut self,
        field: &str,
        value: &str,
        propagation: Duration,
        rotation: RotationPolicy,
        validity: Ttl,
    ) {
        let window = match rotation {
            RotationPolicy::Before(before) => before,
            RotationPolicy::Fraction(fraction) => validity.approximate().mul_f64(1.0 - fraction),
        };
        if propagation >= window {
            self.add(
                field,
                Problem::LongerThanRenewalWindow {
                    value: value.to_string(),
                    window: describe(window),
                },
            );
        }
    }

    pub(crate) fn usage(&mut self, field: &str, values: &[String]) -> Option<Usage> {
        if values.is_empty() {
            self.add(field, Problem::NoUsages);
            return None;
        }
        let mut wanted = Vec::new();
        for (index, value) in values.iter().enumerate() {
            match USAGES.iter().find(|(name, _)| name == value) {
                Some((_, usage)) => wanted.push(*usage),
                None => self.add(
                    format!("{field}[{index}]"),
                    Problem::UnknownUsage(value.clone()),
                ),
            }
        }
        if wanted.len() < values.len() {
            return None;
        }
        let server = wanted.contains(&Usage::Server);
        let client = wanted.contains(&Usage::Client);
        Some(match (server, client) {
            (true, true) => Usage::Both,
            (true, false) => Usage::Server,
            _ => Usage::Client,
        })
    }

    pub(crate) fn dns_names(&mut self, field: &str, values: &[String]) -> Option<Vec<String>> {
        let before = self.errors.len();
        for (index, value) in values.iter().enumerate() {
            self.dns_name(&format!("{field}[{index}]"), value);
        }
        (self.errors.len() == before).then(|| values.to_vec())
    }

    /// Whether `value` is a DNS name (a certificate's DNS SAN); if not, says why.
    pub(crate) fn dns_name(&mut self, field: &str, value: &str) -> bool {
        let Some(reason) = dns_name_problem(value) else {
            return true;
        };
        self.add(
            field,
            Problem::NotADnsName {
                value: value.to_string(),
                reason,
            },
        );
        false
    }

    /// How many problems were found so far.
    pub(crate) fn count(&self) -> usize {
        self.errors.len()
    }

    pub(crate) fn ip_addresses(&mut self, field: &str, values: &[String]) -> Option<Vec<IpAddr>> {
        let mut addresses = Vec::new();
        for (index, value) in values.iter().enumerate() {
            match value.parse() {
                Ok(address) => addresses.push(address),
                Err(_) => self.add(
                    format!("{field}[{index}]"),
                    Problem::NotAnIpAddress(value.clone()),
                ),
            }
        }
        (addresses.len() == values.len()).then_some(addresses)
    }

    /// The name of an object (Secret, ConfigMap, CertificateAuthority): an RFC 1123
    /// subdomain, as the API server requires.
    pub(crate) fn object_name(&mut self, field: &str, kind: &'static str, value: &str) {
        if value.is_empty() {
            self.add(field, Problem::Empty);
        } else if !is_rfc1123(value, 253, true) {
            self.add(
                field,
                Problem::NotAnObjectName {
                    value: value.to_string(),
                    kind,
                    expected: "expected lowercase letters, digits, '-' and '.', starting and \
                               ending with a letter or digit, at most 253 characters",
                },
            );
        }
    }

    /// A namespace's name: an RFC 1123 label.
    pub(crate) fn namespace_name(&mut self, field: &str, value: &str) {
        self.label_name(field, "namespace", value)
    }

    /// An etcd member's name, part of its Secrets' names: an RFC 1123 label.
    pub(crate) fn member_name(&mut self, field: &str, value: &str) {
        self.label_name(field, "member", value)
    }

    pub(crate) fn empty(&mut self, field: &str) {
        self.add(field, Problem::Empty);
    }

    pub(crate) fn duplicate(&mut self, field: &str, value: &str) {
        self.add(field, Problem::Duplicate(value.to_string()));
    }

    pub(crate) fn https_url(&mut self, field: &str, value: &str) {
        let ok = value.parse::<hyper::Uri>().is_ok_and(|uri| {
            uri.scheme_str() == Some("https") && uri.host().is_some_and(|h| !h.is_empty())
        });
        if !ok {
            self.add(field, Problem::NotAnHttpsUrl(value.to_string()));
        }
    }

    fn label_name(&mut self, field: &str, kind: &'static str, value: &str) {
        if value.is_empty() {
            self.add(field, Problem::Empty);
        } else if !is_rfc1123(value, 63, false) {
            self.add(
                field,
                Problem::NotAnObjectName {
                    value: value.to_string(),
                    kind,
                    expected: "expected lowercase letters, digits and '-', starting and \
                               ending with a letter or digit, at most 63 characters",
                },
            );
        }
    }
}

/// `duration` in whole days and the rest (`730d`, `1d2h`, `5m`), to the second.
fn describe(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let rest = Ttl::from_duration(Duration::from_secs(rest)).map(|ttl| ttl.to_string());
    match (days, rest) {
        (0, Err(_)) => "0s".to_string(),
        (0, Ok(rest)) => rest,
        (days, Err(_)) => format!("{days}d"),
        (days, Ok(rest)) => format!("{days}d{rest}"),
    }
}

/// Kubernetes' object-name rules: lowercase RFC 1123 labels, joined by dots if `dots`.
pub(crate) fn is_rfc1123(value: &str, max_len: usize, dots: bool) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    value.len() <= max_len
        && if dots {
            value.split('.').all(label_ok)
        } else {
            label_ok(value)
        }
}

/// Why `name` cannot be a DNS subject alternative name, if it cannot: a hostname of
/// RFC 1123 labels (letters in any case, as DNS compares them without case), optionally
/// with `*` as its whole first label.
fn dns_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > 253 {
        return Some("it is longer than 253 characters");
    }
    if name.parse::<IpAddr>().is_ok() {
        return Some("it is an IP address; list it in spec.ipAddresses");
    }
    for (index, label) in name.split('.').enumerate() {
        if index == 0 && label == "*" && name.len() > 1 {
            continue;
        }
        if label.is_empty() {
            return Some("it has an empty label (two dots in a row, or a dot at an end)");
        }
        if label.len() > 63 {
            return Some("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Some(
                "expected letters, digits, '-' and '.' only, and '*' only as the whole first label",
            );
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Some("a label starts or ends with '-'");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for good in [
            "webhook.demo.svc",
            "webhook.demo.svc.cluster.local",
            "localhost",
            "*.example.com",
            "Mixed-Case.Example",
            "1a.example",
        ] {
            assert_eq!(dns_name_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "*",
            "*.",
            "a.*.b",
            "-a.b",
            "a-.b",
            "under_score.example",
            "space here",
            "10.0.0.1",
            "::1",
        ] {
            assert!(dns_name_problem(bad).is_some(), "{bad}");
        }
        assert!(dns_name_problem(&"a".repeat(64)).is_some());
        assert!(dns_name_problem(&["a"; 127].join(".")).is_none());
        assert!(dns_name_problem(&["a"; 128].join(".")).is_some());
    }

    /// The schema offers exactly the names validation accepts, in the same order.
    #[test]
    fn the_schemas_names_are_the_accepted_ones() {
        use caretaker_api::v1alpha1::{KEY_ALGORITHM_NAMES, USAGE_NAMES};
        assert_eq!(KEY_ALGORITHMS.map(|(name, _)| name), KEY_ALGORITHM_NAMES);
        assert_eq!(USAGES.map(|(name, _)| name), USAGE_NAMES);
    }

    #[test]
    fn object_names() {
        assert!(is_rfc1123("webhooks-ca", 253, true));
        assert!(is_rfc1123("a.b-c", 253, true));
        assert!(!is_rfc1123("a.b-c", 63, false));
        assert!(!is_rfc1123("Webhooks", 253, true));
        assert!(!is_rfc1123("-a", 253, true));
        assert!(!is_rfc1123(&"a".repeat(64), 63, false));
    }
}
