//! `runloop serve` refuses, at startup, a limit that would make it useless,
//! and says what the least workable value is; at that least value it serves.

use runloop_testkit::command::{Serve, run};

#[test]
fn serve_refuses_each_limit_below_its_minimum_and_names_the_minimum() {
    let cases: [(&str, &str, &str); 22] = [
        ("--max-message-size", "0", "4096 bytes"),
        ("--max-message-size", "8", "4096 bytes"),
        ("--max-message-size", "4095", "4096 bytes"),
        ("--max-scopes", "0", "minimum of 1:"),
        ("--max-channels", "0", "minimum of 1:"),
        ("--max-queued-responses", "0", "minimum of 1:"),
        ("--max-connections", "0", "minimum of 1:"),
        ("--authorization-grace", "0", "minimum of 1s:"),
        ("--authorization-grace", "0.5", "minimum of 1s:"),
        ("--max-runs", "0", "minimum of 1:"),
        ("--max-runs-per-identity", "0", "minimum of 1:"),
        ("--max-loops-per-identity", "0", "minimum of 1:"),
        ("--max-run-memory", "0", "16777216 bytes"),
        ("--max-run-memory", "16777215", "16777216 bytes"),
        ("--memory-budget", "1M", "16777216 bytes"),
        ("--disk-budget", "1M", "16777216 bytes"),
        ("--handshake-timeout", "0", "minimum of 1s:"),
        ("--max-unauthorized", "0", "minimum of 1:"),
        ("--max-connections-per-address", "0", "minimum of 1:"),
        ("--max-connections-per-identity", "0", "minimum of 1:"),
        ("--handshake-timeout", "0.5", "minimum of 1s:"),
        ("--max-authorization-size", "4095", "4096 bytes"),
    ];
    for (option, value, minimum) in cases {
        // Bounded: a server that starts anyway would never exit.
        let (status, stdout, stderr) = run(&["serve", "--listen", "127.0.0.1:0", option, value]);
        assert_eq!(status.code(), Some(2), "{option} {value}: {stdout}{stderr}");
        assert_eq!(stdout, "", "{option} {value}: it never listened");
        assert!(
            stderr.starts_with(&format!("runloop: {option} is ")) && stderr.contains(minimum),
            "{option} {value}: {stderr}"
        );
    }
}

#[test]
fn serve_at_every_minimum_still_serves_a_loop() {
    let server = Serve::start(
        "info",
        &[
            "--max-message-size",
            "4K",
            "--max-scopes",
            "1",
            "--max-channels",
            "1",
            "--max-queued-responses",
            "1",
            "--max-connections",
            "1",
            "--authorization-grace",
            "1",
            "--max-unauthorized",
            "1",
            "--max-connections-per-address",
            "1",
            "--max-connections-per-identity",
            "1",
            "--handshake-timeout",
            "1",
            "--max-authorization-size",
            "4K",
            "--max-runs",
            "1",
            "--max-runs-per-identity",
            "1",
            "--max-loops-per-identity",
            "1",
            "--max-run-memory",
            "16M",
            "--max-run-disk",
            "0",
            "--memory-budget",
            "16M",
        ],
    );
    let (status, stdout, stderr) = run(&[
        "run",
        "--url",
        &server.url,
        "--token",
        &"t".repeat(2000),
        "--memory",
        "16M",
        "--disk",
        "0",
        "at the minimums",
    ]);
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(stderr.lines().last(), Some("the loop finished"));
}
