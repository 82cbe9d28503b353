//! PEM blocks found exactly as Go's `encoding/pem.Decode` finds them.
//!
//! trust-manager reads its sources with Go's decoder, and which inputs it accepts decides whether a
//! Bundle is `Synced`: a replacement has to see the same blocks in the same bytes. The rules that
//! differ from a plain RFC 7468 reader:
//! - a block starts only where `-----BEGIN ` starts a line (offset 0 or right after `\n`);
//! - text outside blocks, even bytes that are not UTF-8, is ignored;
//! - `Key: value` lines right after the BEGIN line are headers;
//! - a block that looks like one but does not decode (no matching END line, bad base64) is skipped
//!   without an error, and the search goes on right after its BEGIN line and headers.

use base64::Engine;

const BEGIN: &[u8] = b"-----BEGIN ";
const END: &[u8] = b"\n-----END ";
const DASHES: &[u8] = b"-----";

/// One decoded PEM block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PemBlock {
    pub label: String,
    pub has_headers: bool,
    pub contents: Vec<u8>,
}

/// Every block of `data`, in order.
pub(crate) fn blocks(mut data: &[u8]) -> Vec<PemBlock> {
    let mut found = Vec::new();
    while let Some((block, rest)) = decode(data) {
        found.push(block);
        data = rest;
    }
    found
}

/// The next block and what follows it, or `None` when no further block decodes.
fn decode(data: &[u8]) -> Option<(PemBlock, &[u8])> {
    let mut rest = data;
    loop {
        rest = if rest.starts_with(BEGIN) {
            &rest[BEGIN.len()..]
        } else {
            let at = find(rest, b"\n-----BEGIN ")?;
            &rest[at + 1 + BEGIN.len()..]
        };

        let (type_line, after_type) = line(rest);
        rest = after_type;
        let Some(label) = type_line.strip_suffix(DASHES) else {
            continue;
        };

        let mut has_headers = false;
        loop {
            if rest.is_empty() {
                return None;
            }
            let (header, next) = line(rest);
            if !header.contains(&b':') {
                break;
            }
            has_headers = true;
            rest = next;
        }

        // Without headers the END line may follow at once, with no newline before it.
        let (end_at, trailer_at) = if !has_headers && rest.starts_with(&END[1..]) {
            (0, END.len() - 1)
        } else {
            match find(rest, END) {
                Some(at) => (at, at + END.len()),
                None => continue,
            }
        };
        let trailer = &rest[trailer_at..];
        let trailer_len = label.len() + DASHES.len();
        if trailer.len() < trailer_len {
            continue;
        }
        let (end_label, after_end) = trailer.split_at(trailer_len);
        if !end_label.starts_with(label) || !end_label.ends_with(DASHES) {
            continue;
        }
        if !line(after_end).0.is_empty() {
            continue;
        }
        let Some(contents) = base64_body(&rest[..end_at]) else {
            continue;
        };
        let (_, next) = line(&rest[end_at + END.len() - 1..]);
        let block = PemBlock {
            label: String::from_utf8_lossy(label).into_owned(),
            has_headers,
            contents,
        };
        return Some((block, next));
    }
}

/// Go's `getLine`: up to the next `\n` (a `\r` before it dropped), trailing spaces and tabs trimmed.
fn line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut text, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &data[data.len()..]),
    };
    if data.len() > text.len() {
        text = text.strip_suffix(b"\r").unwrap_or(text);
    }
    while let [head @ .., b' ' | b'\t'] = text {
        text = head;
    }
    (text, rest)
}

/// Go's `base64.StdEncoding.Decode` after spaces and tabs are removed: padding required, `\r`
/// and `\n` anywhere ignored, bits after the last full byte not checked.
fn base64_body(body: &[u8]) -> Option<Vec<u8>> {
    let clean: Vec<u8> = body
        .iter()
        .copied()
        .filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
    );
    engine.decode(clean).ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "MIIBkzCCATmgAwIBAgIQ";

    fn labels(text: &str) -> Vec<String> {
        blocks(text.as_bytes())
            .into_iter()
            .map(|b| b.label)
            .collect()
    }

    #[test]
    fn comments_and_junk_around_blocks_are_ignored() {
        let text = format!(
            "# a comment\n-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----\njunk\n\
             -----BEGIN X-----\n{BODY}\n-----END X-----"
        );
        assert_eq!(labels(&text), ["CERTIFICATE", "X"]);
        let decoded = &blocks(text.as_bytes())[0];
        assert_eq!(decoded.contents.len(), 15);
        assert!(!decoded.has_headers);
    }

    #[test]
    fn a_begin_line_counts_only_at_the_start_of_a_line() {
        let indented = format!(" -----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----");
        assert!(labels(&indented).is_empty());
        let mid_line = format!("x-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----");
        assert!(labels(&mid_line).is_empty());
    }

    #[test]
    fn a_block_without_its_end_line_is_skipped_without_error() {
        // trust-manager's "if invalid certificate, should return empty bundle": no END line and a
        // tab-indented body.
        let text = format!("-----BEGIN CERTIFICATE-----\n\t\t\t{BODY}\n\t\t\t{BODY}");
        assert!(labels(&text).is_empty());
        assert!(labels("qwerty").is_empty());
    }

    #[test]
    fn a_broken_block_does_not_hide_the_next_one() {
        let text = format!(
            "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n\
             -----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----\n"
        );
        assert_eq!(labels(&text), ["CERTIFICATE"]);
    }

    #[test]
    fn mismatched_end_labels_are_not_blocks() {
        let text = format!("-----BEGIN CERTIFICATE-----\n{BODY}\n-----END PRIVATE KEY-----\n");
        assert!(labels(&text).is_empty());
        let trailing =
            format!("-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE----- x\n");
        assert!(labels(&trailing).is_empty());
    }

    #[test]
    fn crlf_spaces_and_tabs_in_the_body_are_accepted() {
        let text =
            format!("-----BEGIN CERTIFICATE-----\r\n {BODY}\t\r\n-----END CERTIFICATE-----  \r\n");
        assert_eq!(blocks(text.as_bytes())[0].contents.len(), 15);
    }

    #[test]
    fn headers_are_reported() {
        let text = format!(
            "-----BEGIN CERTIFICATE-----\nProc-Type: 4,ENCRYPTED\n\n{BODY}\n-----END CERTIFICATE-----"
        );
        let found = blocks(text.as_bytes());
        assert_eq!(found.len(), 1);
        assert!(found[0].has_headers);
    }

    #[test]
    fn an_empty_block_ends_at_once() {
        let found = blocks(b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n");
        assert_eq!(found.len(), 1);
        assert!(found[0].contents.is_empty());
    }

    #[test]
    fn non_utf8_outside_blocks_is_ignored() {
        let mut text = vec![0xff, 0xfe, b'\n'];
        text.extend_from_slice(
            format!("-----BEGIN CERTIFICATE-----\n{BODY}\n-----END CERTIFICATE-----").as_bytes(),
        );
        assert_eq!(blocks(&text).len(), 1);
    }
}
