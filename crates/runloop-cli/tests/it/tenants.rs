//! Tenants and the configuration file (issue 27), with real files, real
//! `runloop serve` processes and real signals: the example configuration
//! of docs/operating.md, where alice floods and bob is still served
//! (connections, runs, loops, memory), with per-tenant metrics counted
//! exactly and no secret in logs or metrics; the default fair share of two
//! tokens of a token file; SIGHUP adding a tenant, removing a token,
//! changing a quota, and a broken file left unapplied; `--check-config` on
//! a typo, a bad size and an unreadable token file; flags over the file;
//! `--print-config` as a file that checks out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runloop::client::{Client, Run, RunError};
use runloop::proto::agents_run::{Container, Image, ImageRef, RunRequest};
use runloop::proto::run_loop::Outcome;
use runloop_testkit::command::{self, token_hash};
use runloop_testkit::loads::{held_loops, loop_refusal, refusal, runtime};
use runloop_testkit::process::KillOnDrop;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The example configuration the operator's page is built around.
fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/serve.toml")
}

/// A demo run asking for `memory`.
fn request(memory: u64) -> RunRequest {
    let image = Image::Server(ImageRef {
        name: "demo".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
    });
    let agent = serde_json::value::RawValue::from_string("{}".into()).expect("JSON");
    RunRequest::new(Container::new(image, memory, 0), agent)
}

/// A `runloop serve` at `RUST_LOG=info` whose log lines are kept, with its
/// URL and, with `--admin`, its admin address.
struct Server {
    child: KillOnDrop,
    url: String,
    admin: Option<SocketAddr>,
    logs: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server::start_with(command::runloop(), args)
    }

    /// [`Server::start`] with `command` as the `runloop` to run (its
    /// environment set).
    fn start_with(mut command: std::process::Command, args: &[&str]) -> Server {
        let mut child = command
            .arg("serve")
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("RUNLOOP_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runloop serve starts");
        let logs = Arc::new(Mutex::new(String::new()));
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        std::thread::spawn({
            let logs = Arc::clone(&logs);
            move || {
                let mut line = String::new();
                while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
                    logs.lock().expect("logs").push_str(&line);
                    line.clear();
                }
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the URL");
        let url = line.trim().to_owned();
        assert!(
            url.starts_with("ws://"),
            "{url:?}; logs: {}",
            logs.lock().expect("logs")
        );
        let admin = args
            .contains(&"--admin")
            .then(|| command::admin_address(&mut stdout));
        Server {
            child: KillOnDrop(child),
            url,
            admin,
            logs,
        }
    }

    fn logs(&self) -> String {
        self.logs.lock().expect("logs").clone()
    }

    /// Waits (bounded) for a log line holding every one of `needles`.
    fn wait_for(&self, needles: &[&str]) -> String {
        let start = Instant::now();
        loop {
            let logs = self.logs();
            if let Some(line) = logs
                .lines()
                .find(|line| needles.iter().all(|n| line.contains(n)))
            {
                return line.to_owned();
            }
            assert!(
                start.elapsed() < command::PATIENCE,
                "no line with {needles:?} in\n{logs}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn hangup(&self) {
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
    }

    /// The status line of its `/healthz`, or why there was none within
    /// `wait` (a server whose workers are all blocked accepts, and never
    /// answers).
    fn healthz(&self, wait: Duration) -> Result<String, String> {
        let admin = self.admin.expect("an admin listener");
        let mut tcp = TcpStream::connect_timeout(&admin, wait).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(wait))
            .map_err(|e| e.to_string())?;
        write!(tcp, "GET /healthz HTTP/1.0\r\nHost: {admin}\r\n\r\n").map_err(|e| e.to_string())?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).map_err(|e| e.to_string())?;
        Ok(answer.lines().next().unwrap_or_default().to_owned())
    }

    /// A scrape of its /metrics.
    fn metrics(&self) -> String {
        let admin = self.admin.expect("an admin listener");
        let mut tcp = TcpStream::connect(admin).expect("the admin listener");
        write!(tcp, "GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").expect("GET");
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).expect("the answer");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a body");
        assert!(
            head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
            "{head}"
        );
        body.to_owned()
    }
}

/// The value of the sample `name` in a Prometheus exposition.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// A tenant's sample of the counter `family`.
fn tenant(text: &str, family: &str, name: &str) -> u64 {
    sample(
        text,
        &format!("runloop_tenant_{family}_total{{tenant=\"{name}\"}}"),
    )
}

