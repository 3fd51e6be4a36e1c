//! Identities: which credentials the server accepts, and who a connection
//! is served as (protocol §3).
//!
//! A module of its own, below the configuration, the admission and the
//! budget, which all name an identity: none of them has to import another
//! to know who a connection is.

use std::fmt;

use subtle::ConstantTimeEq;

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
