//! The figures of the containers' closing note, printed, not asserted
//! (timings on a shared machine are not a test):
//!
//! ```text
//! cargo test -p runloop-cli --test containers -- --ignored --nocapture figures
//! ```
//!
//! - container start, p50 of 20: cold (the image unpacked into a fresh
//!   store, then the container started until its agent accepts TCP) and
//!   cached (the container alone);
//! - a 50 MiB image pulled from the local registry (fetched, checked,
//!   stored and unpacked; the unpack alone measured apart), p50 of 5;
//! - what is left on the machine after 100 runs through `runloop serve`.
//!
//! And apart, the start as a caller sees it (`start_as_a_caller_sees_it`):
//! run request to the run's id, through `runloop serve`, cached image,
//! p50 of 30, as `runloop run --verbose` times it.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runloop::runtime::ContainerLimits;
use runloop_oci::image::Image;
use runloop_oci::layout::Layout;
use runloop_oci::registry::{Pull, RegistryConfig};
use runloop_oci::{Host, HostConfig};

use super::images::{self, Images};
use super::registry::LocalRegistry;
use super::{Server, run_against};

fn limits() -> ContainerLimits {
    ContainerLimits::new(128 << 20, 16 << 20)
}

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn host(store: &std::path::Path) -> HostConfig {
    HostConfig::new(store)
}

/// Counts of what containers leave on a machine, whoever made them.
fn machine() -> [(&'static str, usize); 5] {
    let count = |program: &str, args: &[&str], pattern: &str| {
        let output = Command::new(program).args(args).output().expect("runs");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.contains(pattern))
            .count()
    };
    [
        (
            "runc containers",
            count("runc", &["list", "--quiet"], "runloop-"),
        ),
        (
            "network namespaces",
            count("ip", &["netns", "list"], "runloop-"),
        ),
        (
            "veths",
            count("ip", &["-o", "link", "show", "type", "veth"], ": rl"),
        ),
        (
            "loop devices",
            count("losetup", &["--list", "--noheadings"], "/dev/loop"),
        ),
        (
            "overlay and ext4 mounts under a store",
            std::fs::read_to_string("/proc/self/mountinfo")
                .expect("mountinfo")
                .lines()
                .filter(|line| line.contains("/runs/"))
                .count(),
        ),
    ]
}

#[test]
#[ignore = "prints the closing note's figures; run by hand"]
fn figures() {
    let Some(images) = super::images_with_registry() else {
        return;
    };
    let (layout, _) = images.agent_layout("figures");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Cold: a fresh store each time, so the image is unpacked first.
        let mut cold = Vec::new();
        for _ in 0..20 {
            let scratch = tempfile::tempdir().expect("temp");
            let host = Host::open(host(&scratch.path().join("store")))
                .await
                .expect("host");
            let started = Instant::now();
            let (_, oci) = host.layout(&layout, None).await.expect("layout");
            let container = oci.spawn(limits()).await.expect("starts");
            cold.push(started.elapsed());
            container.terminate().await;
        }
        // Cached: one store, the image unpacked once.
        let scratch = tempfile::tempdir().expect("temp");
        let host = Host::open(host(&scratch.path().join("store")))
            .await
            .expect("host");
        let (_, oci) = host.layout(&layout, None).await.expect("layout");
        let mut cached = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let container = oci.spawn(limits()).await.expect("starts");
            cached.push(started.elapsed());
            container.terminate().await;
        }
        println!(
            "container start, p50 of 20: cold {:?}, cached {:?}",
            p50(cold),
            p50(cached)
        );
    });

    // 50 MiB of incompressible bytes in one layer, beside the agent.
    let registry = LocalRegistry::start();
    let mut noise = vec![0u8; 50 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in noise.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let scratch = tempfile::tempdir().expect("temp");
    let source = Layout::create(scratch.path().join("layout")).expect("layout");
    let big = images::layer(&[("noise", 0o644, &noise)]);
    let (digest, _) =
        images::write_image(&source, "big", &[&images.hog, &big], &["/hog", "stubborn"]);
    registry.push(&source, &digest, "agents/big", "1");
    let size = Image::load(&source, &digest, None).expect("image").size;
    let reference = format!("{}/agents/big:1", registry.host);
    runtime.block_on(async {
        let mut pulls = Vec::new();
        let mut unpacks = Vec::new();
        for _ in 0..5 {
            let scratch = tempfile::tempdir().expect("temp");
            let host = Host::open(host(&scratch.path().join("store"))).await.expect("host");
            let pull = Pull::new(
                Arc::clone(&host),
                RegistryConfig {
                    max_image_size: 1 << 30,
                    ..RegistryConfig::new(vec![], vec![registry.host.clone()])
                },
            )
            .expect("pull");
            let started = Instant::now();
            let puller = runloop::runtime::Puller {
                tenant: "figures".to_owned(),
                max_pulls: None,
            };
            let oci = pull.runtime(&reference, &puller).await.expect("pulled");
            pulls.push(started.elapsed());
            // The unpack alone: the same blobs into a second store.
            let again = runloop_oci::store::Store::open(
                scratch.path().join("second"),
                host.config().unpack,
            )
            .expect("store");
            let started = Instant::now();
            again
                .unpack(host.store().layout(), &oci.image().image)
                .await
                .expect("unpacked");
            unpacks.push(started.elapsed());
        }
        let (pull, unpack) = (p50(pulls), p50(unpacks));
        println!(
            "pull of a {:.1} MiB image from the local registry, p50 of 5: {pull:?} (of which unpacking {unpack:?}; fetching and checking {:?})",
            size as f64 / f64::from(1 << 20),
            pull.saturating_sub(unpack)
        );
    });

    // 100 runs through a server, then what is left.
    let before = machine();
    let (demo, digest) = images.agent_layout("hundred");
    let server = Server::start(&[format!("demo=oci:{}", demo.display())], &[]);
    let started = Instant::now();
    for i in 0..100 {
        let output = run_against(
            &server.url,
            &format!("demo@{digest}"),
            "64M",
            "4M",
            &format!("run {i}"),
        );
        assert_eq!(output.status.code(), Some(0), "{output:?}");
    }
    let elapsed = started.elapsed();
    let keys = server.keys();
    assert_eq!(server.terminate(), Some(0));
    let left = server.left();
    println!(
        "100 runs through runloop serve in {elapsed:?} ({} containers); left of them: {}",
        keys.len(),
        if left.is_empty() {
            "nothing".to_owned()
        } else {
            left.join(", ")
        }
    );
    println!("on the machine before: {before:?}");
    println!("on the machine after:  {:?}", machine());
}

