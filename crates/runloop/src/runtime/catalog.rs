//! The catalog: which runtime serves which `server` image name (SPEC §12).
//!
//! Only `server` images from the catalog are run. An entry may pin a
//! digest, and then any other digest is refused; an unpinned entry accepts
//! any well-formed digest (the request's digest grammar is checked before
//! the catalog is asked). Refusals name the image, so the caller learns
//! exactly what was not accepted.

use std::collections::BTreeMap;
use std::sync::Arc;

use runloop_proto::agents_run::ImageRef;

use super::Runtime;

/// Why the catalog will not run an image; the message goes to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No entry for the name.
    #[error("image {name:?} is not in this server's catalog")]
    UnknownImage {
        /// The requested name.
        name: String,
    },
    /// The entry pins another digest.
    #[error("image {name:?} is pinned to {pinned}; {requested} is refused")]
    WrongDigest {
        /// The requested name.
        name: String,
        /// The digest the entry pins.
        pinned: String,
        /// The digest the request named.
        requested: String,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    digest: Option<String>,
    runtime: Arc<dyn Runtime>,
}

/// Image names mapped to runtimes.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    entries: BTreeMap<String, Entry>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Catalog::default()
    }

    /// Serves `name` with `runtime`, pinned to `digest` when given. A second
    /// entry for a name replaces the first.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        digest: Option<String>,
        runtime: Arc<dyn Runtime>,
    ) {
        self.entries.insert(name.into(), Entry { digest, runtime });
    }

    /// The runtime for `image`, or why there is none.
    pub fn resolve(&self, image: &ImageRef) -> Result<Arc<dyn Runtime>, Refusal> {
        let entry = self
            .entries
            .get(&image.name)
            .ok_or_else(|| Refusal::UnknownImage {
                name: image.name.clone(),
            })?;
        match &entry.digest {
            Some(pinned) if *pinned != image.digest => Err(Refusal::WrongDigest {
                name: image.name.clone(),
                pinned: pinned.clone(),
                requested: image.digest.clone(),
            }),
            _ => Ok(Arc::clone(&entry.runtime)),
        }
    }

    /// The names served, in order, with their pinned digests.
    pub fn names(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.entries
            .iter()
            .map(|(name, entry)| (name.as_str(), entry.digest.as_deref()))
    }

    /// Whether no image is served.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Attach;
    use super::*;

    fn image(name: &str, digest: &str) -> ImageRef {
        ImageRef {
            name: name.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn resolve_by_name_and_pin() {
        let pinned = format!("sha256:{}", "a".repeat(64));
        let other = format!("sha256:{}", "b".repeat(64));
        let mut catalog = Catalog::new();
        catalog.insert("free", None, Arc::new(Attach::new("ws://127.0.0.1:1")));
        catalog.insert(
            "pinned",
            Some(pinned.clone()),
            Arc::new(Attach::new("ws://127.0.0.1:2")),
        );
        assert!(catalog.resolve(&image("free", &other)).is_ok());
        assert!(catalog.resolve(&image("pinned", &pinned)).is_ok());
        let wrong = catalog
            .resolve(&image("pinned", &other))
            .expect_err("pinned");
        assert_eq!(
            wrong.to_string(),
            format!("image \"pinned\" is pinned to {pinned}; {other} is refused")
        );
        let unknown = catalog
            .resolve(&image("nope", &other))
            .expect_err("unknown");
        assert_eq!(
            unknown.to_string(),
            "image \"nope\" is not in this server's catalog"
        );
        assert_eq!(
            catalog.names().collect::<Vec<_>>(),
            [("free", None), ("pinned", Some(pinned.as_str()))]
        );
    }
}
