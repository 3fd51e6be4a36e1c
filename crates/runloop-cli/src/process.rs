//! What the networked subcommands share: the async runtime, logs on
//! stderr, and the signals that end a long-running command.

use std::future::Future;

use crate::exit::Failure;

/// Runs `future` to its end on a multi-threaded runtime.
pub fn block_on<F: Future>(future: F) -> Result<F::Output, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Failure::Runtime)?;
    Ok(runtime.block_on(future))
}

/// Logs to stderr, filtered by `RUST_LOG` (else `default`), in colour only
/// when stderr is a terminal.
pub fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second initialisation (tests running commands in-process) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_env_filter(filter)
        .try_init();
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
