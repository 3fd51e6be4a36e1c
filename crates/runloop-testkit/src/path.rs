//! The server's end of a proxy path (protocol §10), for the tests of a
//! proxy: a WebSocket client that opens `/agent/register` and
//! `/agent/run` the way the server does, sends the ask, and reads every
//! message to the path's end; and what the caller would make of them.

use futures_util::{SinkExt, StreamExt};
use runloop_proto::Writer;
use runloop_proto::run_loop::{AgenticLoopChunk, Outcome, Reader, Relay, Relayed, Step};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// A path as the client holds it.
pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// How a path ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A close frame came.
    Clean,
    /// The path ended without one; why, in the client's words.
    Abrupt(String),
}

/// Every binary message of a path, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The binary messages, in order.
    pub messages: Vec<Vec<u8>>,
    /// How the path ended.
    pub end: End,
}

/// Opens `url` + `path`.
pub async fn open(url: &str, path: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("{url}{path}"))
        .await
        .expect("the proxy accepts the path");
    ws
}

/// Sends the ask as one binary message.
pub async fn ask(ws: &mut Ws, ask: &[u8]) {
    ws.send(Message::Binary(ask.to_vec().into()))
        .await
        .expect("the ask is sent");
}

/// Reads the next binary message; `None` at the end of the path.
pub async fn next_binary(ws: &mut Ws) -> Option<Vec<u8>> {
    loop {
        match ws.next().await? {
            Ok(Message::Binary(bytes)) => return Some(bytes.to_vec()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Reads the rest of a path.
pub async fn rest(mut ws: Ws) -> Exchange {
    let mut messages = Vec::new();
    let mut closed = false;
    loop {
        let why = match ws.next().await {
            Some(Ok(Message::Binary(bytes))) => {
                messages.push(bytes.to_vec());
                continue;
            }
            Some(Ok(Message::Close(_))) => {
                closed = true;
                continue;
            }
            Some(Ok(_)) => continue,
            None => "the stream ended".to_owned(),
            Some(Err(error)) => error.to_string(),
        };
        let end = if closed { End::Clean } else { End::Abrupt(why) };
        return Exchange { messages, end };
    }
}

/// One whole exchange: open the path, send the ask, read to the end.
pub async fn exchange(url: &str, path: &str, ask_bytes: &[u8]) -> Exchange {
    let mut ws = open(url, path).await;
    ask(&mut ws, ask_bytes).await;
    rest(ws).await
}

/// Registers with `{"agent": {}}` and checks the proxy said `[0]`.
pub async fn register(url: &str) {
    let done = exchange(url, "/agent/register", br#"{"agent":{}}"#).await;
    assert_eq!(
        done,
        Exchange {
            messages: vec![vec![0]],
            end: End::Clean
        }
    );
}

/// Feeds a run path's messages through the server's relay and the
/// caller's reader, as the real chain does: the chunks and the outcome the
/// caller would see.
pub fn outcome(exchange: &Exchange) -> (Vec<AgenticLoopChunk>, Outcome) {
    let mut relay = Relay::new();
    let mut reader = Reader::new();
    let mut chunks = Vec::new();
    let mut feed = |reader: &mut Reader, payload: &[u8]| -> Option<Outcome> {
        match reader.response(payload) {
            Some(Step::Chunk(chunk)) => {
                chunks.push(chunk);
                None
            }
            Some(Step::End(outcome)) => Some(outcome),
            Some(Step::Error(_)) | None => None,
        }
    };
    for message in &exchange.messages {
        let mut out = Vec::new();
        let last = match relay.message(message.clone(), &mut Writer::new(&mut out)) {
            Relayed::Forward(next, message) => {
                relay = next;
                if let Some(outcome) = feed(&mut reader, &message) {
                    return (chunks, outcome);
                }
                continue;
            }
            Relayed::Last(error, _finish) => error,
            Relayed::Fault(_finish) => out,
        };
        let ended = feed(&mut reader, &last);
        let outcome = ended.or_else(|| reader.finish()).expect("an outcome");
        return (chunks, outcome);
    }
    let mut out = Vec::new();
    match &exchange.end {
        End::Clean => {
            let _finish = relay.closed();
        }
        End::Abrupt(why) => {
            let _finish = relay.broke(why, &mut Writer::new(&mut out));
            if let Some(outcome) = feed(&mut reader, &out) {
                return (chunks, outcome);
            }
        }
    }
    let outcome = reader.finish().expect("an outcome");
    (chunks, outcome)
}

/// The error JSON of a message that is `[1][JSON]`.
pub fn error_json(message: &[u8]) -> serde_json::Value {
    assert_eq!(message.first(), Some(&1), "an error message");
    serde_json::from_slice(&message[1..]).expect("error JSON")
}

/// The words of an error value the proxy gave for its agent program (kind
/// `agent`, words that are a string), for the test to check.
pub fn agent_words(error: &runloop_proto::ErrorValue) -> &str {
    assert_eq!(error.value()["kind"], "agent", "{error}");
    error.value()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("words: {error}"))
}
