//! The run-loop channel of the Diverge Provider Protocol 2.3.0 over real
//! sockets: the provider's server, the caller's client, the proxy beside an
//! agent, the agent-program contract, and the runtimes that start agents.
//!
//! ```text
//! caller ──ws, framed──▶ server ──ws paths──▶ proxy ──HTTP + SSE──▶ agent program
//! client                 server   runtime     proxy                 agent
//! ```
//!
//! The modules, from the agent program to the caller:
//!
//! ```text
//! agent      the agent-program contract (Agent, AgentServer) and the demo agent
//! proxy      the /agent/* paths in front of an agent program
//! runtime    where a run's agent lives: builtin, exec, attach; the catalog
//! server     the provider: connections, runs, relays
//! client     the caller: connection, runs, loops
//! limits     what a connection and a server may hold, with their minimums
//! listener   (private) how the three servers accept, serve and shut down
//! writer     (private) a framed connection's socket, its queue and the
//!            task that writes what is queued
//! tls        the server's certificate (reloadable) and the client's roots
//! transport  dialling ws:// and wss://, and the server's TLS handshake
//! metrics    the counts of the server and the proxy, for Prometheus
//! admin      the admin listener: /metrics, /healthz, /readyz
//! ```
//!
//! Every decision about what bytes mean is made by [`runloop_proto`] — the
//! rules of a connection included, in its connection table; this crate
//! moves bytes, holds limits, and makes sure that whatever breaks — a
//! proxy, an agent, a connection — the caller still gets an honest
//! [`Outcome`](runloop_proto::run_loop::Outcome).

pub mod admin;
pub mod agent;
pub mod client;
pub mod limits;
mod listener;
pub mod metrics;
pub mod proxy;
pub mod runtime;
pub mod server;
pub mod tls;
pub mod transport;
mod writer;

/// The protocol's types and rules, no I/O: the crate `runloop-proto`,
/// documented here in full so that a caller needs one dependency
/// (`runloop::proto::agents_run::RunRequest`,
/// `runloop::proto::run_loop::Outcome`, …).
#[doc(inline)]
pub use runloop_proto as proto;

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The Rust caller's guide (docs/rust.md), compiled and run as a doctest.
#[doc = include_str!("../../../docs/rust.md")]
#[cfg(doctest)]
pub struct RustCallerDoctests;
