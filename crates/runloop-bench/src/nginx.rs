//! nginx as a plain SSE reverse proxy: the baseline of the whole chain.
//!
//! What a user who puts nginx in front of their agent programs runs: one
//! process (`master_process off`, so the process measured is the one
//! worker), `proxy_buffering off` so each event goes on as it comes,
//! HTTP/1.1 to the agent program, no access log. Everything else is
//! nginx's default. The bench writes the configuration into a directory
//! of its own, starts nginx on a loopback port in the foreground as its
//! child, and removes the directory when it is done.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::process::Command;

/// Where nginx is looked for when `RUNLOOP_BENCH_NGINX` does not say.
const PLACES: &[&str] = &["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"];

/// The nginx program, if one is installed.
pub(crate) fn program() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RUNLOOP_BENCH_NGINX") {
        return Some(PathBuf::from(path));
    }
    PLACES.iter().map(PathBuf::from).find(|path| path.is_file())
}

/// nginx's directory for one bench run, removed when dropped.
#[derive(Debug)]
pub(crate) struct Prefix(PathBuf);

impl Drop for Prefix {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The configuration: nginx on `listen`, in front of the agent program at
/// `agent`, for `connections` connections at once.
pub(crate) fn config(
    prefix: &Path,
    listen: SocketAddr,
    agent: SocketAddr,
    connections: usize,
) -> String {
    let prefix = prefix.display();
    // Each loop holds a connection from the client and one to the agent.
    let descriptors = 2 * connections + 64;
    format!(
        "daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile {descriptors};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections {descriptors};
}}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen {listen};
        location / {{
            proxy_pass http://{agent};
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"
    )
}

/// The command that starts nginx from `program` as [`config`] says, with
/// its directory (kept while the directory lives).
pub(crate) fn command(
    program: &Path,
    listen: SocketAddr,
    agent: SocketAddr,
    connections: usize,
) -> std::io::Result<(Command, Prefix)> {
    let dir = std::env::temp_dir().join(format!(
        "runloop-bench-nginx-{}-{}",
        std::process::id(),
        listen.port()
    ));
    std::fs::create_dir_all(&dir)?;
    let prefix = Prefix(dir);
    let conf = prefix.0.join("nginx.conf");
    std::fs::write(&conf, config(&prefix.0, listen, agent, connections))?;
    let mut command = Command::new(program);
    command
        .arg("-p")
        .arg(&prefix.0)
        .arg("-e")
        .arg(prefix.0.join("error.log"))
        .arg("-c")
        .arg(&conf);
    Ok((command, prefix))
}