#[test]
fn alice_floods_and_bob_is_still_served() {
    let example = example();
    // The file listens on 7878; the command line overrides it.
    let server = Server::start(&[
        "--config",
        example.to_str().expect("a path"),
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    let url = server.url.clone();
    let (bob_chunks, figures) = runtime().block_on(async {
        // Connections: alice holds the defaults' four; a fifth is turned
        // away with 1013 naming her limit, and bob connects.
        let mut alice = Vec::new();
        for _ in 0..4 {
            alice.push(
                Client::connect(&url, "alice-token")
                    .await
                    .expect("connects"),
            );
        }
        let fifth = Client::connect(&url, "alice-token")
            .await
            .expect("the handshake");
        match fifth.start(request(MIB)).await {
            Err(RunError::Closed { code: 1013, reason }) => assert_eq!(
                reason,
                "tenant alice holds as many connections as it may (max-connections 4); try \
                 again later"
            ),
            other => panic!("alice's fifth connection: {:?}", other.map(|_| "a run")),
        }
        let bob = Client::connect(&url, "bob-token")
            .await
            .expect("bob connects");

        // Runs: alice's three, then her own limit; bob's run meanwhile.
        let mut runs = Vec::new();
        for client in &alice[..3] {
            runs.push(client.start(request(512 * MIB)).await.expect("alice's run"));
        }
        let why = refusal(alice[3].start(request(MIB)).await);
        assert_eq!(
            why,
            "tenant alice holds as many runs as it may (max-runs 3); try again later"
        );
        let bobs = bob.start(request(GIB)).await.expect("bob is served");

        // Loops: two held, the third refused naming her max-loops.
        let held = held_loops(&runs[..2], "held demo:pace=250 zebra-prompt").await;
        assert_eq!(
            loop_refusal(&runs[2], "a third").await,
            "tenant alice holds as many loops as it may (max-loops 2); try again later"
        );
        let (bob_chunks, outcome) = bobs
            .run_loop("bob's loop zebra-prompt")
            .collect_chunks()
            .await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        for held_loop in held {
            let (_, outcome) = held_loop.collect_chunks().await;
            assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        }

        // Memory: with one run stopped she holds 1 GiB of her 2 GiB.
        runs.pop().expect("a run").stop().await;
        let why = refusal(alice[0].start(request(1536 * MIB)).await);
        assert_eq!(
            why,
            "memory 1610612736 does not fit tenant alice's memory budget: its runs hold \
             1073741824 of memory-budget 2147483648 bytes; try again later"
        );
        // Bob's share is his own: 1 GiB held, 2 GiB more fits his 4 GiB.
        let more = bob.start(request(2 * GIB)).await.expect("bob's second run");
        let figures = format!(
            "alice: 4 connections (5th turned away), 3 runs (4th refused), 2 loops (3rd \
             refused), 1.5 GiB refused over 1 GiB held; bob: 2 runs of 1 and 2 GiB and a \
             loop of {} chunks served meanwhile",
            bob_chunks.len()
        );
        for run in runs.iter().chain([&bobs, &more]) {
            run.stop().await;
        }
        (bob_chunks.len() as u64, figures)
    });
    println!("{figures}");

    let metrics = server.metrics();
    assert_eq!(tenant(&metrics, "connections_refused", "alice"), 1);
    assert_eq!(tenant(&metrics, "connections_refused", "bob"), 0);
    assert_eq!(tenant(&metrics, "runs_started", "alice"), 3);
    assert_eq!(tenant(&metrics, "runs_started", "bob"), 2);
    assert_eq!(tenant(&metrics, "runs_refused", "alice"), 2);
    assert_eq!(tenant(&metrics, "runs_refused", "bob"), 0);
    assert_eq!(tenant(&metrics, "loops", "alice"), 3);
    assert_eq!(tenant(&metrics, "loops_refused", "alice"), 1);
    assert_eq!(tenant(&metrics, "loops", "bob"), 1);
    assert_eq!(tenant(&metrics, "loops_refused", "bob"), 0);
    assert_eq!(tenant(&metrics, "chunks_relayed", "bob"), bob_chunks);
    // The tenants' chunks and bytes are the server's, split.
    for (family, total) in [
        ("chunks_relayed", "runloop_chunks_relayed_total"),
        ("relayed_bytes", "runloop_relayed_bytes_total"),
    ] {
        let (a, b) = (
            tenant(&metrics, family, "alice"),
            tenant(&metrics, family, "bob"),
        );
        assert!(a > 0 && b > 0, "{family}: {a} {b}");
        assert_eq!(a + b, sample(&metrics, total), "{family}");
    }

    // Logs say which tenant; nothing says a token, its hash or a prompt.
    let logs = server.logs();
    server.wait_for(&["authorized", "tenant=alice"]);
    server.wait_for(&["authorized", "tenant=bob"]);
    for secret in [
        "alice-token",
        "bob-token",
        "97dd3707015dcf069cf7",
        "zebra-prompt",
    ] {
        assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
        assert!(!metrics.contains(secret), "{secret} in the metrics");
    }
}

#[test]
fn two_tokens_of_a_file_have_a_fair_share_by_default() {
    let dir = tempfile::tempdir().expect("a directory");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alpha\nbeta\n").expect("the token file");
    // The default memory budget: 3/4 of MemTotal; each token holds half.
    let server = Server::start(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        tokens.to_str().expect("a path"),
        "--max-runs",
        "40",
    ]);
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .expect("MemTotal");
    let budget = kib * 1024 / 4 * 3;
    let share = budget / 2;
    let expected = (share / GIB) as usize;
    let url = server.url.clone();
    let (served, refused, other) = runtime().block_on(async {
        // The flood: 24 connections of one token asking 1 GiB runs.
        let mut clients = Vec::new();
        for _ in 0..24 {
            clients.push(Client::connect(&url, "alpha").await.expect("connects"));
        }
        let mut served = Vec::new();
        let mut refused = Vec::new();
        for client in &clients {
            match client.start(request(GIB)).await {
                Ok(run) => served.push(run),
                Err(error) => refused.push(refusal(Err(error))),
            }
        }
        let beta = Client::connect(&url, "beta").await.expect("connects");
        let other = beta.start(request(GIB)).await.expect("beta is served");
        let outcome = other.run_loop("hello").outcome().await;
        assert!(matches!(outcome, Outcome::Finished { .. }), "{outcome:?}");
        for run in served.iter().chain([&other]) {
            run.stop().await;
        }
        (served.len(), refused, true)
    });
    println!(
        "fair share: memory budget {budget} bytes; token #1 asked 24 runs of 1 GiB on 24 \
         connections: {served} served, {} refused; token #2 served: {other}",
        refused.len()
    );
    assert_eq!(served, expected.min(20));
    let held = served as u64 * GIB;
    assert!(expected < 20, "a machine this large needs a larger flood");
    assert_eq!(
        refused[0],
        format!(
            "memory {GIB} does not fit tenant token #1's memory budget: its runs hold {held} \
             of memory-budget {share} bytes; try again later"
        )
    );

    // Runs: half of --max-runs, never below one.
    let server = Server::start(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        tokens.to_str().expect("a path"),
        "--max-runs",
        "5",
    ]);
    let url = server.url.clone();
    runtime().block_on(async {
        let alpha = Client::connect(&url, "alpha").await.expect("connects");
        let first = alpha.start(request(MIB)).await.expect("one");
        let second = alpha.start(request(MIB)).await.expect("two");
        let why = refusal(alpha.start(request(MIB)).await);
        assert_eq!(
            why,
            "tenant token #1 holds as many runs as it may (max-runs 2); try again later"
        );
        let beta = Client::connect(&url, "beta").await.expect("connects");
        let bs: Vec<Run> = vec![
            beta.start(request(MIB)).await.expect("beta's first"),
            beta.start(request(MIB)).await.expect("beta's second"),
        ];
        for run in bs.iter().chain([&first, &second]) {
            run.stop().await;
        }
    });
}

