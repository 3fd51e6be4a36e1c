//! The tests of the `runloop` command, in one binary: one link instead
//! of one per file. Each module was a test file of its own; they share
//! the testkit's `command` (starting `runloop serve` and `runloop run`,
//! reading their output) with the binaries beside this one, and its
//! `loads` with `benches/figures/`, which runs them at full size. The
//! container tests (`tests/containers`) and the operator
//! tests (`tests/operate`) stay binaries of their own: each is already
//! one binary of many modules, with helpers of its own.

mod admission;
mod budget;
mod check;
mod cli;
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
