//! Authorization: the type-0 payload the dialling party sends first (protocol §3).
//!
//! ```text
//! [mode: u8][content …]      mode 0 (unbrokered): content is a UTF-8 credential,
//!                            no length prefix, possibly empty
//! ```
//!
//! There is no reply on the wire: an accepted credential simply lets the
//! connection work, a rejected one closes it. The credential is a secret, so
//! [`Authorization`]'s `Debug` never prints it; the errors here say what was
//! wrong with the payload's shape, never what it held.

use std::fmt;

use crate::codec::{Decode, Encode, Writer};

/// Mode byte of an unbrokered credential.
pub const UNBROKERED: u8 = 0;
/// Mode byte reserved for brokered authorization; not accepted.
pub const BROKERED: u8 = 1;

/// A decoded authorization payload.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Authorization<'a> {
    /// Mode 0: an opaque credential string, possibly empty.
    Unbrokered(&'a str),
}

impl Authorization<'_> {
    /// The credential, for comparison against the accepted ones.
    pub fn credential(&self) -> &str {
        match self {
            Authorization::Unbrokered(credential) => credential,
        }
    }
}

impl fmt::Debug for Authorization<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authorization::Unbrokered(credential) => {
                write!(f, "Unbrokered(<{} bytes redacted>)", credential.len())
            }
        }
    }
}

/// An authorization payload that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorizationError {
    /// No mode byte.
    #[error("authorization payload is empty")]
    Empty,
    /// Mode 1, which the protocol reserves.
    #[error("authorization mode 1 (brokered) is reserved")]
    Reserved,
    /// A mode the protocol does not define.
    #[error("unknown authorization mode {0}")]
    UnknownMode(u8),
    /// An unbrokered credential that is not UTF-8.
    #[error("authorization credential is not valid UTF-8")]
    InvalidUtf8(#[source] std::str::Utf8Error),
}

impl<'a> Decode<'a> for Authorization<'a> {
    type Error = AuthorizationError;

    fn decode(bytes: &'a [u8]) -> Result<Self, AuthorizationError> {
        let (&mode, content) = bytes.split_first().ok_or(AuthorizationError::Empty)?;
        match mode {
            UNBROKERED => std::str::from_utf8(content)
                .map(Authorization::Unbrokered)
                .map_err(AuthorizationError::InvalidUtf8),
            BROKERED => Err(AuthorizationError::Reserved),
            mode => Err(AuthorizationError::UnknownMode(mode)),
        }
    }
}

impl Encode for Authorization<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        let Authorization::Unbrokered(credential) = self;
        out.push(UNBROKERED);
        out.extend_from_slice(credential.as_bytes());
        Ok(())
    }

    fn size_hint(&self) -> usize {
        1 + self.credential().len()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn golden_unbrokered() {
        let bytes: &[u8] = &[0, b's', b'e', b'c', b'r', b'e', b't'];
        let auth = Authorization::decode(bytes).expect("decodes");
        assert_eq!(auth.credential(), "secret");
        assert_eq!(auth.to_vec().expect("infallible"), bytes);
    }

    #[test]
    fn empty_credential_is_allowed() {
        assert_eq!(
            Authorization::decode(&[0]),
            Ok(Authorization::Unbrokered(""))
        );
    }

    #[test]
    fn errors_and_messages() {
        assert_eq!(Authorization::decode(&[]), Err(AuthorizationError::Empty));
        assert_eq!(
            AuthorizationError::Empty.to_string(),
            "authorization payload is empty"
        );
        assert_eq!(
            Authorization::decode(&[1, b'x']),
            Err(AuthorizationError::Reserved)
        );
        assert_eq!(
            AuthorizationError::Reserved.to_string(),
            "authorization mode 1 (brokered) is reserved"
        );
        assert_eq!(
            Authorization::decode(&[9]),
            Err(AuthorizationError::UnknownMode(9))
        );
        assert_eq!(
            AuthorizationError::UnknownMode(9).to_string(),
            "unknown authorization mode 9"
        );
        let invalid = Authorization::decode(&[0, 0xff, 0xfe]).expect_err("not UTF-8");
        assert!(matches!(invalid, AuthorizationError::InvalidUtf8(_)));
        assert_eq!(
            invalid.to_string(),
            "authorization credential is not valid UTF-8"
        );
        assert!(invalid.source().is_some());
    }

    #[test]
    fn debug_never_shows_the_credential() {
        let shown = format!("{:?}", Authorization::Unbrokered("hunter2"));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(shown, "Unbrokered(<7 bytes redacted>)");
    }
}
