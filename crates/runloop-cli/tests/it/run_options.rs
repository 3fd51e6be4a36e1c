//! `runloop run`'s options around the loop: its three time limits, Ctrl-C,
//! the renderings (`--text`, `--transcript`, `--quiet`, `--pretty`,
//! `--color`), `-v`, and a prompt from standard input — the built binary
//! against its embedded server, or a listener that never answers.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};

use crate::{runloop, runloop_output};
use serde_json::Value;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn connect_timeout_names_itself_when_the_upgrade_is_never_answered() {
    // The kernel completes the TCP handshake for the backlog; nobody
    // accepts, so the WebSocket upgrade is never answered.
    let silent = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let url = format!("ws://{}", silent.local_addr().expect("its address"));
    let output = runloop_output(&["run", "--url", &url, "--connect-timeout", "0.5", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(8), "{stderr}");
    assert_eq!(
        stderr,
        "runloop: no connection was made and authorized within 0.5 s (--connect-timeout 0.5)\n"
    );
}

#[test]
fn idle_timeout_names_itself_when_the_server_goes_quiet() {
    let output = runloop_output(&["run", "--idle-timeout", "0.3", "hi demo:pace=5000"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(8), "{stderr}");
    assert!(
        stderr
            .ends_with("runloop: nothing came from the server within 0.3 s (--idle-timeout 0.3)\n"),
        "{stderr}"
    );
    // A server that keeps talking is not idle.
    runloop()
        .args(["run", "--idle-timeout", "5", "--quiet", "hi demo:pace=50"])
        .assert()
        .code(0);
}

#[test]
fn timeout_bounds_the_whole_run() {
    // Each chunk comes 0.3 s after the last: the loop takes seconds, and
    // no gap is long, so only the whole run's limit can end it.
    let output = runloop_output(&[
        "run",
        "--json",
        "--timeout",
        "1",
        "--idle-timeout",
        "2",
        "one two three four five six demo:pace=300",
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.ends_with("runloop: the run did not end within 1 s (--timeout 1)\n"),
        "{stderr}"
    );
    let stdout = text(&output.stdout);
    assert!(stdout.contains("{\"chunk\":"), "some chunks came: {stdout}");
    // A script gets something to parse: the limit and its value, last.
    let last = stdout.lines().last().expect("lines");
    assert_eq!(
        last,
        r#"{"outcome":"timeout","limit":"--timeout","seconds":1.0}"#
    );
    assert_eq!(stdout.matches("\"outcome\"").count(), 1, "{stdout}");
}

#[test]
fn timeouts_must_be_positive_seconds() {
    for value in ["0", "-1", "soon"] {
        runloop()
            .args(["run", "--timeout", value, "hi"])
            .assert()
            .code(2);
    }
}

#[test]
fn ctrl_c_stops_the_run_shows_its_ending_and_exits_130() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["run", "--json", "one two three four demo:pace=400"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("a first chunk");
    assert!(first.starts_with("{\"chunk\":"), "{first}");
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let rest: Vec<String> = stdout.lines().map(|line| line.expect("a line")).collect();
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130), "{rest:?}");
    let last: Value = serde_json::from_str(rest.last().expect("an ending")).expect("JSON");
    assert_eq!(last["outcome"], "unfinished", "{rest:?}");
}

#[test]
fn text_transcript_and_quiet() {
    let output = runloop_output(&["run", "--text", "hi"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        text(&output.stdout),
        "You said: \"hi\". That is 1 word and 2 characters.\n"
    );

    let output = runloop_output(&["run", "--transcript", "hi"]);
    assert_eq!(output.status.code(), Some(0));
    let document: Value = serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(document["outcome"], "finished");
    assert!(
        document["transcript"]
            .as_array()
            .is_some_and(|chunks| chunks.len() > 3),
        "{document}"
    );

    let output = runloop_output(&["run", "--quiet", "hi"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(text(&output.stdout), "");
    assert_eq!(text(&output.stderr), "");
    let output = runloop_output(&["run", "--quiet", "hi demo:break"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        !text(&output.stderr).is_empty(),
        "an unfinished loop is told"
    );

    runloop()
        .args(["run", "--json", "--text", "hi"])
        .assert()
        .code(2);
}

#[test]
fn color_follows_the_flag_then_the_environment() {
    let styled = |args: &[&str], env: &[(&str, &str)]| {
        let output = runloop()
            .args(["run"])
            .args(args)
            .arg("hi")
            .envs(env.iter().copied())
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(0));
        output.stdout.contains(&0x1b)
    };
    assert!(!styled(&[], &[]), "a pipe gets plain text");
    assert!(styled(&["--color", "always"], &[]));
    assert!(styled(&[], &[("CLICOLOR_FORCE", "1")]));
    assert!(!styled(&["--color", "never"], &[("CLICOLOR_FORCE", "1")]));
    assert!(styled(
        &["--pretty", "--color", "always"],
        &[("NO_COLOR", "1")]
    ));
    assert!(!styled(
        &["--color", "auto"],
        &[("NO_COLOR", "1"), ("CLICOLOR_FORCE", "1")]
    ));
}

#[test]
fn verbose_shows_each_frame_and_a_timing_line() {
    let output = runloop().args(["run", "-v", "hi"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(0));
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines[0].starts_with("+0.")
            && lines[0].ends_with("> authorization: unbrokered (the credential is not shown)"),
        "{stderr}"
    );
    assert!(
        lines.iter().any(|line| line.contains("< scope 0: id \"")),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("< scope 0 channel 0: chunk {")),
        "{stderr}"
    );
    let timing = lines.last().expect("a timing line");
    assert!(timing.starts_with("timing: id after "), "{stderr}");
    assert!(!timing.contains(" 0 chunks"), "{timing}");
}

#[test]
fn a_dash_reads_the_prompt_from_standard_input() {
    let output = runloop()
        .args(["run", "--text", "-"])
        .write_stdin("from stdin\n")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0));
    assert!(
        text(&output.stdout).starts_with("You said: \"from stdin\"."),
        "{}",
        text(&output.stdout)
    );
    // Not a terminal: no hint, only the ending.
    assert_eq!(text(&output.stderr), "the loop finished\n");
}
