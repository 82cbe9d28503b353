//! Label and field selectors, as accepted by list and watch.

use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed `labelSelector`: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// A label selector token. `In`/`NotIn` read as identifiers where a key or value is expected
/// (`in in (notin)` is a valid selector), as in k8s.io/apimachinery's lexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Identifier,
    DoesNotExist,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    OpenPar,
    ClosedPar,
    Comma,
    End,
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits a label selector into tokens with their text.
fn lex(s: &str) -> Vec<(Token, &str)> {
    let mut tokens = Vec::new();
    let mut rest = s.trim_start();
    while let Some(c) = rest.chars().next() {
        let len = if is_special(c) {
            if rest.starts_with("==") || rest.starts_with("!=") {
                2
            } else {
                1
            }
        } else {
            rest.find(|c: char| c.is_whitespace() || is_special(c))
                .unwrap_or(rest.len())
        };
        let (text, tail) = rest.split_at(len);
        let token = match text {
            "!" => Token::DoesNotExist,
            "=" => Token::Equals,
            "==" => Token::DoubleEquals,
            "!=" => Token::NotEquals,
            ">" => Token::GreaterThan,
            "<" => Token::LessThan,
            "(" => Token::OpenPar,
            ")" => Token::ClosedPar,
            "," => Token::Comma,
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier,
        };
        tokens.push((token, text));
        rest = tail.trim_start();
    }
    tokens.push((Token::End, ""));
    tokens
}

/// A recursive-descent parser with the grammar and error messages of k8s.io/apimachinery's
/// `labels.Parse`, which kube-apiserver answers as 400 BadRequest.
struct Parser<'a> {
    tokens: Vec<(Token, &'a str)>,
    position: usize,
}

/// Where a token is read: keywords are identifiers in key and value positions.
#[derive(Clone, Copy, PartialEq)]
enum Context {
    KeyAndOperator,
    Values,
}

impl<'a> Parser<'a> {
    fn lookahead(&self, context: Context) -> (Token, &'a str) {
        let (token, text) = self.tokens[self.position];
        match token {
            Token::In | Token::NotIn if context == Context::Values => (Token::Identifier, text),
            _ => (token, text),
        }
    }

    fn consume(&mut self, context: Context) -> (Token, &'a str) {
        let next = self.lookahead(context);
        self.position = (self.position + 1).min(self.tokens.len() - 1);
        next
    }

