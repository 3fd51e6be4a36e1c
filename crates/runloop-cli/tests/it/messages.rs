//! The messages that point the right way (issue 17 §3), each as a user
//! meets it: the built binary, real sockets, a real HTTP server.

use std::process::{Command, Stdio};

use runloop_testkit::command::{self, run};
use runloop_testkit::process::KillOnDrop;

use crate::conventions::closed_port;

/// `runloop ARGS…` ends with `code`, prints nothing on stdout, and says
/// exactly `said` on stderr.
fn says_only(args: &[&str], code: i32, said: &str) {
    let (status, stdout, stderr) = run(args);
    assert_eq!(status.code(), Some(code), "{args:?}: {stderr}");
    assert_eq!(stdout, "", "{args:?}");
    assert_eq!(stderr, said, "{args:?}");
}

/// [`says_only`], of both `runloop run` and `runloop check` at `url`.
fn run_and_check_say(url: &str, code: i32, said: &str) {
    for args in [&["run", "--url", url, "hi"][..], &["check", "--url", url]] {
        says_only(args, code, said);
    }
}

#[test]
fn a_capture_that_cannot_be_written_says_so() {
    says_only(
        &["run", "--capture", "/nonexistent/dir/c.txt", "hi"],
        2,
        "runloop: cannot write the capture /nonexistent/dir/c.txt: No such file or directory (os error 2)\n",
    );
}

#[test]
fn a_refused_connection_is_said_once_with_a_hint() {
    let url = format!("ws://127.0.0.1:{}", closed_port());
    run_and_check_say(
        &url,
        2,
        &format!(
            "runloop: cannot connect to {url}: Connection refused (os error 111): is a server listening there?\n"
        ),
    );
}

#[test]
fn a_url_that_is_not_a_websocket_url_gets_the_one_meant() {
    for (url, meant) in [
        ("http://127.0.0.1:7878", "ws://127.0.0.1:7878"),
        ("https://provider.example", "wss://provider.example"),
        ("127.0.0.1:7878", "ws://127.0.0.1:7878"),
    ] {
        run_and_check_say(
            url,
            2,
            &format!("runloop: \"{url}\" is not a WebSocket URL: write {meant} (wss:// for TLS)\n"),
        );
    }
}

/// An HTTP server made with Python's `http.server`, which answers every GET
/// — a WebSocket upgrade included — with 404, in HTTP `version`.
struct HttpServer {
    _child: KillOnDrop,
    port: u16,
}

impl HttpServer {
    fn start(version: &str) -> HttpServer {
        let serve = format!(
            "import http.server as h\n\
             class Handler(h.BaseHTTPRequestHandler):\n\
             \x20   protocol_version = 'HTTP/{version}'\n\
             \x20   def do_GET(self):\n\
             \x20       body = b'no such page'\n\
             \x20       self.send_response(404)\n\
             \x20       self.send_header('Content-Length', str(len(body)))\n\
             \x20       self.end_headers()\n\
             \x20       self.wfile.write(body)\n\
             server = h.HTTPServer(('127.0.0.1', 0), Handler)\n\
             print(server.server_address[1], flush=True)\n\
             server.serve_forever()\n"
        );
        let mut child = Command::new("python3")
            .args(["-c", &serve])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs (apt-get install python3)");
        let line = command::first_line(&mut child);
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no port in {line:?}"));
        HttpServer {
            _child: KillOnDrop(child),
            port,
        }
    }
}

#[test]
fn an_http_server_that_is_not_a_runloop_server_is_named_as_such() {
    let expected = [
        (
            "1.1",
            "it answered the WebSocket upgrade with HTTP 404 Not Found",
        ),
        (
            "1.0",
            "its answer to the WebSocket upgrade is not one: WebSocket protocol error: HTTP \
             version must be 1.1 or higher",
        ),
    ];
    for (version, why) in expected {
        let server = HttpServer::start(version);
        let url = format!("ws://127.0.0.1:{}", server.port);
        let said = format!("runloop: {url} is not a runloop server: {why}\n");
        run_and_check_say(&url, 2, &said);
    }
}

