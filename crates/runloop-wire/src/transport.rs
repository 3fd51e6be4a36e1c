//! The byte stream under a framed connection: TCP, or TLS over TCP, chosen
//! by the URL's scheme (`ws://`, `wss://`) on the client and by the
//! server's configuration on the server.
//!
//! Dialling is done here rather than by the WebSocket library so that each
//! step fails in words an operator can act on: the URL, the TCP connection,
//! the TLS handshake (which host, and why its certificate did not verify:
//! an unknown authority, an expiry, a name it was not issued for), and the
//! WebSocket handshake (with the server's HTTP answer when it gave one).
//!
//! The server side answers a plain HTTP request on a TLS port with a
//! `400` that says to use `wss://`, instead of a TLS alert the caller's
//! WebSocket library would report as garbage.

use std::io;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, CertificateError};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::{client, server};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::either::Either;

use crate::tls::{ClientTls, TlsError};

/// A client's stream: plain TCP (`ws://`) or TLS over TCP (`wss://`).
pub type ClientStream = Either<TcpStream, client::TlsStream<TcpStream>>;

/// Why a connection could not be dialled. Each names the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The URL is not a `ws://` or `wss://` URL with a host.
    #[error("{url:?} is not a ws:// or wss:// URL: {why}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TCP connection failed.
    #[error("cannot reach {host}:{port}")]
    Tcp {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// The client's trust roots could not be made; the error names the
    /// file or the platform's store.
    #[error(transparent)]
    Roots(TlsError),
    /// The TLS handshake failed; `reason` (the source) says why.
    #[error("TLS with {host} failed")]
    Tls {
        /// The host, as the URL names it.
        host: String,
        /// Why, read from `error`.
        #[source]
        reason: TlsReason,
        /// The handshake's error, which `reason` reads: the TLS library's
        /// own words, kept for a caller that wants them.
        error: io::Error,
    },
    /// The WebSocket upgrade was answered with an HTTP status instead:
    /// what answered is not a runloop server, or a runloop server refused
    /// the upgrade and said why. The words say the status and the body,
    /// all the answer holds, so there is no source.
    #[error("{}", upgrade_answered(host, *port, response))]
    Answered {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// The answer.
        response: Box<Response>,
    },
    /// The server closed the connection before it answered the upgrade
    /// (as a runloop server does with a caller it turns away and cannot
    /// take the time to tell why). The words say what the close means, so
    /// the WebSocket error it was read from is kept, not a source.
    #[error("cannot connect to {host}:{port}: {CLOSED_BEFORE_ANSWER}")]
    Closed {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// How the handshake ended.
        error: WsError,
    },
    /// The WebSocket handshake failed otherwise: the connection broke, or
    /// what answered does not speak WebSocket.
    #[error("{}", websocket_failure(host, *port, source))]
    WebSocket {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// What the handshake said.
        #[source]
        source: WsError,
    },
}

/// Why a TLS handshake failed, as far as a caller can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsReason {
    /// The certificate is not signed by an authority the client trusts.
    UnknownAuthority,
    /// The certificate expired this many seconds ago.
    Expired(Option<u64>),
    /// The certificate is not valid yet.
    NotValidYet,
    /// The server's own certificate is a CA's (`openssl req -x509` makes
    /// one): a CA may only sign, the server must serve a leaf.
    CaAsLeaf,
    /// The certificate was not issued for the host dialled; the names it
    /// holds.
    WrongName(Vec<String>),
    /// The server does not speak TLS on this port.
    NotTls,
    /// The server closed the connection without a word of TLS: a plain
    /// port, or a server turning callers away.
    Closed,
    /// The server ended the handshake with this alert.
    Alert(String),
    /// Another reason, in the TLS library's words.
    Other(String),
}

impl std::fmt::Display for TlsReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsReason::UnknownAuthority => f.write_str(
                "its certificate is not signed by a certificate authority this client trusts \
                 (unknown issuer)",
            ),
            TlsReason::Expired(Some(ago)) => {
                write!(f, "its certificate expired {} ago", Ago(*ago))
            }
            TlsReason::Expired(None) => f.write_str("its certificate has expired"),
            TlsReason::NotValidYet => f.write_str("its certificate is not valid yet"),
            TlsReason::CaAsLeaf => f.write_str(
                "a CA certificate was served as the server's own; serve a leaf signed by it",
            ),
            TlsReason::WrongName(names) if names.is_empty() => {
                f.write_str("its certificate was not issued for this host name")
            }
            TlsReason::WrongName(names) => write!(
                f,
                "its certificate was not issued for this host name (it names {})",
                names.join(", ")
            ),
            TlsReason::NotTls => {
                f.write_str("the server did not answer in TLS (is it a plain ws:// port?)")
            }
            TlsReason::Closed => f.write_str(
                "the server closed the connection without answering in TLS: it is turning \
                 callers away (try again later), or this is a plain ws:// port",
            ),
            TlsReason::Alert(alert) => write!(f, "the server refused the handshake ({alert})"),
            TlsReason::Other(why) => f.write_str(why),
        }
    }
}