    fn parse(mut self) -> Result<Vec<LabelRequirement>, String> {
        let mut requirements = Vec::new();
        loop {
            match self.lookahead(Context::Values) {
                (Token::Identifier | Token::DoesNotExist, _) => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    match self.consume(Context::Values) {
                        (Token::End, _) => return Ok(requirements),
                        (Token::Comma, _) => match self.lookahead(Context::Values) {
                            (Token::Identifier | Token::DoesNotExist, _) => {}
                            (_, text) => {
                                return Err(format!(
                                    "found '{text}', expected: identifier after ','"
                                ));
                            }
                        },
                        (_, text) => {
                            return Err(format!(
                                "found '{text}', expected: ',' or 'end of string'"
                            ));
                        }
                    }
                }
                (Token::End, _) => return Ok(requirements),
                (_, text) => {
                    return Err(format!(
                        "found '{text}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        let (mut token, mut key) = self.consume(Context::Values);
        let negated = token == Token::DoesNotExist;
        if negated {
            (token, key) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{key}', expected: identifier"));
        }
        if let Some(problem) = crate::meta::check_qualified_name(key) {
            // apimachinery reports this one without a field path, hence "<nil>".
            return Err(invalid("<nil>", key, &problem));
        }
        let key = key.to_string();
        if negated {
            return Ok(LabelRequirement::NotExists(key));
        }
        if matches!(self.lookahead(Context::Values).0, Token::End | Token::Comma) {
            return Ok(LabelRequirement::Exists(key));
        }
        let operator = match self.consume(Context::KeyAndOperator) {
            (
                op @ (Token::In
                | Token::NotIn
                | Token::Equals
                | Token::DoubleEquals
                | Token::NotEquals
                | Token::GreaterThan
                | Token::LessThan),
                _,
            ) => op,
            (_, text) => {
                return Err(format!(
                    "found '{text}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        };
        let values = if matches!(operator, Token::In | Token::NotIn) {
            self.value_set()?
        } else {
            vec![self.exact_value()?]
        };
        let mut problems: Vec<String> = Vec::new();
        if matches!(operator, Token::GreaterThan | Token::LessThan)
            && values[0].parse::<i64>().is_err()
        {
            problems.push(invalid(
                "values[0]",
                &values[0],
                "for 'Gt', 'Lt' operators, the value must be an integer",
            ));
        }
        for (i, v) in values.iter().enumerate() {
            if let Some(problem) = crate::meta::check_label_value(v) {
                problems.push(invalid(&format!("values[{i}][{key}]"), v, &problem));
            }
        }
        match problems.len() {
            0 => {}
            1 => return Err(problems.remove(0)),
            _ => return Err(format!("[{}]", problems.join(", "))),
        }
        Ok(match operator {
            Token::In => LabelRequirement::In(key, values),
            Token::NotIn => LabelRequirement::NotIn(key, values),
            Token::NotEquals => LabelRequirement::NotEquals(key, values[0].clone()),
            Token::GreaterThan => LabelRequirement::GreaterThan(key, parse_int(&values[0])),
            Token::LessThan => LabelRequirement::LessThan(key, parse_int(&values[0])),
            _ => LabelRequirement::Equals(key, values[0].clone()),
        })
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; empty at a comma or the end.
    fn exact_value(&mut self) -> Result<String, String> {
        if matches!(self.lookahead(Context::Values).0, Token::End | Token::Comma) {
            return Ok(String::new());
        }
        match self.consume(Context::Values) {
            (Token::Identifier, text) => Ok(text.to_string()),
            (_, text) => Err(format!("found '{text}', expected: identifier")),
        }
    }

    /// `(a, b, ...)` after `in` or `notin`, sorted and deduplicated; empty items count as "".
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        let (token, text) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{text}' expected: '('"));
        }
        let mut values = std::collections::BTreeSet::new();
        match self.lookahead(Context::Values) {
            (Token::ClosedPar, _) => {
                self.consume(Context::Values);
                values.insert(String::new());
            }
            (Token::Identifier | Token::Comma, text) => {
                self.identifiers(&mut values)?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{text}', expected: ')'"));
                }
            }
            (_, text) => {
                return Err(format!("found '{text}', expected: ',', ')' or identifier"));
            }
        }
        Ok(values.into_iter().collect())
    }

    fn identifiers(
        &mut self,
        values: &mut std::collections::BTreeSet<String>,
    ) -> Result<(), String> {
        loop {
            match self.consume(Context::Values) {
                (Token::Identifier, text) => {
                    values.insert(text.to_string());
                    match self.lookahead(Context::Values) {
                        (Token::Comma, _) => {}
                        (Token::ClosedPar, _) => return Ok(()),
                        (_, next) => return Err(format!("found '{next}', expected: ',' or ')'")),
                    }
                }
                (Token::Comma, _) => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            values.insert(String::new());
                            return Ok(());
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            values.insert(String::new());
                        }
                        _ => {}
                    }
                }
                (_, text) => return Err(format!("found '{text}', expected: ',', or identifier")),
            }
        }
    }
}

/// A field error as apimachinery words it: `values[0][app]: Invalid value: "x y": why`.
fn invalid(field: &str, value: &str, why: &str) -> String {
    crate::error::FieldError::new(
        field,
        crate::error::FieldErrorKind::Invalid,
        format!("{value:?}: {why}"),
    )
    .to_string()
}

/// A `>`/`<` operand; `requirement` refuses any that does not parse.
fn parse_int(s: &str) -> i64 {
    s.parse().unwrap_or_default()
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let parser = Parser {
            tokens: lex(s),
            position: 0,
        };
        parser
            .parse()
            .map(LabelSelector)
            .map_err(ApiError::bad_request)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let int = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelRequirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::NotExists(k) => get(k).is_none(),
            LabelRequirement::GreaterThan(k, n) => int(k).is_some_and(|x| x > *n),
            LabelRequirement::LessThan(k, n) => int(k).is_some_and(|x| x < *n),
        })
    }
}

/// Splits a field selector on the commas that are not escaped with `\`.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut escaped, mut start) = (false, 0);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
}

/// A field selector value with its `\\`, `\,` and `\=` escapes resolved; unescaped `,` and `=`
/// are errors, as in apimachinery's `fields.UnescapeValue`.
fn unescape(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    ));
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            },
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {c:?} in {value:?}"
                ));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A dotted path of field names (`metadata.name`, `involvedObject.uid`).
fn is_field_path(path: &str) -> bool {
    path.split('.').all(|seg| {
        !seg.is_empty()
            && seg
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    })
}

/// A parsed `fieldSelector`: `path=value`, `path==value` or `path!=value`, comma-separated.
/// Any dotted path parses; which fields a kind can be selected by is `schema/field_labels`'
/// to say (kube-apiserver's per-kind field label conversions).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldRequirement>);

