//! TLS on both sides: `runloop run` and `runloop check` over `wss://`
//! against `runloop serve --tls-cert/--tls-key`, with certificates made in
//! the test; each way a certificate can fail to verify, and each way of
//! speaking the wrong protocol to a port, fails with words that say which.

use std::path::Path;

use runloop_testkit::command::run;
use runloop_testkit::document::{marked_block, workspace};

use crate::serve::Serve;
use runloop_testkit::certs::Pki;

/// `runloop serve` at `level` over TLS with the certificate `cert` and its
/// key `key`, and `args`.
fn tls_serve(level: &str, cert: impl AsRef<Path>, key: impl AsRef<Path>, args: &[&str]) -> Serve {
    let (cert, key) = (path(cert.as_ref()), path(key.as_ref()));
    Serve::start(
        level,
        &[&["--tls-cert", &cert, "--tls-key", &key], args].concat(),
    )
}

/// `runloop serve` over TLS with `pair`.
fn tls_server(pair: &runloop_testkit::certs::Pair) -> Serve {
    tls_serve("warn", &pair.cert, &pair.key, &[])
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

/// `runloop run --url URL ARGS… PROMPT`: exit code, stdout, stderr.
fn run_at(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let (status, stdout, stderr) = run(&[&["run", "--url", url], args, &["hello"]].concat());
    (status.code(), stdout, stderr)
}

#[test]
fn a_loop_runs_over_wss_with_the_test_authority_trusted() {
    let pki = Pki::new();
    let server = tls_server(&pki.localhost);
    assert!(server.url.starts_with("wss://"), "{}", server.url);
    let url = format!("wss://localhost:{}", server.port());
    let (code, stdout, stderr) = run_at(&url, &["--ca", &path(&pki.ca)]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.lines().any(|line| line == "the loop finished"),
        "{stderr}"
    );
    // `check` speaks wss:// too, with the same --ca.
    let (status, stdout, stderr) = run(&["check", "--url", &url, "--ca", &path(&pki.ca)]);
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
}

#[test]
fn a_certificate_that_does_not_verify_says_which_host_and_why() {
    let pki = Pki::new();
    let good = tls_server(&pki.localhost);
    let expired = tls_server(&pki.expired);
    let cases = [
        (
            "an authority the client was not told to trust",
            format!("wss://localhost:{}", good.port()),
            path(&pki.other_ca),
            "TLS with localhost failed: its certificate is not signed by a certificate \
             authority this client trusts",
        ),
        (
            "an expired certificate",
            format!("wss://localhost:{}", expired.port()),
            path(&pki.ca),
            "TLS with localhost failed: its certificate expired",
        ),
        (
            "a host name the certificate does not name",
            format!("wss://127.0.0.1:{}", good.port()),
            path(&pki.ca),
            "TLS with 127.0.0.1 failed: its certificate was not issued for this host name \
             (it names localhost)",
        ),
    ];
    for (what, url, ca, expected) in cases {
        let (code, stdout, stderr) = run_at(&url, &["--ca", &ca]);
        assert_eq!(code, Some(2), "{what}: {stdout}\n{stderr}");
        assert!(stderr.contains(expected), "{what}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot connect to {url}")),
            "{what}: {stderr}"
        );
        // `check` says the same.
        let (status, stdout, stderr) = run(&["check", "--url", &url, "--ca", &ca]);
        assert_ne!(status.code(), Some(0), "{what}: {stdout}\n{stderr}");
        assert!(
            format!("{stdout}{stderr}").contains(expected),
            "{what}: {stdout}\n{stderr}"
        );
    }
    // Without --ca, only the platform's roots are trusted: not the test's.
    let (code, _, stderr) = run_at(&format!("wss://localhost:{}", good.port()), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("not signed by a certificate authority"),
        "{stderr}"
    );
}