/// A duration in seconds, in the largest whole unit.
struct Ago(u64);

impl std::fmt::Display for Ago {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let units = [
            (86_400, "day"),
            (3_600, "hour"),
            (60, "minute"),
            (1, "second"),
        ];
        let (size, name) = units
            .into_iter()
            .find(|(size, _)| self.0 >= *size)
            .unwrap_or((1, "second"));
        let n = self.0 / size;
        write!(f, "{n} {name}{}", if n == 1 { "" } else { "s" })
    }
}

/// A reason is the cause of [`DialError::Tls`], in words: its own cause,
/// the handshake's error, is what it was read from.
impl std::error::Error for TlsReason {}

impl TlsReason {
    /// The reason behind a failed client handshake.
    fn of(error: &io::Error) -> TlsReason {
        let rustls = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        match rustls {
            Some(rustls::Error::InvalidCertificate(certificate)) => match certificate {
                CertificateError::UnknownIssuer => TlsReason::UnknownAuthority,
                CertificateError::Expired => TlsReason::Expired(None),
                CertificateError::ExpiredContext { time, not_after } => {
                    TlsReason::Expired(Some(time.as_secs().saturating_sub(not_after.as_secs())))
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    TlsReason::NotValidYet
                }
                CertificateError::NotValidForName => TlsReason::WrongName(Vec::new()),
                CertificateError::NotValidForNameContext { presented, .. } => {
                    TlsReason::WrongName(presented.iter().map(|name| bare_name(name)).collect())
                }
                CertificateError::Other(other)
                    if matches!(
                        other.0.downcast_ref::<webpki::Error>(),
                        Some(webpki::Error::CaUsedAsEndEntity)
                    ) =>
                {
                    TlsReason::CaAsLeaf
                }
                other => TlsReason::Other(format!("its certificate does not verify: {other}")),
            },
            Some(rustls::Error::InvalidMessage(_)) => TlsReason::NotTls,
            Some(rustls::Error::AlertReceived(alert)) => TlsReason::Alert(alert_name(*alert)),
            Some(other) => TlsReason::Other(other.to_string()),
            None if closed(error) => TlsReason::Closed,
            None => TlsReason::Other(error.to_string()),
        }
    }
}

/// A name as the certificate verifier presents it (`DnsName("example.com")`,
/// `IpAddress(10.0.0.1)`), without its wrapping.
fn bare_name(presented: &str) -> String {
    presented
        .split_once('(')
        .and_then(|(_, inner)| inner.strip_suffix(')'))
        .map_or(presented, |inner| inner.trim_matches('"'))
        .to_owned()
}

fn alert_name(alert: AlertDescription) -> String {
    format!("{alert:?}")
}

