//! `runloop run`: one loop, end to end, rendered as it streams.
//!
//! Without `--url` it starts an embedded server with the built-in demo
//! agent on a loopback port and runs against it over real sockets, so the
//! command works on a fresh machine with no setup. The exit code is the
//! loop's ending (see [`Exit`]); Ctrl-C stops the run, the loop's ending is
//! shown as it came, and the command exits 130. Three time limits bound
//! the wait — for the connection, for the whole run, and between two
//! things from the server — and each that runs out says which it was, with
//! its value, and exits 8, after what came has been shown (`--json` ends
//! with `{"outcome":"timeout","limit":…,"seconds":…}`).

use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use runloop::client::{Client, ClientConfig, Event};
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::agents_run::{
    Container, DIGEST_RULE, Image, ImageRef, RegistryImage, RunRequest, is_valid_digest,
    is_valid_name,
};
use runloop_proto::capture::{Direction, Line};
use runloop_proto::frame::{FrameType, HEADER_LEN, Role};
use runloop_proto::run_loop::{Broken, Outcome};
use serde_json::value::RawValue;
use tokio::task::JoinHandle;

use crate::dial::{DialError, check_url};
use crate::exit::{Exit, Failure};
use crate::notes::{DRAIN, Note, Notes};
use crate::process::{block_on, client_tls, init_logs, shutdown_signal};
use crate::render::{Format, Render};
use crate::seconds;
use crate::size::bytes;
use crate::verbose::Verbose;

/// The digest sent when `--image` names none: any unpinned catalog entry
/// accepts it.
pub const ANY_DIGEST: &str = runloop_proto::agents_run::UNPINNED;

/// Arguments of `runloop run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The prompt; read from standard input when it is `-` or absent.
    pub prompt: Option<String>,
    /// The provider server (ws://HOST:PORT). Without it, an embedded server
    /// with the built-in demo agent runs on a loopback port.
    #[arg(long, env = "RUNLOOP_URL")]
    pub url: Option<String>,
    /// The credential. Every local user can read it in /proc/PID/cmdline:
    /// prefer --token-file or RUNLOOP_TOKEN (the default; empty if unset).
    #[arg(long)]
    pub token: Option<String>,
    /// A file holding the credential (one line).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// The server image to run, from its catalog: NAME or NAME@DIGEST (a
    /// pinned entry, as every oci: one is, wants its digest). Without a
    /// digest, sha256:0…0 is sent, which unpinned catalog entries accept.
    #[arg(long, default_value = "demo", value_parser = image)]
    pub image: ImageRef,
    /// Run a registry image instead: `HOST[:PORT]/REPO[:TAG][@DIGEST]`
    /// (the server must pull from HOST).
    #[arg(long, value_name = "REFERENCE", conflicts_with = "image")]
    pub registry_image: Option<String>,
    /// JSON handed verbatim to the agent's registration.
    #[arg(long, default_value = "{}")]
    pub agent_json: String,
    /// The container's memory limit (K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = bytes)]
    pub memory: u64,
    /// Bytes the container may write (K/M/G suffixes). 0, the default, is
    /// for demo and exec: images; a container (oci: or registry) needs 1M
    /// at least.
    #[arg(long, default_value = "0", value_parser = bytes)]
    pub disk: u64,
    /// One JSON object per line: {"chunk":…}, {"error":…}, then {"outcome":…}.
    #[arg(long, conflicts_with_all = ["pretty", "text", "transcript", "quiet"])]
    pub json: bool,
    /// Every chunk, for a person (the default).
    #[arg(long, conflicts_with_all = ["text", "transcript", "quiet"])]
    pub pretty: bool,
    /// Only the assistant's text, as it streams.
    #[arg(long, conflicts_with_all = ["transcript", "quiet"])]
    pub text: bool,
    /// At the end, one JSON object: the loop coalesced, its error, its outcome.
    #[arg(long, conflicts_with = "quiet")]
    pub transcript: bool,
    /// No output unless the loop did not finish: the exit code tells.
    #[arg(long)]
    pub quiet: bool,
    /// Styles: auto (a terminal, unless NO_COLOR is set or CLICOLOR_FORCE
    /// forces them), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = Color::Auto)]
    pub color: Color,
    /// On stderr: each frame as it is sent and received, and a timing line
    /// at the end.
    #[arg(short, long)]
    pub verbose: bool,
    /// Seconds to connect and send the credential (TCP, WebSocket upgrade,
    /// authorization frame).
    #[arg(long, value_name = "SECONDS", value_parser = seconds::parse, default_value = "10")]
    pub connect_timeout: Duration,
    /// Seconds the whole run may take, connection included.
    #[arg(long, value_name = "SECONDS", value_parser = seconds::parse)]
    pub timeout: Option<Duration>,
    /// Seconds the server may stay silent: the run's answer, then each chunk.
    #[arg(long, value_name = "SECONDS", value_parser = seconds::parse)]
    pub idle_timeout: Option<Duration>,
    /// Record every frame of the connection, both directions, to FILE, in
    /// the format `runloop decode` reads. The credential is not recorded.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// For wss://, also trust the certificate authorities in FILE (PEM;
    /// repeatable), besides the platform's.
    #[arg(long = "ca", value_name = "FILE")]
    pub authorities: Vec<PathBuf>,
}

