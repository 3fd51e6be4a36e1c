//! The `runloop` binary; everything is in the library.

use std::process::ExitCode;

/// jemalloc, so that memory freed after a burst goes back to the system
/// (the measurements are beside the dependency in Cargo.toml).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    runloop_cli::main(std::env::args_os()).into()
}
