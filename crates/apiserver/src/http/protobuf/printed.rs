//! A decoded k8s-pb message read back from its `Debug` text. prost's messages have no
//! reflection and no serde; their derived `Debug` is the one generic view of their fields:
//! each message as `Name { field: value, … }` (Rust field names, `r#` for keywords), optional
//! fields as `Some(…)`/`None`, repeated fields and bytes as `[…]`, maps as `{key: value, …}`,
//! strings as Rust's escaped literals, numbers as Rust prints them. That grammar is all this
//! reads, exactly (string escapes included).

/// One value of the `Debug` text.
#[derive(Debug, Clone, PartialEq)]
pub enum Printed {
    None,
    Some(Box<Printed>),
    Str(String),
    Number(String),
    Bool(bool),
    List(Vec<Printed>),
    /// A non-empty list of numbers that each fit a byte: a bytes field, or small integers.
    /// Read apart so that a body of bytes (a Secret's data) is not a value per byte.
    Bytes(Vec<u8>),
    Map(Vec<(Printed, Printed)>),
    /// A message: its Rust type name and its fields in order.
    Message(String, Vec<(String, Printed)>),
}

/// `text` read as one value; None if it is not the grammar above.
pub fn parse(text: &str) -> Option<Printed> {
    let mut reader = Reader { text, pos: 0 };
    let value = reader.value()?;
    reader.blank();
    (reader.pos == text.len()).then_some(value)
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn blank(&mut self) {
        let rest = self.rest();
        let spaces = rest.len() - rest.trim_start().len();
        self.pos += spaces;
    }

    fn eat(&mut self, token: &str) -> bool {
        self.blank();
        let found = self.rest().starts_with(token);
        if found {
            self.pos += token.len();
        }
        found
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &str {
        let start = self.pos;
        let len = self.rest().find(|c| !keep(c)).unwrap_or(self.rest().len());
        self.pos += len;
        &self.text[start..self.pos]
    }

    /// `open` already read: values separated by `, ` until `close`, each read by `item`.
    fn sequence<T>(
        &mut self,
        close: &str,
        item: impl Fn(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut items = Vec::new();
        if self.eat(close) {
            return Some(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(close) {
                return Some(items);
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn value(&mut self) -> Option<Printed> {
        self.blank();
        match self.peek()? {
            '"' => self.string().map(Printed::Str),
            '[' => {
                self.pos += 1;
                let start = self.pos;
                if let Some(bytes) = self.bytes() {
                    return Some(Printed::Bytes(bytes));
                }
                self.pos = start;
                self.sequence("]", Self::value).map(Printed::List)
            }
            '{' => {
                self.pos += 1;
                self.sequence("}", |r| {
                    let key = r.value()?;
                    r.eat(":").then_some(())?;
                    Some((key, r.value()?))
                })
                .map(Printed::Map)
            }
            '-' | '0'..='9' => {
                let number = self.take_while(|c| c.is_ascii_alphanumeric() || "-+.".contains(c));
                Some(Printed::Number(number.to_string()))
            }
            _ => {
                let name = self
                    .take_while(|c| c.is_alphanumeric() || c == '_')
                    .to_string();
                match name.as_str() {
                    "" => None,
                    "None" => Some(Printed::None),
                    "true" => Some(Printed::Bool(true)),
                    "false" => Some(Printed::Bool(false)),
                    "Some" => {
                        self.eat("(").then_some(())?;
                        let inner = self.value()?;
                        self.eat(")").then_some(())?;
                        Some(Printed::Some(Box::new(inner)))
                    }
                    _ if self.eat("{") => self
                        .sequence("}", |r| {
                            r.blank();
                            let field = r
                                .take_while(|c| c.is_alphanumeric() || c == '_' || c == '#')
                                .trim_start_matches("r#")
                                .to_string();
                            r.eat(":").then_some(())?;
                            Some((field, r.value()?))
                        })
                        .map(|fields| Printed::Message(name, fields)),
                    _ => Some(Printed::Message(name, Vec::new())),
                }
            }
        }
    }

    /// `[` already read: numbers of 0 to 255 until `]`; None (having read some) otherwise.
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        loop {
            self.blank();
            let digits = self.take_while(|c| c.is_ascii_digit());
            bytes.push(digits.parse::<u8>().ok()?);
            if self.eat("]") {
                return Some(bytes);
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    /// A string literal as `str`'s `Debug` writes it (`escape_debug`).
    fn string(&mut self) -> Option<String> {
        self.pos += 1;
        let mut out = String::new();
        let text = self.text;
        let mut chars = text[self.pos..].char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += at + 1;
                    return Some(out);
                }
                '\\' => out.push(match chars.next()?.1 {
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    '0' => '\0',
                    'u' => {
                        (chars.next()?.1 == '{').then_some(())?;
                        let mut hex = String::new();
                        loop {
                            match chars.next()?.1 {
                                '}' => break,
                                digit => hex.push(digit),
                            }
                        }
                        char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                    }
                    other => other,
                }),
                c => out.push(c),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_debug_prints() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Inner {
            r#type: Option<i64>,
            text: Option<String>,
        }
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Outer {
            inner: Option<Inner>,
            list: Vec<Inner>,
            bytes: Option<Vec<u8>>,
            map: std::collections::BTreeMap<String, String>,
            flag: Option<bool>,
            none: Option<String>,
        }
        let odd =
            "quote \" backslash \\ newline \n tab \t nul \0 bell \u{7} accent e\u{301} ☃ ' end";
        let value = Outer {
            inner: Some(Inner {
                r#type: Some(-1),
                text: Some(odd.into()),
            }),
            list: vec![
                Inner {
                    r#type: None,
                    text: None,
                },
                Inner {
                    r#type: Some(i64::MAX),
                    text: Some(String::new()),
                },
            ],
            bytes: Some(vec![0, 255]),
            map: [("k: v".to_string(), "{x}".to_string())].into(),
            flag: Some(false),
            none: None,
        };
        let inner = |t: Printed, s: Printed| {
            Printed::Message("Inner".into(), vec![("type".into(), t), ("text".into(), s)])
        };
        let some = |p: Printed| Printed::Some(Box::new(p));
        assert_eq!(
            parse(&format!("{value:?}")),
            Some(Printed::Message(
                "Outer".into(),
                vec![
                    (
                        "inner".into(),
                        some(inner(
                            some(Printed::Number("-1".into())),
                            some(Printed::Str(odd.into()))
                        ))
                    ),
                    (
                        "list".into(),
                        Printed::List(vec![
                            inner(Printed::None, Printed::None),
                            inner(
                                some(Printed::Number(i64::MAX.to_string())),
                                some(Printed::Str(String::new()))
                            ),
                        ])
                    ),
                    ("bytes".into(), some(Printed::Bytes(vec![0, 255]))),
                    (
                        "map".into(),
                        Printed::Map(vec![(
                            Printed::Str("k: v".into()),
                            Printed::Str("{x}".into())
                        )])
                    ),
                    ("flag".into(), some(Printed::Bool(false))),
                    ("none".into(), Printed::None),
                ]
            ))
        );
        assert_eq!(parse("Some("), None);
        assert_eq!(parse("\"open"), None);
        assert_eq!(parse("[1, 2] trailing"), None);
    }
}
