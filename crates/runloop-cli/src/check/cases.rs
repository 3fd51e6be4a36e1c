//! The cases: what the check sends, and what protocol §1–§7 requires every
//! provider server to do about it.
//!
//! Each case is one row of [`CASES`]: the section it checks, whether it is a
//! MUST or informational, and a small async function that sends something,
//! reads what comes back, and returns a [`Verdict`]. A new case is a new
//! function and a new row. The rows run in order; the first ones learn
//! whether a connection is served and whether a run can be opened, and the
//! [`Ctx`] skips later cases that need what is missing. A case that shows
//! something disregarded needs the probe (see the `wire` module), so the
//! cases that check the probe's own requests run first.
//!
//! Only what docs/protocol.md requires of every server is a MUST here. What §12 says
//! is this project's policy (which images run, an authorization deadline) is
//! never required: another provider may decide otherwise. A server that
//! accepts any credential is conformant (a credential is opaque to the
//! protocol) and is reported as INFO.
//!
//! ```text
//! §3  the library client: connect, authorize, one run request      → an id or an error
//! §4  [200]…, an empty request                                     → bare finish
//! §5  [0] with no JSON, bad JSON, JSON of the wrong form           → bare finish
//! §5  a valid run                                                  → [0]{"id"} first
//! §5  a FUSE mount at ../escape                                    → one error, the finish
//! §6  channel: empty, tag 200; §7 run-loop: bad JSON, no prompt    → bare channel finish
//! §2  truncated, types 2 3 7 255, 5 and 6 for no server channel,
//!     a channel on a scope not open, a request on the run's scope,
//!     §1 a text message                                            → disregarded (probe)
//! §5  stop the shared run                                          → its finish, nothing before
//! §7  the library client: a run-loop with --prompt                 → a valid sequence
//! §6  stop, stop with trailing bytes, stop during a loop           → the finish; nothing after
//! §2  a run again on a finished scope's number                     → answered
//! §3  a second authorization                                       → the connection ends
//! §3  a random credential, mode 7, a credential not UTF-8          → closed with no frame
//! §12 (--slow) never authorize                                     → closed (informational)
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use runloop::client::{Client, ClientConfig, Event, RunError};
use runloop_proto::authorization;
use runloop_proto::error_chain::Chain;
use runloop_proto::frame::{self, ClientFrame, FrameType, HEADER_LEN, raw};
use runloop_proto::run_loop::{Broken, Outcome, Reader, Step};
use tokio::time::timeout;

use super::context::{Ctx, SETTLE};
use super::wire::{Frame, Next, RunAnswer, UNKNOWN_TAG, Wire, show};
use super::{Checked, Level, Verdict, seconds};

/// A boxed case future; it borrows the context for as long as it runs.
type CaseFuture<'a> = Pin<Box<dyn Future<Output = Checked> + 'a>>;

/// One case of the check.
pub(super) struct Case {
    /// The section of docs/protocol.md it checks, `§N`.
    pub(super) section: &'static str,
    /// What it checks, as a statement that holds when it passes.
    pub(super) name: &'static str,
    /// Whether failing it breaks conformance.
    pub(super) level: Level,
    /// Whether it runs only with `--slow`.
    pub(super) slow: bool,
    /// The case itself.
    pub(super) run: for<'a> fn(&'a mut Ctx) -> CaseFuture<'a>,
}

const fn must(
    section: &'static str,
    name: &'static str,
    run: for<'a> fn(&'a mut Ctx) -> CaseFuture<'a>,
) -> Case {
    Case {
        section,
        name,
        level: Level::Must,
        slow: false,
        run,
    }
}

/// How long `--slow` waits for a connection that never authorizes to close.
const SLOW_WAIT: Duration = Duration::from_secs(30);

