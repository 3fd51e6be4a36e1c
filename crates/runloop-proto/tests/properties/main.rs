//! Property tests of the run-loop protocol core.
//!
//! Unit tests beside the code pin known-good bytes; these check laws over
//! arbitrary input instead: encode then decode is the identity for every
//! payload type (`round_trip`), nothing off the wire panics (`never_panics`),
//! the chunk decoder's fast path agrees with the serde path (`fast_path`),
//! the caller's reader agrees with a reference model and never calls a loop
//! finished that was not (`reader`), the server's relay always hands the
//! caller a readable sequence (`relay`), the proxy never says a word inside
//! a fragmented message and ends its path once (`path_send`), the
//! transcript never loses a fragment (`transcript`), and the MCP types
//! chunks carry read back in the bytes they were written as (`mcp`). The strategies all live in `strategy`.

mod fast_path;
mod mcp;
mod never_panics;
mod path_send;
mod reader;
mod relay;
mod round_trip;
mod strategy;
mod transcript;
