//! A hostile registry of the tests' own on loopback: plain HTTP/1.1 written
//! by hand so that it can do what a well-behaved server never would —
//! redirect elsewhere, stream a manifest without end, declare a length it
//! never sends, trickle a byte at a time — and, beside it, a second server
//! ("elsewhere", on 127.0.0.2) that counts the requests it gets: the host
//! a redirect points at.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runloop_oci::digest::Digest;
use runloop_oci::layout::Layout;

/// What the registry does for a repository.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Serves the image of a layout, blobs and all.
    Serve,
    /// Answers every manifest `GET` with `307` to the same path elsewhere.
    RedirectManifest,
    /// Serves the manifest, and answers blob `GET`s with `302` to
    /// `http://HOST/v2/REPO/blobs/DIGEST` (HOST: `host:port`).
    RedirectBlobs(String),
    /// A manifest of `200` without `Content-Length` that never ends.
    EndlessManifest,
    /// A manifest that declares this many bytes and sends none.
    DeclaredManifest(u64),
    /// A manifest sent one byte every this long.
    TrickleManifest(Duration),
    /// The manifest served, and every blob sent one byte every this long.
    TrickleBlobs(Duration),
}

#[derive(Default)]
struct Routes {
    /// repository → (its behaviour, the layout and manifest digest it serves).
    repos: HashMap<String, (Behaviour, Option<(PathBuf, Digest)>)>,
    /// Trickled blobs whose reader went away.
    abandoned: usize,
}

/// The hostile registry and the host its redirects point at.
pub struct Hostile {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// `127.0.0.2:PORT`: "elsewhere", serving the same routes.
    pub elsewhere: String,
    routes: Arc<Mutex<Routes>>,
    elsewhere_hits: Arc<AtomicUsize>,
    hits: Arc<AtomicUsize>,
}

impl Hostile {
    /// Starts both servers, each on a thread of its own.
    pub fn start() -> Hostile {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let registry = TcpListener::bind("127.0.0.1:0").expect("binds");
        let elsewhere = TcpListener::bind("127.0.0.2:0").expect("binds 127.0.0.2");
        let host = registry.local_addr().expect("addr").to_string();
        let other = elsewhere.local_addr().expect("addr").to_string();
        let elsewhere_hits = Arc::new(AtomicUsize::new(0));
        let registry_hits = Arc::new(AtomicUsize::new(0));
        for (listener, hits, plain) in [
            (registry, Arc::clone(&registry_hits), false),
            (elsewhere, Arc::clone(&elsewhere_hits), true),
        ] {
            let routes = Arc::clone(&routes);
            let redirect_to = other.clone();
            std::thread::spawn(move || {
                for tcp in listener.incoming().map_while(Result::ok) {
                    let routes = Arc::clone(&routes);
                    let hits = Arc::clone(&hits);
                    let redirect_to = redirect_to.clone();
                    std::thread::spawn(move || serve(tcp, &routes, &hits, &redirect_to, plain));
                }
            });
        }
        Hostile {
            host,
            elsewhere: other,
            routes,
            elsewhere_hits,
            hits: registry_hits,
        }
    }

    /// Has `repository` behave so, serving `image` (a layout and manifest).
    pub fn route(&self, repository: &str, behaviour: Behaviour, image: Option<(PathBuf, Digest)>) {
        self.routes
            .lock()
            .expect("routes")
            .repos
            .insert(repository.to_owned(), (behaviour, image));
    }

    /// Requests "elsewhere" got.
    pub fn elsewhere_hits(&self) -> usize {
        self.elsewhere_hits.load(Ordering::SeqCst)
    }

    /// Requests the registry got.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Trickled blobs whose reader closed the connection.
    pub fn abandoned(&self) -> usize {
        self.routes.lock().expect("routes").abandoned
    }
}

/// Serves one connection; `plain`: every repository as [`Behaviour::Serve`].
fn serve(tcp: TcpStream, routes: &Mutex<Routes>, hits: &AtomicUsize, elsewhere: &str, plain: bool) {
    let mut reader = BufReader::new(tcp.try_clone().expect("clone"));
    let mut tcp = tcp;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
        }
        hits.fetch_add(1, Ordering::SeqCst);
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        if !answer(&mut tcp, &path, routes, elsewhere, plain) {
            return;
        }
    }
}

