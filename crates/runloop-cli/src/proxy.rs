//! `runloop proxy`: the proxy on its own, for a container image: it
//! listens for the provider's server and forwards to the agent program on
//! `127.0.0.1:$PORT`.

use std::io::Write;
use std::net::SocketAddr;

use runloop::proxy::{DEFAULT_LISTEN, Proxy};
use tracing::info;

use crate::exit::{Exit, Failure};
use crate::process::{block_on, init_logs, shutdown_signal};

/// Arguments of `runloop proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address the provider's server dials.
    #[arg(long, default_value_t = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// The agent program's port on 127.0.0.1 (default: $PORT, else 8080).
    #[arg(long)]
    pub agent_port: Option<u16>,
}

impl Args {
    /// Proxies until Ctrl-C or SIGTERM.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let _logs = init_logs("info");
        let port = self
            .agent_port
            .unwrap_or_else(runloop::agent::port_from_env);
        let agent = SocketAddr::from(([127, 0, 0, 1], port));
        block_on(async {
            let proxy =
                Proxy::bind(self.listen, agent)
                    .await
                    .map_err(|source| Failure::Listen {
                        addr: self.listen.to_string(),
                        source,
                    })?;
            let (proxy, serving) = proxy.spawn();
            writeln!(out, "{}", proxy.url())?;
            out.flush()?;
            info!(addr = %proxy.local_addr(), %agent, "proxying");
            shutdown_signal().await;
            proxy.shutdown();
            let _ = serving.await;
            Ok(Exit::Success)
        })?
    }
}
