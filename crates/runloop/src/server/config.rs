//! The server's configuration: which credentials it accepts, who a
//! connection is served as, its limits (protocol §3, §12), and its TLS.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use subtle::ConstantTimeEq;

use super::admission::Admission;
use super::budget::RunBudget;
use crate::limits::{Limit, LimitError, Limits};
use crate::runtime::{Catalog, Registry};
use crate::tls::ServerTls;

/// Which credentials the server accepts (protocol §3).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Any credential, empty included. Only sensible on a loopback address;
    /// the `runloop serve` command refuses it anywhere else.
    Any,
    /// One of these tokens, compared in constant time.
    Tokens(Vec<String>),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Any => f.write_str("Any"),
            Credentials::Tokens(tokens) => write!(f, "Tokens(<{} redacted>)", tokens.len()),
        }
    }
}

/// Who a connection is served as. It names the credential's position, never
/// the credential, so it can be logged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity(String);

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Credentials {
    /// The identity `credential` is served as, if it is accepted. Every
    /// configured token is compared, in constant time, whatever matches.
    pub fn accept(&self, credential: &str) -> Option<Identity> {
        match self {
            Credentials::Any => Some(Identity("anonymous".to_owned())),
            Credentials::Tokens(tokens) => {
                let mut found = None;
                for (index, token) in tokens.iter().enumerate() {
                    let equal: bool = token.as_bytes().ct_eq(credential.as_bytes()).into();
                    if equal && found.is_none() {
                        found = Some(Identity(format!("token #{}", index + 1)));
                    }
                }
                found
            }
        }
    }
}

/// Connections a server serves at once unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Accepted credentials.
    pub credentials: Credentials,
    /// Per-connection limits.
    pub limits: Limits,
    /// How long a new connection may take to authorize before it is closed
    /// without a frame (protocol §12). Once authorized, nothing times out. At
    /// least [`Limit::MIN_AUTHORIZATION_GRACE`].
    pub authorization_grace: Duration,
    /// Caller connections served at once, authorized or not yet. One more
    /// is turned away: its WebSocket handshake completes and it is closed
    /// at once with close code 1013 (try again later) and a reason that
    /// says so, before anything of it is read. At least one. (Before that,
    /// [`Admission`] may close it at once.)
    pub max_connections: usize,
    /// Which connections are taken on, and what one may cost before it
    /// authorizes (see [`Admission`]).
    pub admission: Admission,
    /// What runs may claim, each and together (see [`RunBudget`]).
    pub budget: RunBudget,
    /// The images this server runs.
    pub catalog: Catalog,
    /// Where `registry` images are pulled from; without one they are refused.
    pub registry: Option<Arc<dyn Registry>>,
    /// TLS for the listener's connections (`wss://`); none: plain `ws://`.
    pub tls: Option<ServerTls>,
}

impl ServerConfig {
    /// A configuration with default limits, a 10 s authorization grace,
    /// [`DEFAULT_MAX_CONNECTIONS`] and the default [`RunBudget`].
    pub fn new(credentials: Credentials, catalog: Catalog) -> Self {
        ServerConfig {
            credentials,
            limits: Limits::default(),
            authorization_grace: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            admission: Admission::default(),
            budget: RunBudget::default(),
            catalog,
            registry: None,
            tls: None,
        }
    }

    /// Whether every limit is at least its minimum ([`Limit`]), so that
    /// the server can serve an ordinary caller; the first that is not is
    /// the error. [`Server::bind`](super::Server::bind) refuses a configuration that fails this.
    pub fn validate(&self) -> Result<(), LimitError> {
        self.limits.validate()?;
        Limit::MaxConnections.check(self.max_connections as u64)?;
        Limit::check_grace(self.authorization_grace)?;
        self.admission.validate()?;
        self.budget.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_and_named_by_position() {
        let credentials = Credentials::Tokens(vec!["alpha".into(), "beta".into()]);
        assert_eq!(
            credentials.accept("beta"),
            Some(Identity("token #2".into()))
        );
        assert_eq!(credentials.accept("gamma"), None);
        assert_eq!(credentials.accept(""), None);
        assert_eq!(credentials.accept("alph"), None);
        assert_eq!(
            Credentials::Any.accept(""),
            Some(Identity("anonymous".into()))
        );
    }

    #[test]
    fn debug_never_shows_tokens() {
        let shown = format!("{:?}", Credentials::Tokens(vec!["s3cret".into()]));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