fn respond(tcp: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> bool {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).is_ok() && tcp.write_all(body).is_ok()
}

/// Answers one request; whether the connection may be used again.
fn answer(
    tcp: &mut TcpStream,
    path: &str,
    routes: &Mutex<Routes>,
    elsewhere: &str,
    plain: bool,
) -> bool {
    if path == "/v2/" {
        return respond(tcp, "200 OK", &[], b"{}");
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return respond(tcp, "404 Not Found", &[], b"");
    };
    let (repository, kind, name) = match (rest.rfind("/manifests/"), rest.rfind("/blobs/")) {
        (Some(at), _) => (&rest[..at], "manifests", &rest[at + "/manifests/".len()..]),
        (_, Some(at)) => (&rest[..at], "blobs", &rest[at + "/blobs/".len()..]),
        _ => return respond(tcp, "404 Not Found", &[], b""),
    };
    let Some((behaviour, image)) = routes
        .lock()
        .expect("routes")
        .repos
        .get(repository)
        .cloned()
    else {
        return respond(tcp, "404 Not Found", &[], b"");
    };
    let behaviour = if plain { Behaviour::Serve } else { behaviour };
    let blob = |digest: &Digest| {
        let (dir, _) = image.as_ref().expect("an image");
        fs::read(Layout::open(dir).expect("layout").blob_path(digest)).ok()
    };
    match (kind, &behaviour) {
        ("manifests", Behaviour::RedirectManifest) => respond(
            tcp,
            "307 Temporary Redirect",
            &[("Location", format!("http://{elsewhere}{path}"))],
            b"",
        ),
        ("manifests", Behaviour::EndlessManifest) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n{\"schemaVersion\":2,\"annotations\":{\"x\":\"";
            if tcp.write_all(head.as_bytes()).is_err() {
                return false;
            }
            let chunk = vec![b'a'; 1 << 20];
            while tcp.write_all(&chunk).is_ok() {}
            false
        }
        ("manifests", Behaviour::DeclaredManifest(length)) => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n{{");
            let _ = tcp.write_all(head.as_bytes());
            std::thread::sleep(Duration::from_secs(60));
            false
        }
        ("manifests", Behaviour::TrickleManifest(every)) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{";
            if tcp.write_all(head.as_bytes()).is_err() {
                return false;
            }
            loop {
                std::thread::sleep(*every);
                if tcp.write_all(b" ").is_err() {
                    return false;
                }
            }
        }
        ("manifests", _) => {
            let (_, digest) = image.as_ref().expect("an image");
            let manifest = blob(digest).expect("the manifest blob");
            respond(
                tcp,
                "200 OK",
                &[
                    (
                        "Content-Type",
                        "application/vnd.oci.image.manifest.v1+json".to_owned(),
                    ),
                    ("Docker-Content-Digest", digest.to_string()),
                ],
                &manifest,
            )
        }
        ("blobs", Behaviour::TrickleBlobs(every)) => {
            let bytes = name
                .parse::<Digest>()
                .ok()
                .and_then(|digest| blob(&digest))
                .expect("a blob of the image");
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", bytes.len());
            let sent = tcp.write_all(head.as_bytes()).is_ok()
                && bytes.iter().all(|byte| {
                    std::thread::sleep(*every);
                    tcp.write_all(&[*byte]).and_then(|()| tcp.flush()).is_ok()
                });
            if !sent {
                routes.lock().expect("routes").abandoned += 1;
            }
            false
        }
        ("blobs", Behaviour::RedirectBlobs(to)) => respond(
            tcp,
            "302 Found",
            &[("Location", format!("http://{to}{path}"))],
            b"",
        ),
        _ => match name.parse::<Digest>().ok().and_then(|digest| blob(&digest)) {
            Some(bytes) => respond(tcp, "200 OK", &[], &bytes),
            None => respond(tcp, "404 Not Found", &[], b""),
        },
    }
}

/// The peak resident memory of process `pid` (`VmHWM`), bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number");
    kib << 10
}

// The tests: each against a `runloop serve` of its own that pulls from the
// hostile registry over plain HTTP.

use std::time::Instant;

use crate::images::{self, Images};
use crate::{Server, exited, pull_and_run, pull_command, refusal};

