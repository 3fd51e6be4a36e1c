//! The baseline: a raw WebSocket forwarder with no protocol logic.
//!
//! It accepts a WebSocket, dials the same path on the upstream proxy, and
//! copies every data message across, one `send` per message, in both
//! directions — the least a program built on the same transport stack
//! (tokio + tokio-tungstenite) can do to pass a loop on. The relay is
//! measured against it in the same run.

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::synthetic::accept;

/// Forwards every connection on `listener` to `upstream` (`ws://host:port`)
/// until the listener fails.
pub async fn forward(listener: TcpListener, upstream: String) -> std::io::Result<()> {
    loop {
        let (tcp, _) = listener.accept().await?;
        tokio::spawn(pipe(tcp, upstream.clone()));
    }
}

async fn pipe(tcp: TcpStream, upstream: String) {
    let Some((client, path)) = accept(tcp).await else {
        return;
    };
    let Ok((upstream, _)) =
        tokio_tungstenite::connect_async_with_config(format!("{upstream}{path}"), None, true).await
    else {
        return;
    };
    let (mut to_client, mut from_client) = client.split();
    let (mut to_upstream, mut from_upstream) = upstream.split();
    let ask = async {
        while let Some(Ok(message)) = from_client.next().await {
            if message.is_close() || (is_data(&message) && to_upstream.send(message).await.is_err())
            {
                break;
            }
        }
        let _ = to_upstream.close().await;
    };
    let answer = async {
        while let Some(Ok(message)) = from_upstream.next().await {
            if is_data(&message) && to_client.send(message).await.is_err() {
                break;
            }
        }
        let _ = to_client.close().await;
    };
    tokio::join!(ask, answer);
}

fn is_data(message: &Message) -> bool {
    matches!(message, Message::Binary(_) | Message::Text(_))
}