/// Writes `text` to `path`, whole, in one rename (a reload never reads
/// half a file).
fn write(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).expect("written");
    std::fs::rename(&partial, path).expect("renamed");
}

/// `runloop serve WHAT --config CONFIG ARGS…` (`--check-config` or
/// `--print-config`): how it exited, stdout, stderr.
fn serve_config(what: &str, config: &Path, args: &[&str]) -> (ExitStatus, String, String) {
    let config = config.to_str().expect("a path");
    command::run(&[&["serve", what, "--config", config], args].concat())
}

/// `runloop serve --check-config` of `text`, written to `serve.toml` in
/// `dir` (where the files it names are): how it exited, stdout, stderr.
fn check_text(dir: &Path, text: &str) -> (ExitStatus, String, String) {
    let config = dir.join("serve.toml");
    write(&config, text);
    serve_config("--check-config", &config, &[])
}

/// Each of `words` is said somewhere in `text`.
fn says_each(text: &str, words: &[&str]) {
    for said in words {
        assert!(text.contains(said), "{said} in\n{text}");
    }
}

/// Each of `lines` is a whole line of `text`.
fn has_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.lines().any(|l| l == *line), "{line} in\n{text}");
    }
}

#[test]
fn sighup_applies_tenants_tokens_and_quotas_and_leaves_a_broken_file_unapplied() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = dir.path().join("serve.toml");
    let tokens = dir.path().join("alice.tokens");
    std::fs::write(&tokens, "a1\na2\n").expect("tokens");
    write(
        &config,
        "max-runs = 16\n[[tenant]]\nname = \"alice\"\ntoken-file = \"alice.tokens\"\nmax-runs = 1\n",
    );
    let server = Server::start(&[
        "--config",
        config.to_str().expect("a path"),
        "--listen",
        "127.0.0.1:0",
    ]);
    let url = server.url.clone();
    let rt = runtime();
    // Alice, by her second token, holds her one run.
    let (a2, first) = rt.block_on(async {
        let a2 = Client::connect(&url, "a2").await.expect("connects");
        let first = a2.start(request(MIB)).await.expect("alice's run");
        let why = refusal(a2.start(request(MIB)).await);
        assert!(why.contains("(max-runs 1)"), "{why}");
        (a2, first)
    });

    // Her second token removed, her max-runs raised, bob added, and a key
    // that needs a restart changed.
    std::fs::write(&tokens, "a1\n").expect("tokens");
    write(
        &config,
        &format!(
            "max-runs = 8\nmax-runs-per-identity = 3\n\
             [[tenant]]\nname = \"alice\"\ntoken-file = \"alice.tokens\"\nmax-runs = 2\n\
             [[tenant]]\nname = \"bob\"\ntokens = [\"{}\"]\n",
            token_hash("b1")
        ),
    );
    server.hangup();
    server.wait_for(&["SIGHUP: applied", "tenant bob added with 1 token(s)"]);
    server.wait_for(&[
        "SIGHUP: applied",
        "tenant alice: 0 token(s) added, 1 removed",
    ]);
    server.wait_for(&["SIGHUP: applied", "tenant alice: max-runs 1 -> 2"]);
    server.wait_for(&["max-runs", "applies only after a restart"]);
    // A per-identity limit is applied: the defaults' runs were half of
    // max-runs 16, and are now the 3 the file says.
    server.wait_for(&["SIGHUP: applied", "tenant-defaults: max-runs 8 -> 3"]);
    assert!(
        !server.logs().contains("key=\"max-runs-per-identity\""),
        "{}",
        server.logs()
    );
    rt.block_on(async {
        // The removed token's open connection is revoked (issue 40, row
        // 1): it opens no more runs, neither under alice's new quota nor
        // the defaults', each refusal saying why; its running run goes on
        // for the revocation grace. A new connection with it is refused.
        for _ in 0..3 {
            let why = refusal(a2.start(request(MIB)).await);
            assert!(why.contains("credential was revoked by a reload"), "{why}");
        }
        let again = Client::connect(&url, "a2").await.expect("the handshake");
        assert!(again.start(request(MIB)).await.is_err(), "a2 is removed");
        // alice's token that stays serves her new quota.
        let a1 = Client::connect(&url, "a1").await.expect("connects");
        let hers = a1.start(request(MIB)).await.expect("a1 serves");
        let bob = Client::connect(&url, "b1").await.expect("connects");
        let bobs = bob.start(request(MIB)).await.expect("bob is served");
        for run in [&first, &hers, &bobs] {
            run.stop().await;
        }
    });

    // A file that does not validate changes nothing, and says why.
    write(
        &config,
        "max-runz = 8\n[[tenant]]\nname = \"carol\"\ntokens = [\"c1\"]\n",
    );
    server.hangup();
    let line = server.wait_for(&["does not validate; nothing changed"]);
    assert!(
        line.contains("max-runz") && line.contains("max-runs"),
        "{line}"
    );
    rt.block_on(async {
        let bob = Client::connect(&url, "b1").await.expect("connects");
        let run = bob.start(request(MIB)).await.expect("bob is still served");
        run.stop().await;
    });
    let logs = server.logs();
    for secret in ["a1", "a2", "b1", &token_hash("b1")[7..]] {
        assert!(
            !logs
                .lines()
                .any(|l| l.split(|c: char| !c.is_alphanumeric()).any(|w| w == secret)),
            "{secret} in the logs:\n{logs}"
        );
    }
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_token_file_that_is_a_fifo_is_refused_on_reload_and_the_server_goes_on() {
    // Issue 40, item 4: a tenant's token-file replaced by a FIFO with no
    // writer. The reload opened it on a runtime worker and blocked there;
    // with one worker (as on a one-CPU host) every connection, run and
    // /healthz stalled until something wrote to it.
    let dir = tempfile::tempdir().expect("a directory");
    let config = dir.path().join("serve.toml");
    let tokens = dir.path().join("alice.tokens");
    std::fs::write(&tokens, "a1\n").expect("tokens");
    write(
        &config,
        "[[tenant]]\nname = \"alice\"\ntoken-file = \"alice.tokens\"\nmax-runs = 1\n",
    );
    let mut command = command::runloop();
    command.env("TOKIO_WORKER_THREADS", "1");
    let server = Server::start_with(
        command,
        &[
            "--config",
            config.to_str().expect("a path"),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
    );
    std::fs::remove_file(&tokens).expect("removed");
    mkfifo(&tokens);
    // The quota changes too: a reload that went through would apply it.
    write(
        &config,
        "[[tenant]]\nname = \"alice\"\ntoken-file = \"alice.tokens\"\nmax-runs = 2\n",
    );
    server.hangup();
    let line = server.wait_for(&["does not validate; nothing changed"]);
    assert!(
        line.contains("alice.tokens") && line.contains("not a regular file"),
        "{line}"
    );
    assert_eq!(
        server.healthz(Duration::from_secs(10)).as_deref(),
        Ok("HTTP/1.0 200 OK"),
        "/healthz answers"
    );
    // The old configuration is in force: alice's token, her one run.
    let url = server.url.clone();
    runtime().block_on(async {
        let alice = Client::connect(&url, "a1").await.expect("connects");
        let run = alice.start(request(MIB)).await.expect("alice is served");
        let why = refusal(alice.start(request(MIB)).await);
        assert!(why.contains("(max-runs 1)"), "{why}");
        run.stop().await;
    });
    // /dev/zero as a token file: refused at once, never read on.
    write(
        &config,
        "[[tenant]]\nname = \"alice\"\ntoken-file = \"/dev/zero\"\n",
    );
    server.hangup();
    server.wait_for(&["does not validate", "/dev/zero", "character device"]);
    assert_eq!(
        server.healthz(Duration::from_secs(10)).as_deref(),
        Ok("HTTP/1.0 200 OK")
    );
}

#[test]
fn check_config_reports_every_fault_at_once() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::create_dir(dir.path().join("unreadable")).expect("a directory");
    let (status, stdout, stderr) = check_text(
        dir.path(),
        "max-run = 3\nmax-message-size = \"16Q\"\n\
         [[tenant]]\nname = \"carol\"\ntoken-file = \"unreadable\"\n",
    );
    assert_eq!(status.code(), Some(2), "{stdout}\n{stderr}");
    says_each(
        &stderr,
        &[
            "unknown key \"max-run\"; the nearest valid key is \"max-runs\"",
            "max-message-size: invalid value '16Q'",
            "tenant \"carol\": cannot read the token file",
            "3 fault(s)",
        ],
    );
    assert!(stdout.contains("# the effective configuration"), "{stdout}");

    // The example checks out; a flag overrides its key.
    let (status, stdout, stderr) = serve_config(
        "--check-config",
        &example(),
        &["--max-runs", "3", "--token", "hunter2-on-the-command-line"],
    );
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    // The effective configuration never shows a token.
    assert!(!stdout.contains("hunter2"), "{stdout}");
    assert!(
        stdout.contains("token = [\"<redacted>\"]  # command line"),
        "{stdout}"
    );
    has_lines(
        &stdout,
        &[
            "max-runs = 3  # command line",
            "memory-budget = \"8G\"  # file",
            "max-scopes = 256  # default",
            "# the configuration is valid",
        ],
    );
}

