//! `runloop decode`, run as a built binary on hand-written captures: the
//! exact JSON lines it prints and the exit code it ends with.

use crate::{exits_2_saying, runloop};
use serde_json::Value;

/// One capture line, the header spelled out and the payload in hex.
fn line(direction: char, frame_type: u8, scope: u32, channel: u32, payload: &[u8]) -> String {
    let mut line = format!("{direction} {frame_type:02x} {scope:08x} {channel:08x}");
    if !payload.is_empty() {
        line.push(' ');
        for byte in payload {
            line.push_str(&format!("{byte:02x}"));
        }
    }
    line
}

const AUTHORIZATION: &str = "> 00 00000000 00000000 00";

/// The client opens scope `scope`; the server sends the run id.
fn run(scope: u32) -> Vec<String> {
    vec![
        line('>', 1, scope, 0, b"\x00{\"agent\":{}}"),
        line('<', 2, scope, 0, b"\x00{\"id\":\"r\"}"),
    ]
}

/// A capture's lines up to the run ids: the authorization, then a run on
/// each of `scopes`.
fn runs(scopes: &[u32]) -> Vec<String> {
    let mut lines = vec![AUTHORIZATION.to_owned()];
    for &scope in scopes {
        lines.extend(run(scope));
    }
    lines
}

fn loop_request(scope: u32, channel: u32) -> String {
    line('>', 4, scope, channel, b"\x05{\"prompt\":\"hi\"}")
}

fn chunk(scope: u32, channel: u32, json: &str) -> String {
    let mut payload = vec![0];
    payload.extend_from_slice(json.as_bytes());
    line('<', 5, scope, channel, &payload)
}

fn error(scope: u32, channel: u32, json: &str) -> String {
    let mut payload = vec![1];
    payload.extend_from_slice(json.as_bytes());
    line('<', 5, scope, channel, &payload)
}

fn finish(scope: u32, channel: u32) -> String {
    line('<', 6, scope, channel, b"")
}

/// A capture with one run on scope 1 and one loop on channel 1, whose
/// responses are `responses`.
fn one_loop(responses: &[String]) -> String {
    let mut lines = runs(&[1]);
    lines.push(loop_request(1, 1));
    lines.extend_from_slice(responses);
    lines.join("\n") + "\n"
}

const TEXT: &str = r#"{"type":"assistant_text_content","text":"Hel"}"#;
const FATAL: &str = r#"{"type":"notification","is_fatal":true,"message":"model gone"}"#;
const DOWN: &str = r#"{"kind":"agent","error":"down"}"#;

