//! Content digests: `sha256:HEX`, the name every blob, manifest and image
//! goes by.
//!
//! Only sha256 is read and written. It is the algorithm the OCI image spec
//! requires registries and layouts to support, and what every common tool
//! writes; an image that names another algorithm is refused with an error
//! naming it, rather than half-supported.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A sha256 content digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

/// Why a string is not a digest this crate reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// Not `ALGORITHM:HEX` at all.
    #[error("digest {0:?} is not ALGORITHM:HEX")]
    Form(String),
    /// An algorithm other than sha256.
    #[error("digest {0:?} uses an algorithm other than sha256, which is the only one read here")]
    Algorithm(String),
    /// sha256 with anything but 64 lowercase hex digits.
    #[error("digest {0:?} is not sha256: and 64 lowercase hex digits")]
    Hex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut hasher = Hasher::new();
        hasher.update(bytes);
        hasher.finish().0
    }

    /// The 64 hex digits, without the algorithm.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(text: &str) -> Result<Digest, DigestError> {
        let (algorithm, hex) = text
            .split_once(':')
            .ok_or_else(|| DigestError::Form(text.to_owned()))?;
        if algorithm != "sha256" {
            return Err(DigestError::Algorithm(text.to_owned()));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Hex(text.to_owned()));
        }
        Ok(Digest {
            hex: hex.to_owned(),
        })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// A running sha256 and byte count, for content read or written in pieces.
#[derive(Debug, Clone, Default)]
pub struct Hasher {
    sha: Sha256,
    len: u64,
}

impl Hasher {
    /// An empty hasher.
    pub fn new() -> Hasher {
        Hasher::default()
    }

    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest and length of everything seen.
    pub fn finish(self) -> (Digest, u64) {
        let sum = self.sha.finalize();
        let mut hex = String::with_capacity(64);
        for byte in sum.iter() {
            use fmt::Write as _;
            let _ = write!(hex, "{byte:02x}");
        }
        (Digest { hex }, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_print_and_hash() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::of(b"").to_string(), empty);
        assert_eq!(empty.parse::<Digest>().expect("parses"), Digest::of(b""));
        let mut hasher = Hasher::new();
        hasher.update(b"ab");
        hasher.update(b"c");
        assert_eq!(hasher.len(), 3);
        assert_eq!(hasher.finish().0, Digest::of(b"abc"));
        let cases = [
            ("nope", "digest \"nope\" is not ALGORITHM:HEX"),
            (
                "sha512:00",
                "digest \"sha512:00\" uses an algorithm other than sha256, which is the only one read here",
            ),
            (
                "sha256:ABC",
                "digest \"sha256:ABC\" is not sha256: and 64 lowercase hex digits",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(text.parse::<Digest>().expect_err(text).to_string(), message);
        }
    }
}