/// Every case, in the order they run.
pub(super) const CASES: &[Case] = &[
    must(
        "§3",
        "an authorized connection is served: a run request gets an answer",
        |ctx| Box::pin(served(ctx)),
    ),
    must("§4", "unknown endpoint tag 200 gets a bare finish", |ctx| {
        Box::pin(unknown_endpoint(ctx))
    }),
    must("§4", "an empty request gets a bare finish", |ctx| {
        Box::pin(bare_finish(ctx, b""))
    }),
    must(
        "§5",
        "containers::agents::run requests that do not decode get bare finishes",
        |ctx| Box::pin(undecodable_run(ctx)),
    ),
    must("§5", "a run request is answered with the id first", |ctx| {
        Box::pin(run_answered(ctx))
    }),
    must(
        "§5",
        "a request with an invalid mount gets one error response, then the finish",
        |ctx| Box::pin(invalid_mount(ctx)),
    ),
    must(
        "§6",
        "an empty channel request gets a bare channel finish",
        |ctx| Box::pin(bare_channel_finish(ctx, b"")),
    ),
    must(
        "§6",
        "unknown channel tag 200 gets a bare channel finish",
        |ctx| Box::pin(unknown_channel(ctx)),
    ),
    must(
        "§7",
        "a run-loop request with bad JSON gets a bare channel finish",
        |ctx| Box::pin(bare_channel_finish(ctx, b"\x05{\"prompt\":")),
    ),
    must(
        "§7",
        "a run-loop request without a prompt gets a bare channel finish",
        |ctx| Box::pin(bare_channel_finish(ctx, b"\x05{}")),
    ),
    must(
        "§7",
        "a run-loop request whose prompt is not a string gets a bare channel finish",
        |ctx| Box::pin(bare_channel_finish(ctx, b"\x05{\"prompt\":7}")),
    ),
    must(
        "§2",
        "a channel number is free again after its finish",
        |ctx| Box::pin(channel_reuse(ctx)),
    ),
    must(
        "§2",
        "truncated frames (0 to 8 bytes) are disregarded",
        |ctx| Box::pin(truncated(ctx)),
    ),
    must(
        "§2",
        "frames of types a client may not send (2, 3, 7, 255) are disregarded",
        |ctx| Box::pin(undefined_types(ctx)),
    ),
    must(
        "§2",
        "responses on server channels that are not open are disregarded",
        |ctx| Box::pin(stray_channel_responses(ctx)),
    ),
    must(
        "§2",
        "channel requests on scopes that are not open are disregarded",
        |ctx| Box::pin(channel_on_closed_scope(ctx)),
    ),
    must(
        "§2",
        "requests naming the open run's scope are disregarded and the run goes on",
        |ctx| Box::pin(request_on_open_scope(ctx)),
    ),
    must("§1", "text messages are ignored", |ctx| {
        Box::pin(text_message(ctx))
    }),
    must(
        "§5",
        "after the id, nothing comes on the main stream until the finish",
        |ctx| Box::pin(main_stream_quiet(ctx)),
    ),
    must("§7", "a run-loop's response sequence is valid", |ctx| {
        Box::pin(run_loop(ctx))
    }),
    must(
        "§6",
        "stop is answered by the scope's finish alone, and nothing of the scope follows",
        |ctx| Box::pin(stop(ctx, b"\x00")),
    ),
    must(
        "§6",
        "a stop request with bytes after 0x00 stops the run",
        |ctx| Box::pin(stop(ctx, b"\x00\x2a\x2a")),
    ),
    must(
        "§6",
        "stop during a run-loop: the loop's channel ends before the scope's finish",
        |ctx| Box::pin(stop_during_loop(ctx)),
    ),
    must(
        "§2",
        "a scope number is free again after its finish",
        |ctx| Box::pin(scope_reuse(ctx)),
    ),
    must(
        "§3",
        "a second authorization frame ends the connection",
        |ctx| Box::pin(second_authorization(ctx)),
    ),
    must(
        "§3",
        "a wrong credential: the connection is closed with no frame",
        |ctx| Box::pin(wrong_credential(ctx)),
    ),
    must(
        "§3",
        "authorization mode 7 is rejected: the connection is closed with no frame",
        |ctx| Box::pin(unknown_mode(ctx)),
    ),
    must(
        "§3",
        "a credential that is not UTF-8 is rejected: the connection is closed with no frame",
        |ctx| Box::pin(not_utf8(ctx)),
    ),
    Case {
        section: "§12",
        name: "a connection that never authorizes is closed after a grace period",
        level: Level::Info,
        slow: true,
        run: |ctx| Box::pin(never_authorizes(ctx)),
    },
];

