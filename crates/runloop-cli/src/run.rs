//! `runloop run`: one loop, end to end, rendered as it streams.
//!
//! Without `--url` it starts an embedded server with the built-in demo
//! agent on a loopback port and runs against it over real sockets, so the
//! command works on a fresh machine with no setup. The exit code is the
//! loop's ending (see [`Exit`]); Ctrl-C stops the run, and the loop then
//! ends unfinished, as it did.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use runloop::client::{Client, ClientConfig, Event};
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::agents_run::{
    Container, Image, ImageRef, RegistryImage, RunRequest, is_valid_digest, is_valid_name,
};
use runloop_proto::capture::{Direction, Line};
use runloop_proto::frame::{FrameType, HEADER_LEN, Role};
use runloop_proto::run_loop::{Broken, Outcome};
use serde_json::value::RawValue;
use tokio::task::JoinHandle;

use crate::exit::{Exit, Failure};
use crate::process::{block_on, client_tls, init_logs, shutdown_signal};
use crate::render::{Format, Render};
use crate::serve::bytes;

/// The digest sent when `--image` names none: any unpinned catalog entry
/// accepts it.
pub const ANY_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Arguments of `runloop run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The prompt; read from standard input when absent.
    pub prompt: Option<String>,
    /// The provider server (ws://HOST:PORT). Without it, an embedded server
    /// with the built-in demo agent runs on a loopback port.
    #[arg(long)]
    pub url: Option<String>,
    /// The credential. Every local user can read it in /proc/PID/cmdline:
    /// prefer --token-file or RUNLOOP_TOKEN (the default; empty if unset).
    #[arg(long)]
    pub token: Option<String>,
    /// A file holding the credential (one line).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// The server image to run: NAME or NAME@DIGEST. Without a digest,
    /// sha256:0…0 is sent, which unpinned catalog entries accept.
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
    /// Bytes the container may write (K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = bytes)]
    pub disk: u64,
    /// One JSON object per line: {"chunk":…}, {"error":…}, then {"outcome":…}.
    #[arg(long)]
    pub json: bool,
    /// Record every frame of the connection, both directions, to FILE, in
    /// the format `runloop decode` reads. The credential is not recorded.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// For wss://, also trust the certificate authorities in FILE (PEM;
    /// repeatable), besides the platform's.
    #[arg(long = "ca", value_name = "FILE")]
    pub authorities: Vec<PathBuf>,
}

/// `NAME` or `NAME@DIGEST`, checked as the server will check it.
pub fn image(text: &str) -> Result<ImageRef, String> {
    let (name, digest) = text.split_once('@').unwrap_or((text, ANY_DIGEST));
    if !is_valid_name(name) {
        return Err(format!(
            "{name:?} is not an image name (a repository path without a host)"
        ));
    }
    if !is_valid_digest(digest) {
        return Err(format!("{digest:?} is not a digest (<algorithm>:<hex>)"));
    }
    Ok(ImageRef {
        name: name.to_owned(),
        digest: digest.to_owned(),
    })
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
        if let Some(prompt) = &self.prompt {
            return Ok(prompt.clone());
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
        let format = if self.json {
            Format::Json
        } else {
            Format::Text
        };
        let stdout = io::stdout();
        let mut render = Render::new(anstream::AutoStream::auto(stdout.lock()), format);
        let tap = capture.as_ref().map(Capture::tap);
        let outcome = block_on(self.connect_and_run(&token, request, prompt, tap, &mut render))??;
        if let Some(capture) = capture {
            capture.finish()?;
        }
        Ok(Exit::of(&outcome))
    }
}

impl Args {
    /// Connects (to the embedded server, without `--url`), runs one loop
    /// and renders it, then closes the connection and ends the embedded
    /// server, whatever the loop did.
    async fn connect_and_run(
        &self,
        token: &str,
        request: RunRequest,
        prompt: String,
        tap: Option<runloop::client::Tap>,
        render: &mut Render<impl Write>,
    ) -> Result<Outcome, Failure> {
        let embedded = match &self.url {
            Some(_) => None,
            None => Some(embedded_server().await?),
        };
        let url = match (&self.url, &embedded) {
            (Some(url), _) => url.clone(),
            (None, Some((handle, _))) => handle.url(),
            (None, None) => unreachable!("an embedded server is started when no URL is given"),
        };
        let config = ClientConfig {
            tap,
            tls: client_tls(&self.authorities)?,
            ..ClientConfig::default()
        };
        let client = Client::connect_with(&url, token, config)
            .await
            .map_err(|source| Failure::Connect {
                url: url.clone(),
                source: source.into(),
            })?;
        let outcome = run_on(&client, request, prompt, render).await;
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
/// end awaited) before this returns, however the rendering went.
async fn run_on(
    client: &Client,
    request: RunRequest,
    prompt: String,
    render: &mut Render<impl Write>,
) -> Result<Outcome, Failure> {
    let run = client.start(request).await.map_err(Failure::Run)?;
    let mut run_loop = run.run_loop(prompt);
    let mut interrupted = false;
    let outcome = loop {
        let event = tokio::select! {
            event = run_loop.next() => event,
            () = shutdown_signal(), if !interrupted => {
                // Stop the run; the loop then ends as it did.
                interrupted = true;
                let run = run.clone();
                tokio::spawn(async move { run.stop().await });
                continue;
            }
        };
        let rendered = match event {
            Some(Event::Chunk { chunk, json }) => render.chunk_with_json(chunk, &json),
            Some(Event::Error(error)) => render.error(&error),
            Some(Event::End(outcome)) => {
                break render
                    .outcome(&outcome)
                    .map(|()| outcome)
                    .map_err(Failure::from);
            }
            None => break Ok(Outcome::Broken(Broken::ConnectionEnded)),
        };
        if let Err(error) = rendered {
            // Nobody to show the rest to (`runloop run | head`).
            break Err(Failure::from(error));
        }
    };
    drop(run_loop);
    run.stop().await;
    outcome
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
    /// The first write error; the capture stops there.
    failed: Option<io::Error>,
}

impl Capture {
    fn create(path: &PathBuf) -> Result<Capture, Failure> {
        let file = File::create(path).map_err(|source| Failure::Input {
            name: path.display().to_string(),
            source,
        })?;
        let mut out = BufWriter::new(file);
        let header = "# runloop capture: '>' client to server, '<' server to client\n";
        let failed = out.write_all(header.as_bytes()).err();
        Ok(Capture {
            path: path.clone(),
            file: Arc::new(Mutex::new(CaptureFile { out, failed })),
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
            let written = writeln!(file.out, "{note}{}", Line::new(direction, message));
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
    }
}
