//! The few DER constructions the trust stores (PKCS#12) and Go's subject strings need, written
//! out by hand: a TLV with a definite length. Inputs are built here, never parsed, so nothing
//! can be malformed.

pub(crate) const INTEGER: u8 = 0x02;
pub(crate) const OCTET_STRING: u8 = 0x04;
pub(crate) const OID: u8 = 0x06;
pub(crate) const UTF8_STRING: u8 = 0x0c;
pub(crate) const PRINTABLE_STRING: u8 = 0x13;
pub(crate) const BMP_STRING: u8 = 0x1e;
pub(crate) const SEQUENCE: u8 = 0x30;
pub(crate) const SET: u8 = 0x31;
/// `[0]` constructed (EXPLICIT).
pub(crate) const EXPLICIT_0: u8 = 0xa0;
/// `[0]` primitive (IMPLICIT OCTET STRING).
pub(crate) const IMPLICIT_0: u8 = 0x80;

pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

pub(crate) fn sequence(parts: &[&[u8]]) -> Vec<u8> {
    tlv(SEQUENCE, &parts.concat())
}

/// A SET OF in DER order: elements sorted by their encodings (as Go's encoding/asn1 does).
pub(crate) fn set_of(mut elements: Vec<Vec<u8>>) -> Vec<u8> {
    elements.sort();
    tlv(SET, &elements.concat())
}

pub(crate) fn integer(value: u32) -> Vec<u8> {
    let mut bytes: Vec<u8> = value
        .to_be_bytes()
        .into_iter()
        .skip_while(|&b| b == 0)
        .collect();
    if bytes.first().is_none_or(|&b| b & 0x80 != 0) {
        bytes.insert(0, 0);
    }
    tlv(INTEGER, &bytes)
}

pub(crate) fn octet_string(bytes: &[u8]) -> Vec<u8> {
    tlv(OCTET_STRING, bytes)
}

/// An OBJECT IDENTIFIER from its arcs.
pub(crate) fn oid(arcs: &[u64]) -> Vec<u8> {
    let mut body = base128(arcs[0] * 40 + arcs[1]);
    for &arc in &arcs[2..] {
        body.extend(base128(arc));
    }
    tlv(OID, &body)
}

fn base128(mut value: u64) -> Vec<u8> {
    let mut out = vec![(value & 0x7f) as u8];
    value >>= 7;
    while value > 0 {
        out.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    out.reverse();
    out
}

/// An AlgorithmIdentifier; `None` parameters are left out, as Go leaves them out.
pub(crate) fn algorithm(arcs: &[u64], parameters: Option<&[u8]>) -> Vec<u8> {
    let oid = oid(arcs);
    match parameters {
        Some(parameters) => sequence(&[&oid, parameters]),
        None => sequence(&[&oid]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_der() {
        assert_eq!(integer(0), [2, 1, 0]);
        assert_eq!(integer(3), [2, 1, 3]);
        assert_eq!(integer(2048), [2, 2, 8, 0]);
        assert_eq!(integer(128), [2, 2, 0, 128]);
        assert_eq!(
            oid(&[1, 2, 840, 113549, 1, 7, 1]),
            [6, 9, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 7, 1]
        );
        assert_eq!(oid(&[2, 5, 29, 37, 0]), [6, 4, 0x55, 0x1d, 0x25, 0]);
        let long = tlv(OCTET_STRING, &[0; 300]);
        assert_eq!(&long[..4], [4, 0x82, 1, 44]);
        assert_eq!(
            set_of(vec![vec![2, 1, 9], vec![2, 1, 1]]),
            [0x31, 6, 2, 1, 1, 2, 1, 9]
        );
    }
}