#[test]
fn check_config_reports_a_limit_beside_a_tls_fault_and_a_bad_tenant_once() {
    // Issue 40, item 10: a TLS fault hid the limits below their minimum,
    // and a bad tenant name was printed (and counted) twice.
    let dir = tempfile::tempdir().expect("a directory");
    let (status, stdout, stderr) = check_text(
        dir.path(),
        &format!(
            "max-scopes = 0\ntls-cert = \"missing.pem\"\ntls-key = \"missing.key\"\n\
             [[tenant]]\nname = \"bad name\"\ntokens = [\"{}\"]\n",
            token_hash("t")
        ),
    );
    assert_eq!(status.code(), Some(2), "{stdout}\n{stderr}");
    for fault in [
        "--max-scopes is 0, below its minimum of 1",
        "cannot read missing.pem",
        "tenant name \"bad name\" is not",
        "3 fault(s)",
    ] {
        assert_eq!(
            stderr.matches(fault).count(),
            1,
            "{fault} once in\n{stderr}"
        );
    }
}

#[test]
fn a_duration_or_size_past_its_maximum_is_a_fault_in_a_file_and_on_the_command_line() {
    // Issue 40, item 6: `authorization-grace = "999999h"` was accepted.
    let dir = tempfile::tempdir().expect("a directory");
    let (status, stdout, stderr) = check_text(
        dir.path(),
        "authorization-grace = \"999999h\"\ntenant-log-rate = \"2G\"\n\
         [[tenant]]\nname = \"alice\"\ntokens = [\"sha256:97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525\"]\ncpu-weight = 0\n",
    );
    assert_eq!(status.code(), Some(2), "{stdout}\n{stderr}");
    says_each(
        &stderr,
        &[
            "authorization-grace: invalid value '999999h'",
            "is more than the most it may be, 10m",
            "tenant-log-rate: invalid value '2G'",
            "tenant \"alice\": cpu-weight is a whole number from 1 to 10000, not 0",
            "3 fault(s)",
        ],
    );
    let (status, _, stderr) =
        command::run(&["serve", "--check-config", "--drain-timeout", "100000h"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the most it may be, 24h"), "{stderr}");
}

#[test]
fn tls_key_on_the_command_line_pairs_with_the_file_s_certificate() {
    let dir = tempfile::tempdir().expect("a directory");
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    std::fs::write(dir.path().join("cert.pem"), cert.pem()).expect("written");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&key_file, key.serialize_pem()).expect("written");
    let config = dir.path().join("serve.toml");
    write(
        &config,
        &format!(
            "tls-cert = {:?}\n",
            dir.path().join("cert.pem").to_str().expect("a path")
        ),
    );
    let key_file = key_file.to_str().expect("a path");
    let (status, stdout, stderr) =
        serve_config("--check-config", &config, &["--tls-key", key_file]);
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("tls-key = {key_file:?}  # command line")),
        "{stdout}"
    );
    // One without the other is a fault that says which is missing.
    let (status, _, stderr) = serve_config("--check-config", &config, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tls-cert is given without --tls-key"),
        "{stderr}"
    );
}