/// Whether `error` is the server closing the connection on the client
/// mid-handshake: the end of the stream, or a reset.
pub fn closed(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// Whether a WebSocket handshake failed because the server closed the
/// connection before it answered (as a runloop server does with a caller
/// it turns away and cannot tell why).
pub fn closed_before_answer(error: &WsError) -> bool {
    match error {
        WsError::Protocol(ProtocolError::HandshakeIncomplete) => true,
        WsError::Io(error) => closed(error),
        _ => false,
    }
}

/// What a caller is told when the server closed the connection before it
/// answered the WebSocket upgrade.
pub const CLOSED_BEFORE_ANSWER: &str = "the server closed the connection before it answered the \
     WebSocket upgrade: it is turning callers away (too many connections at once, or from this \
     address); try again later";

/// The words of a WebSocket upgrade with `host:port` answered with an
/// HTTP status.
fn upgrade_answered(host: &str, port: u16, response: &Response) -> String {
    match runloop_refusal(response) {
        Some(body) => format!(
            "the WebSocket handshake with {host}:{port} failed: the server answered HTTP {}: \
             {body}",
            response.status()
        ),
        None => format!(
            "{host}:{port} is not a runloop server: it answered the WebSocket upgrade with \
             HTTP {}",
            response.status()
        ),
    }
}

/// The words of a WebSocket handshake with `host:port` that failed
/// otherwise; the error, its source, says how.
fn websocket_failure(host: &str, port: u16, error: &WsError) -> String {
    match error {
        WsError::Io(_) => format!("the WebSocket handshake with {host}:{port} failed"),
        _ => format!(
            "{host}:{port} is not a runloop server: its answer to the WebSocket upgrade is not \
             one"
        ),
    }
}

/// The `Server` header of a runloop server's own HTTP answers.
const SERVER: &str = "runloop";

/// Why a runloop server refused the WebSocket upgrade (a `ws://` to its
/// TLS port), when the answer is a runloop server's (its `Server` header)
/// and says why; `None` for any other server's answer.
pub fn runloop_refusal(response: &Response) -> Option<String> {
    let server = response.headers().get("server")?;
    (server.as_bytes() == SERVER.as_bytes())
        .then(|| answer_body(response))
        .flatten()
}

/// The body of an answer to the WebSocket upgrade, trimmed, when it has one
/// (a refusal's reason, from a runloop server or a proxy).
pub fn answer_body(response: &Response) -> Option<String> {
    response
        .body()
        .as_deref()
        .map(String::from_utf8_lossy)
        .map(|body| body.trim().to_owned())
        .filter(|body| !body.is_empty())
}

/// Opens a WebSocket to `url`: TCP, then TLS for `wss://` (trusting
/// `tls`, or the platform's roots when it is `None`), then the WebSocket
/// handshake with `config`.
pub async fn dial(
    url: &str,
    tls: Option<&ClientTls>,
    config: WebSocketConfig,
) -> Result<(WebSocketStream<ClientStream>, Response), DialError> {
    let bad = |why: &str| DialError::Url {
        url: url.to_owned(),
        why: why.to_owned(),
    };
    let request = url
        .into_client_request()
        .map_err(|error| bad(&error.to_string()))?;
    let uri = request.uri();
    let secure = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => return Err(bad("the scheme must be ws or wss")),
    };
    let host = uri
        .host()
        .ok_or_else(|| bad("it names no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| DialError::Tcp {
            host: host.clone(),
            port,
            source,
        })?;
    // Frames are small and written in batches: Nagle would only hold each
    // batch back for an ACK.
    let _ = tcp.set_nodelay(true);
    let stream = if secure {
        let name = ServerName::try_from(host.clone())
            .map_err(|_| bad("the host is not a DNS name or an IP address"))?;
        let connector = match tls {
            Some(tls) => tls.connector(),
            None => ClientTls::platform().map_err(DialError::Roots)?.connector(),
        };
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|error| DialError::Tls {
                host: host.clone(),
                reason: TlsReason::of(&error),
                error,
            })?;
        Either::Right(tls)
    } else {
        Either::Left(tcp)
    };
    tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|source| match source {
            WsError::Http(response) => DialError::Answered {
                host,
                port,
                response,
            },
            error if closed_before_answer(&error) => DialError::Closed { host, port, error },
            source => DialError::WebSocket { host, port, source },
        })
}

/// Why a server-side TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The caller sent plain HTTP; it was answered with a `400` that says
    /// to use `wss://`.
    #[error("the caller spoke plain HTTP to the TLS port (answered 400: use wss://)")]
    Plaintext,
    /// The caller sent something that is neither TLS nor HTTP, or nothing.
    #[error("the caller did not start a TLS handshake")]
    NotTls,
    /// The handshake failed.
    #[error("the TLS handshake failed")]
    Handshake(#[source] io::Error),
}

/// The first byte of a TLS record that starts a handshake.
const TLS_HANDSHAKE: u8 = 0x16;

/// The body of the answer to a plain HTTP request on the TLS port.
const PLAINTEXT_BODY: &str = "this port speaks TLS: use wss://, not ws://\n";

/// The whole answer to a plain HTTP request on the TLS port.
fn plaintext_answer() -> String {
    format!(
        "HTTP/1.1 400 Bad Request\r\nServer: {SERVER}\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{PLAINTEXT_BODY}",
        PLAINTEXT_BODY.len()
    )
}

/// Accepts TLS on a caller's TCP connection. A caller that speaks plain
/// HTTP is answered with a `400` that says why, so that its WebSocket
/// library shows the reason instead of a broken handshake.
pub async fn accept(
    tcp: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> Result<server::TlsStream<TcpStream>, AcceptError> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(1) if first[0] == TLS_HANDSHAKE => {}
        Ok(1) if first[0].is_ascii_uppercase() => {
            answer_plaintext(tcp).await;
            return Err(AcceptError::Plaintext);
        }
        Ok(_) => return Err(AcceptError::NotTls),
        Err(error) => return Err(AcceptError::Handshake(error)),
    }
    acceptor.accept(tcp).await.map_err(AcceptError::Handshake)
}