fn pass(detail: impl Into<String>) -> Checked {
    Ok(Verdict::Pass(detail.into()))
}

fn fail<T>(detail: impl Into<String>) -> Checked<T> {
    Err(Verdict::Fail(detail.into()))
}

/// Connects with the library's client, bounded by the timeout.
async fn client(ctx: &Ctx) -> Result<Client, Verdict> {
    // Bounded here by the check's own timeout, which says so in its words.
    let mut config = ClientConfig::default().connect_timeout(None);
    config.tls = ctx.tls.clone();
    match timeout(
        ctx.timeout,
        Client::connect_with(&ctx.url, ctx.token(), config),
    )
    .await
    {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => fail(Chain(&error).to_string()),
        Err(_) => fail(format!("no connection within {}", ctx.waited())),
    }
}

async fn served(ctx: &mut Ctx) -> Checked {
    ctx.needs_connection()?;
    let client = match client(ctx).await {
        Ok(client) => client,
        Err(verdict) => return Err(ctx.unserved(verdict)),
    };
    let answer = timeout(ctx.timeout, client.start(ctx.request.clone())).await;
    let verdict = match answer {
        Ok(Ok(run)) => pass(format!("the id ({} characters)", run.id().len())),
        Ok(Err(RunError::Refused(error))) => pass(format!("an error: {error}")),
        Ok(Err(RunError::NotServed)) => fail(
            "a bare finish, but a request that decodes is answered with the id or an error (§5)",
        ),
        Ok(Err(RunError::CredentialRefused)) => Err(ctx.unserved(Verdict::Skip(
            "the server closed the connection with no frame, as it does for a refused \
             credential (§3): is --token right?"
                .to_owned(),
        ))),
        Ok(Err(RunError::NoCredential)) => Err(ctx.unserved(Verdict::Skip(
            "the server closed the connection with no frame, as it does for a refused \
             credential (§3), and none was sent: pass one with --token-file FILE or \
             RUNLOOP_TOKEN"
                .to_owned(),
        ))),
        Ok(Err(error)) => fail(Chain(&error).to_string()),
        Err(_) => Err(ctx.unserved(Verdict::Fail(format!(
            "no answer to a run request within {}",
            ctx.waited()
        )))),
    };
    let _ = timeout(ctx.timeout, client.close()).await;
    verdict
}

/// The probe's own request; when it is not answered by the rules, the
/// cases that rely on the probe are skipped.
async fn unknown_endpoint(ctx: &mut Ctx) -> Checked {
    let mut wire = ctx.connect().await?;
    match expect_bare_finish(&mut wire, b"\xc8{}").await {
        Ok(()) => pass(""),
        Err(verdict) => Err(ctx.probe_broken(verdict)),
    }
}

/// A request the server must answer with a bare finish, then the probe.
async fn bare_finish(ctx: &mut Ctx, payload: &[u8]) -> Checked {
    ctx.needs_probe()?;
    let mut wire = ctx.connect().await?;
    expect_bare_finish(&mut wire, payload).await?;
    pass("")
}

async fn expect_bare_finish(wire: &mut Wire, payload: &[u8]) -> Checked<()> {
    let scope = wire.fresh_scope();
    wire.request(scope, payload).await?;
    wire.expect(Frame::Finish { scope }).await?;
    wire.probe(&format!("the bare finish of scope {scope}"))
        .await
}

async fn undecodable_run(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let mut wire = ctx.connect().await?;
    let payloads: [&[u8]; 4] = [b"\x00", b"\x00{", b"\x00[]", b"\x00{\"agent\":{}}"];
    for payload in payloads {
        expect_bare_finish(&mut wire, payload)
            .await
            .map_err(|v| v.context(&format!("request {}", show(payload))))?;
    }
    pass("")
}

async fn run_answered(ctx: &mut Ctx) -> Checked {
    let session = ctx.session().await?;
    let scope = session.scope;
    ctx.keep(session);
    pass(format!(
        "the id came first on scope {scope}; the run stays open for the cases below"
    ))
}

