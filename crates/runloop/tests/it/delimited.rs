//! A loop's end must be provable (protocol §10): real python3 agent programs
//! (`tests/fixtures/framed_agent.py`) answer `/run` with each framing, and
//! the chain from the proxy to the caller's reader says "finished" only for
//! a body whose end is marked — chunked, or as long as its `Content-Length`.
//! A body that ends when the agent program's connection closes (HTTP/1.0)
//! reads the same after a finish and after a crash, so it is never
//! "finished": the proxy relays its chunks and then says why, and how to
//! fix the agent program.

use runloop::proto::run_loop::{AgenticLoopChunk, Outcome};
use runloop::runtime::{ContainerLimits, DiskPolicy, Exec};
use runloop_testkit::path::{End, error_json, exchange, outcome, register};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// One loop of the fixture in `mode`, behind a real proxy: the texts of
/// its chunks, its outcome, and the error message the proxy sent, if any.
async fn one_loop(mode: &str) -> (Vec<String>, Outcome, Option<String>) {
    let exec = Exec::new("python3", [fixture("framed_agent.py"), mode.to_owned()])
        .with_disk(DiskPolicy::Unenforced);
    let container = exec
        .spawn(ContainerLimits::new(1 << 30, 0))
        .await
        .expect("the agent program starts");
    let url = runloop::runtime::Container::proxy_url(&container).to_owned();
    register(&url).await;
    let done = exchange(&url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.end, End::Clean, "{mode}: the proxy closes cleanly");
    let error = done
        .messages
        .last()
        .filter(|last| last.first() == Some(&1))
        .map(|last| {
            error_json(last)["error"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
    let (chunks, outcome) = outcome(&done);
    let texts = chunks
        .into_iter()
        .map(|chunk| match chunk {
            AgenticLoopChunk::AssistantTextContent(text) => text.text,
            other => panic!("{mode}: unexpected chunk {other:?}"),
        })
        .collect();
    container.terminate().await;
    (texts, outcome, error)
}

const FIX: &str = "answer /run with HTTP/1.1 chunked transfer encoding or a Content-Length";

#[tokio::test]
async fn a_close_delimited_body_is_never_finished_even_when_the_agent_finished() {
    let (texts, outcome, error) = one_loop("close-finish").await;
    assert_eq!(texts, ["one", "two"], "every chunk is relayed");
    assert!(matches!(outcome, Outcome::Unfinished(_)), "{outcome:?}");
    let error = error.expect("the proxy's error");
    assert!(
        error.contains("cannot tell a finished loop from a crashed one"),
        "{error}"
    );
    assert!(error.ends_with(FIX), "{error}");
}

#[tokio::test]
async fn a_close_delimited_agent_that_crashes_mid_loop_is_unfinished() {
    for mode in ["close-raise", "close-exit"] {
        let (texts, outcome, error) = one_loop(mode).await;
        assert_eq!(texts, ["one"], "{mode}");
        assert!(
            matches!(outcome, Outcome::Unfinished(_)),
            "{mode}: {outcome:?}"
        );
        let error = error.expect("the proxy's error");
        assert!(error.ends_with(FIX), "{mode}: {error}");
    }
}

#[tokio::test]
async fn a_marked_end_or_a_whole_length_is_finished() {
    for mode in ["chunked-finish", "length-finish"] {
        let (texts, outcome, error) = one_loop(mode).await;
        assert_eq!(texts, ["one", "two"], "{mode}");
        assert_eq!(outcome, Outcome::Finished { fatal: false }, "{mode}");
        assert_eq!(error, None, "{mode}");
    }
}

#[tokio::test]
async fn a_body_cut_short_of_its_content_length_is_unfinished() {
    let (texts, outcome, error) = one_loop("length-short").await;
    assert_eq!(texts, ["one"]);
    assert!(matches!(outcome, Outcome::Unfinished(_)), "{outcome:?}");
    let error = error.expect("the proxy's error");
    assert!(
        error.starts_with(
            "the agent program's /run body ended before the 108 bytes of its Content-Length"
        ),
        "{error}"
    );
}