#[test]
fn a_digest_that_is_not_sha256_states_the_rule() {
    let md5 = format!("md5:{}", "0".repeat(32));
    let rule = "sha256: followed by 64 lowercase hex digits";
    let (status, stdout, stderr) = run(&["run", "--image", &format!("demo@{md5}"), "hi"]);
    assert_eq!(status.code(), Some(2));
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!(
            "\"{md5}\" is not a digest runloop takes: a digest is {rule}"
        )),
        "{stderr}"
    );
    let short = "sha256:abc";
    let (status, _, stderr) = run(&["check", "--image", &format!("demo@{short}")]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains(&format!("a digest is {rule}")), "{stderr}");
    let (status, _, stderr) = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--agent",
        &format!("demo@{md5}=builtin:demo"),
    ]);
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains(&format!("digest \"{md5}\" is not {rule}")),
        "{stderr}"
    );
}

#[test]
fn the_demo_agent_counts_one_word_as_one_word() {
    let (status, stdout, _) = run(&["run", "x"]);
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("The prompt has 1 word."), "{stdout}");
    assert!(stdout.contains("1 word, 1 character"), "{stdout}");
    assert!(
        stdout.contains("That is 1 word and 1 character."),
        "{stdout}"
    );
    assert!(
        !stdout.contains("1 words") && !stdout.contains("1 characters"),
        "{stdout}"
    );
}

#[test]
fn a_program_that_never_listens_is_asked_about_its_port_within_the_startup_timeout() {
    // `sleep` runs and never listens: the run waits --startup-timeout.
    let server = command::Serve::start(
        "error",
        &[
            "--agent",
            "demo=exec:sleep 30",
            "--exec-disk",
            "unenforced",
            "--startup-timeout",
            "0.5",
        ],
    );
    let (status, _, stderr) = run(&["run", "--url", &server.url, "hi"]);
    assert_eq!(status.code(), Some(7), "a refused run: {stderr}");
    assert!(
        stderr.contains("the agent program did not listen on 127.0.0.1:")
            && stderr.contains(" within 0.5 s: it must listen on 127.0.0.1:$PORT (here "),
        "{stderr}"
    );
}

/// An agent program whose `/run` handler runs `BEFORE` (a Python
/// statement) before it answers — a statement that raises makes Python's
/// `http.server` close the connection with no status line, as a typo in a
/// handler does — then streams `EVENTS` (a Python list of bytes), each
/// written as one HTTP chunk of the body; then `AFTER` (a Python
/// statement) runs before the body's end.
const SCRIPTED_AGENT: &str = r#"
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/register":
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        exec(BEFORE)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in EVENTS:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        exec(AFTER)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"#;

/// A server at `level` whose one image is [`SCRIPTED_AGENT`] with the
/// Python statements `before` and `after` around `events` (Python bytes
/// literals), in a scratch directory that lives as long as it.
fn agent_server(
    level: &str,
    before: &str,
    events: &[&str],
    after: &str,
) -> (command::Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let agent = dir.path().join("scripted_agent.py");
    let program = format!(
        "import os, time\nBEFORE = {before:?}\nEVENTS = [{}]\nAFTER = {after:?}\n{SCRIPTED_AGENT}",
        events.join(", ")
    );
    std::fs::write(&agent, program).expect("written");
    let spec = format!("demo=exec:python3 {}", agent.display());
    let server = command::Serve::start(level, &["--agent", &spec, "--exec-disk", "unenforced"]);
    (server, dir)
}

/// A server whose one image is an exec agent that sends `events`.
fn scripted_server(events: &[&str]) -> (command::Serve, tempfile::TempDir) {
    scripted_server_then(events, "pass")
}