fn server(hostile: &Hostile, extra: &[&str]) -> Server {
    let mut args = vec!["--insecure-registry", hostile.host.as_str()];
    args.extend_from_slice(extra);
    Server::start(&[], &args)
}

#[test]
fn registry_redirects_go_only_where_the_operator_said() {
    let Some(images) = super::images() else {
        return;
    };
    let image = images.agent_layout("hostile-redirects");
    let hostile = Hostile::start();
    hostile.route(
        "agents/manifest",
        Behaviour::RedirectManifest,
        Some(image.clone()),
    );
    let elsewhere = hostile.elsewhere.clone();
    hostile.route(
        "agents/blobs",
        Behaviour::RedirectBlobs(elsewhere.clone()),
        Some(image.clone()),
    );
    let port = elsewhere.rsplit(':').next().expect("a port");
    let by_name = format!("localhost:{port}");
    hostile.route(
        "agents/by-name",
        Behaviour::RedirectBlobs(by_name.clone()),
        Some(image.clone()),
    );
    let server = server(&hostile, &[]);
    let host = &hostile.host;

    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/manifest:1"),
        "x",
    ));
    assert!(
        said.contains(&format!(
            "redirected to http://{elsewhere}/v2/agents/manifest/manifests/1"
        )) && said.contains("a manifest is read from the registry itself"),
        "{said}"
    );
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/blobs:1"),
        "x",
    ));
    assert!(
        said.contains(&format!("{elsewhere} is neither the registry nor a mirror")),
        "{said}"
    );
    assert_eq!(
        hostile.elsewhere_hits(),
        0,
        "nothing was asked of another host"
    );
    drop(server);

    // Listed as a mirror by its address: followed, and the image runs.
    let mirrored = self::server(&hostile, &["--registry-mirror", &elsewhere]);
    let output = pull_and_run(&mirrored.url, &format!("{host}/agents/blobs:1"), "mirrored");
    exited(&output, 0, &mirrored);
    assert!(hostile.elsewhere_hits() > 0);
    drop(mirrored);

    // Listed by a name that resolves to loopback: never connected.
    let hits = hostile.elsewhere_hits();
    let named = self::server(&hostile, &["--registry-mirror", &by_name]);
    let said = refusal(&pull_and_run(
        &named.url,
        &format!("{host}/agents/by-name:1"),
        "x",
    ));
    assert!(
        said.contains("localhost resolves to no public address"),
        "{said}"
    );
    assert_eq!(hostile.elsewhere_hits(), hits);
}

#[test]
fn an_endless_manifest_is_refused_at_its_cap_without_the_memory() {
    if !super::ready() {
        return;
    }
    let hostile = Hostile::start();
    hostile.route("agents/endless", Behaviour::EndlessManifest, None);
    hostile.route(
        "agents/declared",
        Behaviour::DeclaredManifest(10_000_000_000),
        None,
    );
    let server = server(&hostile, &[]);
    let pid = server.pid();
    let before = peak_rss(pid);
    let host = &hostile.host;
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/endless:1"),
        "x",
    ));
    assert!(
        said.contains("the manifest is larger than 4194304 bytes"),
        "{said}"
    );
    let started = Instant::now();
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{host}/agents/declared:1"),
        "x",
    ));
    let declared = started.elapsed();
    assert!(
        said.contains("the manifest is larger than 4194304 bytes (it declares 10000000000)"),
        "{said}"
    );
    assert!(declared < Duration::from_secs(10), "{declared:?}");
    let growth = peak_rss(pid).saturating_sub(before);
    println!(
        "endless manifest: the server's peak RSS grew {:.1} MiB ({} → {} KiB); a declared 10 GB manifest refused in {declared:?}",
        growth as f64 / f64::from(1 << 20),
        before >> 10,
        (before + growth) >> 10
    );
    assert!(growth < 64 << 20, "peak RSS grew {growth} bytes");
}

#[test]
fn a_trickling_pull_ends_at_its_deadline() {
    if !super::ready() {
        return;
    }
    let hostile = Hostile::start();
    hostile.route(
        "agents/trickle",
        Behaviour::TrickleManifest(Duration::from_millis(500)),
        None,
    );
    let server = server(&hostile, &["--pull-timeout", "3"]);
    let started = Instant::now();
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{}/agents/trickle:1", hostile.host),
        "x",
    ));
    let took = started.elapsed();
    println!(
        "a manifest trickling a byte every 500 ms: the pull ended after {took:?} (--pull-timeout 3)"
    );
    assert!(
        said.contains("not done within this server's pull timeout of 3 s"),
        "{said}"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
}