/// The "id after N ms" of a `runloop run --verbose` timing line.
fn id_after(stderr: &str) -> Option<Duration> {
    let line = stderr
        .lines()
        .find(|line| line.starts_with("timing: id after "))?;
    let millis: f64 = line["timing: id after ".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(Duration::from_secs_f64(millis / 1000.0))
}

#[test]
#[ignore = "prints the closing note's start figure; run by hand"]
fn start_as_a_caller_sees_it() {
    if !super::ready() {
        return;
    }
    // RUNLOOP_FIGURE_SERVER: another build's `runloop` serves (the client
    // is this build's); the agent listens on 0.0.0.0:8080, which holds
    // its loopback, so that builds of before and after both serve it.
    let binary = std::env::var("RUNLOOP_FIGURE_SERVER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_runloop").to_owned());
    let images = Images::get();
    let (demo, digest) = images.layout(
        "start-figure",
        &[&images.runloop],
        &["/runloop", "agent", "demo", "--listen", "0.0.0.0:8080"],
    );
    let scratch = tempfile::tempdir().expect("temp");
    let store = scratch.path().join("store");
    let server = Server::start_binary(
        &binary,
        scratch,
        store,
        &[format!("demo=oci:{}", demo.display())],
        &[],
        &[],
    );
    let image = format!("demo@{digest}");
    let mut samples = Vec::new();
    for i in 0..31 {
        let output = Command::new(env!("CARGO_BIN_EXE_runloop"))
            .args([
                "run",
                "--verbose",
                "--quiet",
                "--url",
                &server.url,
                "--image",
                &image,
                "--memory",
                "64M",
                "--disk",
                "4M",
                "a b",
            ])
            .output()
            .expect("run runs");
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        let took = id_after(&String::from_utf8_lossy(&output.stderr)).expect("a timing line");
        // The first warms the caches.
        if i > 0 {
            samples.push(took);
        }
    }
    println!(
        "container start as a caller sees it (run request to id, cached image, {binary}), p50 of 30: {:?}",
        p50(samples)
    );
}

/// Container start with the image cached (spawn until the agent accepts
/// TCP and its proxy listens), p50 and p90 of 40, under the runtime of
/// `RUNLOOP_TEST_OCI_RUNTIME` (runc unless set), with egress when
/// `RUNLOOP_FIGURE_EGRESS=1`:
///
/// ```text
/// cargo test -p runloop-cli --test containers -- --ignored --nocapture start_p50
/// ```
#[test]
#[ignore = "prints the start figure; run by hand"]
fn start_p50() {
    let Some(images) = super::images() else {
        return;
    };
    let (layout, _) = images.agent_layout("start-p50");
    let runtime_name = super::oci_runtime();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let scratch = tempfile::tempdir().expect("temp");
        let mut config = host(&scratch.path().join("store"));
        if runtime_name == "runsc" {
            config.runtime = runloop_oci::runc::Kind::Runsc;
            config.runc = "runsc".into();
        }
        let egress = std::env::var("RUNLOOP_FIGURE_EGRESS").is_ok_and(|v| v == "1");
        if egress {
            config.egress = Some(runloop_oci::egress::DEFAULT_NETWORK);
        }
        let host = Host::open(config).await.expect("host");
        let (_, oci) = host.layout(&layout, None).await.expect("layout");
        // One start to warm the caches, not counted.
        oci.spawn(limits()).await.expect("starts").terminate().await;
        let mut starts = Vec::new();
        for _ in 0..40 {
            let started = Instant::now();
            let container = oci.spawn(limits()).await.expect("starts");
            starts.push(started.elapsed());
            container.terminate().await;
        }
        starts.sort();
        println!(
            "container start under {runtime_name}, egress {egress}, image cached, of 40: p50 {:?}, p90 {:?}",
            starts[20], starts[36]
        );
        host.close().await;
    });
}
