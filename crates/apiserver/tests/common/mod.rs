//! Helpers shared by the integration tests: a raw HTTP client, the `Status` of a failed
//! kube-rs request, and a namespace to work in.

#![allow(dead_code)] // each test binary uses a different part

use std::time::Duration;

use kube::core::Status;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `Status` object a request failed with; panics on any other error (a transport failure
/// is not what these tests expect).
pub fn api_status(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Creates namespace `name` with `labels` (a JSON object) through `client`.
pub async fn create_namespace(client: &kube::Client, name: &str, labels: Value) {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    let namespace = json!({"metadata": {"name": name, "labels": labels}});
    namespaces
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(namespace).unwrap(),
        )
        .await
        .unwrap();
}

/// A minimal HTTP client: enough to send what typed clients refuse to build (malformed bodies,
/// foreign Host and Origin headers, odd content types) and to read a watch as it is sent.
pub struct RawHttp {
    /// `host:port` of the server, also the default Host header.
    pub addr: String,
}

impl RawHttp {
    /// For a plain-HTTP server URL (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Self {
        RawHttp {
            addr: url.trim_start_matches("http://").to_string(),
        }
    }

    /// One request with a Content-Type; returns the status code and the JSON body (null if none).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> (u16, Value) {
        self.request(method, path, &[("Content-Type", content_type)], body)
            .await
    }

    /// One request with exactly `headers`, plus Host (unless given), Content-Length and
    /// Connection: close.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Value) {
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        let (code, body) = self.exchange(&head, body).await;
        (code, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// GETs a stream (a watch) until the server ends it, within 10 seconds; returns the lines
    /// of its body that hold JSON objects. HTTP/1.0, so that the body comes unchunked.
    pub async fn stream_lines(&self, path: &str) -> Vec<String> {
        self.stream_lines_with(path, &[]).await
    }

    /// [`Self::stream_lines`] with these headers too.
    pub async fn stream_lines_with(&self, path: &str, headers: &[(&str, &str)]) -> Vec<String> {
        let mut head = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n", self.addr);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let (_, body) = tokio::time::timeout(Duration::from_secs(10), self.exchange(&head, ""))
            .await
            .expect("stream ended");
        body.lines()
            .filter(|l| l.starts_with('{'))
            .map(String::from)
            .collect()
    }

    /// Sends `head` and `body` on a new connection and reads the response to its end; returns
    /// the status code and the body.
    async fn exchange(&self, head: &str, body: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        // A server that refuses a body from its headers answers and closes before reading it
        // all; the answer is still there to read.
        if let Err(e) = s.write_all(body.as_bytes()).await {
            assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ),
                "{e}"
            );
        }
        let mut out = Vec::new();
        if let Err(e) = s.read_to_end(&mut out).await {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
        }
        let text = String::from_utf8_lossy(&out);
        let code: u16 = text[9..12].parse().unwrap();
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (code, body.to_string())
    }
}