async fn invalid_mount(ctx: &mut Ctx) -> Checked {
    ctx.needs_run()?;
    ctx.needs_probe()?;
    let mut wire = ctx.connect().await?;
    let scope = wire.fresh_scope();
    match wire.answer_run(scope, &ctx.mount_request).await? {
        RunAnswer::Refused(error) => {
            wire.probe(&format!("the finish of scope {scope}")).await?;
            pass(format!("refused: {error}"))
        }
        RunAnswer::Id(_) => {
            let _ = wire.stop(scope, b"\x00").await;
            fail(
                "the run started (it got an id) though fuse_file_mounts[0].container_path \
                 is [\"..\", \"escape\"]",
            )
        }
    }
}

/// The run probe's own request; when it is not answered by the rules, the
/// cases that rely on the run probe are skipped.
async fn unknown_channel(ctx: &mut Ctx) -> Checked {
    match bare_channel_finish(ctx, b"\xc8{}").await {
        Err(verdict @ Verdict::Fail(_)) => Err(ctx.run_probe_broken(verdict)),
        other => other,
    }
}

/// A channel request the server must answer with a bare channel finish.
async fn bare_channel_finish(ctx: &mut Ctx, payload: &[u8]) -> Checked {
    ctx.needs_probe()?;
    let mut session = ctx.session().await?;
    let scope = session.scope;
    let channel = session.wire.fresh_channel();
    session
        .wire
        .channel_request(scope, channel, payload)
        .await?;
    session
        .wire
        .expect(Frame::ChannelFinish { scope, channel })
        .await?;
    session
        .wire
        .probe(&format!("the finish of channel {channel}"))
        .await?;
    ctx.keep(session);
    pass("")
}

async fn channel_reuse(ctx: &mut Ctx) -> Checked {
    let mut session = ctx.session().await?;
    let scope = session.scope;
    let channel = session.wire.fresh_channel();
    for attempt in ["first", "second"] {
        session
            .wire
            .channel_request(scope, channel, &[UNKNOWN_TAG])
            .await?;
        session
            .wire
            .expect(Frame::ChannelFinish { scope, channel })
            .await
            .map_err(|v| v.context(&format!("the {attempt} request on channel {channel}")))?;
    }
    ctx.keep(session);
    pass("")
}

async fn truncated(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let mut session = ctx.session().await?;
    let channel = session.wire.fresh_channel();
    let whole = frame::to_message(&ClientFrame::ChannelRequest {
        scope: session.scope,
        channel,
        payload: &[UNKNOWN_TAG],
    });
    for len in 0..HEADER_LEN {
        let short = whole.iter().copied().take(len).collect();
        session.wire.send(short).await?;
    }
    session.wire.probe("messages of 0 to 8 bytes").await?;
    ctx.keep(session);
    pass("")
}

async fn undefined_types(ctx: &mut Ctx) -> Checked {
    ctx.needs_run_probe()?;
    let mut session = ctx.session().await?;
    let scope = session.scope;
    let messages = [
        raw(
            FrameType::Response as u8,
            scope,
            0,
            b"\x00{\"id\":\"forged\"}",
        ),
        raw(FrameType::ResponseFinish as u8, scope, 0, b""),
        raw(7, scope, 0, &[UNKNOWN_TAG]),
        raw(255, scope, 0, &[UNKNOWN_TAG]),
    ];
    for message in messages {
        session.wire.send(message).await?;
    }
    let after = format!("frames of types 2, 3, 7 and 255 naming scope {scope}");
    session.wire.probe(&after).await?;
    session.wire.run_probe(scope, &after).await?;
    ctx.keep(session);
    pass("")
}

async fn stray_channel_responses(ctx: &mut Ctx) -> Checked {
    ctx.needs_run_probe()?;
    let mut session = ctx.session().await?;
    let scope = session.scope;
    session
        .wire
        .send_frame(&ClientFrame::ChannelResponse {
            scope,
            channel: 0,
            payload: b"\x00{}",
        })
        .await?;
    session
        .wire
        .send_frame(&ClientFrame::ChannelResponseFinish { scope, channel: 0 })
        .await?;
    let after = format!("a response and a finish on server channel 0 of scope {scope}");
    session.wire.probe(&after).await?;
    session.wire.run_probe(scope, &after).await?;
    ctx.keep(session);
    pass("")
}

