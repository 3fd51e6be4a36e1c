//! Where an image comes from, and the grammar of its name and digest.
//!
//! `name` is a repository path without a host (OCI distribution grammar:
//! lowercase components joined by `/`, each of `[a-z0-9]` runs joined by
//! `.`, `_`, `__` or dashes). The protocol writes a `digest` as
//! `<algorithm>:<hex>` and names no algorithm; runloop takes one, sha256,
//! the algorithm every OCI registry and image layout supports and the only
//! one its runtimes can check (protocol §12). A digest of another algorithm
//! (`md5:…`, `sha512:…`) is refused, with [`DIGEST_RULE`] in the message,
//! rather than accepted unchecked.

use serde::{Deserialize, Serialize};

/// An image's source, externally tagged on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Image {
    /// `{"client": {"name", "digest"}}`: an image the caller supplies.
    Client(ImageRef),
    /// `{"server": {"name", "digest"}}`: an image from the server's catalog.
    Server(ImageRef),
    /// `{"registry": {"reference"}}`: an image pulled from a registry.
    Registry(RegistryImage),
}

/// A named image pinned by digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// Repository path without a host.
    pub name: String,
    /// `<algorithm>:<hex>`.
    pub digest: String,
}

/// An image by registry reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryImage {
    /// The reference, e.g. `registry.example/agents/demo:1`.
    pub reference: String,
}

impl Image {
    /// The source's name in the protocol: `client`, `server` or `registry`.
    pub fn source(&self) -> &'static str {
        match self {
            Image::Client(_) => "client",
            Image::Server(_) => "server",
            Image::Registry(_) => "registry",
        }
    }
}

/// Whether `name` is a repository path without a host.
pub fn is_valid_name(name: &str) -> bool {
    let components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            return false;
        }
    }
    !name.is_empty() && name.len() <= 255 && components.iter().all(|c| is_path_component(c))
}

/// `[a-z0-9]+` runs separated by `.`, `_`, `__` or one or more `-`.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        let dashes = separator.bytes().all(|b| b == b'-');
        if !(separator == "." || separator == "_" || separator == "__" || dashes) {
            return false;
        }
    }
    true
}

/// The digest a request sends when it pins none: `sha256:` and 64 zeros.
/// The protocol requires a digest on every image; a catalog entry that
/// pins none accepts any well-formed one, and an entry that pins one
/// refuses this one by name.
pub const UNPINNED: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The digests runloop takes, in the words its messages use.
pub const DIGEST_RULE: &str = "sha256: followed by 64 lowercase hex digits";

/// Whether `digest` is `sha256:` followed by 64 lowercase hex digits
/// ([`DIGEST_RULE`]).
pub fn is_valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in [
            "demo",
            "agents/demo",
            "a/b/c",
            "my.agent",
            "a_b",
            "a__b",
            "a---b",
            "x9/y.z",
        ] {
            assert!(is_valid_name(good), "{good}");
        }
        for bad in [
            "",
            "Demo",
            "a//b",
            "/a",
            "a/",
            "registry.io/demo",
            "host:5000/demo",
            "localhost/a",
            "a..b",
            "a___b",
            "-a",
            "a-",
            "a b",
            "a@b",
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn digests() {
        let sha256 = format!("sha256:{}", "0a".repeat(32));
        assert!(is_valid_digest(&sha256));
        for bad in [
            "sha256",
            "sha256:",
            ":00",
            "sha256:abc",
            "SHA256:00",
            "sha256:ZZ",
            "a..b:00",
            &format!("sha256:{}", "AB".repeat(32)),
            &format!("sha256:{}0", "ab".repeat(32)),
            &format!("sha256: {}", "ab".repeat(32)),
            // Other algorithms: well formed, and not taken.
            &format!("md5:{}", "0".repeat(32)),
            &format!("sha512:{}", "0".repeat(128)),
            "blake3+x.y:00ff",
        ] {
            assert!(!is_valid_digest(bad), "{bad}");
        }
    }

    #[test]
    fn externally_tagged_forms() {
        let image: Image =
            serde_json::from_str(r#"{"registry":{"reference":"r.io/a:1"}}"#).expect("parses");
        assert_eq!(
            image,
            Image::Registry(RegistryImage {
                reference: "r.io/a:1".into()
            })
        );
        assert_eq!(image.source(), "registry");
        let image: Image = serde_json::from_str(r#"{"client":{"name":"a","digest":"sha256:00"}}"#)
            .expect("parses");
        assert_eq!(image.source(), "client");
        assert!(serde_json::from_str::<Image>(r#"{"cloud":{"name":"a"}}"#).is_err());
        assert!(serde_json::from_str::<Image>(r#"{"server":{"name":"a"}}"#).is_err());
    }
}
