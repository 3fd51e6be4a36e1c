//! Browser callers (protocol §12) against a real `runloop serve
//! --allow-origin`: an upgrade from a foreign origin gets HTTP 403 before
//! the upgrade, an allowed one is served, an allowed one with an empty
//! credential is not, and a caller that sends no `Origin` is unaffected.
//! The server takes any credential (no tokens), so that only the origin
//! rule can refuse the empty one.

use futures_util::{SinkExt, StreamExt};
use runloop_testkit::command::Serve;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

const PAGE: &str = "http://127.0.0.1:8080";

/// A frame: type, scope, channel, payload.
fn frame(kind: u8, scope: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&scope.to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// What happened to a caller sending `origin` and `credential` that asks
/// for a demo run: `Err(status)` when the upgrade was refused, else whether
/// the run's id came (`false`: the connection was closed with no frame).
async fn attempt(url: &str, origin: Option<&str>, credential: &str) -> Result<bool, u16> {
    let mut request = url.into_client_request().expect("a request");
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert("Origin", origin.parse().expect("a header value"));
    }
    let mut ws = match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => ws,
        Err(WsError::Http(response)) => return Err(response.status().as_u16()),
        Err(other) => panic!("{other}"),
    };
    let mut authorization = vec![0u8];
    authorization.extend_from_slice(credential.as_bytes());
    let run = br#"{"image":{"server":{"name":"demo","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}},"memory":67108864,"disk":0,"agent":{}}"#;
    let mut request = vec![0u8];
    request.extend_from_slice(run);
    ws.send(Message::Binary(frame(0, 0, &authorization).into()))
        .await
        .expect("sent");
    ws.send(Message::Binary(frame(1, 1, &request).into()))
        .await
        .expect("sent");
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Binary(bytes) = message {
            // The run's first answer: its id (tag 0).
            return Ok(bytes.first() == Some(&2) && bytes.get(9) == Some(&0));
        }
    }
    Ok(false)
}

#[tokio::test]
async fn origins_are_checked_before_the_upgrade_and_at_the_authorization() {
    let server = Serve::start("error", &["--allow-origin", PAGE]);
    let url = server.url.clone();
    assert_eq!(
        attempt(&url, Some("https://evil.example"), "x").await,
        Err(403),
        "a foreign origin"
    );
    assert_eq!(
        attempt(&url, Some("http://127.0.0.1:8081"), "x").await,
        Err(403),
        "another port is another origin"
    );
    assert_eq!(
        attempt(&url, Some(PAGE), "a-token").await,
        Ok(true),
        "allowed"
    );
    assert_eq!(
        attempt(&url, Some(PAGE), "").await,
        Ok(false),
        "allowed, with an empty credential"
    );
    assert_eq!(
        attempt(&url, None, "").await,
        Ok(true),
        "no Origin: unaffected"
    );
}

#[tokio::test]
async fn without_allow_origin_no_browser_page_connects() {
    let server = Serve::start("error", &[]);
    assert_eq!(attempt(&server.url, Some(PAGE), "x").await, Err(403));
    assert_eq!(attempt(&server.url, None, "").await, Ok(true));
}
