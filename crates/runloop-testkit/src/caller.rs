//! A caller that sends whatever frames it is told to (protocol §2–§7),
//! including what the real client never would, and reads the server's
//! frames as values it owns; and, under the WebSocket, a TCP connection
//! from any loopback address and a handshake written by hand.

use std::net::{IpAddr, SocketAddr};

use futures_util::{SinkExt, StreamExt};
use runloop_proto::Decode;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::server::run_request_payload;
use crate::wait::PATIENCE;

/// A frame-level client: sends whatever bytes it is told to.
pub struct RawClient {
    /// The connection, for what the methods do not cover.
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl RawClient {
    /// Connects without authorizing.
    pub async fn connect(url: &str) -> RawClient {
        // Small frames one after another: Nagle would hold each for an ACK.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
            .await
            .expect("connect");
        RawClient { ws }
    }

    /// Connects and authorizes with `credential`.
    pub async fn authorized(url: &str, credential: &str) -> RawClient {
        let mut client = RawClient::connect(url).await;
        let mut payload = vec![0];
        payload.extend_from_slice(credential.as_bytes());
        client
            .send_frame(&ClientFrame::Authorization { payload: &payload })
            .await;
        client
    }

    /// Sends `bytes` as one binary message.
    pub async fn send(&mut self, bytes: Vec<u8>) {
        self.ws
            .send(Message::Binary(bytes.into()))
            .await
            .expect("send");
    }

    /// Sends `frame`.
    pub async fn send_frame(&mut self, frame: &ClientFrame<'_>) {
        self.send(frame::to_message(frame)).await;
    }

    /// Opens scope `scope` with a run request and returns the id.
    pub async fn open_run(&mut self, scope: u32) -> String {
        self.send_frame(&ClientFrame::Request {
            scope,
            payload: &run_request_payload(),
        })
        .await;
        match self.next_frame().await {
            Some(Owned::Response { scope: s, payload }) if s == scope && payload[0] == 0 => {
                let id: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("id JSON");
                id["id"].as_str().expect("id").to_owned()
            }
            other => panic!("expected the run's id, got {other:?}"),
        }
    }

    /// Opens a run-loop channel.
    pub async fn open_loop(&mut self, scope: u32, channel: u32, prompt: &str) {
        let mut payload = vec![5];
        payload.extend_from_slice(serde_json::json!({"prompt": prompt}).to_string().as_bytes());
        self.send_frame(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload: &payload,
        })
        .await;
    }

    /// The next server frame, `None` when the connection ends.
    pub async fn next_frame(&mut self) -> Option<Owned> {
        let next = async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Binary(bytes))) => {
                        return Some(Owned::from(
                            ServerFrame::decode(&bytes).expect("a server frame"),
                        ));
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                    Some(Ok(_)) => {}
                }
            }
        };
        tokio::time::timeout(PATIENCE, next)
            .await
            .expect("a frame or the end in time")
    }
}

/// A server frame that owns its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// The authorization frame (its payload is not kept).
    Authorization,
    /// A response on `scope`.
    Response {
        /// The scope.
        scope: u32,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// The finish of `scope`.
    ResponseFinish {
        /// The scope.
        scope: u32,
    },
    /// A channel request (its payload is not kept).
    ChannelRequest {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
    },
    /// A response on a channel.
    ChannelResponse {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// The finish of a channel.
    ChannelResponseFinish {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
    },
}

impl From<ServerFrame<'_>> for Owned {
    fn from(frame: ServerFrame<'_>) -> Owned {
        match frame {
            ServerFrame::Authorization { .. } => Owned::Authorization,
            ServerFrame::Response { scope, payload } => Owned::Response {
                scope,
                payload: payload.to_vec(),
            },
            ServerFrame::ResponseFinish { scope } => Owned::ResponseFinish { scope },
            ServerFrame::ChannelRequest { scope, channel, .. } => {
                Owned::ChannelRequest { scope, channel }
            }
            ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => Owned::ChannelResponse {
                scope,
                channel,
                payload: payload.to_vec(),
            },
            ServerFrame::ChannelResponseFinish { scope, channel } => {
                Owned::ChannelResponseFinish { scope, channel }
            }
        }
    }
}

/// A TCP connection to `to` from `from`.
pub async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// A WebSocket upgrade request, written by hand.
pub const UPGRADE: &str = "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: \
                       Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                       Sec-WebSocket-Version: 13\r\n\r\n";

/// Completes the WebSocket handshake by hand on `tcp`.
pub async fn upgrade(tcp: &mut TcpStream) -> std::io::Result<()> {
    tcp.write_all(UPGRADE.as_bytes()).await?;
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        response.push(byte[0]);
    }
    if response.starts_with(b"HTTP/1.1 101") {
        Ok(())
    } else {
        Err(std::io::Error::other("not upgraded"))
    }
}

/// The header of a binary frame of `length` bytes, masked with a zero key
/// (so its payload goes as it is), the last of its message or not.
pub fn binary_header(length: u64, fin: bool) -> Vec<u8> {
    let mut header = vec![if fin { 0x82 } else { 0x02 }];
    if length < 126 {
        header.push(0x80 | length as u8);
    } else {
        header.push(0x80 | 127);
        header.extend_from_slice(&length.to_be_bytes());
    }
    header.extend_from_slice(&[0; 4]);
    header
}

/// Sends `frame` as one binary message on a connection made by hand.
pub async fn send_masked(tcp: &mut TcpStream, frame: &ClientFrame<'_>) -> std::io::Result<()> {
    let message = frame::to_message(frame);
    tcp.write_all(&binary_header(message.len() as u64, true))
        .await?;
    tcp.write_all(&message).await
}

/// On `tcp`, the upgrade by hand, then the authorization with
/// `credential`.
pub async fn authorize(tcp: &mut TcpStream, credential: &str) -> std::io::Result<()> {
    upgrade(tcp).await?;
    let mut payload = vec![0u8];
    payload.extend_from_slice(credential.as_bytes());
    send_masked(tcp, &ClientFrame::Authorization { payload: &payload }).await
}

/// A WebSocket connection by hand from `from`, authorized with
/// `credential` ([`authorize`]).
pub async fn authorized_from(
    from: IpAddr,
    to: SocketAddr,
    credential: &str,
) -> std::io::Result<TcpStream> {
    let mut tcp = connect_from(from, to).await?;
    authorize(&mut tcp, credential).await?;
    Ok(tcp)
}