async fn channel_on_closed_scope(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let mut wire = ctx.connect().await?;
    let never_opened = wire.fresh_scope();
    let finished = wire.fresh_scope();
    wire.request(finished, &[UNKNOWN_TAG]).await?;
    wire.expect(Frame::Finish { scope: finished }).await?;
    for scope in [never_opened, finished] {
        let channel = wire.fresh_channel();
        wire.channel_request(scope, channel, &[UNKNOWN_TAG]).await?;
        let channel = wire.fresh_channel();
        wire.channel_request(scope, channel, b"\x00").await?;
    }
    wire.probe(&format!(
        "channel requests (tag 200, and a stop) on scope {never_opened}, never opened, \
         and on scope {finished}, finished"
    ))
    .await?;
    pass("")
}

async fn request_on_open_scope(ctx: &mut Ctx) -> Checked {
    ctx.needs_run_probe()?;
    let mut session = ctx.session().await?;
    let scope = session.scope;
    session.wire.request(scope, &[UNKNOWN_TAG]).await?;
    let run_request = ctx.run_request.clone();
    session.wire.request(scope, &run_request).await?;
    let after = format!("an unknown request and a run request on the open scope {scope}");
    session.wire.probe(&after).await?;
    session.wire.run_probe(scope, &after).await?;
    ctx.keep(session);
    pass("")
}

async fn text_message(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let mut wire = ctx.connect().await?;
    let scope = wire.fresh_scope();
    // A request frame of unknown tag 127, all ASCII, so it can travel as
    // text: a server that read it as a frame would bare-finish `scope`.
    let frame = raw(FrameType::Request as u8, scope, 0, &[0x7f]);
    wire.send_text(String::from_utf8_lossy(&frame).into_owned())
        .await?;
    wire.probe(&format!(
        "a text message holding the bytes of a request on scope {scope}"
    ))
    .await?;
    pass("")
}

async fn main_stream_quiet(ctx: &mut Ctx) -> Checked {
    let mut session = ctx.session().await?;
    let scope = session.scope;
    let channel = session.wire.stop(scope, b"\x00").await?;
    session
        .wire
        .expect(Frame::Finish { scope })
        .await
        .map_err(|v| v.context(&format!("after a stop on channel {channel}")))?;
    session
        .wire
        .quiet(SETTLE, &format!("the finish of scope {scope}"))
        .await?;
    pass(format!(
        "the run on scope {scope} served the cases above, and stopping it brought its finish \
         next"
    ))
}

async fn run_loop(ctx: &mut Ctx) -> Checked {
    ctx.needs_run()?;
    let client = client(ctx).await?;
    let verdict = loop_outcome(ctx, &client).await;
    let _ = timeout(ctx.timeout, client.close()).await;
    verdict
}

async fn loop_outcome(ctx: &Ctx, client: &Client) -> Checked {
    let run = match timeout(ctx.timeout, client.start(ctx.request.clone())).await {
        Ok(Ok(run)) => run,
        Ok(Err(RunError::Refused(error))) => {
            return Err(Verdict::Skip(format!(
                "the run was refused this time: {error}"
            )));
        }
        Ok(Err(error)) => return fail(format!("the run did not start: {}", Chain(&error))),
        Err(_) => {
            return fail(format!(
                "no answer to a run request within {}",
                ctx.waited()
            ));
        }
    };
    let mut run_loop = run.run_loop(ctx.prompt.as_str());
    let mut chunks = 0_u64;
    let outcome = loop {
        match timeout(ctx.timeout, run_loop.next()).await {
            Ok(Some(Event::Chunk { .. })) => chunks += 1,
            Ok(Some(Event::Error(_))) => {}
            Ok(Some(Event::End(outcome))) => break outcome,
            // The stream says `End` before it ends; this is only for completeness.
            Ok(None) => break Outcome::Broken(Broken::ConnectionEnded),
            Err(_) => {
                return fail(format!(
                    "no channel response or finish within {} ({} so far)",
                    ctx.waited(),
                    counted(chunks)
                ));
            }
        }
    };
    let _ = timeout(ctx.timeout, run.stop()).await;
    match outcome {
        Outcome::Broken(why) => fail(format!("broken after {}: {}", counted(chunks), Chain(&why))),
        outcome => pass(format!(
            "{} ({}): {outcome}",
            outcome.name(),
            counted(chunks)
        )),
    }
}

