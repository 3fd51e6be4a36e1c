//! The bytes and rules of the run-loop channel of the Diverge Provider
//! Protocol, revision 2.3.0, with no I/O.
//!
//! Everything that decides what a byte on the run-loop path means lives
//! here, as plain functions and state machines fed one message at a time.
//! Nothing in this crate opens a socket, spawns a task or reads a clock: the
//! async crate moves bytes and asks this one what they mean. That split keeps
//! the rules testable byte by byte, fuzzable, and cheap to benchmark.
//!
//! The path a run-loop takes, and where each piece of it is decoded, in the
//! order a request meets them:
//!
//! ```text
//! caller ──frames──▶ provider server ──bare messages──▶ proxy ──HTTP+SSE──▶ agent program
//!
//! frame            the 9-byte header, client and server frames      (§2)
//! authorization    the type-0 credential                            (§3)
//! connection       the connection table: which scope and channel
//!                  numbers are open, what each frame does to them,
//!                  what is disregarded, what gets a bare finish     (§2, §3, §6)
//! endpoint         the type-1 endpoint tag                          (§4)
//! agents_run       containers::agents::run request and response     (§5)
//! channel          client channel requests: stop, run-loop, others  (§6)
//! registration     the /agent/register exchange                     (§10)
//! run_loop         the run-loop request, response payload, chunks,
//!                  reader, sender, relay and transcript             (§7, §8, §11, §12)
//! mcp              the MCP types chunks carry: annotations, `_meta`,
//!                  content blocks                                   (§8)
//! error_value      the error value, and the kinds this project writes (§9, §12)
//! codec            Encode, Decode and the append-only Writer
//! error_chain      an error and its causes as one line, each said once
//!
//! capture          a connection's messages as lines of hex text
//! observer         a connection reconstructed from a capture, kept in
//!                  the connection table, following every run-loop
//!                  channel with the caller's reader                 (§2, §3, §7)
//! ```

pub mod agents_run;
pub mod authorization;
pub mod capture;
pub mod channel;
pub mod codec;
pub mod connection;
pub mod endpoint;
pub mod error_chain;
pub mod error_value;
pub mod frame;
pub mod mcp;
pub mod observer;
pub mod registration;
pub mod run_loop;

pub use codec::{Decode, Encode, Undecodable, Writer};
pub use error_value::{ErrorKind, ErrorValue};