#[test]
fn the_wrong_protocol_for_the_port_is_named() {
    let pki = Pki::new();
    let tls = tls_server(&pki.localhost);
    let (code, _, stderr) = run_at(&format!("ws://localhost:{}", tls.port()), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr
            .contains("the server answered HTTP 400 Bad Request: this port speaks TLS: use wss://"),
        "{stderr}"
    );
    let plain = Serve::start("warn", &[]);
    let (code, _, stderr) = run_at(
        &format!("wss://localhost:{}", plain.port()),
        &["--ca", &path(&pki.ca)],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "TLS with localhost failed: {}",
            runloop::transport::TlsReason::Closed
        )),
        "{stderr}"
    );
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let pki = Pki::new();
    let scratch = tempfile::tempdir().expect("scratch");
    let cert = scratch.path().join("cert.pem");
    let key = scratch.path().join("key.pem");
    std::fs::copy(&pki.localhost.cert, &cert).expect("copy");
    std::fs::copy(&pki.localhost.key, &key).expect("copy");
    let server = tls_serve("info", &cert, &key, &[]);
    let url = format!("wss://localhost:{}", server.port());
    let ca = path(&pki.ca);
    assert_eq!(run_at(&url, &["--ca", &ca]).0, Some(0));
    // Files that do not load are refused, and the certificate stays.
    std::fs::write(&key, "not a key").expect("write");
    server.signal("HUP");
    assert_eq!(run_at(&url, &["--ca", &ca]).0, Some(0));
    // Renewed files are served from the next handshake on.
    std::fs::copy(&pki.expired.cert, &cert).expect("copy");
    std::fs::copy(&pki.expired.key, &key).expect("copy");
    server.signal("HUP");
    let served_expired = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        run_at(&url, &["--ca", &ca])
            .2
            .contains("its certificate expired")
    });
    let (_, _, log) = server.terminate();
    assert!(served_expired, "{log}");
    assert!(log.contains("the TLS certificate did not reload"), "{log}");
    assert!(log.contains("TLS certificate reloaded"), "{log}");
}

