//! `runloop decode`, run as a built binary on hand-written captures: the
//! exact JSON lines it prints and the exit code it ends with.

use assert_cmd::Command;

fn runloop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runloop"))
}

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
    let mut lines = vec![AUTHORIZATION.to_owned()];
    lines.extend(run(1));
    lines.push(loop_request(1, 1));
    lines.extend_from_slice(responses);
    lines.join("\n") + "\n"
}

const TEXT: &str = r#"{"type":"assistant_text_content","text":"Hel"}"#;
const FATAL: &str = r#"{"type":"notification","is_fatal":true,"message":"model gone"}"#;
const DOWN: &str = r#"{"kind":"agent","error":"down"}"#;

fn decode(capture: &str, stdout: &str, code: i32) {
    runloop()
        .arg("decode")
        .write_stdin(capture)
        .assert()
        .code(code)
        .stdout(stdout.to_owned())
        .stderr("");
}

#[test]
fn a_finished_loop_from_a_file() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/captures/finished.txt");
    runloop()
        .args(["decode", file])
        .assert()
        .code(0)
        .stdout(
            r#"{"scope":1,"channel":1,"chunk":{"type":"assistant_text_content","text":"Hel"}}
{"scope":1,"channel":1,"chunk":{"type":"assistant_text_content","text":"lo"}}
{"scope":1,"channel":1,"chunk":{"type":"usage","completion_tokens":2,"prompt_tokens":9,"total_tokens":11}}
{"scope":1,"channel":1,"outcome":"finished"}
"#,
        )
        .stderr("");
}

#[test]
fn the_same_capture_on_standard_input_and_as_dash() {
    let capture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/captures/finished.txt"
    ))
    .expect("the fixture is there");
    for args in [&["decode"][..], &["decode", "-"]] {
        runloop()
            .args(args)
            .write_stdin(capture.clone())
            .assert()
            .code(0)
            .stdout(predicates::str::ends_with(
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
    let mut lines = vec![AUTHORIZATION.to_owned()];
    lines.extend(run(1));
    lines.extend(run(2));
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
    let mut lines = vec![AUTHORIZATION.to_owned()];
    lines.extend(run(1));
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
    let mut lines = vec![AUTHORIZATION.to_owned()];
    lines.extend(run(1));
    lines.push(line('<', 3, 1, 0, b""));
    runloop()
        .arg("decode")
        .write_stdin(lines.join("\n"))
        .assert()
        .code(3)
        .stdout("")
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
            r#"{"outcome":"broken","reason":"a response did not decode: agentic loop chunk did not parse: EOF while parsing an object at line 1 column 1"}
{"line":2,"malformed":"bad hex digit 'z' at column 1"}
{"line":5,"malformed":"a line after the channel response finish"}
"#,
        );
}

#[test]
fn an_unreadable_file_fails_with_2_and_one_message() {
    runloop()
        .args(["decode", "/nonexistent/capture.txt"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::starts_with(
            "runloop: cannot read /nonexistent/capture.txt: ",
        ))
        .stderr(predicates::str::contains('\n').count(1));
}
