//! The `runloop` command under test, as a child process: `runloop serve`
//! on a loopback port, `runloop run` and the rest run to their end, each
//! waited for within a bound, its output drained on a thread of its own
//! so that it never blocks on a full pipe.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::process::KillOnDrop;
use runloop_proto::agents_run::{Container, Image, ImageRef, RunRequest};

/// How long a command that should end may take before the test fails:
/// generous, for a shared machine; a hang takes forever.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The `runloop` to run: the binary `RUNLOOP_BIN` names (another build,
/// measured against this one), else the one cargo built beside the running
/// test or bench (`target/PROFILE/runloop`, which cargo builds before it
/// runs runloop-cli's tests and benches).
pub fn binary() -> PathBuf {
    if let Some(named) = std::env::var_os("RUNLOOP_BIN") {
        return named.into();
    }
    let exe = std::env::current_exe().expect("the test's own path");
    // target/PROFILE/deps/NAME-HASH
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/PROFILE/deps");
    let built = profile.join("runloop");
    assert!(
        built.is_file(),
        "no {}: the runloop-cli tests build it (cargo test -p runloop-cli)",
        built.display()
    );
    built
}

/// A command of [`binary`].
pub fn runloop() -> Command {
    Command::new(binary())
}

/// The first line `child` prints on its stdout (which it takes), without
/// its end: empty when the child exits before it says anything.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout, taken once"))
        .read_line(&mut line)
        .expect("the child's stdout reads");
    line.trim_end().to_owned()
}

/// Reads the URL a `runloop serve` prints first on its stdout.
pub fn url(child: &mut Child) -> String {
    let url = first_line(child);
    assert!(url.starts_with("ws://"), "{url:?}");
    url
}

/// `runloop serve --listen 127.0.0.1:0 ARGS` at `RUST_LOG=level`, started
/// by `sh` under `ulimits` (each the arguments of a `ulimit`, such as
/// `-n 256`: the descriptors it may open), with no stdin and its stdout
/// and stderr piped; its URL read.
pub fn serve_under(ulimits: &[&str], level: &str, args: &str) -> (Child, String) {
    let ulimits: String = ulimits.iter().map(|u| format!("ulimit {u} && ")).collect();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{ulimits}exec \"$0\" serve --listen 127.0.0.1:0 {args}"
        ))
        .arg(binary())
        .env("RUST_LOG", level)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs");
    let url = url(&mut child);
    (child, url)
}

/// Reads the line an `--admin` listener is announced with on `stdout`
/// (`http://ADDRESS`, after the URL): its address.
pub fn admin_address(stdout: &mut impl BufRead) -> SocketAddr {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the admin URL");
    line.trim()
        .strip_prefix("http://")
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("not an admin URL: {line:?}"))
}

/// Waits for `child` to exit, for `PATIENCE` at most; past that it is
/// killed and the test fails, naming `what`.
pub fn exits(child: &mut Child, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            return status;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {PATIENCE:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads all of a child's pipe on a thread, so the child never blocks on it.
pub fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A `runloop serve` on a loopback port, killed if the test ends first.
pub struct Serve {
    child: KillOnDrop,
    /// The URL it printed.
    pub url: String,
}

impl Serve {
    /// Starts `runloop serve --listen 127.0.0.1:0 ARGS…` at `RUST_LOG=level`,
    /// its stderr a pipe the caller takes with [`Serve::stderr`].
    pub fn start(level: &str, args: &[&str]) -> Serve {
        let mut child = start(
            level,
            &[&["serve", "--listen", "127.0.0.1:0"], args].concat(),
        );
        let url = url(&mut child);
        Serve {
            child: KillOnDrop(child),
            url,
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.url
            .trim_start_matches("ws://")
            .parse()
            .expect("an address")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A size field of its `/proc/PID/status` (`VmRSS`, `VmHWM`…), bytes.
    pub fn status(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        let line = status
            .lines()
            .find(|line| line.starts_with(field))
            .unwrap_or_else(|| panic!("{field} in {status}"));
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|kib| kib.parse().ok())
            .expect("a size in kB");
        kib * 1024
    }

    /// Kills it outright (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The read end of its stderr.
    pub fn stderr(&mut self) -> ChildStderr {
        self.child.stderr.take().expect("stderr, taken once")
    }

    /// Sends SIGTERM and waits (bounded) for the exit.
    pub fn terminate(mut self) -> ExitStatus {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        exits(&mut self.child, "serve after SIGTERM")
    }
}

/// `runloop ARGS…` started at `RUST_LOG=level`, with no stdin, and its
/// stdout and stderr pipes for the test to take.
pub fn start(level: &str, args: &[&str]) -> Child {
    runloop()
        .args(args)
        .env("RUST_LOG", level)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runloop starts")
}

/// Waits (bounded) for a `run` of the demo whose stdout is drained by
/// `stdout`, and checks that it rendered its loop to the end and exited 0
/// (the ending line is a note on stderr, which the caller may not read).
pub fn finishes(mut child: Child, stdout: JoinHandle<String>, what: &str) {
    let status = exits(&mut child, what);
    let stdout = stdout.join().expect("stdout read");
    assert_eq!(status.code(), Some(0), "{what}: {stdout}");
    // The loop, to its last chunk and the line's end.
    assert!(
        stdout.len() > 1 && stdout.ends_with('\n'),
        "{what}: {stdout}"
    );
}

/// `runloop ARGS…` run to its end (bounded): exit status, stdout, stderr.
pub fn run(args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = start("error", args);
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let status = exits(&mut child, &format!("runloop {}", args.join(" ")));
    (
        status,
        stdout.join().expect("stdout read"),
        stderr.join().expect("stderr read"),
    )
}

/// How a configuration file names `token`: `sha256:` and its SHA-256 in
/// lowercase hex.
pub fn token_hash(token: &str) -> String {
    crate::sha256(token.as_bytes())
}

/// A run request for the demo agent, with room to spare.
pub fn demo_request() -> RunRequest {
    request("demo", 1 << 30, 1 << 30)
}

/// A run of the server's image `image` (any digest) asking for `memory`
/// and `disk`, with an empty `agent`.
pub fn request(image: &str, memory: u64, disk: u64) -> RunRequest {
    let image = Image::Server(ImageRef {
        name: image.into(),
        digest: format!("sha256:{}", "0".repeat(64)),
    });
    let agent = serde_json::value::RawValue::from_string("{}".into()).expect("JSON");
    RunRequest::new(Container::new(image, memory, disk), agent)
}
