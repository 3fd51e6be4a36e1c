//! The run-loop channel (client channel tag 5): request, response frame,
//! chunk vocabulary, and the machines that read, send, relay and coalesce a
//! loop, and the proxy's send rule (protocol §7, §8, §10, §11, §12).
//!
//! ```text
//! request   [0x05]{"prompt": "…"}                         RunLoopRequest
//! response  [0x00][chunk JSON]   zero or more, the loop   Response::Chunk
//!           [0x01][error JSON]   at most one, last        Response::Error
//!           then the channel response finish
//! ```
//!
//! | the caller sees          | it states                          | [`Outcome`]            |
//! |--------------------------|------------------------------------|------------------------|
//! | chunks…, finish          | the loop ran and finished          | `Finished`             |
//! | chunks…, error, finish   | it ended without finishing         | `Unfinished(error)`    |
//! | error, finish            | no loop ran                        | `NoLoop(error)`        |
//! | finish alone             | the proxy did not serve the loop   | `NotServed`            |
//! | anything else            | nothing can be concluded           | `Broken(why)`          |

mod chunk;
mod path_send;
mod reader;
mod request;
pub mod response;
mod scan;
mod sender;
mod transcript;

pub use chunk::{
    AgenticLoopChunk, ChunkKind, MediaChunk, NotificationChunk, TextChunk, TokenLogprob,
    ToolCallChunk, ToolResponseChunk, TopLogprob, UsageChunk, UsageCounts, UserChunk,
};
pub use path_send::{FrameHead, OutOfOrder, PathEnd, PathSend, PieceKind};
pub use reader::{Broken, Outcome, Reader, Step};
pub use request::RunLoopRequest;
pub use response::{CHUNK, ERROR, Response, ResponseError, Tag};
pub use sender::{Erred, Finish, Relay, Relayed, Sender};
pub use transcript::Transcript;