/// [`scripted_server`], whose agent runs the Python statement `after`
/// once its events are written, before its body's end.
fn scripted_server_then(events: &[&str], after: &str) -> (command::Serve, tempfile::TempDir) {
    agent_server("error", "pass", events, after)
}

#[test]
fn a_payload_that_is_not_a_chunk_is_shown_with_how_a_loop_ends() {
    let (server, _dir) = scripted_server(&[
        r#"b'data: {"type":"assistant_text_content","text":"hi"}\n\n'"#,
        r#"b"data: [DONE]\n\n""#,
    ]);
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "hi"]);
    assert_eq!(status.code(), Some(5), "broken: {stdout}{stderr}");
    assert_eq!(stdout, "hi\n");
    assert!(
        stderr.contains("agentic loop chunk did not parse: ")
            && stderr.contains("; the payload was \"[DONE]\" (6 bytes)\n"),
        "the parser's words, then the payload: {stderr}"
    );
    assert!(
        stderr.contains(
            "each data event must be one chunk, a JSON object with a \"type\"; the end of \
             the stream ends the loop"
        ),
        "{stderr}"
    );
}

/// Issue 30 §3: a bad chunk followed by good ones. The quote is the first
/// payload that did not parse — not the last that came — in `run`, in
/// `decode` of its capture, and in `decode --render`.
#[test]
fn the_first_bad_payload_is_quoted_not_the_last_received() {
    let (server, dir) = scripted_server(&[
        r#"b"data: {this is not json\n\n""#,
        r#"b'data: {"type": "assistant_text_content", "text": "one"}\n\n'"#,
        r#"b'data: {"type": "assistant_text_content", "text": "two"}\n\n'"#,
    ]);
    let capture = dir.path().join("capture.txt");
    let capture = capture.to_str().expect("a UTF-8 path");
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "--capture", capture, "hi"]);
    assert_eq!(status.code(), Some(5), "broken: {stdout}{stderr}");
    let quote = "; the payload was \"{this is not json\" (17 bytes)";
    assert!(stderr.contains(quote), "{stderr}");
    assert!(
        !stderr.contains("two"),
        "the last chunk is not the one quoted: {stderr}"
    );

    let (status, stdout, stderr) = run(&["decode", capture]);
    assert_eq!(status.code(), Some(5), "{stderr}");
    let outcome = stdout
        .lines()
        .find(|line| line.contains("\"outcome\""))
        .expect("an outcome line");
    assert!(
        outcome.ends_with(r#"; the payload was \"{this is not json\" (17 bytes)"}"#),
        "{outcome}"
    );
    let (status, stdout, stderr) = run(&["decode", "--render", capture]);
    assert_eq!(status.code(), Some(5), "{stderr}");
    assert!(stdout.contains(quote), "{stdout}");
}

/// Issue 30 §7: an agent program that dies mid-loop is reported in the
/// runtime's words, in the error value the caller gets, not the HTTP
/// client's account of a broken chunked body.
#[test]
fn an_agent_that_dies_mid_loop_is_reported_with_its_exit_status() {
    let (server, _dir) = scripted_server_then(
        &[r#"b'data: {"type":"assistant_text_content","text":"partial"}\n\n'"#],
        "os._exit(3)",
    );
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "--json", "hi"]);
    assert_eq!(status.code(), Some(1), "unfinished: {stdout}{stderr}");
    assert!(
        stdout.contains(
            r#"{"error":{"kind":"agent","error":"the agent program exited (exit status 3) before its /run body ended"}}"#
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("chunk size line"), "{stdout}");
    assert!(
        stdout.ends_with("{\"outcome\":\"unfinished\"}\n"),
        "{stdout}"
    );
}

