//! `runloop proxy`: the proxy on its own, for a container image: it
//! listens for the provider's server and forwards to the agent program on
//! `127.0.0.1:$PORT`.

use std::io::Write;
use std::net::SocketAddr;

use std::sync::Arc;

use runloop::proxy::{DEFAULT_LISTEN, Proxy};
use tracing::info;

use crate::exit::{Exit, Failure};
use crate::process::{LogArgs, block_on, init_logs_as, shutdown_signal, start_admin};

/// Arguments of `runloop proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address the provider's server dials.
    #[arg(long, default_value_t = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// The agent program's port on 127.0.0.1 (default: $PORT, else 8080).
    #[arg(long)]
    pub agent_port: Option<u16>,
    /// Serve GET /metrics (Prometheus), /healthz and /readyz over HTTP on
    /// this address; its URL is printed after the proxy's. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// How log lines are written (`--log-format`).
    #[command(flatten)]
    pub logs: LogArgs,
}

impl Args {
    /// Proxies until Ctrl-C or SIGTERM.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let _logs = init_logs_as("info", self.logs.log_format);
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
            let admin = match self.admin {
                Some(addr) => {
                    let (url, stop, serving) = start_admin(addr, Arc::new(proxy.clone())).await?;
                    writeln!(out, "{url}")?;
                    Some((stop, serving))
                }
                None => None,
            };
            out.flush()?;
            info!(addr = %proxy.local_addr(), %agent, "proxying");
            shutdown_signal().await;
            proxy.shutdown();
            let _ = serving.await;
            if let Some((stop, serving)) = admin {
                stop.cancel();
                let _ = serving.await;
            }
            Ok(Exit::Success)
        })?
    }
}
