//! Dialling a provider server: what a URL must look like, and each way a
//! connection can fail, in words that point at the fix.
//!
//! A user who cannot connect needs to know which of three things is wrong:
//! the URL (not a WebSocket URL at all — often `http://` or a bare
//! `HOST:PORT`), the network (nothing listens there), or the peer (something
//! answers, but it is not a runloop server: an HTTP server that will not
//! upgrade, or a port that does not speak HTTP). [`DialError`] keeps them
//! apart; each message names the URL once, and the cause (the system's or
//! the WebSocket library's error) comes through `source()`, so the command
//! prints it once, after, as every error chain; a usual cause's hint
//! ([`DialError::hint`]) comes last.
//!
//! ```text
//! "localhost:7878" is not a WebSocket URL: write ws://localhost:7878 (wss:// for TLS)
//! cannot connect to ws://127.0.0.1:1: Connection refused (os error 111): is a server listening there?
//! http://127.0.0.1:8000/ is not a runloop server: it answered the WebSocket upgrade with HTTP 404 Not Found
//! ```

use std::io;
use std::time::Duration;

use runloop::client::ConnectError;
use runloop::transport;
use tokio_tungstenite::tungstenite::Error as WsError;

/// Why a connection to a provider server could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The URL is not `ws://` or `wss://`.
    #[error("{url:?} is not a WebSocket URL: write {suggestion} (wss:// for TLS)")]
    Scheme {
        /// The URL as given.
        url: String,
        /// The same address as a WebSocket URL.
        suggestion: String,
    },
    /// The URL cannot be dialled as written (no host, an unsupported part).
    #[error("cannot connect to {url}: the URL cannot be used: {why}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// Nothing answered: refused, unreachable, a name that does not resolve.
    #[error("cannot connect to {url}")]
    Network {
        /// The URL.
        url: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// TLS could not be set up: the client's roots, or a handshake whose
    /// certificate did not verify (the library's error names the host and
    /// the reason).
    #[error("cannot connect to {url}")]
    Tls {
        /// The URL.
        url: String,
        /// What the transport said.
        #[source]
        source: Box<transport::DialError>,
    },
    /// An HTTP server answered, and did not upgrade to WebSocket.
    #[error("{url} is not a runloop server: it answered the WebSocket upgrade with HTTP {status}")]
    NotUpgraded {
        /// The URL.
        url: String,
        /// Its answer's status, with its reason phrase.
        status: String,
    },
    /// A runloop server answered the upgrade with an error saying why (a
    /// `ws://` dialled to its TLS port).
    #[error("cannot connect to {url}: the server answered HTTP {status}: {body}")]
    Answered {
        /// The URL.
        url: String,
        /// Its answer's status, with its reason phrase.
        status: String,
        /// What its answer's body says.
        body: String,
    },
    /// The server closed the connection before it answered the upgrade:
    /// what a runloop server does with a caller it turns away when it
    /// cannot take the time to say why. The words say what the close
    /// means; the WebSocket error it was read from is kept, not a source.
    #[error("cannot connect to {url}: {}", transport::CLOSED_BEFORE_ANSWER)]
    Closed {
        /// The URL.
        url: String,
        /// How it ended.
        error: WsError,
    },
    /// Something answered that does not complete a WebSocket handshake.
    #[error("{url} is not a runloop server: its answer to the WebSocket upgrade is not one")]
    Handshake {
        /// The URL.
        url: String,
        /// What broke.
        #[source]
        source: WsError,
    },
    /// The WebSocket opened, and the authorization could not be sent.
    #[error("cannot authorize at {url}: the connection failed")]
    Authorization {
        /// The URL.
        url: String,
        /// What broke.
        #[source]
        source: WsError,
    },
    /// The connection was not made within a time limit.
    #[error("cannot connect to {url}: {what} within {} ({option})", crate::seconds::show(*.after))]
    Timeout {
        /// The URL.
        url: String,
        /// What did not happen in time.
        what: &'static str,
        /// The limit.
        after: Duration,
        /// The option that sets it.
        option: &'static str,
    },
    /// The client's own configuration cannot work.
    #[error(transparent)]
    Config(ConnectError),
}

/// Refuses a URL that is not a WebSocket URL, suggesting the one meant.
pub fn check_url(url: &str) -> Result<(), DialError> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let suggestion = match scheme.to_ascii_lowercase().as_str() {
        "ws" | "wss" => return Ok(()),
        "https" => format!("wss://{rest}"),
        _ => format!("ws://{rest}"),
    };
    Err(DialError::Scheme {
        url: url.to_owned(),
        suggestion,
    })
}

