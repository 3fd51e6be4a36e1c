//! `runloop serve` and `runloop run` at `RUST_LOG=trace`: everything both
//! processes log while one caller is served and another refused, and
//! neither credential anywhere in it, as text or as hex.

use std::io::Read;
use std::process::{Command, Stdio};

const ACCEPTED: &str = "tok-ACCEPTED-4be1";
const REFUSED: &str = "tok-REFUSED-0d77";

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn assert_no_credential(who: &str, logs: &str) {
    for token in [ACCEPTED, REFUSED] {
        for form in [token.to_owned(), hex(token)] {
            let line = logs.lines().find(|line| line.contains(&form));
            assert!(line.is_none(), "{who} logged {form}: {line:?}");
        }
    }
}

#[test]
fn no_credential_in_the_logs_of_serve_or_run_at_trace() {
    let exe = env!("CARGO_BIN_EXE_runloop");
    let mut serve = Command::new(exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--token", ACCEPTED])
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let url = runloop_testkit::command::url(&mut serve);
    let mut serve_stderr = serve.stderr.take().expect("stderr");
    let serve_logs = std::thread::spawn(move || {
        let mut logs = Vec::new();
        let _ = serve_stderr.read_to_end(&mut logs);
        String::from_utf8_lossy(&logs).into_owned()
    });

    let mut run_logs = String::new();
    for (token, code) in [(ACCEPTED, 0), (REFUSED, 7)] {
        let run = Command::new(exe)
            .args(["run", "--url", url.trim(), "--token", token, "hello"])
            .env("RUST_LOG", "trace")
            .output()
            .expect("run runs");
        assert_eq!(run.status.code(), Some(code), "{run:?}");
        run_logs.push_str(&String::from_utf8_lossy(&run.stderr));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(serve.wait().expect("serve exits").code(), Some(0));
    let serve_logs = serve_logs.join().expect("stderr read");

    // Both logged plenty, at trace, including the WebSocket library's own
    // records up to debug...
    assert!(serve_logs.contains("TRACE"), "{serve_logs}");
    assert!(serve_logs.contains("authorized"));
    assert!(serve_logs.contains("the credential is not accepted"));
    assert!(serve_logs.contains("tungstenite"), "the bridge is there");
    assert!(run_logs.contains("Client handshake done"), "{run_logs}");
    // ...and neither credential.
    assert_no_credential("serve", &serve_logs);
    assert_no_credential("run", &run_logs);
}