#[test]
fn a_gzip_bomb_is_refused_at_its_unpack_ratio() {
    if !super::ready() {
        return;
    }
    use std::io::Write as _;
    let images = Images::get();
    // 256 MiB of zeros in one file: a few hundred KiB gzipped.
    let zeros = vec![0u8; 256 << 20];
    let tar = images::layer(&[("zeros", 0o644, &zeros)]);
    drop(zeros);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gzip.write_all(&tar.0).expect("gzips");
    drop(tar);
    let bomb = gzip.finish().expect("gzipped");
    let (path, digest) = images.hog_layout("bomb-base");
    let layout = Layout::open(&path).expect("layout");
    let base: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.blob_path(&digest)).expect("manifest"))
            .expect("JSON");
    let bomb_digest = layout.put(&bomb).expect("the bomb blob");
    let mut manifest = base.clone();
    manifest["layers"]
        .as_array_mut()
        .expect("layers")
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": bomb_digest.to_string(),
            "size": bomb.len(),
        }));
    let manifest = serde_json::to_vec(&manifest).expect("manifest");
    let digest = layout.put(&manifest).expect("the manifest blob");
    let size = manifest.len() as u64
        + base["config"]["size"].as_u64().expect("size")
        + base["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|layer| layer["size"].as_u64().expect("size"))
            .sum::<u64>()
        + bomb.len() as u64;
    let hostile = Hostile::start();
    hostile.route("agents/bomb", Behaviour::Serve, Some((path, digest)));
    let server = server(&hostile, &["--max-unpack-ratio", "10"]);
    let said = refusal(&pull_and_run(
        &server.url,
        &format!("{}/agents/bomb:1", hostile.host),
        "x",
    ));
    println!(
        "a gzip bomb of {} KiB (256 MiB unpacked) in a {size}-byte image: refused at {} bytes (--max-unpack-ratio 10)",
        bomb.len() >> 10,
        size * 10
    );
    assert!(
        said.contains(&format!(
            "the image unpacks to more than {} bytes of files",
            size * 10
        )),
        "{said}"
    );
    server.stop();
    let left: Vec<_> = fs::read_dir(server.store.join("images"))
        .expect("images")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_callers_reference_cannot_forge_a_server_log_line() {
    if !super::ready() {
        return;
    }
    let hostile = Hostile::start();
    let server = server(&hostile, &[]);
    let forged = "2026-01-01T00:00:00.000000Z  WARN runloop::server: forged";
    // (NUL cannot be in an argument; the log formatter's own test has it.)
    for c in ['\n', '\r', '\u{1b}', '\u{85}'] {
        let reference = format!("{}/agents/absent:1{c}{forged}", hostile.host);
        let output = pull_and_run(&server.url, &reference, "x");
        assert_ne!(output.status.code(), Some(0), "{output:?}");
    }
    let log = server.log();
    assert!(
        log.contains(r"\n2026-01-01T00:00:00.000000Z  WARN"),
        "{log}"
    );
    for line in log.lines() {
        assert!(!line.starts_with("2026-01-01"), "a forged line: {line:?}");
        assert!(
            !line.contains(['\r', '\u{1b}', '\u{85}']),
            "a control character in {line:?}"
        );
    }
}

#[test]
fn a_server_stopped_mid_unpack_leaves_no_partial_image() {
    if !super::ready() {
        return;
    }
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    let images = Images::get();
    // 4 GiB of zeros in one file, gzipped: an unpack that takes a while.
    // The gzip is made of members (which a layer may be): the tar header,
    // 256 of one 16 MiB block of zeros, and the archive's end.
    let gzip = |bytes: &[u8]| {
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gzip.write_all(bytes).expect("gzips");
        gzip.finish().expect("gzipped")
    };
    let size: u64 = 4 << 30;
    let mut header = tar::Header::new_gnu();
    header.set_path("zeros").expect("path");
    header.set_size(size);
    header.set_mode(0o644);
    // Owner and time written out: left empty, the unpack refuses the entry
    // at once ("numeric field was not a number"), and the test would see
    // a server that failed, not one stopped mid-unpack.
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut layer = gzip(header.as_bytes());
    let block = gzip(&vec![0u8; 16 << 20]);
    for _ in 0..size / (16 << 20) {
        layer.extend_from_slice(&block);
    }
    layer.extend_from_slice(&gzip(&[0u8; 1024]));
    let (source, base) = images.hog_layout("slow-unpack");
    let source = Layout::open(&source).expect("layout");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(source.blob_path(&base)).expect("manifest"))
            .expect("JSON");
    // A layout of its own, holding only this image.
    let dir = tempfile::tempdir().expect("temp");
    let path = dir.path().join("layout");
    let layout = Layout::create(&path).expect("layout");
    let copy = |descriptor: &serde_json::Value| {
        let digest: Digest = descriptor["digest"]
            .as_str()
            .expect("digest")
            .parse()
            .expect("digest");
        layout
            .put(&fs::read(source.blob_path(&digest)).expect("blob"))
            .expect("copied");
    };
    copy(&manifest["config"]);
    for descriptor in manifest["layers"].as_array().expect("layers") {
        copy(descriptor);
    }
    let layer_digest = layout.put(&layer).expect("layer blob");
    manifest["layers"]
        .as_array_mut()
        .expect("layers")
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest.to_string(),
            "size": layer.len(),
        }));
    let manifest = serde_json::to_vec(&manifest).expect("manifest");
    let digest = layout.put(&manifest).expect("manifest blob");
    layout
        .add_manifest(
            "latest",
            &digest,
            manifest.len() as u64,
            runloop_oci::oci_spec::image::MediaType::ImageManifest,
        )
        .expect("indexed");
    let scratch = tempfile::tempdir().expect("temp");
    let store = scratch.path().join("store");
    let mut child = Command::new(env!("CARGO_BIN_EXE_runloop"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(&store)
        .arg("--agent")
        .arg(format!("slow=oci:{}", path.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let images_dir = store.join("images");
    let unpacking = || {
        fs::read_dir(&images_dir)
            .map(|entries| {
                entries
                    .map_while(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(".unpacking-"))
                    .count()
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while unpacking() == 0 {
        if let Some(status) = child.try_wait().expect("waits") {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(
                &mut child.stderr.take().expect("stderr"),
                &mut stderr,
            );
            panic!("serve exited ({status}) before its unpack: {stderr}");
        }
        assert!(Instant::now() < deadline, "no unpack began");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Well into the unpack.
    std::thread::sleep(Duration::from_millis(500));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let started = Instant::now();
    let exited = child.wait().expect("exits");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    println!(
        "stopped mid-unpack: exited {exited} {:?} after SIGTERM",
        started.elapsed()
    );
    assert!(!exited.success(), "{stderr}");
    assert!(
        stderr.contains("stopped by a signal while unpacking"),
        "{stderr}"
    );
    assert_eq!(unpacking(), 0, "a partial unpack is left");
    assert_eq!(fs::read_dir(&images_dir).expect("images").count(), 0);
}

/// `runloop run --json` of a registry image, as the tenant of `token`.
fn pull_as(url: &str, reference: &str, token: &str) -> std::process::Command {
    let mut command = pull_command(url, reference, "x");
    command.env("RUNLOOP_TOKEN", token);
    command
}

/// Waits (10 s at most) until `done`.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_tenant_at_its_pull_cap_is_refused_and_another_still_pulls() {
    let Some(images) = super::images() else {
        return;
    };
    let hostile = Hostile::start();
    hostile.route(
        "agents/slow",
        Behaviour::TrickleManifest(Duration::from_millis(500)),
        None,
    );
    hostile.route(
        "agents/demo",
        Behaviour::Serve,
        Some(images.agent_layout("tenant-pulls")),
    );
    let scratch = tempfile::tempdir().expect("temp");
    let tokens = scratch.path().join("tokens");
    fs::write(&tokens, "alice-secret\nbob-secret\n").expect("tokens");
    // Two pulls server-wide: each tenant's share is one.
    let server = server(
        &hostile,
        &[
            "--token-file",
            tokens.to_str().expect("UTF-8"),
            "--max-pulls",
            "2",
        ],
    );
    let slow = format!("{}/agents/slow:1", hostile.host);
    let demo = format!("{}/agents/demo:1", hostile.host);
    let before = hostile.hits();
    let mut held = pull_as(&server.url, &slow, "alice-secret")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run starts");
    // Its place is taken before its first request.
    until("the slow pull's first request", || hostile.hits() > before);
    let second = pull_as(&server.url, &demo, "alice-secret")
        .output()
        .expect("run runs");
    let said = refusal(&second);
    assert!(
        said.contains(
            "tenant token #1 has as many registry pulls under way as it may (max-pulls 1); \
             try again later"
        ),
        "{said}"
    );
    let other = pull_as(&server.url, &demo, "bob-secret")
        .output()
        .expect("run runs");
    exited(&other, 0, &server);
    let _ = held.kill();
    let _ = held.wait();
}

#[test]
fn a_pull_nobody_waits_for_stops_and_leaves_no_partial_blob() {
    let Some(images) = super::images() else {
        return;
    };
    let hostile = Hostile::start();
    hostile.route(
        "agents/trickle-blobs",
        Behaviour::TrickleBlobs(Duration::from_millis(100)),
        Some(images.agent_layout("abandoned-pull")),
    );
    let server = server(&hostile, &[]);
    let blobs = server.store.join("layout/blobs/sha256");
    let partials = || -> Vec<String> {
        fs::read_dir(&blobs)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.starts_with(".partial-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut caller = pull_and_run_child(
        &server.url,
        &format!("{}/agents/trickle-blobs:1", hostile.host),
    );
    until("a partial blob", || !partials().is_empty());
    std::thread::sleep(Duration::from_millis(300));
    // The only caller waiting on the pull goes away.
    let _ = caller.kill();
    let _ = caller.wait();
    let left = Instant::now();
    until("the partial blob's removal", || partials().is_empty());
    until("the registry's connection closed", || {
        hostile.abandoned() > 0
    });
    println!(
        "a pull whose only caller left: its partial blob removed and its connection closed within {:?}",
        left.elapsed()
    );
}

/// `runloop run` of a registry image, left running.
fn pull_and_run_child(url: &str, reference: &str) -> std::process::Child {
    pull_command(url, reference, "x")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run starts")
}

/// An HTTP proxy of the test's own on loopback: it forwards plain-HTTP
/// requests (absolute URIs), refuses `CONNECT`, and remembers the
/// `HOST:PORT` of every request it was asked to carry.
struct HttpProxy {
    url: String,
    asked: Arc<Mutex<Vec<String>>>,
}

impl HttpProxy {
    fn start() -> HttpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let remembered = Arc::clone(&asked);
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                let asked = Arc::clone(&remembered);
                std::thread::spawn(move || carry(tcp, &asked));
            }
        });
        HttpProxy { url, asked }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("asked").clone()
    }
}

/// Carries the requests of one connection, each on a connection of its own
/// to where it goes.
fn carry(client: TcpStream, asked: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let mut client = client;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            headers.push(header);
        }
        let mut words = line.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let Some(rest) = target.strip_prefix("http://") else {
            asked.lock().expect("asked").push(target.to_owned());
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        asked.lock().expect("asked").push(authority.to_owned());
        let Ok(mut upstream) = TcpStream::connect(authority) else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let mut request = format!(
            "{method} {} HTTP/1.1\r\n",
            if path.is_empty() { "/" } else { path }
        );
        for header in headers
            .iter()
            .filter(|h| !h.to_ascii_lowercase().starts_with("proxy-"))
        {
            request.push_str(header);
        }
        request.push_str("\r\n");
        if upstream.write_all(request.as_bytes()).is_err() {
            return;
        }
        // The answer: its head, then as many bytes as it declares.
        let mut answer = BufReader::new(upstream);
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if answer.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
            if client.write_all(header.as_bytes()).is_err() {
                return;
            }
            if header == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        if std::io::Read::read_exact(&mut answer, &mut body).is_err()
            || client.write_all(&body).is_err()
        {
            return;
        }
    }
}

#[test]
fn the_environments_proxy_is_not_used_and_the_operators_keeps_the_address_rules() {
    let Some(images) = super::images() else {
        return;
    };
    let image = images.agent_layout("hostile-proxied");
    let hostile = Hostile::start();
    let port = hostile.elsewhere.rsplit(':').next().expect("a port");
    let by_name = format!("localhost:{port}");
    hostile.route(
        "agents/by-name",
        Behaviour::RedirectBlobs(by_name.clone()),
        Some(image),
    );
    let proxy = HttpProxy::start();
    let reference = format!("{}/agents/by-name:1", hostile.host);
    let environment = [
        ("HTTP_PROXY", proxy.url.as_str()),
        ("HTTPS_PROXY", proxy.url.as_str()),
        ("ALL_PROXY", proxy.url.as_str()),
        ("http_proxy", proxy.url.as_str()),
    ];

    // The environment names a proxy: pulls do not use it (through it the
    // mirror's name would be resolved where the rules cannot see), and the
    // mirror listed by a loopback name is still never reached.
    let server = Server::start_with_env(
        &[],
        &[
            "--insecure-registry",
            &hostile.host,
            "--registry-mirror",
            &by_name,
        ],
        &environment,
    );
    let said = refusal(&pull_and_run(&server.url, &reference, "x"));
    assert!(
        said.contains("localhost resolves to no public address"),
        "{said}"
    );
    assert_eq!(
        proxy.asked(),
        Vec::<String>::new(),
        "the proxy was not asked"
    );
    assert!(
        server
            .log()
            .contains("registry pulls do not use the environment's proxy"),
        "{}",
        server.log()
    );
    drop(server);

    // The operator's proxy carries the requests to the registry; the
    // mirror's name is checked before the proxy is asked for it.
    let server = self::server(
        &hostile,
        &[
            "--registry-mirror",
            &by_name,
            "--registry-proxy",
            &proxy.url,
        ],
    );
    let said = refusal(&pull_and_run(&server.url, &reference, "x"));
    assert!(
        said.contains("localhost resolves to 127.0.0.1, which is not a public address")
            || said.contains("localhost resolves to ::1, which is not a public address"),
        "{said}"
    );
    let asked = proxy.asked();
    assert!(asked.contains(&hostile.host), "{asked:?}");
    assert!(
        asked.iter().all(|host| *host == hostile.host),
        "only the registry was asked for: {asked:?}"
    );
    assert_eq!(hostile.elsewhere_hits(), 0);
}

#[test]
fn a_bounded_store_sheds_the_image_no_run_holds_and_says_a_held_one_keeps_it_over() {
    let Some(images) = super::images() else {
        return;
    };
    let one = images.agent_layout("store-bound-one");
    let two = images.layout_with_env(
        "store-bound-two",
        &[&images.runloop],
        &["/runloop", "agent", "demo"],
        &["IMAGE=two"],
    );
    let (first, second) = (one.1.clone(), two.1.clone());
    assert_ne!(first, second);
    let hostile = Hostile::start();
    hostile.route("agents/one", Behaviour::Serve, Some(one));
    hostile.route("agents/two", Behaviour::Serve, Some(two));
    // Far below one image: every new image sheds all no run holds.
    let server = server(&hostile, &["--store-max-size", "1K"]);
    let output = pull_and_run(&server.url, &format!("{}/agents/one:1", hostile.host), "x");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // The second image's run is slow, so that it holds its image while the
    // collection its unpack started runs.
    let output = pull_and_run(
        &server.url,
        &format!("{}/agents/two:1", hostile.host),
        "demo:pace=200 held",
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let names = || -> Vec<String> {
        fs::read_dir(server.store.join("images"))
            .expect("images")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    until("the first image's removal", || {
        names()
            .iter()
            .all(|name| !name.starts_with(&format!("sha256-{}", first.hex())))
    });
    assert!(
        names()
            .iter()
            .any(|name| name.starts_with(&format!("sha256-{}", second.hex()))),
        "{:?}",
        names()
    );
    let layout = Layout::open(server.store.join("layout")).expect("layout");
    assert!(!layout.has_blob(&first) && layout.has_blob(&second));
    let log = server.log();
    assert!(
        log.contains("removed from the store, least recently used")
            && log.contains(&first.to_string()),
        "{log}"
    );
    assert!(
        log.contains("the store stays over its bound: the images left are held by runs"),
        "{log}"
    );
}
