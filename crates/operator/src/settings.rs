//! The operator's settings, from the command line.

use std::time::Duration;

/// Operator settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Port of the agents when a Machine has no `caretaker.dev/agent-endpoint`.
    pub agent_port: u16,
    /// Attempts per request before it ends `failed`.
    pub max_attempts: u32,
    /// The first retry delay; it doubles per failed attempt.
    pub retry_base: Duration,
    /// How long one call to an agent may take.
    pub agent_timeout: Duration,
    /// How often a running upgrade's operation is read from its agent (agents cannot notify).
    pub upgrade_poll: Duration,
    /// The Bundle controller's settings (trust-manager's flags).
    pub trust: TrustSettings,
    /// `--authority-secret-namespaces`: the only namespaces a CertificateAuthority's Secret
    /// may be in; any when `None`.
    pub authority_secret_namespaces: Option<std::collections::BTreeSet<String>>,
}

/// What trust-manager takes as flags, for the Bundle controller.
#[derive(Debug, Clone)]
pub struct TrustSettings {
    /// `--trust-namespace`: the only namespace sources are read from.
    pub namespace: String,
    /// `--secret-targets-enabled`, `--target-namespaces`.
    pub bundles: crate::trust::plan::BundleSettings,
    /// `--filter-expired-certificates`, `--filter-non-ca-certs`.
    pub filters: caretaker_pki::PoolFilters,
    /// `--default-package-location` or `--default-package-from-system`.
    pub default_package: Option<crate::trust::package::DefaultPackage>,
}

impl Default for TrustSettings {
    fn default() -> Self {
        Self {
            namespace: "cert-manager".into(),
            bundles: Default::default(),
            filters: Default::default(),
            default_package: None,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            agent_port: 9443,
            max_attempts: 3,
            retry_base: Duration::from_secs(10),
            agent_timeout: Duration::from_secs(30),
            upgrade_poll: Duration::from_secs(2),
            trust: TrustSettings::default(),
            authority_secret_namespaces: None,
        }
    }
}

/// Where a server listens, as controller-runtime's `--*-bind-address` flags say it:
/// `HOST:PORT`, `[IPv6]:PORT`, or `:PORT` for every address of the host (IPv6 and IPv4).
/// Port 0 takes any free port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindAddress {
    /// `:PORT`.
    Any(u16),
    /// `HOST:PORT`, as written.
    Host(String),
}

impl std::str::FromStr for BindAddress {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let expected = "expected HOST:PORT, [IPv6]:PORT or :PORT (every address)";
        let Some((host, port)) = value.rsplit_once(':') else {
            return Err(format!("no port in {value:?}; {expected}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port (0 to 65535); {expected}"))?;
        let bracketed = host.starts_with('[') || host.ends_with(']');
        if host.is_empty() {
            Ok(BindAddress::Any(port))
        } else if bracketed
            && !(host.starts_with('[')
                && host.ends_with(']')
                && host[1..host.len() - 1]
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok())
        {
            Err(format!(
                "{host:?} is not a bracketed IPv6 address; {expected}"
            ))
        } else if !bracketed && host.contains(':') {
            Err(format!(
                "IPv6 addresses take brackets ([{host}]:{port}); {expected}"
            ))
        } else {
            Ok(BindAddress::Host(value.to_string()))
        }
    }
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindAddress::Any(port) => write!(f, ":{port}"),
            BindAddress::Host(address) => f.write_str(address),
        }
    }
}

impl BindAddress {
    /// A listener on this address. `:PORT` listens on IPv6's any address, which takes IPv4
    /// too, or on IPv4's alone where the host has no IPv6.
    pub async fn listen(&self) -> std::io::Result<tokio::net::TcpListener> {
        use std::net::{Ipv4Addr, Ipv6Addr};
        match self {
            BindAddress::Any(port) => {
                match tokio::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, *port)).await {
                    Ok(listener) => Ok(listener),
                    Err(_) => tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, *port)).await,
                }
            }
            BindAddress::Host(address) => tokio::net::TcpListener::bind(address.as_str()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_as_controller_runtime_writes_them() {
        let parse = |s: &str| s.parse::<BindAddress>();
        assert_eq!(parse(":9443"), Ok(BindAddress::Any(9443)));
        assert_eq!(parse(":0"), Ok(BindAddress::Any(0)));
        for host in [
            "127.0.0.1:9443",
            "[::1]:9443",
            "localhost:8080",
            "0.0.0.0:1",
        ] {
            assert_eq!(parse(host), Ok(BindAddress::Host(host.into())), "{host}");
            assert_eq!(parse(host).unwrap().to_string(), host);
        }
        assert_eq!(parse(":9443").unwrap().to_string(), ":9443");
        for (bad, says) in [
            ("9443", "no port"),
            ("", "no port"),
            (":", "is not a port"),
            (":65536", "is not a port"),
            ("host:https", "is not a port"),
            ("::1:9443", "take brackets"),
            ("[::1:9443", "is not a bracketed"),
            ("[nope]:9443", "is not a bracketed"),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[tokio::test]
    async fn any_address_takes_ipv4_too() {
        let listener = BindAddress::Any(0).listen().await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
    }
}
