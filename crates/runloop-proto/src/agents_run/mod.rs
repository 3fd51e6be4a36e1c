//! `containers::agents::run` (endpoint tag 0): the request that starts a
//! container and its agent, the checks a server makes before it starts
//! anything, and the scope's main-stream response (protocol §5).
//!
//! ```text
//! request   [0x00]{"image": …, "memory": n, "disk": n, "volume_mounts"?: […], …, "agent": <any JSON>}
//! response  [0x00]{"id": "<string>"}   once, when the container runs
//!           [0x01][error JSON]         once, when it will not run; the finish follows
//! ```
//!
//! Decoding checks only the JSON's shape; [`RunRequest::validate`] then
//! checks the rules the shape cannot express (names, digests, paths,
//! identities, overlapping mounts) and says which rule failed, so a refusal
//! can tell the caller exactly why.

mod image;
mod mounts;
mod request;
mod response;

pub use image::{
    DIGEST_RULE, Image, ImageRef, RegistryImage, UNPINNED, is_valid_digest, is_valid_name,
};
pub use mounts::{FuseMount, IdentityMount, PathRule, VolumeMount};
pub use request::{
    Container, DEFAULT_DISK, DEFAULT_MEMORY, InvalidRequest, RunRequest, RunRequestError,
};
pub use response::{RunResponse, RunResponseError};