/// `1 chunk`, `2 chunks`.
fn counted(chunks: u64) -> String {
    match chunks {
        1 => "1 chunk".to_owned(),
        n => format!("{n} chunks"),
    }
}

async fn stop(ctx: &mut Ctx, payload: &[u8]) -> Checked {
    ctx.needs_probe()?;
    let (mut wire, scope) = ctx.open_run().await?;
    let channel = wire.stop(scope, payload).await?;
    wire.expect(Frame::Finish { scope })
        .await
        .map_err(|v| v.context(&format!("after a stop on channel {channel}")))?;
    settled(&mut wire, scope).await
}

/// After a scope's finish: nothing for a moment, then the probe answered.
async fn settled(wire: &mut Wire, scope: u32) -> Checked {
    let after = format!("the finish of scope {scope}");
    wire.quiet(SETTLE, &after).await?;
    wire.probe(&after).await?;
    pass(format!(
        "nothing of scope {scope} came in the {} after its finish, nor before the probe's",
        seconds(SETTLE)
    ))
}

async fn stop_during_loop(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let (mut wire, scope) = ctx.open_run().await?;
    let looping = wire.fresh_channel();
    let run_loop_request = ctx.run_loop_request.clone();
    wire.channel_request(scope, looping, &run_loop_request)
        .await?;
    let stop = wire.stop(scope, b"\x00").await?;
    let mut reader = Reader::new();
    let mut outcome = None;
    loop {
        let next = wire.next().await;
        match next {
            Next::Frame(Frame::ChannelResponse {
                scope: s,
                channel: c,
                payload,
            }) if (s, c) == (scope, looping) && outcome.is_none() => {
                if let Some(Step::End(broken)) = reader.response(&payload) {
                    return fail(format!("the loop's sequence: {broken}"));
                }
            }
            Next::Frame(Frame::ChannelFinish {
                scope: s,
                channel: c,
            }) if (s, c) == (scope, looping) && outcome.is_none() => {
                outcome = reader.finish();
            }
            Next::Frame(Frame::Finish { scope: s }) if s == scope => break,
            other => {
                return fail(format!(
                    "after a stop (channel {stop}) during a loop (channel {looping}), expected \
                     the loop's responses and finish, then the finish of scope {scope}; got {other}"
                ));
            }
        }
    }
    let Some(outcome) = outcome else {
        return fail(format!(
            "scope {scope} finished while its run-loop channel {looping} was still open: ending \
             a run ends every channel first (§5)"
        ));
    };
    settled(&mut wire, scope).await?;
    pass(format!(
        "the loop's channel ended ({}) before the finish of scope {scope}; nothing followed",
        outcome.name()
    ))
}

async fn scope_reuse(ctx: &mut Ctx) -> Checked {
    let (mut wire, scope) = ctx.open_run().await?;
    wire.stop(scope, b"\x00").await?;
    wire.expect(Frame::Finish { scope })
        .await
        .map_err(|v| v.context("after a stop"))?;
    let run_request = ctx.run_request.clone();
    let again = wire
        .answer_run(scope, &run_request)
        .await
        .map_err(|v| v.context(&format!("a run request on scope {scope} after its finish")))?;
    match again {
        RunAnswer::Id(_) => {
            wire.stop(scope, b"\x00").await?;
            wire.expect(Frame::Finish { scope })
                .await
                .map_err(|v| v.context("after stopping the second run"))?;
            pass(format!("scope {scope} opened a second run"))
        }
        RunAnswer::Refused(error) => pass(format!(
            "scope {scope} answered a second run request (refused: {error})"
        )),
    }
}

