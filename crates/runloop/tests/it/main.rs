//! The integration tests of the whole chain, in one binary: one link of
//! tokio and every crate of runloop instead of one per file.
//!
//! Each module was a test file of its own; they share `common` (a proxy
//! path driven as the server drives it, a scripted agent program, a log
//! writer) and `support` (a scripted proxy, raw clients, owned frames).
//! Some tests stay binaries of their own, because they hold or measure
//! the whole process: `soak` (its descriptor limit and resident memory),
//! `limits` (the resident memory of a flood), and `ends`, `exec`, `logs`
//! and `path_close`, which each install the process's one global log
//! subscriber and read what every thread of the process logged.

mod agent;
// Its log and process helpers serve the binaries beside this one.
#[allow(dead_code)]
mod common;
mod crossings;
mod delimited;
mod end_to_end;
mod faults;
mod fuzz_corpus;
mod hostile;
mod lifecycle;
mod model;
mod over_limit;
mod proxy;
mod relay;
mod support;
mod walls;