/// Issue 30 §6: a time limit that runs out keeps what came. A tool call's
/// fragments (shown for a person only once its arguments stop growing)
/// are shown before the ending line; `--json` ends with the limit. (The
/// limit covers the run's start too: 3 s leave a loaded machine time to
/// start Python.)
#[test]
fn an_idle_timeout_shows_what_came_then_says_which_limit() {
    let (server, _dir) = scripted_server_then(
        &[
            r#"b'data: {"type":"assistant_text_content","text":"looking"}\n\n'"#,
            r#"b'data: {"type":"assistant_tool_call","id":"c1","name":"grep","arguments":"{\\"pattern\\": "}\n\n'"#,
            r#"b'data: {"type":"assistant_tool_call","id":"c1","name":"grep","arguments":"\\"todo\\"}"}\n\n'"#,
        ],
        "time.sleep(30)",
    );
    // The loop at `--idle-timeout 3`, shown as `shown` asks.
    let idle = |shown: &[&str]| {
        let head = ["run", "--url", &server.url, "--idle-timeout", "3"];
        run(&[&head[..], shown, &["hi"]].concat())
    };
    let (status, stdout, stderr) = idle(&["--color", "never"]);
    assert_eq!(status.code(), Some(8), "{stdout}{stderr}");
    assert_eq!(
        stdout, "looking\ntool call grep (c1): {\"pattern\": \"todo\"}\n",
        "the call received is shown"
    );
    assert!(
        stderr.ends_with("runloop: nothing came from the server within 3 s (--idle-timeout 3)\n"),
        "{stderr}"
    );
    let (status, stdout, stderr) = idle(&["--json"]);
    assert_eq!(status.code(), Some(8), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "three chunks, then the outcome: {stdout}");
    assert_eq!(
        lines[3],
        r#"{"outcome":"timeout","limit":"--idle-timeout","seconds":3.0}"#
    );
    let (status, stdout, _) = idle(&["--transcript"]);
    assert_eq!(status.code(), Some(8));
    let document: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(document["outcome"], "timeout");
    assert_eq!(document["limit"], "--idle-timeout");
    assert_eq!(
        document["transcript"][1]["arguments"],
        "{\"pattern\": \"todo\"}"
    );
}

/// Issue 30 §8: an exec catalog under the default `--exec-disk refuse`
/// says at startup that its runs will be refused, and a run that asks for
/// no disk (`--disk 0`, the default) goes ahead.
#[test]
fn a_catalog_that_refuses_disk_says_so_at_startup_and_disk_0_runs() {
    let exe = env!("CARGO_BIN_EXE_runloop");
    let spec = format!("demo=exec:{exe} agent demo");
    let mut server = command::Serve::start("warn", &["--agent", &spec]);
    let log = command::drain(server.stderr());
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "--disk", "0", "hi"]);
    assert_eq!(status.code(), Some(0), "disk 0 runs: {stdout}{stderr}");
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "hi"]);
    assert_eq!(
        status.code(),
        Some(0),
        "the default disk, 0, runs: {stdout}{stderr}"
    );
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--disk", "1G", "hi"]);
    assert_eq!(status.code(), Some(7), "disk 1G is refused: {stderr}");
    assert!(stderr.contains("; disk 0 goes ahead"), "{stderr}");
    server.terminate();
    let log = log.join().expect("the log");
    assert!(
        log.contains(
            "image \"demo\" cannot be served as configured: every run that asks for disk will \
             be refused"
        ),
        "{log}"
    );
}

/// A server whose one image's agent runs `on_run` (a Python statement
/// that fails) in its `/run` handler, before it answers.
fn failing_server(on_run: &str, level: &str) -> (command::Serve, tempfile::TempDir) {
    agent_server(level, on_run, &[], "pass")
}

/// Newcomer G7: a handler that raises is said as the agent program's
/// fault, with where its traceback went — not as the HTTP client's `error
/// sending request for url (http://127.0.0.1:PORT/run) … connection
/// closed before message completed`.
#[test]
fn an_agent_that_raises_in_its_handler_is_said_to_have_closed_the_connection() {
    let (mut server, _dir) = failing_server("raise KeyError('promt')", "info");
    let log = command::drain(server.stderr());
    says_only(
        &["run", "--url", &server.url, "hi"],
        3,
        "no loop ran: {\"kind\":\"agent\",\"error\":\"the agent program closed the connection \
         without answering POST /run: it failed while handling the request, or exited (its \
         output is in the server's log)\"}\n",
    );
    server.terminate();
    let log = log.join().expect("the log");
    assert!(
        log.contains("runloop::agent_program") && log.contains("KeyError: 'promt'"),
        "the traceback is where the message says: {log}"
    );
}