async fn second_authorization(ctx: &mut Ctx) -> Checked {
    let mut wire = ctx.connect().await?;
    // With a run open the case also shows that its finish may come first.
    let open = if ctx.needs_run().is_ok() {
        let scope = wire.fresh_scope();
        match wire.answer_run(scope, &ctx.run_request).await? {
            RunAnswer::Id(_) => Some(scope),
            RunAnswer::Refused(_) => None,
        }
    } else {
        None
    };
    wire.authorize(&ctx.authorization()).await?;
    let mut finished = false;
    loop {
        match wire.next().await {
            Next::Closed(how) => {
                return pass(match open {
                    Some(scope) if finished => {
                        format!("{how}, after the finish of the run on scope {scope}")
                    }
                    Some(scope) => format!("{how}; the run on scope {scope} was open"),
                    None => how,
                });
            }
            Next::Frame(Frame::Finish { scope }) if open == Some(scope) && !finished => {
                finished = true;
            }
            Next::Silent(wait) => {
                return fail(format!(
                    "the connection was still open {} after a second authorization frame",
                    seconds(wait)
                ));
            }
            Next::Frame(frame) => {
                return fail(format!(
                    "after a second authorization frame the connection should end (a finish of \
                     an open scope may come first); got {frame}"
                ));
            }
        }
    }
}

/// What a server made of an authorization frame.
enum Authorized {
    /// The connection was closed with no frame; how.
    Refused(String),
    /// The probe was answered: the connection works.
    Accepted,
}

/// Authorizes a new connection with `payload`, then sends the probe.
async fn authorize_with(ctx: &mut Ctx, payload: &[u8]) -> Checked<Authorized> {
    let mut wire = ctx.dial().await?;
    wire.authorize(payload).await?;
    let scope = wire.fresh_scope();
    // A server that refused may have closed already, so this send may fail;
    // the next message says what happened either way.
    let _ = wire.request(scope, &[UNKNOWN_TAG]).await;
    match wire.next().await {
        Next::Closed(how) => Ok(Authorized::Refused(how)),
        Next::Frame(Frame::Finish { scope: s }) if s == scope => Ok(Authorized::Accepted),
        Next::Frame(frame) => fail(format!(
            "expected the connection to close with no frame, or, had the authorization been \
             accepted, the probe's bare finish; got {frame}"
        )),
        Next::Silent(wait) => fail(format!(
            "the connection was neither closed nor was the probe answered within {}",
            seconds(wait)
        )),
    }
}

async fn wrong_credential(ctx: &mut Ctx) -> Checked {
    ctx.needs_probe()?;
    let mut random = [0_u8; 16];
    if let Err(error) = getrandom::fill(&mut random) {
        return Err(Verdict::Skip(format!(
            "no randomness for a credential: {error}"
        )));
    }
    let mut payload = vec![authorization::UNBROKERED];
    for byte in random {
        payload.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    match authorize_with(ctx, &payload).await? {
        Authorized::Refused(how) => pass(format!("a random credential: {how}")),
        Authorized::Accepted => Ok(Verdict::Info(
            "the server accepts any credential: fine for a loopback development server, not for \
             production"
                .to_owned(),
        )),
    }
}

async fn unknown_mode(ctx: &mut Ctx) -> Checked {
    let mut payload = vec![7];
    payload.extend_from_slice(ctx.token().as_bytes());
    match authorize_with(ctx, &payload).await? {
        Authorized::Refused(how) => pass(how),
        Authorized::Accepted => fail("mode 7 with --token was accepted: the probe was answered"),
    }
}

async fn not_utf8(ctx: &mut Ctx) -> Checked {
    let mut payload = vec![authorization::UNBROKERED];
    payload.extend_from_slice(ctx.token().as_bytes());
    payload.extend_from_slice(b"\xff\xfe");
    match authorize_with(ctx, &payload).await? {
        Authorized::Refused(how) => pass(how),
        Authorized::Accepted => {
            fail("--token followed by the bytes ff fe was accepted: the probe was answered")
        }
    }
}

async fn never_authorizes(ctx: &mut Ctx) -> Checked {
    let mut wire = ctx.dial().await?;
    let started = Instant::now();
    let detail = match wire.next_within(SLOW_WAIT).await {
        Next::Closed(how) => format!(
            "{how} after about {} s, with no frame",
            started.elapsed().as_secs()
        ),
        Next::Silent(wait) => format!(
            "still open after {}: allowed, the grace period is this project's policy (§12)",
            seconds(wait)
        ),
        Next::Frame(frame) => {
            format!("the server sent {frame} to a connection that never authorized")
        }
    };
    Ok(Verdict::Info(detail))
}