/// When to style the output (`--color`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Color {
    /// On a terminal, unless `NO_COLOR` is set; `CLICOLOR_FORCE` forces them.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// How long a run waits for a server that stops at the command's end
/// (a time limit, Ctrl-C) to end the run.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The three limits of `run`, counted from the command's start.
#[derive(Debug, Clone, Copy)]
struct Limits {
    started: Instant,
    connect: Duration,
    whole: Option<Duration>,
    idle: Option<Duration>,
}

impl Limits {
    /// Waits for the connection: `--connect-timeout`, within `--timeout`.
    async fn connect<T>(&self, connecting: impl Future<Output = T>) -> Result<T, Failure> {
        let connected = tokio::time::timeout(self.connect, connecting);
        self.within(None, connected)
            .await?
            .map_err(|_| Failure::TimedOut {
                what: "no connection was made and authorized",
                option: "--connect-timeout",
                after: self.connect,
            })
    }

    /// Waits for something from the server: `--idle-timeout`, within
    /// `--timeout`.
    async fn next<T>(&self, answer: impl Future<Output = T>) -> Result<T, Failure> {
        self.within(self.idle, answer).await
    }

    async fn within<T>(
        &self,
        idle: Option<Duration>,
        future: impl Future<Output = T>,
    ) -> Result<T, Failure> {
        let left = self
            .whole
            .map(|whole| whole.saturating_sub(self.started.elapsed()));
        tokio::select! {
            value = future => Ok(value),
            () = sleep(left) => Err(Failure::TimedOut {
                what: "the run did not end",
                option: "--timeout",
                after: self.whole.unwrap_or_default(),
            }),
            () = sleep(idle) => Err(Failure::TimedOut {
                what: "nothing came from the server",
                option: "--idle-timeout",
                after: idle.unwrap_or_default(),
            }),
        }
    }
}

/// Sleeps for `after`; forever without it.
async fn sleep(after: Option<Duration>) {
    match after {
        Some(after) => tokio::time::sleep(after).await,
        None => std::future::pending().await,
    }
}

/// How the loop ended for the command.
#[derive(Debug)]
struct Ending {
    /// The loop's outcome; none when Ctrl-C stopped a run that then did
    /// not end within [`STOP_GRACE`].
    outcome: Option<Outcome>,
    /// Whether Ctrl-C (or SIGTERM) stopped the run.
    interrupted: bool,
}

/// `NAME` or `NAME@DIGEST`, checked as the server will check it.
pub fn image(text: &str) -> Result<ImageRef, String> {
    let (name, digest) = text.split_once('@').unwrap_or((text, ANY_DIGEST));
    if !is_valid_name(name) {
        return Err(format!(
            "{name:?} is not an image name (a repository path without a host){}",
            registry_hint(name)
        ));
    }
    if !is_valid_digest(digest) {
        return Err(format!(
            "{digest:?} is not a digest runloop takes: a digest is {DIGEST_RULE}"
        ));
    }
    Ok(ImageRef {
        name: name.to_owned(),
        digest: digest.to_owned(),
    })
}

