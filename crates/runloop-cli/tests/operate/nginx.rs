//! A real nginx (the Debian package's binary) in front of `runloop serve`
//! processes: WebSocket upgrade proxying, plain or with TLS terminated at
//! nginx, on a loopback port, from a configuration the test writes.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runloop_testkit::Part;

use runloop_testkit::certs::Pair;

/// Where the Debian package puts nginx.
const NGINX: &str = "/usr/sbin/nginx";

/// nginx, as a test asks for it before it starts anything.
pub const PART: Part = Part::program("nginx", "nginx");

/// A running nginx, stopped when dropped.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// Where callers connect.
    pub addr: SocketAddr,
}

/// A port the OS has just handed out and taken back: free, for now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Nginx {
    /// Starts nginx proxying to `upstreams`, each a `runloop serve`, with
    /// TLS terminated at nginx when `tls` is given.
    pub fn start(upstreams: &[SocketAddr], tls: Option<&Pair>) -> Nginx {
        let dir = tempfile::tempdir().expect("scratch");
        // The port is free when chosen; another process could take it
        // before nginx binds it, so a failed start is tried again.
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let config = config(dir.path(), addr, upstreams, tls);
            let path = dir.path().join("nginx.conf");
            std::fs::write(&path, config).expect("the configuration");
            let mut child = Command::new(NGINX)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&path)
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nginx starts");
            if listening(&mut child, addr) {
                return Nginx { child, dir, addr };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nginx did not start; its log:\n{}", log(dir.path()));
    }

    /// nginx's error log so far.
    pub fn log(&self) -> String {
        log(self.dir.path())
    }
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
}

/// Waits (bounded) until `addr` accepts, while `child` runs.
fn listening(child: &mut Child, addr: SocketAddr) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The configuration: one worker, logs and temporary files in `dir`, and
/// docs/serving.md's WebSocket proxying. `least_conn` spreads the connections;
/// a server that refuses connections (one draining) is passed over for
/// the next one.
fn config(dir: &Path, addr: SocketAddr, upstreams: &[SocketAddr], tls: Option<&Pair>) -> String {
    let dir = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|up| format!("        server {up} max_fails=1 fail_timeout=30s;\n"))
        .collect();
    let (listen, certificate) = match tls {
        Some(pair) => (
            format!("{addr} ssl"),
            format!(
                "        ssl_certificate {};\n        ssl_certificate_key {};\n",
                path(&pair.cert),
                path(&pair.key)
            ),
        ),
        None => (addr.to_string(), String::new()),
    };
    format!(
        "daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 2048; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}
    upstream runloop {{
        least_conn;
{servers}    }}
    server {{
        listen {listen};
{certificate}        location / {{
            proxy_pass http://runloop;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            proxy_buffering off;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"
    )
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGQUIT: nginx's graceful stop; a kill if it does not go.
        let _ = Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
