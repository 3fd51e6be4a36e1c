//! A real registry for the tests: Debian's `docker-registry` (the CNCF
//! distribution registry) on a loopback port, with a configuration and a
//! storage directory of its own, stopped when dropped.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use runloop_oci::digest::Digest;
use runloop_oci::layout::Layout;

/// A running registry.
pub struct LocalRegistry {
    child: Child,
    /// `127.0.0.1:PORT`, as references name it.
    pub host: String,
    log: PathBuf,
    storage: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl LocalRegistry {
    /// Starts one on a free loopback port.
    pub fn start() -> LocalRegistry {
        let dir = tempfile::tempdir().expect("temp");
        let storage = dir.path().join("storage");
        LocalRegistry::start_in(dir, storage, None)
    }

    /// Starts one on a free loopback port that keeps its images in
    /// `storage` (which may outlive it, for another registry to serve), in
    /// HTTPS with `tls` (a certificate and its key, PEM files) when given.
    pub fn start_at(storage: &Path, tls: Option<(&Path, &Path)>) -> LocalRegistry {
        let dir = tempfile::tempdir().expect("temp");
        LocalRegistry::start_in(dir, storage.to_owned(), tls)
    }

    fn start_in(
        dir: tempfile::TempDir,
        storage: PathBuf,
        tls: Option<(&Path, &Path)>,
    ) -> LocalRegistry {
        let config = dir.path().join("config.yml");
        let tls = tls
            .map(|(cert, key)| {
                format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    cert.display(),
                    key.display()
                )
            })
            .unwrap_or_default();
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:0\n{tls}",
                storage.display()
            ),
        )
        .expect("config");
        let mut command = Command::new("docker-registry");
        command.arg("serve").arg(&config);
        let log = dir.path().join("access.log");
        LocalRegistry::spawn(command, log, storage, Some(dir))
    }

    /// Runs `command`, which starts a registry storing in `storage` (a
    /// shell script that ends in `docker-registry serve`, say), with its
    /// access log in `log`; waits until it says where it listens. The
    /// command runs in a process group of its own, all of which is
    /// killed when this is dropped, and then `dir` is removed.
    pub fn spawn(
        mut command: Command,
        log: PathBuf,
        storage: PathBuf,
        dir: Option<tempfile::TempDir>,
    ) -> LocalRegistry {
        // Its access log (one line per request) goes to stdout.
        let mut child = command
            .process_group(0)
            .stdout(fs::File::create(&log).expect("log"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker-registry starts (apt-get install docker-registry)");
        // It says where it listens on stderr, then keeps logging there.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let host = loop {
            let line = lines
                .next()
                .expect("the registry logs where it listens")
                .expect("a log line");
            if let Some(at) = line.find("listening on ") {
                // `listening on 127.0.0.1:PORT"`, or `…:PORT, tls"`.
                let rest = &line[at + "listening on ".len()..];
                break rest
                    .split(['"', ','])
                    .next()
                    .expect("an address")
                    .to_owned();
            }
            assert!(Instant::now() < deadline, "the registry did not listen");
        };
        // Keep reading its own log so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        LocalRegistry {
            child,
            host,
            log,
            storage,
            _dir: dir,
        }
    }

    /// Pushes the image `digest` of `layout` as `repository:tag`.
    pub fn push(&self, layout: &Layout, digest: &Digest, repository: &str, tag: &str) {
        let reference: Reference = format!("{}/{repository}:{tag}", self.host)
            .parse()
            .expect("reference");
        // oci-client's reqwest has TLS with no provider (runloop-oci's feature).
        runloop::tls::install_default_provider();
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..ClientConfig::default()
        });
        let manifest = fs::read(layout.blob_path(digest)).expect("manifest");
        let parsed: serde_json::Value = serde_json::from_slice(&manifest).expect("JSON");
        let mut blobs = vec![
            parsed["config"]["digest"]
                .as_str()
                .expect("config")
                .to_owned(),
        ];
        for layer in parsed["layers"].as_array().expect("layers") {
            blobs.push(layer["digest"].as_str().expect("layer").to_owned());
        }
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            client
                .store_auth_if_needed(reference.resolve_registry(), &RegistryAuth::Anonymous)
                .await;
            for blob in blobs {
                let digest: Digest = blob.parse().expect("digest");
                let data = fs::read(layout.blob_path(&digest)).expect("blob");
                client
                    .push_blob(&reference, data, &blob)
                    .await
                    .expect("blob pushed");
            }
            client
                .push_manifest_raw(
                    &reference,
                    manifest,
                    "application/vnd.oci.image.manifest.v1+json"
                        .parse()
                        .expect("header"),
                )
                .await
                .expect("manifest pushed");
        });
    }

    /// The file the registry keeps a blob in.
    pub fn blob_file(&self, digest: &Digest) -> PathBuf {
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&digest.hex()[..2])
            .join(digest.hex())
            .join("data")
    }

    /// Flips one byte of a stored blob, keeping its size.
    pub fn tamper(&self, digest: &Digest) {
        let file = self.blob_file(digest);
        let mut bytes = fs::read(&file).expect("blob");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        fs::write(&file, bytes).expect("tampered");
    }

    /// Changes a stored manifest without breaking its JSON (the registry
    /// parses a manifest before it serves it): one space more.
    pub fn tamper_manifest(&self, digest: &Digest) {
        let file = self.blob_file(digest);
        let mut bytes = fs::read(&file).expect("manifest");
        bytes.insert(1, b' ');
        fs::write(&file, bytes).expect("tampered");
    }

    /// How many times a path of the registry API was fetched (its access log).
    pub fn gets(&self, path_part: &str) -> usize {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        log.lines()
            .filter(|line| {
                line.contains("\"GET /v2/")
                    && line.contains(path_part)
                    && line.contains(" HTTP/1.1\" 200 ")
            })
            .count()
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        if let Ok(group) = i32::try_from(self.child.id()) {
            // SAFETY: kill has no memory effects; the group is the one
            // `spawn` made for this child, which is not reaped yet.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}
