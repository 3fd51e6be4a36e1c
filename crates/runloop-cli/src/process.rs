//! What the networked subcommands share: the async runtime, logs on
//! stderr, the signals that end a long-running command, and the admin
//! listener `serve` and `proxy` start.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use runloop::admin::{self, Watched};
use runloop::tls::ClientTls;
use runloop_proto::error_chain::Chain;
use tokio_util::sync::CancellationToken;

use crate::exit::Failure;

/// Runs `future` to its end on a multi-threaded runtime.
pub fn block_on<F: Future>(future: F) -> Result<F::Output, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Failure::Runtime)?;
    Ok(runtime.block_on(future))
}

/// Log lines queued for stderr, at most, while it is slow; more are dropped.
pub const QUEUED_LOG_LINES: usize = 8192;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// For a person: one line each, in colour on a terminal.
    #[default]
    Text,
    /// For a log shipper: one JSON object a line, with the event's fields
    /// at the top level and every span it happened in (connection, scope,
    /// with their ids) under `spans`.
    Json,
}

/// `--log-format`, for the commands that serve (`serve`, `proxy`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LogArgs {
    /// Log lines as `text`, or as `json` objects (one a line) for a log
    /// shipper.
    #[arg(
        long,
        value_name = "FORMAT",
        value_enum,
        default_value_t,
        hide_possible_values = true
    )]
    pub log_format: LogFormat,
}

/// Logs to stderr in the text format; see [`init_logs_as`].
pub fn init_logs(default: &str) -> Logs {
    init_logs_as(default, LogFormat::Text)
}

/// Logs to stderr, filtered by `RUST_LOG` (else `default`), in `format`
/// (text in colour only when stderr is a terminal), until the returned
/// [`Logs`] is dropped.
///
/// A log sink that goes away or stalls costs log lines, never the work
/// (protocol §12 "Logs never hold anything up"). Tasks never write to stderr
/// themselves: they queue their lines for one thread that does, and when
/// [`QUEUED_LOG_LINES`] are waiting (a reader that stopped reading) further
/// lines are dropped. A write that fails (a reader that went away) is
/// ignored: the formatter's own report of it would write to the same
/// stderr, and panics on a closed one.
///
/// Crates that log through `log` rather than `tracing` (the WebSocket
/// library, the HTTP client) reach these logs up to debug, never at trace:
/// at trace tungstenite writes out every message it reads or sends, byte
/// for byte, and the first of them carries the connection's credential.
pub fn init_logs_as(default: &str, format: LogFormat) -> Logs {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LOG_LINES)
        .thread_name("runloop-logs")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter)
        .log_internal_errors(false);
    let installed = match format {
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            tracing::subscriber::set_global_default(
                builder.with_ansi(ansi).fmt_fields(text_fields()).finish(),
            )
        }
        LogFormat::Json => tracing::subscriber::set_global_default(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(true)
                .finish(),
        ),
    };
    // A second initialisation (tests running commands in-process) is harmless.
    if installed.is_ok() {
        let _ = tracing_log::LogTracer::builder()
            .with_max_level(tracing_log::log::LevelFilter::Debug)
            .init();
    }
    Logs {
        guard: Some(guard),
        dropped,
    }
}

/// The text format's fields: the message, then `name=value` pairs, each
/// written through [`Escaped`](runloop::runtime::output::Escaped), so that
/// no value from outside (a reference, an error text, an agent's output
/// line) can end the line or forge the next one. (The JSON format escapes
/// them itself.)
pub fn text_fields()
-> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static {
    use runloop::runtime::output::Escaped;
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let name = field.name();
        // What the `log` bridge records about a record's origin.
        if name.starts_with("log.") {
            return Ok(());
        }
        let text = format!("{value:?}");
        if name == "message" {
            write!(writer, "{}", Escaped(&text))
        } else {
            write!(writer, "{name}={}", Escaped(&text))
        }
    })
    .delimited(" ")
}

