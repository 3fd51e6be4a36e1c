//! `--log-format json`: one JSON object a line, which a log shipper reads
//! as it is; every line about a connection, a run or a loop carries their
//! ids; no credential, at any level.

use runloop_testkit::command::run;
use serde_json::Value;

use crate::serve::Serve;

const TOKEN: &str = "json-logs-secret-token";

/// The value of `key` in the line's own fields or in any of its spans.
fn field<'a>(line: &'a Value, key: &str) -> Option<&'a Value> {
    line.get(key).or_else(|| {
        line["spans"]
            .as_array()?
            .iter()
            .rev()
            .find_map(|span| span.get(key))
    })
}

#[test]
fn json_lines_carry_the_ids_of_their_connection_run_and_loop() {
    let server = Serve::start(
        "runloop=debug,info",
        &["--token", TOKEN, "--log-format", "json"],
    );
    for (prompt, code) in [("hello", 0), ("demo:break", 1)] {
        let (status, stdout, stderr) =
            run(&["run", "--url", &server.url, "--token", TOKEN, prompt]);
        assert_eq!(status.code(), Some(code), "{stdout}{stderr}");
    }
    let (status, _, _) = run(&["run", "--url", &server.url, "--token", "wrong", "hi"]);
    assert_eq!(status.code(), Some(7));
    let (status, _, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(!log.contains(TOKEN), "a credential in the log:\n{log}");
    assert!(
        !log.contains("wrong\""),
        "a refused credential in the log:\n{log}"
    );

    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let (mut connections, mut runs, mut loops) = (0, 0, 0);
    for line in &lines {
        assert!(
            line["timestamp"].is_string() && line["level"].is_string(),
            "{line}"
        );
        let target = line["target"].as_str().unwrap_or_default();
        let about_a_connection = target == "runloop_server::connection";
        let about_a_run = target == "runloop_server::scope";
        let about_a_loop = target == "runloop_server::relay";
        if about_a_connection || about_a_run || about_a_loop {
            assert!(
                field(line, "connection").is_some_and(Value::is_u64),
                "no connection id: {line}"
            );
            connections += 1;
        }
        if about_a_run || about_a_loop {
            assert!(
                field(line, "scope").is_some_and(Value::is_u64),
                "no scope: {line}"
            );
            runs += 1;
        }
        if about_a_run
            && line["message"] != "starting the container"
            && line["message"] != "run refused"
        {
            assert!(field(line, "id").is_some(), "no run id: {line}");
        }
        if about_a_loop {
            assert!(field(line, "run").is_some(), "no run id: {line}");
            assert!(
                field(line, "channel").is_some_and(Value::is_u64),
                "no channel: {line}"
            );
            loops += 1;
        }
    }
    // Two loops, two runs, three connections, each said something.
    assert!(loops >= 2, "{loops} loop lines in\n{log}");
    assert!(runs >= 4, "{runs} run lines in\n{log}");
    assert!(connections >= 6, "{connections} connection lines in\n{log}");
    let refused = lines
        .iter()
        .find(|line| line["message"] == "authorization refused; closing without a frame")
        .unwrap_or_else(|| panic!("no refusal in\n{log}"));
    assert_eq!(
        refused["why"], "the credential is not accepted",
        "{refused}"
    );
}
