//! A certificate subject written as Go's `pkix.Name.String()` writes it.
//!
//! trust-manager names every JKS and PKCS#12 entry `<8 hex of SHA-256>|<subject>`, with the subject
//! in Go's form: the nine attributes Go knows collected per kind (all countries in one RDN, and so
//! on, in the order C, ST, L, STREET, POSTALCODE, O, OU, CN, SERIALNUMBER, with the last CN and
//! SERIALNUMBER winning), other attributes first and each in its own RDN, then the whole sequence
//! written in reverse, RFC 4514-escaped. Attributes without a short name are written as
//! `<oid>=#<hex of the value re-encoded as Go's asn1.Marshal encodes a string>`.

use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

use crate::der;

/// Go's standard attributes (`2.5.4.N`), in the order `ToRDNSequence` appends them.
const STANDARD: [(u64, &str); 9] = [
    (6, "C"),
    (8, "ST"),
    (7, "L"),
    (9, "STREET"),
    (17, "POSTALCODE"),
    (10, "O"),
    (11, "OU"),
    (3, "CN"),
    (5, "SERIALNUMBER"),
];

/// One attribute value as Go's parser leaves it, or the reason Go refuses the certificate.
fn value(attribute: &AttributeTypeAndValue<'_>) -> Result<String, String> {
    let any = attribute.attr_value();
    let data = any.data;
    let text = |ok: bool| {
        ok.then(|| String::from_utf8_lossy(data).into_owned())
            .ok_or_else(|| format!("invalid {:?} in the subject", any.tag()))
    };
    match any.tag() {
        Tag::T61String => Ok(data.iter().map(|&b| char::from(b)).collect()),
        Tag::PrintableString => text(data.iter().all(|&b| printable(b))),
        Tag::Utf8String => text(std::str::from_utf8(data).is_ok()),
        Tag::Ia5String => text(data.is_ascii()),
        Tag::NumericString => text(data.iter().all(|&b| b.is_ascii_digit() || b == b' ')),
        Tag::BmpString => {
            if data.len() % 2 != 0 {
                return Err("invalid BMPString in the subject".into());
            }
            let units: Vec<u16> = data
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).map_err(|_| "invalid BMPString in the subject".into())
        }
        other => Err(format!("unsupported string type {other:?} in the subject")),
    }
}

/// Go's PrintableString alphabet, `*` and `&` included as its parser allows them.
fn printable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(&b)
}

/// The subject in Go's `String()` form, or why Go would not parse the certificate.
pub(crate) fn subject_string(name: &X509Name<'_>) -> Result<String, String> {
    let mut standard: [Vec<String>; 9] = Default::default();
    let mut others = Vec::new();
    for attribute in name.iter_attributes() {
        let text = value(attribute)?;
        let oid = attribute.attr_type();
        let arcs: Vec<u64> = oid.iter().map(|a| a.collect()).unwrap_or_default();
        let slot = match arcs.as_slice() {
            [2, 5, 4, n] => STANDARD.iter().position(|(arc, _)| arc == n),
            _ => None,
        };
        match slot {
            // Go keeps only the last CN and SERIALNUMBER.
            Some(at @ (7 | 8)) => standard[at] = vec![text],
            Some(at) => standard[at].push(text),
            None => others.push(format!("{oid}=#{}", super::hex(&go_marshal_string(&text)))),
        }
    }
    let mut rdns: Vec<String> = others;
    for (at, ((_, short), values)) in STANDARD.iter().zip(&standard).enumerate() {
        // An empty CN or SERIALNUMBER is left out; an empty value of the others is written.
        let single_and_empty = at >= 7 && values.iter().all(String::is_empty);
        if values.is_empty() || single_and_empty {
            continue;
        }
        let joined: Vec<String> = values
            .iter()
            .map(|v| format!("{short}={}", escape(v)))
            .collect();
        rdns.push(joined.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// RFC 4514 escaping as Go does it.
fn escape(value: &str) -> String {
    let last = value.len().saturating_sub(1);
    let mut out = String::with_capacity(value.len());
    for (at, c) in value.char_indices() {
        let needs = match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' => true,
            ' ' => at == 0 || at == last,
            '#' => at == 0,
            _ => false,
        };
        if needs {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `asn1.Marshal(string)`: a PrintableString when every character is in its alphabet (without
/// `*` and `&`), otherwise a UTF8String.
fn go_marshal_string(text: &str) -> Vec<u8> {
    let printable = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b));
    let tag = if printable {
        der::PRINTABLE_STRING
    } else {
        der::UTF8_STRING
    };
    der::tlv(tag, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_as_go_escapes_them() {
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape(" lead and trail "), "\\ lead and trail\\ ");
        assert_eq!(escape("#first # not"), "\\#first # not");
        assert_eq!(escape("q\"<>;\\"), "q\\\"\\<\\>\\;\\\\");
        assert_eq!(escape(""), "");
    }

    #[test]
    fn strings_are_marshalled_as_go_marshals_them() {
        assert_eq!(go_marshal_string("example"), b"\x13\x07example");
        assert_eq!(go_marshal_string("a@b.c"), b"\x0c\x05a@b.c");
        assert_eq!(go_marshal_string("a*"), b"\x0c\x02a*");
        let long = "x".repeat(200);
        assert_eq!(&go_marshal_string(&long)[..3], b"\x13\x81\xc8");
    }
}
