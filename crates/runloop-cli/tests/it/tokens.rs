//! Credentials off the command line: `serve --token-file` (one token per
//! line), `run --token-file` and `RUNLOOP_TOKEN` work; `--token` works and
//! is warned about; the help steers to the file and the variable.

use std::io::Read;

use runloop_testkit::command::{self, Serve, run, runloop};

fn token_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("written");
    path.display().to_string()
}

#[test]
fn serve_takes_its_tokens_from_a_file_and_callers_from_a_file_or_the_environment() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let tokens = token_file(&dir, "tokens", "\n  first-token \nsecond-token\n\n");
    let server = Serve::start("error", &["--token-file", &tokens]);

    for (name, text) in [("first", "first-token\n"), ("second", "second-token")] {
        let file = token_file(&dir, name, text);
        let (status, stdout, stderr) =
            run(&["run", "--url", &server.url, "--token-file", &file, "hi"]);
        assert_eq!(status.code(), Some(0), "{name}: {stdout}{stderr}");
        assert!(!stderr.contains("warning"), "{stderr}");
    }
    let output = runloop()
        .args(["run", "--url", &server.url, "hi"])
        .env("RUNLOOP_TOKEN", "second-token")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let wrong = token_file(&dir, "wrong", "third-token\n");
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--token-file", &wrong, "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("is the credential right?"), "{stderr}");
    let two = token_file(&dir, "two", "a\nb\n");
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--token-file", &two, "hi"]);
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains("holds 2 tokens; a client sends one"),
        "{stderr}"
    );
}

#[test]
fn serve_also_takes_runloop_token() {
    let mut child = runloop()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUNLOOP_TOKEN", "from-the-environment")
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starts");
    let url = command::url(&mut child);
    let url = url.as_str();
    let ok = runloop()
        .args(["run", "--url", url, "hi"])
        .env("RUNLOOP_TOKEN", "from-the-environment")
        .output()
        .expect("runs");
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let refused = runloop()
        .args(["run", "--url", url, "hi"])
        .env_remove("RUNLOOP_TOKEN")
        .output()
        .expect("runs");
    assert_eq!(refused.status.code(), Some(7), "no credential: {refused:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_token_on_the_command_line_works_and_is_warned_about() {
    let mut server = Serve::start("warn", &["--token", "on-the-command-line"]);
    let mut stderr = server.stderr();
    let (status, stdout, run_stderr) = run(&[
        "run",
        "--url",
        &server.url,
        "--token",
        "on-the-command-line",
        "hi",
    ]);
    assert_eq!(status.code(), Some(0), "{stdout}{run_stderr}");
    assert!(
        run_stderr.starts_with(
            "runloop: warning: --token is visible to every local user in /proc/PID/cmdline and \
             ps; pass the credential with --token-file FILE or the RUNLOOP_TOKEN environment \
             variable"
        ),
        "{run_stderr}"
    );
    assert_eq!(server.terminate().code(), Some(0));
    let mut log = String::new();
    stderr.read_to_string(&mut log).expect("the log");
    assert!(
        log.contains("WARN") && log.contains("--token is visible to every local user"),
        "{log}"
    );
}

#[test]
fn a_token_file_that_cannot_be_used_is_refused_at_startup() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let missing = dir.path().join("missing").display().to_string();
    let (status, stdout, stderr) =
        run(&["serve", "--listen", "127.0.0.1:0", "--token-file", &missing]);
    assert_eq!(status.code(), Some(2));
    assert_eq!(stdout, "");
    assert!(
        stderr.starts_with(&format!("runloop: cannot read the token file {missing}: ")),
        "{stderr}"
    );
    let empty = token_file(&dir, "empty", "\n \n");
    let (status, _, stderr) = run(&["serve", "--listen", "127.0.0.1:0", "--token-file", &empty]);
    assert_eq!(status.code(), Some(2));
    assert_eq!(
        stderr,
        format!("runloop: the token file {empty} holds no token\n")
    );
}

#[test]
fn the_help_steers_to_the_file_and_the_environment() {
    for command in ["serve", "run", "check"] {
        let output = runloop().args([command, "--help"]).output().expect("runs");
        let help = String::from_utf8_lossy(&output.stdout).replace(char::is_whitespace, " ");
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains("--token-file <FILE>")
                && help.contains("Every local user can read it in /proc/PID/cmdline: prefer --token-file or RUNLOOP_TOKEN"),
            "runloop {command} --help:\n{help}"
        );
    }
}
