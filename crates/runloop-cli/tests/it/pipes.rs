//! Readers that go away: a log sink closed under `run` and `serve` costs
//! log lines only (protocol §12 "Logs never hold anything up"), and a closed
//! stdout ends `run` quietly.
//!
//! Each test closes a pipe of a real process while it runs, and waits for
//! it with a bound: a hang fails the test instead of holding it.

use std::io::{BufRead, BufReader};

use runloop_testkit::command::{Serve, drain, exits, finishes, run, start};

/// Reads `n` lines of a child's stderr, then closes the pipe.
fn read_lines_then_close(stderr: std::process::ChildStderr, n: usize) -> Vec<String> {
    let mut lines = BufReader::new(stderr).lines();
    (0..n)
        .map(|_| lines.next().expect("a log line").expect("readable"))
        .collect()
    // Dropping the reader closes the pipe's only read end.
}

#[test]
fn run_finishes_its_loop_when_its_stderr_closes_mid_run() {
    for level in ["info", "trace"] {
        // Paced, so that most of the loop's logging comes after the close.
        let mut child = start(level, &["run", "count these words demo:pace=30"]);
        let stdout = drain(child.stdout.take().expect("stdout"));
        let first = read_lines_then_close(child.stderr.take().expect("stderr"), 2);
        assert!(first.iter().all(|line| !line.is_empty()), "{first:?}");
        // The panic text itself would go to the closed stderr: what shows it
        // here is the loop, rendered whole, and the exit code of a finish.
        finishes(child, stdout, &format!("run at RUST_LOG={level}"));
    }
}

#[test]
fn serve_keeps_serving_when_its_stderr_closes() {
    let mut server = Serve::start("info", &[]);
    let first = read_lines_then_close(server.stderr(), 1);
    assert!(first[0].contains("serving"), "{first:?}");
    // Every connection now logs into a closed pipe.
    for n in 0..3 {
        let (status, stdout, stderr) = run(&["run", "--url", &server.url, "still served?"]);
        assert_eq!(status.code(), Some(0), "run {n}: {stdout}{stderr}");
        assert_eq!(stderr.lines().last(), Some("the loop finished"), "run {n}");
    }
    assert_eq!(server.terminate().code(), Some(0), "a clean shutdown");
}

#[test]
fn run_ends_quietly_with_2_when_its_stdout_closes() {
    for args in [
        &["run", "demo:load=4000x1000"][..],
        &["run", "--json", "demo:load=4000x1000"],
    ] {
        let mut child = start("error", args);
        // Nobody will read the loop: its first write meets a closed pipe.
        drop(child.stdout.take());
        let stderr = drain(child.stderr.take().expect("stderr"));
        let status = exits(&mut child, "run with its stdout closed");
        let stderr = stderr.join().expect("stderr read");
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}: quiet, and no panic");
    }
}

#[test]
fn serve_and_run_go_on_when_nobody_reads_their_stderr() {
    // At trace a few runs log far more than a pipe holds; nobody reads it,
    // and nobody closes it.
    let mut server = Serve::start("trace", &[]);
    let stalled = server.stderr();
    for n in 0..3 {
        let mut child = start("trace", &["run", "--url", &server.url, "demo:load=300"]);
        let stdout = drain(child.stdout.take().expect("stdout"));
        let _unread = child.stderr.take();
        finishes(child, stdout, &format!("run {n} with a stalled stderr"));
    }
    assert_eq!(server.terminate().code(), Some(0), "a clean shutdown");
    drop(stalled);
}
