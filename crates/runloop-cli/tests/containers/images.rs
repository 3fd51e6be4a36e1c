//! The test images, built with no network: OCI image layouts written by
//! the testkit (`runloop_testkit::oci`), from layers made here.
//!
//! - `agent`: this build's `runloop` binary (stripped) and the shared
//!   libraries `ldd` lists, running `runloop agent demo` as it comes: on
//!   `127.0.0.1:$PORT`, the loopback of the run's own network namespace,
//!   exactly as under exec;
//! - `hog MODE`: a small static C program (`hog.c`) that misbehaves as
//!   asked: `memory`, `disk`, `stubborn`, `once`, `dies`, `silent`,
//!   `tenant`, `reach`, `mark`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use runloop_oci::digest::Digest;
use runloop_oci::image::host_arch;
use runloop_oci::layout::Layout;
use runloop_testkit::oci;
use serde_json::json;

/// A layer: its tar bytes.
pub struct Layer(pub Vec<u8>);

/// Builds a tar layer from (path in the image, mode, content) triples.
pub fn layer(files: &[(&str, u32, &[u8])]) -> Layer {
    Layer(oci::tar(files))
}

/// Writes an image to `layout` with `layers` and a process of `args`;
/// returns its manifest digest (and the manifest's bytes).
pub fn write_image(
    layout: &Layout,
    name: &str,
    layers: &[&Layer],
    args: &[&str],
) -> (Digest, Vec<u8>) {
    write_image_with_env(layout, name, layers, args, &[])
}

/// [`write_image`], with `env` (`NAME=VALUE`) after `PATH=/`.
pub fn write_image_with_env(
    layout: &Layout,
    name: &str,
    layers: &[&Layer],
    args: &[&str],
    env: &[&str],
) -> (Digest, Vec<u8>) {
    let env: Vec<&str> = std::iter::once("PATH=/")
        .chain(env.iter().copied())
        .collect();
    let config = oci::config(host_arch(), json!({"Entrypoint": args, "Env": env}));
    let layers: Vec<(&str, &[u8])> = layers
        .iter()
        .map(|layer| (oci::TAR, layer.0.as_slice()))
        .collect();
    let (digest, manifest) = oci::write_image(layout.dir(), name, &config, &layers);
    (digest.parse().expect("a digest"), manifest)
}

/// The built images, made once per test run.
pub struct Images {
    /// Where they are: a fixed directory under the target's temporary
    /// directory, emptied and filled again by each run. (A `TempDir` in a
    /// static is never dropped: each run would leave its images in /tmp.)
    dir: PathBuf,
    /// The layer with `runloop` and its libraries.
    pub runloop: Layer,
    /// The layer with the static `hog`.
    pub hog: Layer,
}

impl Images {
    /// The images, built on first use.
    pub fn get() -> &'static Images {
        static IMAGES: OnceLock<Images> = OnceLock::new();
        IMAGES.get_or_init(Images::build)
    }

    fn build() -> Images {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("container-images");
        if dir.exists() {
            fs::remove_dir_all(&dir).expect("the last run's images removed");
        }
        fs::create_dir_all(&dir).expect("the images' directory");
        let exe = env!("CARGO_BIN_EXE_runloop");
        let stripped = dir.join("runloop");
        let status = Command::new("strip")
            .args(["-o"])
            .arg(&stripped)
            .arg(exe)
            .status()
            .expect("strip runs");
        assert!(status.success(), "strip failed");
        let runloop = fs::read(&stripped).expect("stripped binary");
        let mut files: Vec<(String, u32, Vec<u8>)> = vec![("runloop".to_owned(), 0o755, runloop)];
        for library in libraries(Path::new(exe)) {
            let content = fs::read(&library).expect("library");
            let path = library.to_string_lossy().trim_start_matches('/').to_owned();
            files.push((path, 0o755, content));
        }
        let runloop = layer(
            &files
                .iter()
                .map(|(path, mode, data)| (path.as_str(), *mode, data.as_slice()))
                .collect::<Vec<_>>(),
        );

        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/containers/hog.c");
        let hog_binary = dir.join("hog");
        let status = Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(&hog_binary)
            .arg(&source)
            .status()
            .expect("gcc runs");
        assert!(
            status.success(),
            "gcc -static hog.c failed (is libc6-dev installed?)"
        );
        let hog = layer(&[("hog", 0o755, &fs::read(&hog_binary).expect("hog"))]);
        Images { dir, runloop, hog }
    }

    /// The static `hog` binary itself, to run on the host.
    pub fn hog_binary(&self) -> PathBuf {
        self.dir.join("hog")
    }

    /// A layout of its own (`name`) holding one image.
    pub fn layout(&self, name: &str, layers: &[&Layer], args: &[&str]) -> (PathBuf, Digest) {
        let path = self.dir.join(format!("layout-{name}"));
        let layout = Layout::create(&path).expect("layout");
        let (digest, _) = write_image(&layout, "latest", layers, args);
        (path, digest)
    }

    /// [`Images::layout`], with `env` in the image's configuration.
    pub fn layout_with_env(
        &self,
        name: &str,
        layers: &[&Layer],
        args: &[&str],
        env: &[&str],
    ) -> (PathBuf, Digest) {
        let path = self.dir.join(format!("layout-{name}"));
        let layout = Layout::create(&path).expect("layout");
        let (digest, _) = write_image_with_env(&layout, "latest", layers, args, env);
        (path, digest)
    }

    /// A layout holding the demo agent image (`runloop agent demo`, with
    /// its default address).
    pub fn agent_layout(&self, name: &str) -> (PathBuf, Digest) {
        self.layout(name, &[&self.runloop], &["/runloop", "agent", "demo"])
    }

    /// A layout holding the hog image in `mode`.
    pub fn hog_layout(&self, mode: &str) -> (PathBuf, Digest) {
        self.layout(&format!("hog-{mode}"), &[&self.hog], &["/hog", mode])
    }
}

/// The shared libraries `ldd` lists for `binary`, resolved to the paths
/// the loader will look them up at.
fn libraries(binary: &Path) -> Vec<PathBuf> {
    let output = Command::new("ldd").arg(binary).output().expect("ldd runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once(" => ") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}
