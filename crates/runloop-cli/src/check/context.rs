//! The cases' shared context: the requests they send, the connections they
//! open, and what earlier cases learned that later ones depend on.
//!
//! Things learned early spare the rest of the check a cascade of misleading
//! failures and bounded-but-long waits: that an authorized connection is not
//! served at all (a wrong `--token`, a silent server), that no run can be
//! opened (a refused `--image`), and that a probe is not answered the way
//! docs/protocol.md says (then nothing can be shown disregarded with it). Cases that
//! need what is missing are skipped with the reason instead of failing one
//! by one; the case that found it has already failed.
//!
//! Cases that need an open run share one **session**, a connection with a
//! run open on it, for as long as they pass: a case takes it, and gives it
//! back only when it passed, so a case that failed (and may have left frames
//! in flight) never confuses the next one, which opens a fresh session.

use std::time::Duration;

use runloop::tls::ClientTls;
use runloop_proto::Encode;
use runloop_proto::agents_run::{Container, FuseMount, Image, RunRequest};
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::error_chain::Chain;
use runloop_proto::run_loop::RunLoopRequest;

use super::wire::{RunAnswer, Wire};
use super::{Args, Checked, Verdict, seconds};

/// Memory asked for each run, bytes (1 GiB).
pub(super) const MEMORY: u64 = 1 << 30;
/// Disk asked for each run, bytes (1 GiB).
pub(super) const DISK: u64 = 1 << 30;

/// How long the check waits for stragglers after a scope's finish.
pub(super) const SETTLE: Duration = Duration::from_millis(250);

/// A connection with a run open on it.
pub(super) struct Session {
    pub(super) wire: Wire,
    /// The run's scope.
    pub(super) scope: u32,
}

/// What every case reads, and what the cases learn along the way.
pub(super) struct Ctx {
    pub(super) url: String,
    /// Whom a `wss://` server's certificate must come from (`--ca`).
    pub(super) tls: Option<ClientTls>,
    token: String,
    /// The run request, for the library's client.
    pub(super) request: RunRequest,
    /// The run request as a type-1 payload: `[0]` and its JSON.
    pub(super) run_request: Vec<u8>,
    /// The same with a FUSE mount at `../escape`.
    pub(super) mount_request: Vec<u8>,
    /// The run-loop request as a type-4 payload: `[5]{"prompt"}`.
    pub(super) run_loop_request: Vec<u8>,
    pub(super) prompt: String,
    /// How long any one wait lasts.
    pub(super) timeout: Duration,
    /// The server could not be reached once; why.
    unreachable: Option<String>,
    /// An authorized connection was not served; why.
    unserved: Option<String>,
    /// A run could not be opened; why.
    no_run: Option<String>,
    /// An unknown endpoint does not get a bare finish.
    no_probe: bool,
    /// An unknown channel tag does not get a bare channel finish.
    no_run_probe: bool,
    session: Option<Session>,
}

impl Ctx {
    pub(super) fn new(args: &Args, token: String, tls: Option<ClientTls>) -> Ctx {
        let container = Container::new(Image::Server(args.image.clone()), MEMORY, DISK);
        let request = RunRequest::new(container, args.agent.clone());
        let mut with_mount = request.clone();
        with_mount.container.fuse_file_mounts.push(FuseMount {
            container_path: vec!["..".to_owned(), "escape".to_owned()],
            id: 1,
            readonly: None,
        });
        let Ok(run_loop_request) =
            ChannelRequest::RunLoop(RunLoopRequest::new(args.prompt.clone())).to_vec();
        Ctx {
            url: args.url.clone(),
            tls,
            token,
            run_request: endpoint_payload(&request),
            mount_request: endpoint_payload(&with_mount),
            request,
            run_loop_request,
            prompt: args.prompt.clone(),
            timeout: args.timeout,
            unreachable: None,
            unserved: None,
            no_run: None,
            no_probe: false,
            no_run_probe: false,
            session: None,
        }
    }

    /// The credential `--token` gave.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// The type-0 payload of `--token`.
    pub(super) fn authorization(&self) -> Vec<u8> {
        let Ok(payload) = Authorization::Unbrokered(&self.token).to_vec();
        payload
    }

    /// Notes that an authorized connection is not served, and says so.
    pub(super) fn unserved(&mut self, verdict: Verdict) -> Verdict {
        self.unserved = Some(verdict.detail().to_owned());
        verdict
    }

