//! Warm pools (`serve --warm`): containers started before a run asks for
//! one, each serving exactly one run, held to what that run asked for,
//! and gone with the server.

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use super::images::Images;
use super::{Server, json_lines, leftovers, oci_runtime};

/// The text of the one chunk a `mark` run answered:
/// `fresh|seen HOST[BEFORE]; memory limit M; disk free F`.
fn said(output: &Output, server: &Server) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "{output:?}\n{}",
        server.log()
    );
    json_lines(output)
        .iter()
        .filter_map(|line| line.get("chunk"))
        .find_map(|chunk| chunk["text"].as_str().map(str::to_owned))
        .expect("the mark's chunk")
}

/// The number after `words` in `text`.
fn figure(text: &str, words: &str) -> i64 {
    text.split_once(words)
        .and_then(|(_, rest)| rest.split([';', ' ']).find(|w| !w.is_empty()))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {words:?} in {text:?}"))
}

/// How many runs the server's log says a warm container went to.
fn warm_runs(server: &Server) -> usize {
    server
        .log()
        .matches("a warm container goes to a run")
        .count()
}

/// Waits until the server's log says `count` containers became ready
/// (a pool of `count` has filled), however long the machine takes.
fn ready_containers(server: &Server, count: usize) {
    for _ in 0..1200 {
        if server.log().matches("oci container ready").count() >= count {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{count} containers never became ready:\n{}", server.log());
}

#[test]
fn a_pool_of_four_serves_100_runs_each_in_a_container_no_run_was_in_before() {
    if !super::ready() {
        return;
    }
    let images = Images::get();
    let (mark, digest) = images.hog_layout("mark");
    let server = Server::start(
        &[format!("mark=oci:{}", mark.display())],
        &["--warm", "4", "--warm-memory", "128M", "--warm-disk", "32M"],
    );
    ready_containers(&server, 4);
    let mut hosts = BTreeSet::new();
    for run in 0..100 {
        let output = server.run(&format!("mark@{digest}"), "128M", "32M", "x");
        let text = said(&output, &server);
        // Nothing of an earlier run: neither its root's writes nor its /tmp.
        assert!(text.starts_with("fresh "), "run {run}: {text}");
        let host = text
            .split([' ', ';'])
            .nth(1)
            .expect("the container's host name")
            .to_owned();
        assert!(
            hosts.insert(host),
            "run {run} was in a container of another: {text}"
        );
        if run == 0 {
            assert_eq!(warm_runs(&server), 1, "the first run took a warm container");
        }
    }
    println!(
        "100 runs, {} of them in a warm container",
        warm_runs(&server)
    );
    let keys = server.keys();
    let store = server.store.clone();
    assert_eq!(server.terminate(), Some(0));
    // Every container the server made, the pool's unused ones included.
    assert!(keys.len() >= 100, "{} keys", keys.len());
    assert_eq!(leftovers(&store, &keys), Vec::<String>::new());
}

#[test]
fn a_run_that_fits_a_warm_container_is_held_to_its_own_limits_and_one_that_does_not_starts_cold() {
    if !super::ready() {
        return;
    }
    let images = Images::get();
    let (mark, digest) = images.layout("mark-fit", &[&images.hog], &["/hog", "mark"]);
    let image = format!("mark@{digest}");
    let server = Server::start(
        &[format!("mark=oci:{}", mark.display())],
        &["--warm", "1", "--warm-memory", "128M", "--warm-disk", "32M"],
    );
    ready_containers(&server, 1);
    // More memory than a warm container has: a cold start.
    let cold = said(&server.run(&image, "256M", "8M", "x"), &server);
    assert!(cold.starts_with("fresh "), "{cold}");
    assert_eq!(warm_runs(&server), 0, "{}", server.log());
    // Less of both: the warm one, held to the run's own.
    let warm = said(&server.run(&image, "64M", "8M", "x"), &server);
    assert!(warm.starts_with("fresh "), "{warm}");
    assert_eq!(warm_runs(&server), 1, "{}", server.log());
    let free = figure(&warm, "disk free");
    assert!(
        free <= 8 << 20 && free > 4 << 20,
        "the run's 8 MiB, less its file system's own: {warm}"
    );
    // gVisor shows no host cgroup inside: the limit is checked under runc.
    if oci_runtime() == "runc" {
        assert_eq!(figure(&cold, "memory limit"), 256 << 20, "{cold}");
        assert_eq!(figure(&warm, "memory limit"), 64 << 20, "{warm}");
    }
    let keys = server.keys();
    let store = server.store.clone();
    assert_eq!(server.terminate(), Some(0));
    assert_eq!(leftovers(&store, &keys), Vec::<String>::new());
}

#[test]
fn a_pinned_registry_image_kept_warm_serves_a_run_that_names_its_digest_without_a_pull() {
    if !super::ready_with_registry() {
        return;
    }
    let images = Images::get();
    let (path, digest) = images.layout("mark-registry", &[&images.hog], &["/hog", "mark"]);
    let registry = super::LocalRegistry::start();
    registry.push(
        &runloop_oci::layout::Layout::open(&path).expect("layout"),
        &digest,
        "agents/mark",
        "1",
    );
    let pinned = format!("{}/agents/mark@{digest}", registry.host);
    let server = Server::start(
        &[],
        &[
            "--insecure-registry",
            &registry.host,
            "--warm-image",
            &pinned,
            "--warm",
            "1",
            "--warm-memory",
            "128M",
            "--warm-disk",
            "32M",
        ],
    );
    ready_containers(&server, 1);
    let manifests = registry.gets("/manifests/");
    let output = super::pull_and_run(&server.url, &pinned, "x");
    let text = said(&output, &server);
    assert!(text.starts_with("fresh "), "{text}");
    assert_eq!(warm_runs(&server), 1, "{}", server.log());
    assert_eq!(
        registry.gets("/manifests/"),
        manifests,
        "the run asked the registry nothing"
    );
    let keys = server.keys();
    let store = server.store.clone();
    assert_eq!(server.terminate(), Some(0));
    assert_eq!(leftovers(&store, &keys), Vec::<String>::new());
}
