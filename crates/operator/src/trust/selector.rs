//! Label selectors as Kubernetes' `labels.Selector` reads, matches and prints them.
//!
//! trust-manager's success message names the namespace selector in `labels.Selector.String()`
//! form (`env=prod,team in (a,b)`), and GitOps health checks compare that message, so the text
//! has to be Kubernetes' own: requirements sorted by key, values of `in`/`notin` sorted.
//!
//! Label keys and values are checked as apimachinery checks them, with its messages
//! ([`qualified_name_errors`], [`label_value_errors`]), which trust-manager's admission answers
//! carry.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Operator {
    Equals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Kubernetes' `LabelSelectorAsSelector`: `None` and `{}` select everything.
    pub fn parse(selector: Option<&LabelSelector>) -> Result<Self, String> {
        let Some(selector) = selector else {
            return Ok(Self::default());
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(requirement(key, Operator::Equals, [value.clone()].into())?);
        }
        for expression in selector.match_expressions.iter().flatten() {
            let operator = match expression.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            let values = expression.values.iter().flatten().cloned().collect();
            requirements.push(requirement(&expression.key, operator, values)?);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.operator {
                Operator::Equals | Operator::In => value.is_some_and(|v| r.values.contains(v)),
                Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
            }
        })
    }

    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

fn requirement(
    key: &str,
    operator: Operator,
    values: BTreeSet<String>,
) -> Result<Requirement, String> {
    valid_key(key)?;
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => {
            return Err(format!(
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty (key {key:?})"
            ));
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            return Err(format!(
                "values: Invalid value: {values:?}: values set must be empty for exists and does not exist (key {key:?})"
            ));
        }
        _ => {}
    }
    for value in &values {
        valid_value(value)?;
    }
    Ok(Requirement {
        key: key.to_string(),
        operator,
        values,
    })
}

fn valid_key(key: &str) -> Result<(), String> {
    match qualified_name_errors(key).into_iter().next() {
        Some(why) => Err(format!("key: Invalid value: {key:?}: {why}")),
        None => Ok(()),
    }
}

fn valid_value(value: &str) -> Result<(), String> {
    match label_value_errors(value).into_iter().next() {
        Some(why) => Err(format!("values: Invalid value: {value:?}: {why}")),
        None => Ok(()),
    }
}

/// The alphabet and shape of a label name or value, as apimachinery's messages describe it.
pub(crate) const NAME_REGEX: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
pub(crate) const NAME_SHAPE: &str = "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn name_chars_ok(text: &str) -> bool {
    let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_alphanumeric());
    alnum(text.bytes().next())
        && alnum(text.bytes().last())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn dns_subdomain_ok(text: &str) -> bool {
    text.split('.').all(|label| {
        let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        alnum(label.bytes().next())
            && alnum(label.bytes().last())
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// apimachinery's `IsQualifiedName` (label keys): its messages, none when `key` is one.
pub(crate) fn qualified_name_errors(key: &str) -> Vec<String> {
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            let mut errors = Vec::new();
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errors.push("prefix part must be no more than 253 bytes".to_string());
                }
                if !dns_subdomain_ok(prefix) {
                    errors.push("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string());
                }
            }
            return [errors, name_part_errors(name)].concat();
        }
        _ => {
            return vec![format!(
                "a valid label key must {NAME_SHAPE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    name_part_errors(name)
}

fn name_part_errors(name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 bytes".to_string());
    }
    if !name_chars_ok(name) {
        errors.push(format!("name part must {NAME_SHAPE}"));
    }
    errors
}

/// apimachinery's `IsValidLabelValue`: its messages, none when `value` is one.
pub(crate) fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 bytes".to_string());
    }
    if !value.is_empty() && !name_chars_ok(value) {
        errors.push(format!(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '({NAME_REGEX})?')"
        ));
    }
    errors
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let values = || r.values.iter().cloned().collect::<Vec<_>>().join(",");
            match r.operator {
                Operator::Equals => write!(f, "{}={}", r.key, values())?,
                Operator::In => write!(f, "{} in ({})", r.key, values())?,
                Operator::NotIn => write!(f, "{} notin ({})", r.key, values())?,
                Operator::Exists => write!(f, "{}", r.key)?,
                Operator::DoesNotExist => write!(f, "!{}", r.key)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn none_and_empty_select_everything() {
        for selector in [None, Some(&LabelSelector::default())] {
            let parsed = Selector::parse(selector).unwrap();
            assert!(parsed.is_everything());
            assert!(parsed.matches(&labels(&[])));
            assert_eq!(parsed.to_string(), "");
        }
    }

    #[test]
    fn the_string_form_is_kubernetes() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("team", "a"), ("env", "prod")])),
            match_expressions: Some(vec![
                expression(
                    "trust-manager.io/namespace",
                    "In",
                    &["outside-ns", "ns-1", "ns-2"],
                ),
                expression("zone", "NotIn", &["b", "a"]),
                expression("critical", "Exists", &[]),
                expression("legacy", "DoesNotExist", &[]),
            ]),
        };
        let parsed = Selector::parse(Some(&selector)).unwrap();
        assert_eq!(
            parsed.to_string(),
            "critical,env=prod,!legacy,team=a,trust-manager.io/namespace in (ns-1,ns-2,outside-ns),zone notin (a,b)"
        );
    }

    #[test]
    fn matching_follows_each_operator() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("env", "prod")])),
            match_expressions: Some(vec![
                expression("zone", "NotIn", &["b"]),
                expression("legacy", "DoesNotExist", &[]),
            ]),
        };
        let parsed = Selector::parse(Some(&selector)).unwrap();
        assert!(parsed.matches(&labels(&[("env", "prod")])));
        assert!(parsed.matches(&labels(&[("env", "prod"), ("zone", "a")])));
        assert!(!parsed.matches(&labels(&[("env", "prod"), ("zone", "b")])));
        assert!(!parsed.matches(&labels(&[("env", "prod"), ("legacy", "")])));
        assert!(!parsed.matches(&labels(&[("env", "dev")])));
        assert!(!parsed.matches(&labels(&[])));
    }

    #[test]
    fn bad_selectors_name_the_bad_part() {
        let bad_operator = LabelSelector {
            match_expressions: Some(vec![expression("a", "Near", &["x"])]),
            ..Default::default()
        };
        assert!(
            Selector::parse(Some(&bad_operator))
                .unwrap_err()
                .contains("\"Near\"")
        );
        let empty_in = LabelSelector {
            match_expressions: Some(vec![expression("a", "In", &[])]),
            ..Default::default()
        };
        assert!(
            Selector::parse(Some(&empty_in))
                .unwrap_err()
                .contains("can't be empty")
        );
        let bad_key = LabelSelector {
            match_labels: Some(labels(&[("-bad", "x")])),
            ..Default::default()
        };
        assert!(
            Selector::parse(Some(&bad_key))
                .unwrap_err()
                .contains("\"-bad\"")
        );
        let bad_value = LabelSelector {
            match_labels: Some(labels(&[("ok", "not ok")])),
            ..Default::default()
        };
        assert!(
            Selector::parse(Some(&bad_value))
                .unwrap_err()
                .contains("\"not ok\"")
        );
    }
}