    /// Whether no served connection can be had: the server could not be
    /// reached again, or an authorized connection is not served (a refused
    /// credential). The check stops there.
    pub(super) fn no_connection(&self) -> bool {
        self.unreachable.is_some() || self.unserved.is_some()
    }

    /// Skips a case that needs a served connection when there is none.
    pub(super) fn needs_connection(&self) -> Checked<()> {
        if let Some(why) = &self.unreachable {
            return Err(Verdict::Skip(format!(
                "the server could not be reached: {why}"
            )));
        }
        match &self.unserved {
            Some(why) => Err(Verdict::Skip(format!(
                "an authorized connection is not served: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Skips a case that needs a run when none could be opened.
    pub(super) fn needs_run(&self) -> Checked<()> {
        self.needs_connection()?;
        match &self.no_run {
            Some(why) => Err(Verdict::Skip(format!(
                "needs a run, and none could be opened: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Notes that the probe cannot be relied on, and says so.
    pub(super) fn probe_broken(&mut self, verdict: Verdict) -> Verdict {
        self.no_probe = true;
        verdict
    }

    /// Notes that the run probe cannot be relied on, and says so.
    pub(super) fn run_probe_broken(&mut self, verdict: Verdict) -> Verdict {
        self.no_run_probe = true;
        verdict
    }

    /// Skips a case that shows something disregarded with the probe when
    /// the probe itself is not answered by the rules.
    pub(super) fn needs_probe(&self) -> Checked<()> {
        if self.no_probe {
            return Err(Verdict::Skip(
                "the probe this case relies on, a request with unknown endpoint tag 200, does \
                 not get a bare finish from this server (see §4 above)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The same for the run probe (and the probe).
    pub(super) fn needs_run_probe(&self) -> Checked<()> {
        self.needs_probe()?;
        if self.no_run_probe {
            return Err(Verdict::Skip(
                "the probe this case relies on, a channel request with unknown tag 200, does not \
                 get a bare channel finish from this server (see §6 above)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// A new WebSocket to the server, not authorized.
    pub(super) async fn dial(&mut self) -> Checked<Wire> {
        if let Some(why) = &self.unreachable {
            return Err(Verdict::Skip(format!(
                "the server could not be reached: {why}"
            )));
        }
        match Wire::dial(&self.url, self.tls.as_ref(), self.timeout).await {
            Ok(wire) => Ok(wire),
            Err(error) => {
                let why = format!("{}{}", Chain(&error), error.hint());
                self.unreachable = Some(why.clone());
                Err(Verdict::Fail(why))
            }
        }
    }

    /// A new connection, authorized with `--token`.
    pub(super) async fn connect(&mut self) -> Checked<Wire> {
        self.needs_connection()?;
        let mut wire = self.dial().await?;
        wire.authorize(&self.authorization()).await?;
        Ok(wire)
    }

    /// A new connection with a run open on it: the wire, the run's scope.
    pub(super) async fn open_run(&mut self) -> Checked<(Wire, u32)> {
        self.needs_run()?;
        let mut wire = self.connect().await?;
        let scope = wire.fresh_scope();
        match wire.answer_run(scope, &self.run_request).await {
            Ok(RunAnswer::Id(_)) => Ok((wire, scope)),
            Ok(RunAnswer::Refused(error)) => {
                let why = format!("the server refused the run (is --image right?): {error}");
                self.no_run = Some(why.clone());
                Err(Verdict::Skip(why))
            }
            Err(verdict) => {
                self.no_run = Some(verdict.detail().to_owned());
                Err(verdict)
            }
        }
    }

    /// The shared session, or a new one.
    pub(super) async fn session(&mut self) -> Checked<Session> {
        if let Some(session) = self.session.take() {
            return Ok(session);
        }
        let (wire, scope) = self.open_run().await?;
        Ok(Session { wire, scope })
    }

    /// Gives the session back after a case that passed.
    pub(super) fn keep(&mut self, session: Session) {
        self.session = Some(session);
    }

    /// Closes the session's connection, which ends its run.
    pub(super) async fn close(&mut self) {
        if let Some(session) = self.session.take() {
            session.wire.close().await;
        }
    }

    /// The timeout in words.
    pub(super) fn waited(&self) -> String {
        seconds(self.timeout)
    }
}

/// `[0]` and the request's JSON.
fn endpoint_payload(request: &RunRequest) -> Vec<u8> {
    EndpointRequest::AgentsRun(Box::new(request.clone()))
        .to_vec()
        // Strings, integers and an `agent` that parsed as JSON when the
        // arguments were read: serialization has nothing that can fail.
        .expect("a run request always serializes")
}
