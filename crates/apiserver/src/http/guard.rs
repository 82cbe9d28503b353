//! Refuses requests a web browser could be made to send on a web page's behalf.
//!
//! The server has no authentication, so any request that reaches it may read Secrets (CA keys
//! among them) and write anything. Browsers reach loopback servers too: a page can post "simple"
//! cross-origin requests blind, and through DNS rebinding (its own name re-resolved to this
//! server's address) it can even read the answers. Both carry tell-tale headers: a `Host` that
//! names the page's site, an `Origin` that is not this server's. kubectl and kube-rs send
//! neither: their `Host` is the kubeconfig's server address and they send no `Origin`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Which `Host` and `Origin` values belong to this server.
#[derive(Debug, Clone)]
pub struct RequestGuard {
    /// The bound address (an unspecified IP when listening on every interface).
    listen: SocketAddr,
    scheme: &'static str,
}

/// A request's `Host` or `Origin` authority, normalised for comparison.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    fn new(authority: &Authority, scheme: &str) -> Self {
        let default_port = if scheme == "https" { 443 } else { 80 };
        Endpoint {
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(default_port),
        }
    }

    fn ip(&self) -> Option<IpAddr> {
        self.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()
    }
}

impl RequestGuard {
    pub fn new(listen: SocketAddr, tls: bool) -> Self {
        RequestGuard {
            listen,
            scheme: if tls { "https" } else { "http" },
        }
    }

    /// Ok when the request may be served.
    ///
    /// Refusals are 403 Forbidden `Status` objects: the request is well formed but comes from a
    /// place this server does not serve, which is what kubectl users know Forbidden to mean (and
    /// what they would see from kube-apiserver's authorizer). Only a missing `Host` is a 400
    /// BadRequest: HTTP/1.1 requires it.
    fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        // HTTP/2 carries the authority in the URI, HTTP/1.1 in the Host header.
        let authority = match uri.authority() {
            Some(a) => a.clone(),
            None => {
                let host = headers
                    .get(header::HOST)
                    .ok_or_else(|| ApiError::bad_request("the request has no Host header"))?;
                let host = String::from_utf8_lossy(host.as_bytes());
                host.parse::<Authority>().map_err(|_| {
                    ApiError::bad_request(format!("the Host header {host:?} is not a host[:port]"))
                })?
            }
        };
        let own = Endpoint::new(&authority, self.scheme);
        if !self.is_own_host(&own) {
            return Err(ApiError::forbidden(format!(
                "Host {:?} is neither this server's address {} nor a loopback name; use the server address from the kubeconfig",
                authority.as_str(),
                self.listen
            )));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !self.is_same_origin(&origin, &own) {
                return Err(ApiError::forbidden(format!(
                    "cross-origin request from Origin {origin:?} refused: this server serves only its own origin {}://{}",
                    self.scheme,
                    authority.as_str()
                )));
            }
        }
        Ok(())
    }

    /// A loopback name (any port: tunnels and port forwards change it), or the address the
    /// server listens on with its port. When it listens on every interface, any IP literal with
    /// its port: a rebinding page can only make a browser send its own DNS name as Host.
    fn is_own_host(&self, host: &Endpoint) -> bool {
        let ip = host.ip();
        if host.host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) {
            return true;
        }
        ip.is_some_and(|ip| {
            host.port == self.listen.port()
                && (ip == self.listen.ip() || self.listen.ip().is_unspecified())
        })
    }

    /// Whether `origin` (`scheme://host[:port]`) is the origin the request was sent to.
    fn is_same_origin(&self, origin: &str, own: &Endpoint) -> bool {
        let Ok(uri) = origin.parse::<Uri>() else {
            return false;
        };
        match (uri.scheme_str(), uri.authority()) {
            (Some(scheme), Some(authority)) if uri.path() == "/" || uri.path().is_empty() => {
                scheme.eq_ignore_ascii_case(self.scheme)
                    && Endpoint::new(authority, self.scheme) == *own
            }
            _ => false,
        }
    }
}

/// Middleware: serves the request only when [`RequestGuard`] admits it.
pub async fn guard(State(guard): State<Arc<RequestGuard>>, req: Request, next: Next) -> Response {
    match guard.check(req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn check(guard: &RequestGuard, host: &str, origin: Option<&str>) -> Result<(), u16> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            headers.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        guard
            .check(&Uri::from_static("/api/v1/secrets"), &headers)
            .map_err(|e| e.code)
    }

    #[test]
    fn hosts() {
        let loopback = RequestGuard::new("127.0.0.1:6443".parse().unwrap(), false);
        for ok in [
            "127.0.0.1:6443",
            "localhost:6443",
            "LOCALHOST:7000",
            "[::1]:6443",
            "127.0.0.2",
        ] {
            assert_eq!(check(&loopback, ok, None), Ok(()), "{ok}");
        }
        for refused in [
            "attacker.example:6443",
            "attacker.example",
            "192.0.2.1:6443",
            "localhost.attacker.example:6443",
        ] {
            assert_eq!(check(&loopback, refused, None), Err(403), "{refused}");
        }

        let remote = RequestGuard::new("192.0.2.1:6443".parse().unwrap(), true);
        assert_eq!(check(&remote, "192.0.2.1:6443", None), Ok(()));
        assert_eq!(check(&remote, "192.0.2.1:443", None), Err(403));
        assert_eq!(check(&remote, "192.0.2.1", None), Err(403));
        assert_eq!(check(&remote, "192.0.2.2:6443", None), Err(403));
        assert_eq!(check(&remote, "myhost:6443", None), Err(403));

        let everywhere = RequestGuard::new("0.0.0.0:6443".parse().unwrap(), false);
        assert_eq!(check(&everywhere, "198.51.100.7:6443", None), Ok(()));
        assert_eq!(check(&everywhere, "198.51.100.7:80", None), Err(403));
        assert_eq!(check(&everywhere, "myhost:6443", None), Err(403));

        assert_eq!(
            loopback
                .check(&Uri::from_static("/api"), &HeaderMap::new())
                .map_err(|e| e.code),
            Err(400)
        );
    }

    #[test]
    fn origins() {
        let guard = RequestGuard::new("127.0.0.1:6443".parse().unwrap(), false);
        let host = "127.0.0.1:6443";
        assert_eq!(check(&guard, host, Some("http://127.0.0.1:6443")), Ok(()));
        for refused in [
            "http://attacker.example",
            "http://127.0.0.1:8080",
            "https://127.0.0.1:6443",
            "http://localhost:6443",
            "null",
            "",
        ] {
            assert_eq!(check(&guard, host, Some(refused)), Err(403), "{refused}");
        }
        let https = RequestGuard::new("127.0.0.1:443".parse().unwrap(), true);
        assert_eq!(
            check(&https, "127.0.0.1", Some("https://127.0.0.1:443")),
            Ok(())
        );
    }
}
