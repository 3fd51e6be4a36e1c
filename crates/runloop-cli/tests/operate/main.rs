//! Operating runloop as a provider would, with the tools operators have:
//! TLS on both sides with certificates made in the test, metrics scraped by
//! a real Prometheus, three servers behind a real nginx (and one of them
//! drained), and logs as JSON lines.
//!
//! nginx and Prometheus are the Debian packages' binaries, started by the
//! tests on loopback ports from configurations they write (`.ci/run`
//! installs them when missing).

mod http;
mod nginx;
mod prometheus;
mod serve;

mod balance;
mod logs;
mod metrics;
mod tls;
