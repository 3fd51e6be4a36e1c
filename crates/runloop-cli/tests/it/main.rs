//! The tests of the `runloop` command, in one binary: one link instead
//! of one per file. Each module was a test file of its own; they share
//! `common` (starting `runloop serve` and `runloop run`, reading their
//! output). The container tests (`tests/containers`) and the operator
//! tests (`tests/operate`) stay binaries of their own: each is already
//! one binary of many modules, with helpers of its own.

mod admission;
mod budget;
// The test certificates of the operator tests, for the TLS flood of `walls`.
#[allow(dead_code)]
#[path = "../operate/certs.rs"]
mod certs;
mod check;
mod cli;
mod common;
mod conventions;
mod corpus;
mod decode;
mod descriptors;
mod docs;
mod ends;
mod examples;
mod exec;
mod limits;
mod logs;
mod memory;
mod messages;
mod origins;
mod outgoing;
mod pipes;
mod run;
mod run_options;
mod store;
mod tenants;
mod tokens;
mod walls;
