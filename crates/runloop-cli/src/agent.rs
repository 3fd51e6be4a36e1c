//! `runloop agent demo`: the demo agent program on its own, on
//! `127.0.0.1:$PORT`, for putting behind a proxy or an exec runtime.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runloop::agent::AgentServer;
use runloop::agent::demo::Demo;

use crate::exit::{Exit, Failure};
use crate::process::{block_on, init_logs, shutdown_signal};

/// Arguments of `runloop agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which agent program.
    #[command(subcommand)]
    pub agent: Which,
}

/// The agent programs this command can be.
#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// The deterministic demo agent (keywords in the prompt: demo:fatal,
    /// demo:break, demo:refuse, demo:refuse-text, `demo:load=N[xSIZE]`, demo:pace=MS).
    Demo {
        /// The address to listen on (default: 127.0.0.1:$PORT, else 127.0.0.1:8080).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Milliseconds to wait before each chunk, so a person can watch it stream.
        #[arg(long, default_value_t = 0)]
        pace: u64,
    },
}

impl Args {
    /// Serves until Ctrl-C or SIGTERM.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let Which::Demo { listen, pace } = &self.agent;
        let _logs = init_logs("info");
        let listen = listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], runloop::agent::port_from_env())));
        let agent = Arc::new(Demo::with_pace(Duration::from_millis(*pace)));
        block_on(async {
            let server =
                AgentServer::bind(listen, agent)
                    .await
                    .map_err(|source| Failure::Listen {
                        addr: listen.to_string(),
                        source,
                    })?;
            let (server, serving) = server.spawn();
            writeln!(out, "{}", server.url())?;
            out.flush()?;
            shutdown_signal().await;
            server.shutdown();
            let _ = serving.await;
            Ok(Exit::Success)
        })?
    }
}
