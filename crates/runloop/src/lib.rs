//! The run-loop channel of the Diverge Provider Protocol 2.3.0 over real
//! sockets: the provider's server, the caller's client, the proxy beside an
//! agent, the agent-program contract, and the runtimes that start agents.
//!
//! ```text
//! caller ──ws, framed──▶ server ──ws paths──▶ proxy ──HTTP + SSE──▶ agent program
//! client                 server   runtime     proxy                 agent
//! ```
//!
//! This crate is the facade: each room is a crate of its own, along the
//! arrows (each imports only the crates above it), and is re-exported here
//! under the name it has always had, so `use runloop::server::Server`
//! keeps working. A caller who wants only the client can depend on
//! `runloop-client` alone; an agent written in Rust on `runloop-agent`.
//!
//! ```text
//! proto      runloop-proto    what every byte means (no I/O)
//! limits, tls, transport, small_file
//!            runloop-wire     the framed connection's socket: limits, the
//!                             writer, dialling and accepting, TLS, the
//!                             operator's files read within a bound
//! client     runloop-client   the caller: connection, runs, loops
//! metrics, admin
//!            runloop-metrics  the counts of the server and the proxy, and
//!                             the admin listener: /metrics, /healthz, /readyz
//! agent      runloop-agent    the agent-program contract and the demo agent
//! proxy      runloop-proxy    the /agent/* paths in front of an agent program
//! runtime    runloop-runtime  where a run's agent lives: builtin, exec,
//!                             attach; the catalog
//! server     runloop-server   the provider: connections, runs, relays
//! ```
//!
//! Every decision about what bytes mean is made by [`proto`] — the
//! rules of a connection included, in its connection table; the crates
//! below move bytes, hold limits, and make sure that whatever breaks — a
//! proxy, an agent, a connection — the caller still gets an honest
//! [`Outcome`](proto::run_loop::Outcome).

#[doc(inline)]
pub use runloop_agent as agent;
#[doc(inline)]
pub use runloop_client as client;
#[doc(inline)]
pub use runloop_metrics as metrics;
#[doc(inline)]
pub use runloop_metrics::admin;
/// The protocol's types and rules, no I/O: the crate `runloop-proto`,
/// documented here in full so that a caller needs one dependency
/// (`runloop::proto::agents_run::RunRequest`,
/// `runloop::proto::run_loop::Outcome`, …).
#[doc(inline)]
pub use runloop_proto as proto;
#[doc(inline)]
pub use runloop_proxy as proxy;
#[doc(inline)]
pub use runloop_runtime as runtime;
#[doc(inline)]
pub use runloop_server as server;
#[doc(inline)]
pub use runloop_wire::{limits, small_file, tls, transport};

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The Rust caller's guide (docs/rust.md), compiled and run as a doctest.
#[doc = include_str!("../../../docs/rust.md")]
#[cfg(doctest)]
pub struct RustCallerDoctests;
