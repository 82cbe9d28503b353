//! The plain answers of the operator's servers (the admission webhook, `/metrics` and the
//! health probes). Which connections they keep open is `caretaker_listener`'s.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// A `text/plain` answer: `message` and a newline.
pub(crate) fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `response`, after which the connection is closed: whatever the client sent after the
/// request's head (or part of its body) is not read, and is not going to be.
pub(crate) fn closing(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