/// Writes the `400` and closes, without reading the request: it is small
/// and sits in the socket's buffer, so the close may reset the connection;
/// a short linger first lets the answer reach the caller.
async fn answer_plaintext(mut tcp: TcpStream) {
    let answered = async {
        tcp.write_all(plaintext_answer().as_bytes()).await?;
        tcp.shutdown().await?;
        // Read what the caller sent until it closes, so the close is clean.
        let mut sink = [0u8; 1024];
        loop {
            tcp.readable().await?;
            match tcp.try_read(&mut sink) {
                Ok(0) => return Ok::<(), io::Error>(()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Newcomer G6 (issue 30): the library names an HTTP server that is
    /// not a runloop server as the CLI does, not as a bare handshake
    /// failure.
    #[tokio::test]
    async fn an_http_server_that_does_not_upgrade_is_named_not_a_runloop_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bound");
        let port = listener.local_addr().expect("an address").port();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("a connection");
            let mut request = [0u8; 1024];
            let _ = tcp.read(&mut request).await;
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            tcp.write_all(answer).await.expect("answered");
        });
        let url = format!("ws://127.0.0.1:{port}");
        let error = dial(&url, None, WebSocketConfig::default())
            .await
            .expect_err("not a WebSocket server");
        assert_eq!(
            error.to_string(),
            format!(
                "127.0.0.1:{port} is not a runloop server: it answered the WebSocket upgrade \
                 with HTTP 200 OK"
            )
        );
        assert!(
            std::error::Error::source(&error).is_none(),
            "the words say all the answer holds"
        );
        server.await.expect("the server ends");
    }

    #[tokio::test]
    async fn no_dial_or_accept_error_says_its_cause_twice() {
        use std::error::Error;

        use runloop_proto::error_chain::Chain;
        use runloop_testkit::errors::assert_cause_said_once;

        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        let tcp = DialError::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
            source: refused(),
        };
        let tls = DialError::Tls {
            host: "localhost".into(),
            reason: TlsReason::UnknownAuthority,
            error: io::Error::other("invalid peer certificate: UnknownIssuer"),
        };
        let handshake = DialError::WebSocket {
            host: "127.0.0.1".into(),
            port: 1,
            source: WsError::Io(io::Error::from(io::ErrorKind::ConnectionReset)),
        };
        let not_websocket = DialError::WebSocket {
            host: "127.0.0.1".into(),
            port: 1,
            source: WsError::Protocol(
                tokio_tungstenite::tungstenite::error::ProtocolError::SecWebSocketAcceptKeyMismatch,
            ),
        };
        let roots = DialError::Roots(TlsError::Read {
            path: "/nowhere/ca.pem".into(),
            source: io::Error::from(io::ErrorKind::NotFound).into(),
        });
        let errors: [&(dyn Error + 'static); 6] = [
            &tcp,
            &tls,
            &handshake,
            &not_websocket,
            &roots,
            &AcceptError::Handshake(refused()),
        ];
        for error in errors {
            assert_cause_said_once(error);
        }
        assert_eq!(
            Chain(&tcp).to_string(),
            format!("cannot reach 127.0.0.1:1: {}", refused())
        );
        assert_eq!(
            Chain(&tls).to_string(),
            "TLS with localhost failed: its certificate is not signed by a certificate \
             authority this client trusts (unknown issuer)"
        );
        assert_eq!(
            Chain(&handshake).to_string(),
            format!(
                "the WebSocket handshake with 127.0.0.1:1 failed: IO error: {}",
                io::Error::from(io::ErrorKind::ConnectionReset)
            ),
            "tungstenite's IO error says its cause in its words: said once"
        );
    }

    #[test]
    fn the_plaintext_answer_is_well_formed() {
        let text = plaintext_answer();
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{text}"
        );
    }

    #[test]
    fn presented_names_lose_their_wrapping() {
        assert_eq!(bare_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(bare_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(bare_name("plain"), "plain");
    }

    #[test]
    fn ago_says_the_largest_unit() {
        assert_eq!(Ago(1).to_string(), "1 second");
        assert_eq!(Ago(59).to_string(), "59 seconds");
        assert_eq!(Ago(3 * 86_400 + 5).to_string(), "3 days");
        assert_eq!(Ago(7_200).to_string(), "2 hours");
        assert_eq!(Ago(0).to_string(), "0 seconds");
    }
}