#[test]
fn serve_refuses_a_network_address_without_a_token_or_without_tls() {
    let pki = Pki::new();
    let (cert, key) = (path(&pki.localhost.cert), path(&pki.localhost.key));
    let cases: [(&[&str], &str); 3] = [
        (&[], "without a token"),
        (&["--token", "t"], "without TLS"),
        (&["--tls-cert", &cert, "--tls-key", &key], "without a token"),
    ];
    for (args, why) in cases {
        let (status, _, stderr) = run(&[&["serve", "--listen", "0.0.0.0:0"], args].concat());
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    let (_, _, stderr) = run(&["serve", "--listen", "0.0.0.0:0", "--token", "t"]);
    assert!(stderr.contains("--allow-plaintext"), "{stderr}");
    // Told explicitly, it listens in the clear.
    let mut child = runloop_testkit::command::start(
        "warn",
        &[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--token",
            "t",
            "--allow-plaintext",
        ],
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("a URL");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("ws://0.0.0.0:"), "{line}");
}

#[test]
fn a_caller_silent_before_its_tls_handshake_is_closed_by_the_handshake_timeout() {
    use std::io::Read;
    use std::time::{Duration, Instant};

    let pki = Pki::new();
    // The authorization grace (10 s by default) is far longer than the
    // handshake timeout: only the latter can close the socket in time.
    let (cert, key) = (&pki.localhost.cert, &pki.localhost.key);
    let server = tls_serve("warn", cert, key, &["--handshake-timeout", "1"]);
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connects");
    socket
        .set_read_timeout(Some(Duration::from_secs(6)))
        .expect("a read timeout");
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let read = socket.read(&mut byte);
    assert!(
        matches!(read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the server should have closed a silent socket: {read:?} after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// docs/tls.md's openssl recipe, run as the page has it in an empty
/// directory: the leaf it makes is served, and a loop runs with its
/// authority as `--ca`. The certificate `openssl req -x509` makes alone is
/// refused with words that say what to do.
#[test]
fn the_openssl_recipe_of_the_tls_page_makes_a_certificate_that_serves() {
    use runloop_testkit::{Part, needs};
    if !needs(&[Part::program("openssl", "openssl")]) {
        return;
    }
    let recipe = marked_block("docs/tls.md", "recipe: tls");
    let dir = tempfile::tempdir().expect("scratch");
    let made = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &recipe])
        .current_dir(dir.path())
        .output()
        .expect("bash runs");
    assert!(
        made.status.success(),
        "the recipe failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let file = |name: &str| path(&dir.path().join(name));
    let server = tls_serve("warn", file("server.pem"), file("server.key"), &[]);
    let (code, stdout, stderr) = run_at(
        &format!("wss://localhost:{}", server.port()),
        &["--ca", &file("ca.pem")],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    // The names the leaf holds: 127.0.0.1 too.
    let (code, _, stderr) = run_at(
        &format!("wss://127.0.0.1:{}", server.port()),
        &["--ca", &file("ca.pem")],
    );
    assert_eq!(code, Some(0), "{stderr}");

    // The obvious first try: one self-signed certificate, which OpenSSL
    // makes an authority's.
    let selfsigned = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "self.key",
            "-out",
            "self.pem",
            "-days",
            "30",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .current_dir(dir.path())
        .output()
        .expect("openssl runs");
    assert!(selfsigned.status.success(), "{selfsigned:?}");
    let server = tls_serve("warn", file("self.pem"), file("self.key"), &[]);
    let url = format!("wss://localhost:{}", server.port());
    let expected = runloop::transport::TlsReason::CaAsLeaf.to_string();
    for ca in [&["--ca", &file("self.pem")][..], &[]] {
        let (code, _, stderr) = run_at(&url, ca);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("TLS with localhost failed: {expected}")),
            "{ca:?}: {stderr}"
        );
    }
}

/// The failure table of docs/tls.md has a row for each reason a caller
/// can be given, in the words the code uses.
#[test]
fn the_tls_page_lists_each_failure_as_the_code_says_it() {
    use runloop::transport::TlsReason;
    let page = std::fs::read_to_string(workspace().join("docs/tls.md")).expect("docs/tls.md");
    let rows: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with("| `"))
        .collect();
    let reasons = [
        TlsReason::CaAsLeaf,
        TlsReason::UnknownAuthority,
        TlsReason::Expired(Some(3 * 86_400)),
        TlsReason::NotValidYet,
        TlsReason::WrongName(vec!["localhost".into()]),
        TlsReason::NotTls,
        TlsReason::Closed,
    ];
    for reason in reasons {
        let said = format!("`TLS with HOST failed: {reason}`");
        assert!(
            rows.iter()
                .any(|row| row.starts_with(&format!("| {said} |"))),
            "docs/tls.md has no row for {said}"
        );
    }
}

/// The value of one series in an exposition, 0 when absent.
fn series(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn slow_handshakes_time_out_and_a_caller_turned_away_is_told_why() {
    use std::io::Write;
    use std::time::{Duration, Instant};

    let pki = Pki::new();
    let server = tls_serve(
        "warn",
        &pki.localhost.cert,
        &pki.localhost.key,
        &[
            "--handshake-timeout",
            "2",
            "--max-unauthorized",
            "4",
            "--admin",
            "127.0.0.1:0",
        ],
    );
    let admin = server.admin.expect("an admin listener");
    // Four callers that start a TLS handshake and send the rest of their
    // ClientHello a byte every 300 ms: they hold every place there is.
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let port = server.port();
            std::thread::spawn(move || {
                let mut socket =
                    std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
                let hello = [
                    0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
                ];
                let started = Instant::now();
                for byte in hello.iter().cycle() {
                    if socket.write_all(&[*byte]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                    if started.elapsed() > Duration::from_secs(10) {
                        break;
                    }
                }
                started.elapsed()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (code, _, stderr) = run_at(
        &server.url.replace("127.0.0.1", "localhost"),
        &["--ca", &path(&pki.ca)],
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("too many connections are authorizing"),
        "the refusal should say why: {stderr}"
    );
    for thread in slow {
        let held = thread.join().expect("joined");
        assert!(
            held < Duration::from_secs(5),
            "a slow handshake held its place {held:?}"
        );
    }
    let metrics = crate::http::metrics(admin);
    assert_eq!(
        series(
            &metrics,
            r#"runloop_tls_handshake_failures_total{reason="timeout"}"#
        ),
        4.0,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            r#"runloop_tls_handshake_failures_total{reason="handshake"}"#
        ),
        0.0,
        "{metrics}"
    );
}