/// A hint for a registry reference given as a catalog name: a first
/// component that is a host (`127.0.0.1:5000/…`, `registry.example/…`,
/// `localhost/…`) or a `:TAG`.
fn registry_hint(name: &str) -> &'static str {
    let first = name.split('/').next().unwrap_or_default();
    let host = name.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    if host || name.contains(':') {
        "; a registry image is asked for with runloop run --registry-image HOST/REPO[:TAG][@DIGEST]"
    } else {
        ""
    }
}

impl Args {
    fn request(&self) -> Result<RunRequest, Failure> {
        let agent = RawValue::from_string(self.agent_json.clone())
            .map_err(|e| Failure::Argument(format!("--agent-json is not JSON: {e}")))?;
        let image = match &self.registry_image {
            Some(reference) => Image::Registry(RegistryImage {
                reference: reference.clone(),
            }),
            None => Image::Server(self.image.clone()),
        };
        let container = Container::new(image, self.memory, self.disk);
        let request = RunRequest::new(container, agent);
        request
            .validate()
            .map_err(|e| Failure::Argument(e.to_string()))?;
        Ok(request)
    }

    fn prompt(&self) -> Result<String, Failure> {
        if let Some(prompt) = self.prompt.as_ref().filter(|prompt| *prompt != "-") {
            return Ok(prompt.clone());
        }
        if io::stdin().is_terminal() {
            // Not a hang: the command waits for the person at the terminal.
            let _ = writeln!(
                io::stderr(),
                "runloop: reading the prompt from standard input; end it with Ctrl-D \
                 (or give it as an argument)"
            );
        }
        let mut prompt = String::new();
        io::stdin()
            .read_to_string(&mut prompt)
            .map_err(|source| Failure::Input {
                name: "standard input".into(),
                source,
            })?;
        if prompt.ends_with('\n') {
            prompt.pop();
            if prompt.ends_with('\r') {
                prompt.pop();
            }
        }
        Ok(prompt)
    }

    /// Runs one loop and renders it to stdout.
    pub fn execute(&self) -> Result<Exit, Failure> {
        if let Some(url) = &self.url {
            check_url(url).map_err(Failure::Dial)?;
        }
        let token = crate::token::client(self.token.as_deref(), self.token_file.as_deref())?;
        if self.token.is_some() {
            crate::token::warn_command_line();
        }
        let request = self.request()?;
        let prompt = self.prompt()?;
        let capture = self.capture.as_ref().map(Capture::create).transpose()?;
        // The embedded server's own account of a loop that failed would only
        // repeat what the rendering says; RUST_LOG brings it back.
        let _logs = init_logs("error");
        let limits = Limits {
            started: Instant::now(),
            connect: self.connect_timeout,
            whole: self.timeout,
            idle: self.idle_timeout,
        };
        match self.color {
            Color::Auto => {}
            Color::Always => anstream::ColorChoice::Always.write_global(),
            Color::Never => anstream::ColorChoice::Never.write_global(),
        }
        let stdout = io::stdout();
        let mut render = Render::new(anstream::AutoStream::auto(stdout.lock()), self.format());
        let notes = Notes::new(io::stderr());
        let verbose = self
            .verbose
            .then(|| Verbose::new(notes.note(), limits.started));
        let mut taps: Vec<runloop::client::Tap> = capture.iter().map(Capture::tap).collect();
        if let Some(verbose) = &verbose {
            let verbose = Arc::clone(verbose);
            taps.push(Arc::new(move |sender, message: &[u8]| {
                verbose.frame(sender, message)
            }));
        }
        let tap: runloop::client::Tap = Arc::new(move |sender, message: &[u8]| {
            for tap in &taps {
                tap(sender, message);
            }
        });
        let ending = block_on(self.connect_and_run(
            limits,
            &token,
            (request, prompt),
            tap,
            &mut render,
            notes.note(),
        ));
        if let Some(verbose) = &verbose {
            notes
                .note()
                .line(format!("{}\n", verbose.timing()).into_bytes());
        }
        // A time limit ends the rendering too: what came is shown, JSON
        // lines get their outcome record, then the failure says which limit.
        if let Ok(Err(Failure::TimedOut { option, after, .. })) = &ending {
            let _ = render.timed_out(option, *after);
        }
        notes.finish(DRAIN);
        let ending = ending??;
        if let Some(capture) = capture {
            capture.finish()?;
        }
        Ok(match ending.outcome {
            Some(outcome) if !ending.interrupted => Exit::of(&outcome),
            _ => Exit::Interrupted,
        })
    }