/// Newcomer G8: an exec agent program the kernel kills at the run's memory
/// limit while it handles `/run` is said to have run out of memory, in
/// the loop's error the caller gets.
#[test]
fn an_agent_killed_at_its_memory_limit_before_it_answers_says_so() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Cgroups]) {
        return;
    }
    let (server, _dir) = failing_server("hog = b'x' * (256 << 20)", "error");
    let (status, stdout, stderr) = run(&["run", "--url", &server.url, "--memory", "64M", "hi"]);
    assert_eq!(status.code(), Some(3), "no loop ran: {stdout}{stderr}");
    assert!(
        stderr.starts_with(
            "no loop ran: {\"kind\":\"agent\",\"error\":\"the agent program exited (killed by \
             signal 9; it ran out of memory: the kernel killed 1 of its processes at the run's \
             memory limit) before it answered POST /run\"}"
        ),
        "{stderr}"
    );
}

/// Newcomer G11 and G17: a pinned image asked for by name alone is
/// answered with the reference to ask for (not the all-zero digest the
/// caller never typed), and a name the catalog lacks with the names it has.
#[test]
fn a_catalog_refusal_says_what_would_be_served() {
    let pinned = format!("sha256:{}", "a".repeat(64));
    let server =
        command::Serve::start("error", &["--agent", &format!("rev@{pinned}=builtin:demo")]);
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--image", "rev", "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "runloop: the run was refused: {{\"kind\":\"policy\",\"error\":\"image \\\"rev\\\" is \
             pinned to {pinned}: ask for it by that digest (the request's image digest: \
             RunRequest::server(\\\"rev\\\").digest(…) in the Rust client, \
             digest=\\\"{pinned}\\\" in Python's client.start, rev@{pinned} on runloop run's \
             command line)\"}}\n"
        )
    );
    assert!(!stderr.contains(&"0".repeat(64)), "{stderr}");
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--image", "reverse", "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(
        stderr.contains(
            "image \\\"reverse\\\" is not in this server's catalog, which serves \\\"rev\\\"\"}"
        ),
        "{stderr}"
    );
}

/// Newcomer G12: a registry reference given to `--image` points to
/// `--registry-image`; a name that is merely malformed does not.
#[test]
fn a_registry_reference_given_as_an_image_name_points_to_registry_image() {
    let hint = "; a registry image is asked for with runloop run --registry-image \
                HOST/REPO[:TAG][@DIGEST]";
    for reference in [
        "127.0.0.1:5000/agents/rev:1",
        "registry.example/agents/rev",
        "localhost/agents/rev",
        "agents/rev:1",
    ] {
        let (status, _, stderr) = run(&["run", "--image", reference, "hi"]);
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "{reference:?} is not an image name (a repository path without a host){hint}"
            )),
            "{stderr}"
        );
    }
    let (status, _, stderr) = run(&["run", "--image", "Agents/Rev", "hi"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("--registry-image"), "{stderr}");
}