impl DialError {
    /// What to try, for the failures that have a usual cause, said after
    /// the error's chain (with its own leading punctuation); else `""`.
    pub fn hint(&self) -> &'static str {
        match self {
            DialError::Network { source, .. }
                if source.kind() == io::ErrorKind::ConnectionRefused =>
            {
                ": is a server listening there?"
            }
            _ => "",
        }
    }

    /// The error of the WebSocket handshake with `url`.
    pub fn websocket(url: &str, error: WsError) -> DialError {
        let url = url.to_owned();
        match error {
            error if transport::closed_before_answer(&error) => DialError::Closed { url, error },
            WsError::Io(source) => DialError::Network { url, source },
            WsError::Http(response) => {
                let status = response.status().to_string();
                match transport::runloop_refusal(&response) {
                    Some(body) => DialError::Answered { url, status, body },
                    None => DialError::NotUpgraded { url, status },
                }
            }
            source => DialError::Handshake { url, source },
        }
    }

    /// The error of dialling `url` (TCP, TLS, the WebSocket handshake).
    pub fn transport(url: &str, error: transport::DialError) -> DialError {
        let url = url.to_owned();
        match error {
            transport::DialError::Url { why, .. } => DialError::Url { url, why },
            transport::DialError::Tcp { source, .. } => DialError::Network { url, source },
            transport::DialError::WebSocket { source, .. } => DialError::websocket(&url, source),
            transport::DialError::Answered { response, .. } => {
                DialError::websocket(&url, WsError::Http(response))
            }
            transport::DialError::Closed { error, .. } => DialError::websocket(&url, error),
            source => DialError::Tls {
                url,
                source: Box::new(source),
            },
        }
    }

    /// The error of the library client's connect to `url`.
    pub fn client(url: &str, error: ConnectError) -> DialError {
        match error {
            ConnectError::Dial(error) => DialError::transport(url, error),
            ConnectError::Authorization(source) => DialError::Authorization {
                url: url.to_owned(),
                source,
            },
            other => DialError::Config(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use runloop_testkit::errors::assert_cause_said_once;

    use super::*;

    #[test]
    fn urls_that_are_not_websocket_urls_get_the_one_meant() {
        for good in ["ws://127.0.0.1:7878", "wss://example.com/x", "WS://h:1"] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        let cases = [
            ("http://127.0.0.1:7878", "ws://127.0.0.1:7878"),
            ("https://example.com", "wss://example.com"),
            ("127.0.0.1:7878", "ws://127.0.0.1:7878"),
            ("ftp://h:1", "ws://h:1"),
        ];
        for (url, suggestion) in cases {
            let error = check_url(url).expect_err(url);
            assert_eq!(
                error.to_string(),
                format!("{url:?} is not a WebSocket URL: write {suggestion} (wss:// for TLS)")
            );
        }
    }

    #[test]
    fn each_failure_names_the_url_once_and_keeps_its_cause() {
        use std::error::Error as _;

        let refused = DialError::websocket(
            "ws://127.0.0.1:1",
            WsError::Io(io::Error::from(io::ErrorKind::ConnectionRefused)),
        );
        assert_eq!(refused.to_string(), "cannot connect to ws://127.0.0.1:1");
        assert_eq!(refused.hint(), ": is a server listening there?");
        let cause = refused.source().expect("what the system said");
        assert!(cause.is::<io::Error>(), "{cause}");
        assert_cause_said_once(&refused);

        let closed = DialError::websocket(
            "ws://h:1",
            WsError::Protocol(
                tokio_tungstenite::tungstenite::error::ProtocolError::HandshakeIncomplete,
            ),
        );
        let text = closed.to_string();
        assert!(
            text.starts_with("cannot connect to ws://h:1: the server closed the connection")
                && text.contains("try again later")
                && !text.contains("not a runloop server"),
            "{text}"
        );

        let mut response = tokio_tungstenite::tungstenite::http::Response::new(None);
        *response.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::NOT_FOUND;
        let not_upgraded = DialError::websocket("ws://h:1", WsError::Http(Box::new(response)));
        assert_eq!(
            not_upgraded.to_string(),
            "ws://h:1 is not a runloop server: it answered the WebSocket upgrade with HTTP 404 Not Found"
        );
    }
}