    /// The rendering the flags ask for.
    fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else if self.text {
            Format::Text
        } else if self.transcript {
            Format::Transcript
        } else if self.quiet {
            Format::Quiet
        } else {
            Format::Pretty
        }
    }
}

impl Args {
    /// Connects (to the embedded server, without `--url`), runs one loop
    /// and renders it, then closes the connection and ends the embedded
    /// server, whatever the loop did.
    async fn connect_and_run(
        &self,
        limits: Limits,
        token: &str,
        (request, prompt): (RunRequest, String),
        tap: runloop::client::Tap,
        render: &mut Render<impl Write>,
        notes: Note,
    ) -> Result<Ending, Failure> {
        let embedded = match &self.url {
            Some(_) => None,
            None => Some(embedded_server().await?),
        };
        let url = match (&self.url, &embedded) {
            (Some(url), _) => url.clone(),
            (None, Some((handle, _))) => handle.url(),
            (None, None) => unreachable!("an embedded server is started when no URL is given"),
        };
        // `--connect-timeout` bounds the connection here (exit 8, named).
        let mut config = ClientConfig::default().tap(tap).connect_timeout(None);
        config.tls = client_tls(&self.authorities)?;
        let client = limits
            .connect(Client::connect_with(&url, token, config))
            .await?
            .map_err(|error| Failure::Dial(DialError::client(&url, error)))?;
        let outcome = run_on(&client, limits, (request, prompt), render, notes).await;
        // Done, whatever happened (a refused run, a reader that went
        // away): close with a handshake, so that the server does not see
        // a connection that broke (protocol §12 "Clean ends").
        client.close().await;
        if let Some((handle, serving)) = embedded {
            handle.shutdown();
            let _ = serving.await;
        }
        outcome
    }
}

/// A server with the demo agent on a loopback port, serving.
async fn embedded_server() -> Result<(ServerHandle, JoinHandle<()>), Failure> {
    let config = ServerConfig::new(Credentials::Any, Catalog::demo());
    let server = Server::bind("127.0.0.1:0", config)
        .await
        .map_err(|error| Failure::bind("127.0.0.1:0", error))?;
    Ok(server.spawn())
}

/// Runs one loop on `client` and renders it; the run is stopped (and its
/// end awaited, for [`STOP_GRACE`] at most) before this returns, however
/// the rendering went.
async fn run_on(
    client: &Client,
    limits: Limits,
    (request, prompt): (RunRequest, String),
    render: &mut Render<impl Write>,
    note: Note,
) -> Result<Ending, Failure> {
    let run = limits
        .next(client.start(request))
        .await?
        .map_err(Failure::Run)?;
    let mut run_loop = run.run_loop(prompt);
    let interrupt = shutdown_signal();
    tokio::pin!(interrupt);
    let mut interrupted = false;
    let outcome = loop {
        let event = tokio::select! {
            event = limits.next(run_loop.next()) => match event {
                Ok(event) => event,
                Err(limit) => break Err(limit),
            },
            () = &mut interrupt, if !interrupted => {
                // Stop the run; the loop then ends as it did.
                interrupted = true;
                let run = run.clone();
                tokio::spawn(async move { run.stop().await });
                continue;
            }
            () = tokio::time::sleep(STOP_GRACE), if interrupted => {
                // The server did not end the run it was asked to stop.
                break Ok(None);
            }
        };
        let rendered = match event {
            Some(Event::Chunk { chunk, json }) => render.chunk_with_json(chunk, &json),
            Some(Event::Error(error)) => render.error(&error),
            Some(Event::End(outcome)) => {
                // Styled as stderr takes them, then queued as one note.
                let choice = anstream::AutoStream::choice(&io::stderr());
                let mut notes = anstream::AutoStream::new(Vec::new(), choice);
                let rendered = render.outcome(&outcome, Some(&mut notes));
                note.line(notes.into_inner());
                if let Some(unparsed) = crate::unparsed::note(&outcome) {
                    note.line(unparsed.into_bytes());
                }
                break rendered.map(|()| Some(outcome)).map_err(Failure::from);
            }
            None => break Ok(Some(Outcome::Broken(Broken::ConnectionEnded))),
        };
        if let Err(error) = rendered {
            // Nobody to show the rest to (`runloop run | head`).
            break Err(Failure::from(error));
        }
    };
    drop(run_loop);
    // A server that does not end a stopped run does not hold the command.
    let _ = tokio::time::timeout(STOP_GRACE, run.stop()).await;
    outcome.map(|outcome| Ending {
        outcome,
        interrupted,
    })
}