/// `path=value` (`equal`) or `path!=value`; a field the object lacks reads as `missing` (what
/// kube-apiserver's field set holds for it: Go's zero value, `false` or `0`, or "").
#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    path: String,
    equal: bool,
    value: String,
    missing: &'static str,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_terms(s).into_iter().filter(|p| !p.trim().is_empty()) {
            // The first operator from the left, as apimachinery's splitTerm finds it.
            let Some((i, op)) = part.char_indices().find_map(|(i, _)| {
                ["!=", "==", "="]
                    .into_iter()
                    .find(|op| part[i..].starts_with(op))
                    .map(|op| (i, op))
            }) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let path = part[..i].trim();
            // kube-apiserver's answer to a field it cannot select on.
            if !is_field_path(path) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {path}"
                )));
            }
            let value = unescape(part[i + op.len()..].trim()).map_err(ApiError::bad_request)?;
            reqs.push(FieldRequirement {
                path: path.to_string(),
                equal: op != "!=",
                value,
                missing: "",
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// This selector with each requirement's field label replaced by the path `convert` makes
    /// of it and what that field reads as when missing (kube-apiserver's field label
    /// conversion), or `convert`'s error.
    pub fn convert_labels(
        self,
        convert: impl Fn(&str) -> Result<(String, &'static str), ApiError>,
    ) -> Result<Self, ApiError> {
        let converted = self.0.into_iter().map(|r| {
            convert(&r.path).map(|(path, missing)| FieldRequirement { path, missing, ..r })
        });
        Ok(FieldSelector(converted.collect::<Result<_, _>>()?))
    }

    /// Whether `obj` meets every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let mut cur = Some(obj);
            for seg in r.path.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            let actual = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => r.missing.to_string(),
                Some(other) => other.to_string(),
            };
            (actual == r.value) == r.equal
        })
    }
}

/// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`) in label-selector
/// syntax (`app=web,env in (prod,qa),!canary`).
pub fn label_selector_text(selector: &Value) -> String {
    let mut parts: Vec<String> = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn label_selector_grammar() {
        let obj = json!({"metadata": {"labels": {"in": "notin", "n": "5", "e": ""}}});
        for (sel, want) in [
            ("in in (notin)", true),
            ("in=notin", true),
            ("in", true),
            ("e=", true),
            ("e in (,x)", true),
            ("n>4,n<6", true),
            ("n>5", false),
            ("in>1", false),
            (" n == 5 , !missing ", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                want,
                "{sel}"
            );
        }
    }

    /// The messages are k8s.io/apimachinery's, which kube-apiserver returns as 400 BadRequest.
    #[test]
    fn malformed_label_selectors() {
        for (sel, message) in [
            (
                "a!=!=b",
                "unable to parse requirement: found '!=', expected: identifier",
            ),
            ("a=b,", "found '', expected: identifier after ','"),
            ("a=x y", "found 'y', expected: ',' or 'end of string'"),
            (
                "=a",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a in (x",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "n>x",
                "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer",
            ),
        ] {
            let err = LabelSelector::parse(sel).unwrap_err();
            assert_eq!((err.code, err.message.as_str()), (400, message), "{sel}");
        }
        let err = LabelSelector::parse("a=-x").unwrap_err();
        assert!(
            err.message.starts_with(
                "unable to parse requirement: values[0][a]: Invalid value: \"-x\": a valid label must be"
            ),
            "{}",
            err.message
        );
        let err = LabelSelector::parse("a/b/c").unwrap_err();
        assert!(
            err.message
                .starts_with("unable to parse requirement: <nil>: Invalid value: \"a/b/c\": "),
            "{}",
            err.message
        );
    }

    #[test]
    fn field_selectors() {
        let obj =
            json!({"metadata": {"name": "a", "namespace": "ns"}, "involvedObject": {"name": "x"}});
        assert!(
            FieldSelector::parse("metadata.name=a,metadata.namespace==ns")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            !FieldSelector::parse("metadata.name!=a")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            FieldSelector::parse("involvedObject.name=x")
                .unwrap()
                .matches(&obj)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
        assert!(
            FieldSelector::parse(r"metadata.name=a\,b\=c\\")
                .unwrap()
                .matches(&json!({"metadata": {"name": r"a,b=c\"}}))
        );
        // A trailing comma adds no requirement.
        assert!(
            FieldSelector::parse("metadata.name=a,")
                .unwrap()
                .matches(&obj)
        );
    }

    #[test]
    fn malformed_field_selectors() {
        for (sel, message) in [
            ("=", "field label not supported: "),
            ("==x", "field label not supported: "),
            (
                "metadata..name=a",
                "field label not supported: metadata..name",
            ),
            (
                "metadata.name=a=b",
                "invalid field selector: unescaped character in value: '=' in \"a=b\"",
            ),
            (
                r"metadata.name=a\x",
                r"invalid field selector: invalid escape sequence: \x",
            ),
            (
                "nonsense",
                "invalid selector: 'nonsense'; can't understand 'nonsense'",
            ),
        ] {
            let err = FieldSelector::parse(sel).unwrap_err();
            assert_eq!((err.code, err.message.as_str()), (400, message), "{sel}");
        }
    }
}
