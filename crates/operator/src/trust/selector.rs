//! Label selectors as Kubernetes' `labels.Selector` reads, matches and prints them.
//!
//! trust-manager's success message names the namespace selector in `labels.Selector.String()`
//! form (`env=prod,team in (a,b)`), and GitOps health checks compare that message, so the text
//! has to be Kubernetes' own: requirements sorted by key, values of `in`/`notin` sorted.

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
    valid_qualified_name(key).map_err(|why| format!("key: Invalid value: {key:?}: {why}"))
}

fn valid_value(value: &str) -> Result<(), String> {
    valid_label_value(value).map_err(|why| format!("values: Invalid value: {value:?}: {why}"))
}

/// A qualified name (label and annotation keys): an optional DNS-subdomain prefix and `/`, then
/// a name of at most 63 characters; the reason when it is not one.
pub(crate) fn valid_qualified_name(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("prefix part must be a lowercase RFC 1123 subdomain");
        }
    }
    if name.is_empty() || name.len() > 63 || !name_chars_ok(name) {
        return Err(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        );
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of the name alphabet; the reason otherwise.
pub(crate) fn valid_label_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || (value.len() <= 63 && name_chars_ok(value)) {
        return Ok(());
    }
    Err(
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
    )
}

fn name_chars_ok(text: &str) -> bool {
    let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_alphanumeric());
    alnum(text.bytes().next())
        && alnum(text.bytes().last())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
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
