//! The client certificate embedded in a kubeconfig, read and replaced in place.
//!
//! kubeadm writes kubeconfigs with one `client-certificate-data: <base64>` and one
//! `client-key-data: <base64>` line. Replacing just those values keeps everything else in the
//! file byte for byte (comments, order, other users), which a YAML round trip would not.
//! Kubeconfigs that reference certificate files instead (`client-certificate:`) are reported
//! as such and left alone.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const CERTIFICATE_FIELD: &str = "client-certificate-data";
const KEY_FIELD: &str = "client-key-data";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigError {
    #[error("has no {CERTIFICATE_FIELD} (certificates kept in separate files are not managed)")]
    NoEmbeddedCertificate,
    #[error("has {0} users with embedded client certificates; expected exactly one")]
    SeveralUsers(usize),
    #[error("its {0} is not valid base64 PEM")]
    BadEncoding(&'static str),
}

/// The PEM of the embedded client certificate.
pub fn client_certificate_pem(text: &str) -> Result<String, KubeconfigError> {
    let values = field_values(text, CERTIFICATE_FIELD);
    match values.as_slice() {
        [] => Err(KubeconfigError::NoEmbeddedCertificate),
        [value] => decode(value, CERTIFICATE_FIELD),
        more => Err(KubeconfigError::SeveralUsers(more.len())),
    }
}

/// The PEM of the embedded client key.
pub fn client_key_pem(text: &str) -> Result<String, KubeconfigError> {
    match field_values(text, KEY_FIELD).as_slice() {
        [value] => decode(value, KEY_FIELD),
        [] => Err(KubeconfigError::NoEmbeddedCertificate),
        more => Err(KubeconfigError::SeveralUsers(more.len())),
    }
}

/// `text` with the embedded client certificate and key replaced; everything else unchanged.
pub fn replace_client_credentials(
    text: &str,
    certificate_pem: &str,
    key_pem: &str,
) -> Result<String, KubeconfigError> {
    client_certificate_pem(text)?;
    client_key_pem(text)?;
    let mut out = String::with_capacity(text.len() + 512);
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let replacement = match field_of(body) {
            Some((indent, CERTIFICATE_FIELD, _)) => {
                Some((indent, CERTIFICATE_FIELD, certificate_pem))
            }
            Some((indent, KEY_FIELD, _)) => Some((indent, KEY_FIELD, key_pem)),
            _ => None,
        };
        match replacement {
            Some((indent, field, pem)) => {
                out.push_str(indent);
                out.push_str(field);
                out.push_str(": ");
                out.push_str(&STANDARD.encode(pem));
                out.push_str(newline);
            }
            None => out.push_str(line),
        }
    }
    Ok(out)
}

/// Splits `    client-key-data: abc` into (indent, field, value).
fn field_of(line: &str) -> Option<(&str, &str, &str)> {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    let (field, value) = trimmed.split_once(':')?;
    Some((indent, field.trim(), value.trim().trim_matches('"')))
}

fn field_values<'a>(text: &'a str, wanted: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(field_of)
        .filter(|(_, field, _)| *field == wanted)
        .map(|(_, _, value)| value)
        .collect()
}

fn decode(value: &str, field: &'static str) -> Result<String, KubeconfigError> {
    STANDARD
        .decode(value)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or(KubeconfigError::BadEncoding(field))
}

/// A kubeadm-style kubeconfig for one user with embedded credentials.
pub fn render(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    certificate_pem: &str,
    key_pem: &str,
) -> String {
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: {cluster}\ncontexts:\n- context:\n    cluster: {cluster}\n    user: {user}\n  name: {user}@{cluster}\ncurrent-context: {user}@{cluster}\nkind: Config\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n    {CERTIFICATE_FIELD}: {cert}\n    {KEY_FIELD}: {key}\n",
        ca = STANDARD.encode(ca_pem),
        cert = STANDARD.encode(certificate_pem),
        key = STANDARD.encode(key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_replaces_only_the_credentials() {
        let text = render(
            "kubernetes",
            "https://10.0.0.1:6443",
            "CA",
            "admin",
            "OLD CERT",
            "OLD KEY",
        );
        let text = format!("# managed by kubeadm\n{text}");
        assert_eq!(client_certificate_pem(&text).unwrap(), "OLD CERT");
        assert_eq!(client_key_pem(&text).unwrap(), "OLD KEY");

        let updated = replace_client_credentials(&text, "NEW CERT", "NEW KEY").unwrap();
        assert_eq!(client_certificate_pem(&updated).unwrap(), "NEW CERT");
        assert_eq!(client_key_pem(&updated).unwrap(), "NEW KEY");
        let unchanged = |t: &str| {
            t.lines()
                .filter(|l| {
                    !l.contains("client-certificate-data") && !l.contains("client-key-data")
                })
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(unchanged(&updated), unchanged(&text));
        assert!(updated.starts_with("# managed by kubeadm\n"));
    }

    #[test]
    fn file_references_and_several_users_are_refused() {
        let referenced = "users:\n- name: k\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n";
        assert_eq!(
            client_certificate_pem(referenced),
            Err(KubeconfigError::NoEmbeddedCertificate)
        );
        let two = "    client-certificate-data: QQ==\n    client-certificate-data: QQ==\n";
        assert_eq!(
            client_certificate_pem(two),
            Err(KubeconfigError::SeveralUsers(2))
        );
        let bad = "    client-certificate-data: !!!\n";
        assert_eq!(
            client_certificate_pem(bad),
            Err(KubeconfigError::BadEncoding(CERTIFICATE_FIELD))
        );
    }
}