/// Newcomer G13: a server that wants a credential and got none is told
/// apart from one that refused the credential sent (protocol §3 gives
/// both no frame; the client knows which it sent).
#[test]
fn no_credential_is_told_apart_from_a_wrong_one() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "right\n").expect("written");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "wrong\n").expect("written");
    let server = command::Serve::start("error", &["--token-file", tokens.to_str().expect("UTF-8")]);
    let none = command::runloop()
        .args(["run", "--url", &server.url, "hi"])
        .env_remove("RUNLOOP_TOKEN")
        .output()
        .expect("runs");
    assert_eq!(none.status.code(), Some(7), "{none:?}");
    assert_eq!(
        String::from_utf8_lossy(&none.stderr),
        "runloop: the server closed the connection without answering: it wants a credential, \
         and none was sent (pass it with --token-file FILE or RUNLOOP_TOKEN)\n"
    );
    let wrong = wrong.to_str().expect("UTF-8");
    let (status, _, stderr) = run(&["run", "--url", &server.url, "--token-file", wrong, "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert_eq!(
        stderr,
        "runloop: the server closed the connection without answering (is the credential right?)\n"
    );
}

/// Issue 40 item 9: a server killed while a run starts is named as a
/// connection that broke, not as a credential it wanted (none was sent:
/// the server takes any), and exits 2, not 7 (nothing refused the run).
#[test]
fn a_server_killed_mid_start_is_a_broken_connection() {
    // The exec agent never listens: the run's start is still going on.
    let mut server = command::Serve::start("error", &["--agent", "slow=exec:sleep 60"]);
    let mut caller = command::runloop()
        .args([
            "run",
            "--url",
            &server.url,
            "--image",
            "slow",
            "--disk",
            "0",
            "hi",
        ])
        .env_remove("RUNLOOP_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let stderr = command::drain(caller.stderr.take().expect("stderr"));
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert_eq!(caller.try_wait().expect("waits"), None, "still starting");
    server.kill();
    let status = command::exits(&mut caller, "runloop run after the server's kill");
    let stderr = stderr.join().expect("stderr");
    assert!(
        stderr.starts_with(
            "runloop: the connection ended before the run started: it broke with no close \
             handshake (did the server stop?): "
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("credential"), "{stderr}");
    assert_eq!(status.code(), Some(2), "{stderr}");
}

/// Newcomer G14: `serve` says at startup when an `exec:` entry's program,
/// or the script it is given, is not there — not only at the first run.
#[test]
fn serve_warns_at_startup_of_an_exec_program_that_is_not_there() {
    let mut server = command::Serve::start(
        "warn",
        &[
            "--exec-disk",
            "unenforced",
            "--agent",
            "nowhere=exec:agent-that-is-nowhere.py",
            "--agent",
            "typo=exec:python3 agnet.py",
            "--agent",
            "fine=exec:python3 -m http.server",
        ],
    );
    let log = command::drain(server.stderr());
    server.terminate();
    let log = log.join().expect("the log");
    assert!(
        log.contains(
            "image \"nowhere\" cannot be served as configured: every run will fail: the agent \
             program \"agent-that-is-nowhere.py\" is not on the server's PATH (write a path, such \
             as ./agent-that-is-nowhere.py, or name its interpreter)"
        ),
        "{log}"
    );
    assert!(
        log.contains(
            "image \"typo\" cannot be served as configured: every run will fail: python3's \
             argument \"agnet.py\" names no file (relative to the server's directory)"
        ),
        "{log}"
    );
    assert!(!log.contains("image \"fine\""), "{log}");
}

/// Newcomer G10: a program that exits before it listens is refused with
/// where its output went (under exec and oci alike: the words are the
/// supervised module's).
#[test]
fn a_program_that_exits_before_it_listens_says_where_its_output_is() {
    let mut server = command::Serve::start(
        "info",
        &[
            "--exec-disk",
            "unenforced",
            "--agent",
            "demo=exec:python3 -c raise(SystemExit('a-typo-in-the-agent'))",
        ],
    );
    let log = command::drain(server.stderr());
    let (status, _, stderr) = run(&["run", "--url", &server.url, "hi"]);
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(
        stderr.contains(": exit status 1 (its output is in the server's log)\"}"),
        "{stderr}"
    );
    server.terminate();
    let log = log.join().expect("the log");
    assert!(
        log.contains("runloop::agent_program") && log.contains("a-typo-in-the-agent"),
        "{log}"
    );
}