/// The `--capture` file, written by the client's tap.
#[derive(Debug, Clone)]
struct Capture {
    path: PathBuf,
    file: Arc<Mutex<CaptureFile>>,
}

#[derive(Debug)]
struct CaptureFile {
    out: BufWriter<File>,
    /// When the file was made: each line's time counts from it.
    start: Instant,
    /// The first write error; the capture stops there.
    failed: Option<io::Error>,
}

impl Capture {
    fn create(path: &PathBuf) -> Result<Capture, Failure> {
        let file = File::create(path).map_err(|source| Failure::Capture {
            path: path.display().to_string(),
            source,
        })?;
        let mut out = BufWriter::new(file);
        let header = "# runloop capture: +seconds since the start, '>' client to server, \
                      '<' server to client, the message in hex\n";
        let failed = out.write_all(header.as_bytes()).err();
        Ok(Capture {
            path: path.clone(),
            file: Arc::new(Mutex::new(CaptureFile {
                out,
                start: Instant::now(),
                failed,
            })),
        })
    }

    fn tap(&self) -> runloop::client::Tap {
        let file = Arc::clone(&self.file);
        Arc::new(move |sender: Role, message: &[u8]| {
            let direction = match sender {
                Role::Client => Direction::ClientToServer,
                Role::Server => Direction::ServerToClient,
            };
            let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if file.failed.is_some() {
                return;
            }
            // An authorization frame is kept as its header and mode byte:
            // the credential stays out of the file.
            let authorization = message.first() == Some(&(FrameType::Authorization as u8));
            let (message, note) = if authorization && message.len() > HEADER_LEN + 1 {
                (
                    &message[..HEADER_LEN + 1],
                    "# the credential is not recorded\n",
                )
            } else {
                (message, "")
            };
            let line = Line::new(direction, message).at(file.start.elapsed());
            let written = writeln!(file.out, "{note}{line}");
            if let Err(error) = written {
                file.failed = Some(error);
            }
        })
    }

    fn finish(self) -> Result<(), Failure> {
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = match file.failed.take() {
            Some(error) => Err(error),
            None => file.out.flush(),
        };
        result.map_err(|source| Failure::Capture {
            path: self.path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_arguments() {
        assert_eq!(
            image("demo"),
            Ok(ImageRef {
                name: "demo".into(),
                digest: ANY_DIGEST.into()
            })
        );
        let pinned = format!("agents/x@sha256:{}", "a".repeat(64));
        assert_eq!(image(&pinned).map(|i| i.name), Ok("agents/x".into()));
        assert!(image("Demo").is_err());
        assert!(image("demo@md5").is_err());
        let md5 = image(&format!("demo@md5:{}", "0".repeat(32))).expect_err("md5 is refused");
        assert!(
            md5.ends_with("a digest is sha256: followed by 64 lowercase hex digits"),
            "{md5}"
        );
    }
}
