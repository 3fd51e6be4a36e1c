//! The `runloop` binary; everything is in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    runloop_cli::main(std::env::args_os()).into()
}
