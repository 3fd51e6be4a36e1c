//! `runloop serve` as a child process: its URL and admin address, its
//! stderr kept, a SIGTERM or a SIGHUP sent, its exit awaited.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use runloop_testkit::command::{self, drain, exits};
use runloop_testkit::process::KillOnDrop;

/// A running `runloop serve`, killed if the test ends first.
pub struct Serve {
    child: KillOnDrop,
    /// The URL it printed (`ws://…` or `wss://…`).
    pub url: String,
    /// Its admin listener, when it has one.
    pub admin: Option<SocketAddr>,
    stderr: Option<JoinHandle<String>>,
}

impl Serve {
    /// Starts `runloop serve --listen 127.0.0.1:0 ARGS…` at `RUST_LOG=level`.
    pub fn start(level: &str, args: &[&str]) -> Serve {
        let mut child = command::start(
            level,
            &[&["serve", "--listen", "127.0.0.1:0"], args].concat(),
        );
        let stderr = drain(child.stderr.take().expect("stderr"));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut url = String::new();
        stdout.read_line(&mut url).expect("serve prints its URL");
        if url.is_empty() {
            let _ = child.wait();
            panic!("serve did not start: {}", stderr.join().unwrap_or_default());
        }
        let admin = args
            .contains(&"--admin")
            .then(|| command::admin_address(&mut stdout));
        Serve {
            child: KillOnDrop(child),
            url: url.trim().to_owned(),
            admin,
            stderr: Some(stderr),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.url
            .rsplit_once("://")
            .and_then(|(_, addr)| addr.parse().ok())
            .unwrap_or_else(|| panic!("no address in {}", self.url))
    }

    /// Sends `signal` (a name `kill` knows: TERM, HUP…).
    pub fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .stdout(Stdio::null())
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -{signal}");
    }

    /// Waits (bounded) for the exit: its status, how long it took, and
    /// everything it logged.
    pub fn exit(mut self) -> (ExitStatus, std::time::Duration, String) {
        let start = Instant::now();
        let status = exits(&mut self.child, "runloop serve");
        let took = start.elapsed();
        let stderr = self
            .stderr
            .take()
            .map(|s| s.join().unwrap_or_default())
            .unwrap_or_default();
        (status, took, stderr)
    }

    /// SIGTERM, then [`exit`](Self::exit).
    pub fn terminate(self) -> (ExitStatus, std::time::Duration, String) {
        self.signal("TERM");
        self.exit()
    }
}
