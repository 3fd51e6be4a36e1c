//! The wire of runloop: what moves a framed connection's bytes over a
//! WebSocket, for the client, the proxy and the server alike.
//!
//! ```text
//! limits     what a connection and a server may hold, with their minimums
//! writer     a framed connection's socket, its queue and the task that
//!            writes what is queued (large frames as fragments)
//! ws         the WebSocket frame layer: the frame head codec, the message
//!            reader, and the rules of sharing a socket with tungstenite
//! lane       a server's socket under its WebSocket: data frames written
//!            from their own bytes, in one vectored write
//! histogram  the latency histogram the writer records into
//! transport  dialling ws:// and wss://, and the server's TLS handshake
//! tls        the server's certificate (reloadable) and the client's roots
//! small_file the files an operator names (certificates, keys, tokens,
//!            configuration), read only when regular and within a bound
//! listener   how the servers accept, with a backoff when out of descriptors
//! ```
//!
//! The lowest async layer: it knows frames only as bytes to write and
//! read ([`runloop_proto`] decides what they mean), and nothing above it —
//! the client, the proxy, the server — is imported here, so each of them
//! builds on it without the others.

pub mod histogram;
pub mod lane;
pub mod limits;
pub mod listener;
pub mod small_file;
pub mod tls;
pub mod transport;
pub mod writer;
pub mod ws;
