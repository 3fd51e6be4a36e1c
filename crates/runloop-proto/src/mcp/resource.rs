//! Resources in content blocks: a link that names one, and the contents an
//! embedded one carries.
//!
//! A `resource_link` block describes a resource (its URI, name and what else
//! the server knows of it) without its bytes. A `resource` block embeds the
//! contents: text, or binary data as a base64 `blob`. MCP tells the two
//! kinds of contents apart by which of `text` and `blob` is present, and so
//! does this decoder, trying text first.

use serde::{Deserialize, Serialize};

use super::{Annotations, Meta};

/// A `resource_link` block: a resource named by its URI.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ResourceLink {
    /// The resource's URI.
    pub uri: String,
    /// Its name, for programs (and for people when there is no title).
    pub name: String,
    /// Its name for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What it is, for a model or a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its MIME type, when known.
    #[serde(rename = "mimeType", skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Its size in bytes before any encoding, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Icons a user interface may show for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icons: Option<Vec<Icon>>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// MCP annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// An icon: an image a user interface may show.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Icon {
    /// Where the image is: a URL, or a `data:` URI.
    pub src: String,
    /// Its MIME type, when the source's own is missing or too vague.
    #[serde(rename = "mimeType", skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The sizes it suits, each `WxH` (such as `48x48`) or `any`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sizes: Option<Vec<String>>,
    /// The background it is drawn for; any, when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub theme: Option<IconTheme>,
}

/// The background an icon is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum IconTheme {
    /// `light`: a light background.
    Light,
    /// `dark`: a dark background.
    Dark,
}

/// What an embedded resource holds: text, or a base64 blob.
///
/// MCP's `TextResourceContents` and `BlobResourceContents`. Read untagged:
/// contents with a `text` member are text (a `blob` beside it is ignored),
/// else contents with a `blob` are binary, else they do not decode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ResourceContents {
    /// The contents as text.
    Text {
        /// The resource's URI.
        uri: String,
        /// Its MIME type, when known.
        #[serde(rename = "mimeType", skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        /// The text.
        text: String,
        /// MCP `_meta`.
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<Meta>,
    },
    /// The contents as binary data.
    Blob {
        /// The resource's URI.
        uri: String,
        /// Its MIME type, when known.
        #[serde(rename = "mimeType", skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        /// The data, base64.
        blob: String,
        /// MCP `_meta`.
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<Meta>,
    },
}

impl ResourceContents {
    /// The resource's URI.
    pub fn uri(&self) -> &str {
        match self {
            ResourceContents::Text { uri, .. } | ResourceContents::Blob { uri, .. } => uri,
        }
    }
}