/// The lines of the loops (chunk, error, outcome) and the malformed ones:
/// what these tests are about. The lines of the other frames are checked
/// by `every_frame_of_a_capture`.
fn loop_lines(stdout: &[u8]) -> String {
    let mut kept = String::new();
    for line in String::from_utf8_lossy(stdout).lines() {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        if ["chunk", "error", "outcome", "malformed"]
            .iter()
            .any(|member| value.get(member).is_some())
        {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

fn decode(capture: &str, stdout: &str, code: i32) {
    let output = runloop()
        .arg("decode")
        .write_stdin(capture)
        .assert()
        .code(code)
        .stderr("")
        .get_output()
        .clone();
    assert_eq!(loop_lines(&output.stdout), stdout);
}

/// The shared corpus's finished loop (corpus/ at the repository's root).
const FINISHED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../corpus/finished.txt");

#[test]
fn every_frame_of_a_capture() {
    // A capture written before lines had times: it reads as it always did.
    runloop()
        .args(["decode", FINISHED])
        .assert()
        .code(0)
        .stdout(
            r#"{"authorization":"unbrokered"}
{"scope":1,"run":{"image":{"server":{"name":"demo","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}},"memory":1073741824,"disk":0,"agent":{}}}
{"scope":1,"id":"r-1"}
{"scope":1,"channel":1,"run_loop":{"prompt":"hi"}}
{"scope":1,"channel":1,"chunk":{"type":"assistant_text_content","text":"Hel"}}
{"scope":1,"channel":1,"chunk":{"type":"assistant_text_content","text":"lo"}}
{"scope":1,"channel":1,"chunk":{"type":"usage","completion_tokens":2,"prompt_tokens":9,"total_tokens":11}}
{"scope":1,"channel":1,"outcome":"finished"}
{"scope":1,"channel":2,"stop":true}
{"scope":1,"finish":true}
"#,
        )
        .stderr("");
}

#[test]
fn a_refused_run_and_a_request_for_another_endpoint() {
    let capture = [
        AUTHORIZATION.to_owned(),
        line('>', 1, 1, 0, b"\x00{\"agent\":{}}"),
        line('<', 2, 1, 0, b"\x01{\"kind\":\"policy\"}"),
        line('<', 3, 1, 0, b""),
        line('>', 1, 2, 0, b"\x07"),
        line('<', 3, 2, 0, b""),
    ]
    .join("\n");
    runloop()
        .arg("decode")
        .write_stdin(capture)
        .assert()
        .code(3)
        .stdout(
            r#"{"authorization":"unbrokered"}
{"scope":1,"request":"request [0] (13 bytes)"}
{"scope":1,"refused":{"kind":"policy"}}
{"scope":1,"finish":true}
{"scope":2,"request":"request [7] (1 bytes)"}
{"scope":2,"finish":true}
"#,
        )
        .stderr("runloop: the capture holds no run-loop channel\n");
}

#[test]
fn times_come_first_and_lines_without_one_still_read() {
    let capture = format!(
        "+0.5 {AUTHORIZATION}\n{}\n+1.25 {}\n{}\n+2 {}\n",
        run(1).join("\n"),
        loop_request(1, 1),
        chunk(1, 1, TEXT),
        finish(1, 1)
    );
    runloop()
        .arg("decode")
        .write_stdin(capture)
        .assert()
        .code(0)
        .stdout(format!(
            r#"{{"time":0.500000,"authorization":"unbrokered"}}
{{"scope":1,"request":"request [0] (13 bytes)"}}
{{"scope":1,"id":"r"}}
{{"time":1.250000,"scope":1,"channel":1,"run_loop":{{"prompt":"hi"}}}}
{{"scope":1,"channel":1,"chunk":{TEXT}}}
{{"time":2.000000,"scope":1,"channel":1,"outcome":"finished"}}
"#
        ));
}

#[test]
fn scope_and_channel_keep_the_lines_of_one_loop() {
    let mut lines = runs(&[1, 2]);
    lines.push(loop_request(1, 1));
    lines.push(loop_request(2, 1));
    lines.push(chunk(1, 1, TEXT));
    lines.push(error(2, 1, DOWN));
    lines.push(finish(2, 1));
    lines.push(finish(1, 1));
    lines.push("bad line".to_owned());
    let capture = lines.join("\n");
    let decoded = |args: &[&str], code: i32| {
        let output = runloop()
            .arg("decode")
            .args(args)
            .write_stdin(capture.clone())
            .assert()
            .code(code)
            .get_output()
            .clone();
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let malformed = "{\"line\":12,\"malformed\":\"missing direction: expected '>' or '<' at column 1, found 'b'\"}\n";
    assert_eq!(
        decoded(&["--scope", "2"], 3),
        format!(
            "{{\"scope\":2,\"request\":\"request [0] (13 bytes)\"}}\n\
             {{\"scope\":2,\"id\":\"r\"}}\n\
             {{\"scope\":2,\"channel\":1,\"run_loop\":{{\"prompt\":\"hi\"}}}}\n\
             {{\"scope\":2,\"channel\":1,\"error\":{DOWN}}}\n\
             {{\"scope\":2,\"channel\":1,\"outcome\":\"no_loop\"}}\n{malformed}"
        )
    );
    assert_eq!(
        decoded(&["--scope", "1", "--channel", "1"], 0),
        format!(
            "{{\"scope\":1,\"channel\":1,\"run_loop\":{{\"prompt\":\"hi\"}}}}\n\
             {{\"scope\":1,\"channel\":1,\"chunk\":{TEXT}}}\n\
             {{\"scope\":1,\"channel\":1,\"outcome\":\"finished\"}}\n{malformed}"
        )
    );
    // Channel 1 of both scopes: the first opened did not finish.
    assert_eq!(decoded(&["--channel", "1"], 3).lines().count(), 7);
    runloop()
        .args(["decode", "--scope", "9"])
        .write_stdin(capture.clone())
        .assert()
        .code(3)
        .stderr("runloop: the capture holds no run-loop channel that --scope and --channel keep\n");
}

#[test]
fn render_shows_a_capture_as_run_does() {
    let output = runloop()
        .args(["decode", "--render", FINISHED])
        .env_remove("CLICOLOR_FORCE")
        .assert()
        .code(0)
        .stderr("")
        .get_output()
        .clone();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "Hello\nusage: 11 tokens (9 prompt, 2 completion)\nthe loop finished\n"
    );
    // Two loops, interleaved: a heading where the lines turn to another.
    let mut lines = runs(&[1]);
    lines.push(loop_request(1, 1));
    lines.push(loop_request(1, 2));
    lines.push(chunk(1, 1, TEXT));
    lines.push(chunk(1, 2, TEXT));
    lines.push(error(1, 2, DOWN));
    lines.push(finish(1, 2));
    lines.push(finish(1, 1));
    runloop()
        .args(["decode", "--render"])
        .write_stdin(lines.join("\n"))
        .assert()
        .code(1)
        .stdout(format!(
            "Hel\n─── channel 2 of scope 1 ───\nHel\nthe loop ended without finishing (partial result): {DOWN}\n\
             ─── channel 1 of scope 1 ───\nthe loop finished\n"
        ));
}

#[test]
fn an_input_that_is_not_a_capture_is_refused_once() {
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    exits_2_saying(&["decode", readme], " is not a capture: none of its first ")
        .stderr(predicates::str::contains('\n').count(1));
    // The JSON of a decode, fed back by mistake.
    let output = runloop().args(["decode", FINISHED]).output().expect("runs");
    runloop()
        .arg("decode")
        .write_stdin(output.stdout)
        .assert()
        .code(2)
        .stdout("")
        .stderr(
            "runloop: standard input is not a capture: none of its first 10 lines is a capture \
             line (line 1: missing direction: expected '>' or '<' at column 1, found '{')\n",
        );
    // Malformed lines before the first good one are printed once it comes.
    let capture = format!("junk\n{}", one_loop(&[finish(1, 1)]));
    decode(
        &capture,
        "{\"line\":1,\"malformed\":\"missing direction: expected '>' or '<' at column 1, found 'j'\"}\n\
         {\"scope\":1,\"channel\":1,\"outcome\":\"not_served\"}\n",
        4,
    );
}

#[test]
fn the_same_capture_on_standard_input_and_as_dash() {
    let capture = std::fs::read_to_string(FINISHED).expect("the fixture is there");
    for args in [&["decode"][..], &["decode", "-"]] {
        runloop()
            .args(args)
            .write_stdin(capture.clone())
            .assert()
            .code(0)
            .stdout(predicates::str::contains(
                "{\"scope\":1,\"channel\":1,\"outcome\":\"finished\"}\n",
            ));
    }
}

#[test]
fn each_ending_and_its_exit_code() {
    let text = chunk(1, 1, TEXT);
    let fatal = chunk(1, 1, FATAL);
    let down = error(1, 1, DOWN);
    let chunk_line = format!(r#"{{"scope":1,"channel":1,"chunk":{TEXT}}}"#);
    let fatal_line = format!(r#"{{"scope":1,"channel":1,"chunk":{FATAL}}}"#);
    let error_line = format!(r#"{{"scope":1,"channel":1,"error":{DOWN}}}"#);
    let outcome = |what: &str| format!(r#"{{"scope":1,"channel":1,"outcome":"{what}"{}"#, "}");
    let cases = [
        (
            vec![text.clone(), finish(1, 1)],
            vec![chunk_line.clone(), outcome("finished")],
            0,
        ),
        (
            vec![text.clone(), down.clone(), finish(1, 1)],
            vec![chunk_line.clone(), error_line.clone(), outcome("unfinished")],
            1,
        ),
        (
            vec![down.clone(), finish(1, 1)],
            vec![error_line.clone(), outcome("no_loop")],
            3,
        ),
        (vec![finish(1, 1)], vec![outcome("not_served")], 4),
        (
            vec![down.clone(), text.clone(), finish(1, 1)],
            vec![
                error_line.clone(),
                r#"{"scope":1,"channel":1,"outcome":"broken","reason":"a response came after the error"}"#
                    .to_owned(),
            ],
            5,
        ),
        (
            vec![text.clone(), fatal.clone(), finish(1, 1)],
            vec![
                chunk_line.clone(),
                fatal_line,
                r#"{"scope":1,"channel":1,"outcome":"finished","fatal":true}"#.to_owned(),
            ],
            6,
        ),
    ];
    for (responses, expected, code) in cases {
        decode(&one_loop(&responses), &(expected.join("\n") + "\n"), code);
    }
}

#[test]
fn a_channel_without_finish_is_broken_when_the_capture_ends() {
    decode(
        &one_loop(&[chunk(1, 1, TEXT)]),
        &format!(
            "{{\"scope\":1,\"channel\":1,\"chunk\":{TEXT}}}\n\
             {{\"scope\":1,\"channel\":1,\"outcome\":\"broken\",\"reason\":\"capture ended\"}}\n"
        ),
        5,
    );
}

#[test]
fn a_scope_finish_breaks_the_loops_still_open_in_it() {
    decode(
        &one_loop(&[chunk(1, 1, TEXT), line('<', 3, 1, 0, b"")]),
        &format!(
            "{{\"scope\":1,\"channel\":1,\"chunk\":{TEXT}}}\n\
             {{\"scope\":1,\"channel\":1,\"outcome\":\"broken\",\"reason\":\"the run ended before the channel's finish\"}}\n"
        ),
        5,
    );
}

#[test]
fn several_channels_exit_with_the_first_opened_that_did_not_finish() {
    let mut lines = runs(&[1, 2]);
    // Opened in this order: 1/5, 2/3, 1/3 (numbers are per scope).
    lines.push(loop_request(1, 5));
    lines.push(loop_request(2, 3));
    lines.push(loop_request(1, 3));
    // 1/3 ends first, not served; 2/3 finishes; 1/5 ends last, with no loop.
    lines.push(finish(1, 3));
    lines.push(chunk(2, 3, TEXT));
    lines.push(finish(2, 3));
    lines.push(error(1, 5, DOWN));
    lines.push(finish(1, 5));
    let capture = lines.join("\n") + "\n";
    decode(
        &capture,
        &format!(
            "{{\"scope\":1,\"channel\":3,\"outcome\":\"not_served\"}}\n\
             {{\"scope\":2,\"channel\":3,\"chunk\":{TEXT}}}\n\
             {{\"scope\":2,\"channel\":3,\"outcome\":\"finished\"}}\n\
             {{\"scope\":1,\"channel\":5,\"error\":{DOWN}}}\n\
             {{\"scope\":1,\"channel\":5,\"outcome\":\"no_loop\"}}\n"
        ),
        3,
    );

    // All of them finished: 0.
    let mut lines = runs(&[1]);
    for channel in [1, 2] {
        lines.push(loop_request(1, channel));
        lines.push(chunk(1, channel, TEXT));
        lines.push(finish(1, channel));
    }
    runloop()
        .arg("decode")
        .write_stdin(lines.join("\n"))
        .assert()
        .code(0);
}

#[test]
fn malformed_lines_and_frames_are_reported_with_their_line() {
    let capture = [
        "# a comment, then a blank line",
        "",
        AUTHORIZATION,
        "> 01 00000001 00000000 00 7b7d",
        "> 04 00000001 00000001 05 7b2270726f6d7074223a226869227d",
        "x 00",
        ">00",
        "< 05 00000001 00000001 0",
        "< 05 00000001 00000001 0g",
        "< 05 0000",
        "> 02 00000001 00000000",
        "< 06 00000009 00000001",
        "< 06 00000001 00000002",
        "> 00 00000000 00000000 00",
        &chunk(1, 1, TEXT),
        &finish(1, 1),
    ]
    .join("\n");
    decode(
        &capture,
        &format!(
            r#"{{"line":6,"malformed":"missing direction: expected '>' or '<' at column 1, found 'x'"}}
{{"line":7,"malformed":"expected a space after the direction '>' at column 2, found '0'"}}
{{"line":8,"malformed":"odd number of hex digits (19): the last byte is missing a digit"}}
{{"line":9,"malformed":"bad hex digit 'g' at column 25"}}
{{"line":10,"malformed":"frame is truncated: 3 bytes, the header alone is 9"}}
{{"line":11,"malformed":"frame type 2 is not defined for frames sent by a client"}}
{{"line":12,"malformed":"channel response finish for scope 9, which is not open"}}
{{"line":13,"malformed":"channel response finish for the client's channel 2 of scope 1, which is not open"}}
{{"line":14,"malformed":"a second authorization, from the client"}}
{{"scope":1,"channel":1,"chunk":{TEXT}}}
{{"scope":1,"channel":1,"outcome":"finished"}}
"#
        ),
        0,
    );
}

#[test]
fn chunk_json_is_printed_as_it_came() {
    // Members out of order, spaces, an unknown member, a number spelled 1.50,
    // and a line break that JSON allows between tokens.
    let odd = "{ \"text\" : \"a\",\r\n \"type\":\"assistant_text_content\", \"x\": 1.50 }";
    decode(
        &one_loop(&[chunk(1, 1, odd), finish(1, 1)]),
        "{\"scope\":1,\"channel\":1,\"chunk\":{ \"text\" : \"a\",   \"type\":\"assistant_text_content\", \"x\": 1.50 }}\n\
         {\"scope\":1,\"channel\":1,\"outcome\":\"finished\"}\n",
        0,
    );
}

#[test]
fn a_capture_without_any_loop_exits_3_with_a_note() {
    let mut lines = runs(&[1]);
    lines.push(line('<', 3, 1, 0, b""));
    runloop()
        .arg("decode")
        .write_stdin(lines.join("\n"))
        .assert()
        .code(3)
        .stdout(
            "{\"authorization\":\"unbrokered\"}\n{\"scope\":1,\"request\":\"request [0] (13 bytes)\"}\n\
             {\"scope\":1,\"id\":\"r\"}\n{\"scope\":1,\"finish\":true}\n",
        )
        .stderr("runloop: the capture holds no run-loop channel\n");
    runloop()
        .arg("decode")
        .write_stdin("")
        .assert()
        .code(3)
        .stdout("");
}

#[test]
fn payloads_mode() {
    let hex = |tag: u8, json: &str| {
        let mut payload = format!("{tag:02x} ");
        for byte in json.as_bytes() {
            payload.push_str(&format!("{byte:02X}"));
        }
        payload
    };
    let input = [
        "# one channel's responses",
        &hex(0, TEXT),
        "",
        &hex(1, DOWN),
        "finish",
    ]
    .join("\n");
    runloop()
        .args(["decode", "--payloads"])
        .write_stdin(input)
        .assert()
        .code(1)
        .stdout(format!(
            "{{\"chunk\":{TEXT}}}\n{{\"error\":{DOWN}}}\n{{\"outcome\":\"unfinished\"}}\n"
        ))
        .stderr("");

    // Each ending, including none at all.
    let cases: [(&[&str], &str, i32); 6] = [
        (&["finish"], r#"{"outcome":"not_served"}"#, 4),
        (&[&hex(1, DOWN), "finish"], r#"{"outcome":"no_loop"}"#, 3),
        (&[&hex(0, TEXT), "finish"], r#"{"outcome":"finished"}"#, 0),
        (
            &[&hex(0, FATAL), "finish"],
            r#"{"outcome":"finished","fatal":true}"#,
            6,
        ),
        (
            &[&hex(0, TEXT)],
            r#"{"outcome":"broken","reason":"capture ended"}"#,
            5,
        ),
        (&[], r#"{"outcome":"broken","reason":"capture ended"}"#, 5),
    ];
    for (lines, last, code) in cases {
        runloop()
            .args(["decode", "--payloads"])
            .write_stdin(lines.join("\n"))
            .assert()
            .code(code)
            .stdout(predicates::str::ends_with(format!("{last}\n")));
    }
}

#[test]
fn payloads_mode_reports_bad_lines_and_broken_sequences() {
    runloop()
        .args(["decode", "--payloads"])
        .write_stdin("00 7b\nzz\n02\nfinish\n00\n")
        .assert()
        .code(5)
        .stdout(
            r#"{"outcome":"broken","reason":"a response did not decode: agentic loop chunk did not parse: EOF while parsing an object at line 1 column 1; the payload was \"{\" (1 byte)"}
{"line":2,"malformed":"bad hex digit 'z' at column 1"}
{"line":5,"malformed":"a line after the channel response finish"}
"#,
        );
}

/// Issue 30 §3: `decode --payloads` of `\x00[DONE]` quotes the payload,
/// as JSON and rendered.
#[test]
fn payloads_mode_quotes_the_payload_that_did_not_parse() {
    let done = "00 5b444f4e455d\nfinish\n";
    runloop()
        .args(["decode", "--payloads"])
        .write_stdin(done)
        .assert()
        .code(5)
        .stdout(predicates::str::ends_with(
            "; the payload was \\\"[DONE]\\\" (6 bytes)\"}\n",
        ));
    runloop()
        .args(["decode", "--payloads", "--render"])
        .write_stdin(done)
        .assert()
        .code(5)
        .stdout(predicates::str::ends_with(
            "; the payload was \"[DONE]\" (6 bytes)\n",
        ));
    // A payload longer than what is kept is cut short, and its length said.
    let long = format!("00 {}\n", "41".repeat(100));
    runloop()
        .args(["decode", "--payloads"])
        .write_stdin(long)
        .assert()
        .code(5)
        .stdout(predicates::str::contains(format!(
            "the payload was \\\"{}…\\\" (100 bytes)",
            "A".repeat(64)
        )));
}

#[test]
fn an_unreadable_file_fails_with_2_and_one_message() {
    let said = "runloop: cannot read /nonexistent/capture.txt: ";
    exits_2_saying(&["decode", "/nonexistent/capture.txt"], said)
        .stderr(predicates::str::starts_with(said))
        .stderr(predicates::str::contains('\n').count(1));
}
