//! The Model Context Protocol's model types that chunks carry (protocol §8).
//!
//! Several chunk kinds hold MCP values as they stand: `annotations`, `_meta`,
//! and a tool response's content blocks. They are written here from the MCP
//! specification (revision 2025-11-25) as plain serde types, so that this
//! crate needs no MCP SDK, and so no async runtime, to read a chunk, and so
//! that the JSON they read and write is decided here, where the golden
//! tests and round-trip properties pin it.
//!
//! ```text
//! meta         `_meta`: any JSON object, its members kept in order
//! annotations  `annotations` and the `Role`s of its audience
//! content      content blocks: text, image, audio, resource link,
//!              embedded resource
//! resource     what a resource link names and what an embedded resource
//!              holds (text or blob contents), and a link's icons
//! ```
//!
//! # What decoding accepts
//!
//! Like MCP, decoding tolerates members a type does not define and refuses a
//! value of the wrong shape: a missing required member, a `type` or `role`
//! outside MCP's list, a member of the wrong JSON type. Members are written
//! in a fixed order, `_meta` before `annotations`, which is the order
//! runloop has always written them in.

mod annotations;
mod content;
mod meta;
mod resource;

pub use annotations::{Annotations, Role};
pub use content::{AudioContent, ContentBlock, EmbeddedResource, ImageContent, TextContent};
pub use meta::Meta;
pub use resource::{Icon, IconTheme, ResourceContents, ResourceLink};
