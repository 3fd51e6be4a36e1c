//! How a connection's end reaches a run that was waiting for its answer:
//! each fault named as what it is, against real sockets on loopback whose
//! far side misbehaves the way a server can (a kill mid-start, a message
//! over the limit, a torn frame, a refusal, silence).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_client::{Client, ClientConfig, ConnectError, Ending, RunError, RunRequest};
use runloop_proto::error_chain::Chain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// A listener on a free loopback port, and its `ws://` URL.
async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("ws://{}", listener.local_addr().expect("an address"));
    (listener, url)
}

/// Accepts one connection's upgrade, and reads its authorization and the
/// run request that follows (two binary messages).
async fn accept_and_read_request(listener: &TcpListener) -> WebSocketStream<TcpStream> {
    let (tcp, _) = listener.accept().await.expect("accepts");
    let mut ws = tokio_tungstenite::accept_async(tcp)
        .await
        .expect("the upgrade");
    for what in ["the authorization", "the run request"] {
        match ws.next().await {
            Some(Ok(Message::Binary(_))) => {}
            other => panic!("expected {what}, got {other:?}"),
        }
    }
    ws
}

/// `start` on a fresh connection to `url` with `credential`.
async fn start(url: &str, credential: &str) -> RunError {
    let client = Client::connect(url, credential).await.expect("connects");
    let error = client
        .start(RunRequest::server("demo").disk(0))
        .await
        .expect_err("no run");
    client.close().await;
    error
}

/// Issue 40 item 9: a server killed while a run starts (its socket gone,
/// no close handshake) was reported as a missing credential when none
/// was sent. It is a broken connection, and says so.
#[tokio::test]
async fn a_server_gone_mid_start_is_a_broken_connection_not_a_credential() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        let ws = accept_and_read_request(&listener).await;
        // As a SIGKILL leaves it: the socket closes, no close frame.
        drop(ws.into_inner());
    });
    let error = start(&url, "").await;
    let RunError::ConnectionEnded(Ending::Broke(said)) = &error else {
        panic!("{error:?}");
    };
    assert!(!said.is_empty());
    let message = Chain(&error).to_string();
    assert!(
        message.starts_with(
            "the connection ended before the run started: it broke with no close \
             handshake (did the server stop?): "
        ),
        "{message}"
    );
    assert!(!message.contains("credential"), "{message}");
    server.await.expect("the fake server");
}

/// The same with a credential: not "is the credential right?".
#[tokio::test]
async fn a_server_gone_mid_start_with_a_credential_is_broken_too() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        let ws = accept_and_read_request(&listener).await;
        drop(ws.into_inner());
    });
    let error = start(&url, "a-token").await;
    assert!(
        matches!(error, RunError::ConnectionEnded(Ending::Broke(_))),
        "{error:?}"
    );
    let message = Chain(&error).to_string();
    assert!(!message.contains("credential"), "{message}");
    server.await.expect("the fake server");
}

/// Issue 40 item 9: a message over the client's `max_message_size` ends
/// the connection, and the run that waited is told the sizes, not asked
/// about its credential.
#[tokio::test]
async fn a_message_over_the_limit_is_named_with_the_limit() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        let mut ws = accept_and_read_request(&listener).await;
        let limit = runloop_client::Limits::default().max_message_size;
        // Whatever the client does with it, it may go before all is sent.
        let _ = ws.send(Message::Binary(vec![0u8; limit + 1].into())).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    });
    let error = start(&url, "a-token").await;
    let limit = runloop_client::Limits::default().max_message_size;
    assert!(
        matches!(
            error,
            RunError::ConnectionEnded(Ending::TooLarge { limit: l, .. }) if l == limit
        ),
        "{error:?}"
    );
    let message = Chain(&error).to_string();
    assert!(
        message.contains(&format!(
            "over this client's max_message_size of {limit} bytes"
        )),
        "{message}"
    );
    server.await.expect("the fake server");
}

/// Issue 40 item 9: a WebSocket frame cut off in its middle (its header
/// promises more than comes before the socket closes) is a torn frame,
/// named as the connection's break.
#[tokio::test]
async fn a_torn_frame_is_a_broken_connection() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        let ws = accept_and_read_request(&listener).await;
        let mut tcp = ws.into_inner();
        // FIN + binary, a 16-bit length of 1000, and 10 bytes of it.
        tcp.write_all(&[0x82, 126, 0x03, 0xe8])
            .await
            .expect("writes");
        tcp.write_all(&[0u8; 10]).await.expect("writes");
        tcp.shutdown().await.expect("shuts down");
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest).await;
    });
    let error = start(&url, "").await;
    assert!(
        matches!(
            error,
            RunError::ConnectionEnded(Ending::Broke(_) | Ending::Unreadable(_))
        ),
        "{error:?}"
    );
    let message = Chain(&error).to_string();
    assert!(!message.contains("credential"), "{message}");
    server.await.expect("the fake server");
}

/// A message that is not a frame of the protocol, then a clean close: the
/// server answered (badly), so this is not a refused credential either.
#[tokio::test]
async fn a_frame_that_does_not_decode_then_a_close_is_not_a_credential() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        let mut ws = accept_and_read_request(&listener).await;
        ws.send(Message::Binary(vec![2, 0, 0].into()))
            .await
            .expect("sends");
        ws.close(None).await.expect("closes");
        while let Some(Ok(_)) = ws.next().await {}
    });
    let error = start(&url, "").await;
    assert!(
        matches!(error, RunError::ConnectionEnded(Ending::Closed { .. })),
        "{error:?}"
    );
    server.await.expect("the fake server");
}

/// The refusal's own shape (close code 1008, no reason, no frame) is still
/// read as the credential: refused, or wanted when none was sent.
#[tokio::test]
async fn a_refusal_is_still_the_credential() {
    let (listener, url) = listener().await;
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let mut ws = accept_and_read_request(&listener).await;
            let _ = ws
                .close(Some(CloseFrame {
                    code: CloseCode::Policy,
                    reason: "".into(),
                }))
                .await;
            while let Some(Ok(_)) = ws.next().await {}
        }
    });
    assert_eq!(start(&url, "wrong").await, RunError::CredentialRefused);
    assert_eq!(start(&url, "").await, RunError::NoCredential);
    server.await.expect("the fake server");
}

/// `ClientConfig::connect_timeout` bounds a server that accepts TCP and
/// never answers the upgrade.
#[tokio::test]
async fn a_silent_server_times_out_connecting() {
    let (listener, url) = listener().await;
    let config = ClientConfig::default().connect_timeout(Some(Duration::from_millis(200)));
    match Client::connect_with(&url, "", config).await {
        Err(ConnectError::Timeout(limit)) => {
            assert_eq!(limit, Duration::from_millis(200));
        }
        other => panic!("{other:?}"),
    }
    drop(listener);
}

/// The default bound is the Python package's: 10 s.
#[test]
fn the_default_connect_timeout_is_ten_seconds() {
    assert_eq!(
        ClientConfig::default().connect_timeout,
        Some(Duration::from_secs(10))
    );
}
