//! Clean ends between caller and server (protocol §12 "Clean ends"): a
//! `runloop run` that is done closes its connection with a handshake, so
//! the server never logs a caller that left normally as broken.

use runloop_testkit::command::{Serve, drain, exits, run, start};

/// Normal runs, one after another; the server at debug sees how each
/// connection ended, down to the WebSocket library's words.
const RUNS: usize = 20;

#[test]
fn every_run_that_is_done_closes_with_a_handshake() {
    let mut server = Serve::start("debug", &[]);
    let logs = drain(server.stderr());
    for n in 0..RUNS {
        let (status, stdout, stderr) = run(&["run", "--url", &server.url, "a normal run"]);
        assert_eq!(status.code(), Some(0), "run {n}: {stdout}{stderr}");
    }
    // A caller whose reader went away, and one whose run was refused, are
    // done too: they close the same way.
    let mut quiet = start(
        "error",
        &["run", "--url", &server.url, "demo:load=4000x1000"],
    );
    drop(quiet.stdout.take());
    assert_eq!(
        exits(&mut quiet, "run with its stdout closed").code(),
        Some(2)
    );
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--image", "unknown", "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("the run was refused"), "{stderr}");

    assert_eq!(server.terminate().code(), Some(0));
    let logs = logs.join().expect("logs read");
    // The callers' connections, not the proxy paths of their runs (which
    // log under a scope, or in the proxy's own spans).
    let callers: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("connection{connection=") && !line.contains("scope{"))
        .collect();
    let endings: Vec<&str> = callers
        .iter()
        .copied()
        .filter(|line| line.contains("connection ending"))
        .collect();
    assert_eq!(endings.len(), RUNS + 2, "{logs}");
    for line in &endings {
        assert!(
            line.contains(r#"why="the caller closed the connection""#),
            "{line}"
        );
    }
    for broken in ["broke", "without closing handshake", "reset"] {
        let line = callers.iter().find(|line| line.contains(broken));
        assert!(line.is_none(), "{line:?}");
    }
}
