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
///
/// Crates that log through `log` rather than `tracing` (the WebSocket
/// library, the HTTP client) reach these logs up to debug, never at trace:
/// at trace tungstenite writes out every message it reads or sends, byte
/// for byte, and the first of them carries the connection's credential.
pub fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_env_filter(filter)
        .finish();
    // A second initialisation (tests running commands in-process) is harmless.
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        let _ = tracing_log::LogTracer::builder()
            .with_max_level(tracing_log::log::LevelFilter::Debug)
            .init();
    }
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
