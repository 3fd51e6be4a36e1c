//! Browser callers (protocol §12): the `Origin` of a WebSocket upgrade.
//!
//! A browser sends its page's origin with every WebSocket upgrade and lets
//! any page open `ws://127.0.0.1:…`, so without a check any site a person
//! visits could drive a server on their machine. A caller that is not a
//! browser (a CLI, an SDK) sends no `Origin`, and is unaffected. So: an
//! upgrade that carries an `Origin` is answered with HTTP 403, before the
//! upgrade, unless that origin is on the server's allow list (empty by
//! default: no browser at all); and a connection that carried one never
//! authorizes with an empty credential, even on a server that otherwise
//! takes any, since a page could otherwise act as every caller at once.

use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request};
use tokio_tungstenite::tungstenite::http::StatusCode;

/// What an upgrade's `Origin` says about its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// No `Origin`: not a browser.
    NoOrigin,
    /// A browser page whose origin is allowed.
    Browser,
}

/// Whether `request` may be upgraded, given the `allowed` origins; the
/// 403 that refuses it when not.
// The handshake callback's error type is tungstenite's, large by design.
#[allow(clippy::result_large_err)]
pub(crate) fn check(request: &Request, allowed: &[String]) -> Result<Caller, ErrorResponse> {
    let Some(origin) = request.headers().get("origin") else {
        return Ok(Caller::NoOrigin);
    };
    let origin = origin.to_str().unwrap_or_default();
    if allowed.iter().any(|one| one.eq_ignore_ascii_case(origin)) {
        return Ok(Caller::Browser);
    }
    let body =
        format!("the origin {origin:?} is not allowed to connect (runloop serve --allow-origin)\n");
    let mut refusal = ErrorResponse::new(Some(body));
    *refusal.status_mut() = StatusCode::FORBIDDEN;
    Err(refusal)
}

/// Why an origin cannot be put on the allow list: it must be an origin as
/// a browser sends it, `http://` or `https://`, a host and an optional
/// port, without a path; or `null` (sandboxed and `file:` pages).
pub fn invalid_origin(origin: &str) -> Option<String> {
    if origin == "null" {
        return None;
    }
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match rest {
        None => Some(format!(
            "{origin:?} is not an origin: it starts with http:// or https://"
        )),
        Some(host) if host.is_empty() || host.contains(['/', '?', '#', ' ', '@']) => Some(format!(
            "{origin:?} is not an origin: a scheme, a host and an optional port, such as https://app.example.com or http://127.0.0.1:8080, without a path"
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: Option<&str>) -> Request {
        let mut builder = Request::builder().uri("/");
        if let Some(origin) = origin {
            builder = builder.header("Origin", origin);
        }
        builder.body(()).expect("a request")
    }

    #[test]
    fn no_origin_is_not_a_browser_and_an_allowed_one_is() {
        let allowed = vec!["http://127.0.0.1:8080".to_owned()];
        assert_eq!(check(&request(None), &allowed).ok(), Some(Caller::NoOrigin));
        assert_eq!(check(&request(None), &[]).ok(), Some(Caller::NoOrigin));
        assert_eq!(
            check(&request(Some("HTTP://127.0.0.1:8080")), &allowed).ok(),
            Some(Caller::Browser)
        );
    }

    #[test]
    fn a_foreign_origin_gets_403() {
        let allowed = vec!["http://127.0.0.1:8080".to_owned()];
        for origin in ["https://evil.example", "http://127.0.0.1:8081", "null"] {
            let refusal = check(&request(Some(origin)), &allowed).expect_err(origin);
            assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
            assert!(
                refusal
                    .body()
                    .as_deref()
                    .unwrap_or_default()
                    .contains(origin)
            );
        }
        assert!(check(&request(Some("http://127.0.0.1:8080")), &[]).is_err());
    }

    #[test]
    fn origins_are_checked_as_a_browser_writes_them() {
        for good in ["http://127.0.0.1:8080", "https://app.example.com", "null"] {
            assert_eq!(invalid_origin(good), None, "{good}");
        }
        for bad in [
            "127.0.0.1:8080",
            "https://app.example.com/",
            "ftp://x",
            "https://",
            "*",
        ] {
            assert!(invalid_origin(bad).is_some(), "{bad}");
        }
    }
}
