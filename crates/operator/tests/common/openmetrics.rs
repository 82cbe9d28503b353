//! A strict little reader of the OpenMetrics text format, to check what `/metrics` serves:
//! every line is a `# HELP`, `# TYPE` or `# UNIT` line, a sample `name{label="value",...}
//! value` of the family declared last, or the final `# EOF`. Shared by the integration tests
//! and the unit tests of `caretaker_operator::metrics` (through `#[path]`).

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A whole exposition: each family's type, and the samples in order.
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The value of the sample `name` whose labels are exactly `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == labels)
            .map(|s| s.value)
    }

    /// Every sample named `name`, as `label=value,...` strings with their values, sorted.
    pub fn series(&self, name: &str) -> Vec<(String, f64)> {
        let mut series: Vec<(String, f64)> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| {
                let labels: Vec<String> =
                    s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                (labels.join(","), s.value)
            })
            .collect();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        series
    }
}

const TYPES: [&str; 8] = [
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "unknown",
];

/// Reads `text`, or says which line breaks the format.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut exposition = Exposition::default();
    let Some(body) = text.strip_suffix("# EOF\n") else {
        return Err("the exposition does not end with \"# EOF\\n\"".into());
    };
    let mut family: Option<String> = None;
    for (number, line) in body.lines().enumerate() {
        let fail = |why: &str| format!("line {}: {why}: {line:?}", number + 1);
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (keyword, name, rest) = (parts.next(), parts.next(), parts.next());
            let name = name
                .filter(|n| is_name(n))
                .ok_or_else(|| fail("bad name"))?;
            match (keyword, rest) {
                (Some("HELP"), Some(_)) => family = Some(name.to_string()),
                (Some("TYPE"), Some(kind)) if TYPES.contains(&kind) => {
                    if family.as_deref() != Some(name) {
                        return Err(fail("TYPE of another family than the HELP before"));
                    }
                    exposition.types.insert(name.to_string(), kind.to_string());
                }
                (Some("UNIT"), Some(unit)) if name.ends_with(&format!("_{unit}")) => {}
                _ => return Err(fail("not a HELP, TYPE or UNIT line")),
            }
            continue;
        }
        let sample = sample(line).ok_or_else(|| fail("not `name{labels} value`"))?;
        let declared = family
            .as_deref()
            .ok_or_else(|| fail("a sample before any TYPE"))?;
        let suffix = sample.name.strip_prefix(declared);
        if !matches!(
            suffix,
            Some("" | "_total" | "_bucket" | "_count" | "_sum" | "_created")
        ) {
            return Err(fail("a sample outside its family"));
        }
        exposition.samples.push(sample);
    }
    Ok(exposition)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `name{k="v",...} value` or `name value`.
fn sample(line: &str) -> Option<Sample> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        None => (head, BTreeMap::new()),
    };
    is_name(name).then(|| Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k="v"`, with `\\`, `\"` and `\n` escapes in values.
fn labels(mut text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    while !text.is_empty() {
        let (key, rest) = text.split_once("=\"")?;
        if !is_name(key) || key.contains(':') {
            return None;
        }
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    _ => return None,
                },
                (_, c) => value.push(c),
            }
        };
        if labels.insert(key.to_string(), value).is_some() {
            return None;
        }
        text = &rest[end + 1..];
        text = match text.strip_prefix(',') {
            Some(more) if !more.is_empty() => more,
            Some(_) => return None,
            None if text.is_empty() => text,
            None => return None,
        };
    }
    Some(labels)
}
