//! The run-loop channel of the Diverge Provider Protocol 2.3.0 over real
//! sockets: the framed WebSocket connection, the provider's server, the
//! caller's client, the proxy beside an agent, the agent-program contract,
//! and the runtimes that start agents.
//!
//! ```text
//! caller ──ws, framed──▶ server ──ws paths──▶ proxy ──HTTP + SSE──▶ agent program
//! client                 server   runtime     proxy                 agent
//! ```
//!
//! Every decision about what bytes mean is made by [`runloop_proto`]; this
//! crate moves bytes, holds limits, and makes sure that whatever breaks —
//! a proxy, an agent, a connection — the caller still gets an honest
//! [`Outcome`](runloop_proto::run_loop::Outcome).

pub mod admin;
pub mod agent;
pub mod client;
pub mod connection;
pub mod metrics;
pub mod proxy;
pub mod runtime;
pub mod server;
pub mod tls;
pub mod transport;

pub use runloop_proto as proto;

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
