//! The conventions a command-line user expects of `runloop`: settings from
//! the environment, exit codes of their own for a refused run, a time limit
//! and Ctrl-C, and the prompt from standard input.

use std::process::Stdio;

use runloop_testkit::command::{Serve, exits, run, runloop};

/// A port on loopback that nothing listens on.
pub(crate) fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn runloop_url_is_the_server_of_run_and_check() {
    let server = Serve::start("error", &[]);
    let output = runloop()
        .args(["run", "--json", "hi"])
        .env("RUNLOOP_URL", &server.url)
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");

    // Where nothing listens, both say that is where they went.
    let url = format!("ws://127.0.0.1:{}", closed_port());
    for args in [&["run", "hi"][..], &["check"]] {
        let output = runloop()
            .args(args)
            .env("RUNLOOP_URL", &url)
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with(&format!("runloop: cannot connect to {url}: ")),
            "{args:?}: {stderr}"
        );
    }
    // --url wins over the environment.
    let output = runloop()
        .args(["run", "--json", "--url", &server.url, "hi"])
        .env("RUNLOOP_URL", &url)
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[test]
fn runloop_token_is_the_credential_of_run_and_check() {
    let server = Serve::start("error", &["--token", "s3cret"]);
    for (token, code) in [("s3cret", 0), ("wrong", 7)] {
        let output = runloop()
            .args(["run", "--url", &server.url, "hi"])
            .env("RUNLOOP_TOKEN", token)
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(code), "{token}: {output:?}");
    }
    let output = runloop()
        .args(["check", "--url", &server.url])
        .env("RUNLOOP_TOKEN", "wrong")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("is --token right?"), "{stdout}");
}

#[test]
fn a_refused_run_has_its_own_exit_code() {
    let (status, stdout, stderr) = run(&["run", "--image", "unknown", "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.starts_with("runloop: the run was refused: "),
        "{stderr}"
    );
    // Bad arguments stay 2.
    let (status, _, _) = run(&["run", "--memory", "lots", "hi"]);
    assert_eq!(status.code(), Some(2));
    let mut child = runloop()
        .args(["run", "--agent-json", "{", "hi"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    assert_eq!(exits(&mut child, "a bad --agent-json").code(), Some(2));
}