/// Keeps the log thread of [`init_logs`]; dropped at a command's end, it
/// writes out the lines still queued (waiting a second at most).
#[must_use = "the logs end when this is dropped"]
pub struct Logs {
    guard: Option<tracing_appender::non_blocking::WorkerGuard>,
    dropped: tracing_appender::non_blocking::ErrorCounter,
}

impl Drop for Logs {
    fn drop(&mut self) {
        // Lines were dropped: the sink is stalled or overwhelmed, and the
        // queue may be full. The guard would then wait for room and, failing
        // that, say so on stdout — the command's data. Lines are being lost
        // anyway; the rest of the queue goes with the process.
        if self.dropped.dropped_lines() > 0 {
            std::mem::forget(self.guard.take());
        }
    }
}

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs")
            .field("dropped", &self.dropped.dropped_lines())
            .finish()
    }
}

/// Whom a `wss://` client trusts: the platform's roots, and besides them
/// the certificate authorities of `--ca` (`None` without any: the
/// platform's alone, read when a `wss://` URL needs them).
pub fn client_tls(authorities: &[PathBuf]) -> Result<Option<ClientTls>, Failure> {
    if authorities.is_empty() {
        return Ok(None);
    }
    ClientTls::new(authorities)
        .map(Some)
        .map_err(|error| Failure::Argument(format!("--ca: {}", Chain(&error))))
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

/// Binds an admin listener for `watched` on `addr` and serves it until the
/// returned token is cancelled: its `http://` URL, the token, its task.
pub async fn start_admin(
    addr: SocketAddr,
    watched: Arc<dyn Watched>,
) -> Result<(String, CancellationToken, tokio::task::JoinHandle<()>), Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Failure::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(Failure::Runtime)?;
    let stop = CancellationToken::new();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move {
            if let Err(error) = admin::serve(listener, watched, stop).await {
                tracing::warn!(error = %Chain(&error), "the admin listener failed");
            }
        }
    });
    Ok((format!("http://{bound}"), stop, serving))
}

#[cfg(test)]
mod tests {
    use runloop_testkit::logs::Logs;

    use super::*;

    #[test]
    fn no_outside_text_ends_a_text_log_line_or_forges_one() {
        let captured = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .fmt_fields(text_fields())
            .finish();
        let controls: Vec<char> = (0u32..0x20)
            .chain(0x7f..0xa0)
            .chain([0x2028, 0x2029])
            .filter_map(char::from_u32)
            .collect();
        let mut events = 0;
        tracing::subscriber::with_default(subscriber, || {
            for c in &controls {
                let evil = format!("x{c}2026-01-01T00:00:00.000000Z  WARN runloop::server: forged");
                // The fields the server fills from outside: a reference, an
                // error text, an image name, a peer (a span field), an
                // agent's output line (the message), a Debug-formatted value.
                let span = tracing::info_span!("connection", peer = %evil);
                let _entered = span.enter();
                tracing::info!(reference = %evil, "pulling the image");
                tracing::info!(error = %evil, "run refused");
                tracing::info!(image = %evil, "starting the container");
                tracing::info!(target: "runloop::agent_program", program = %evil, pid = 1, stream = "stdout", "{evil}");
                tracing::info!(detail = ?evil, "debug");
                events += 5;
            }
        });
        let text = String::from_utf8(captured.bytes()).expect("UTF-8");
        let lines: Vec<&str> = text.split_terminator('\n').collect();
        assert_eq!(lines.len(), events, "{text}");
        for line in &lines {
            assert!(line.contains("INFO"), "{line:?}");
            assert!(!line.contains(|c: char| controls.contains(&c)), "{line:?}");
            assert!(!line.starts_with("2026-01-01"), "{line:?}");
        }
        assert!(
            text.contains(r"reference=x\n2026-01-01T00:00:00.000000Z"),
            "{text}"
        );
        assert!(text.contains(r"peer=x\r2026"), "{text}");
        assert!(text.contains(r"x\u00002026"), "{text}");
    }
}