#[test]
fn print_config_with_a_file_prints_its_tenants_as_a_file_that_serves_the_same() {
    let (status, printed, stderr) = serve_config("--print-config", &example(), &[]);
    assert_eq!(status.code(), Some(0), "{printed}\n{stderr}");
    has_lines(
        &printed,
        &[
            "max-runs = 8  # file",
            "[[tenant]]",
            "name = \"alice\"",
            "name = \"bob\"",
            "[tenant-defaults]",
            "max-connections = 4",
        ],
    );
    // Printed elsewhere, it is the same configuration: alice's token
    // file is named where it is.
    let dir = tempfile::tempdir().expect("a directory");
    let (status, again, stderr) = check_text(dir.path(), &printed);
    assert_eq!(status.code(), Some(0), "{again}\n{stderr}");
    let tenants = |text: &str| text[text.find("[[tenant]]").expect("tenants")..].to_owned();
    assert_eq!(tenants(&again), tenants(&printed));
}

#[test]
fn print_config_uncommented_is_a_valid_configuration() {
    let (status, printed, stderr) = command::run(&["serve", "--print-config"]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    let mut file = String::new();
    for line in printed.lines() {
        if line.starts_with("# ── Tenants") {
            break;
        }
        assert!(line.is_empty() || line.starts_with('#'), "{line}");
        if let Some(setting) = line.strip_prefix("# ")
            && setting
                .split_once(" = ")
                .is_some_and(|(key, _)| key.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            && !setting.contains("(see above)")
        {
            file.push_str(setting);
            file.push('\n');
        }
    }
    says_each(
        &printed,
        &[
            "listen = ",
            "max-runs = 256",
            "memory-budget",
            "drain-timeout = \"30s\"",
        ],
    );
    let dir = tempfile::tempdir().expect("a directory");
    let (status, stdout, stderr) = check_text(dir.path(), &file);
    assert_eq!(status.code(), Some(0), "{file}\n{stdout}\n{stderr}");
}
