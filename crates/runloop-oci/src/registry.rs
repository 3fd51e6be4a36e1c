//! Registry images: `{"registry":{"reference":"HOST[:PORT]/REPO[:TAG][@sha256:HEX]"}}`
//! pulled over the OCI distribution API into the store, checked, and run.
//!
//! ```text
//! reference ──host allowed?──▶ manifest (digest checked; index → this platform's manifest)
//!    ──size within the limit?──▶ config + layers, each streamed to the store and checked
//!    ──▶ unpacked (once per digest) ──▶ OciRuntime
//! ```
//!
//! The rules, each a refusal with its reason as the run's error response,
//! and nothing started:
//!
//! - only hosts the operator named (`--registry`, or `--insecure-registry`
//!   for plain HTTP) are asked; anything else is `policy`;
//! - the manifest must hash to the reference's digest when it names one,
//!   and every blob to the digest its descriptor names (oci-client checks
//!   as it streams, and the store checks again before it keeps a blob);
//!   blobs are fetched from the registry itself, never from a descriptor's
//!   `urls`;
//! - the image (manifest, configuration and compressed layers, as the
//!   manifest declares them) must fit the configured size, checked before
//!   any layer is fetched, and no blob may run past its declared size.
//!
//! A registry that does not connect within 30 s, or goes silent for 60 s
//! mid-answer, fails the pull.
//!
//! Blobs are kept in the store's layout under their digests and shared by
//! every image; a reference pinned by digest whose image is already there
//! runs without asking the registry. Two runs that ask for the same
//! reference at once fetch it once: the second waits for the first and
//! finds the blobs in the store.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{ImageIndex, ImageManifest, MediaType};
use runloop_proto::ErrorKind;
use runloop_runtime::{BoxFuture, Registry, RegistryError, Runtime};
use tokio::io::AsyncWriteExt;
use tracing::info;

use crate::OciRuntime;
use crate::digest::{Digest, Hasher};
use crate::host::Host;
use crate::image::{self, ACCEPTED, Image, is_index};
use crate::layout::{MAX_JSON, check};

/// How long a registry has to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a registry may go silent mid-answer before the pull fails (a
/// run's start waits on it, and so do the runs asking for the same image).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Which registries a server pulls from, and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Hosts (`HOST[:PORT]`, as written in references) pulled from over HTTPS.
    pub allowed: Vec<String>,
    /// Hosts pulled from over plain HTTP.
    pub insecure: Vec<String>,
    /// The largest image, bytes: manifest, configuration and compressed layers.
    pub max_image_size: u64,
}

/// Pulls `registry` images for a server and runs them on its host.
pub struct Pull {
    host: Arc<Host>,
    config: RegistryConfig,
    client: Client,
}

impl std::fmt::Debug for Pull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pull")
            .field("config", &self.config)
            .finish()
    }
}

fn refused(kind: ErrorKind, message: String) -> RegistryError {
    RegistryError { kind, message }
}

/// Whether an error of the registry means "no such image".
fn not_found(error: &OciDistributionError) -> bool {
    match error {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::ServerError { code, .. } => *code == 404,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::BlobUnknown
            )
        }),
        _ => false,
    }
}

impl Pull {
    /// Pulls into `host`'s store from the registries `config` allows.
    pub fn new(host: Arc<Host>, config: RegistryConfig) -> Pull {
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(config.insecure.clone()),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        });
        Pull {
            host,
            config,
            client,
        }
    }

    /// The runtime for `reference`, pulling what the store lacks.
    pub async fn runtime(&self, text: &str) -> Result<OciRuntime, RegistryError> {
        let reference: Reference = text.parse().map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("registry reference {text:?} does not parse: {error}"),
            )
        })?;
        let host = reference.registry();
        let allowed = self.config.allowed.iter().chain(&self.config.insecure);
        if !allowed.clone().any(|name| name == host) {
            let list: Vec<&str> = allowed.map(String::as_str).collect();
            return Err(refused(
                ErrorKind::Policy,
                format!(
                    "registry {host} is not one this server pulls from (it pulls from: {})",
                    list.join(", ")
                ),
            ));
        }
        let pinned = reference
            .digest()
            .map(|digest| {
                digest.parse::<Digest>().map_err(|error| {
                    refused(ErrorKind::Registry, format!("reference {text:?}: {error}"))
                })
            })
            .transpose()?;
        let store = self.host.store();
        // Pinned and already here: no need to ask the registry.
        if let Some(digest) = &pinned
            && let Ok(image) = Image::load(store.layout(), digest, None)
            && image
                .layers
                .iter()
                .all(|layer| store.layout().has_blob(&layer.digest))
        {
            return self.unpacked(text, &image).await;
        }
        let _flight = store.flights().lock(&format!("pull {text}")).await;
        let (digest, manifest) = self.manifest(&reference, pinned.as_ref()).await?;
        let image = self.fetch(&reference, &digest, &manifest).await?;
        store
            .layout()
            .add_manifest(
                text,
                &digest,
                manifest.len() as u64,
                MediaType::ImageManifest,
            )
            .map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("cannot record {text} in the store: {error}"),
                )
            })?;
        self.unpacked(text, &image).await
    }

    async fn unpacked(&self, text: &str, image: &Image) -> Result<OciRuntime, RegistryError> {
        let unpacked = self
            .host
            .store()
            .unpack(self.host.store().layout(), image)
            .await
            .map_err(|error| refused(ErrorKind::Registry, format!("image {text}: {error}")))?;
        Ok(OciRuntime::new(Arc::clone(&self.host), unpacked))
    }

    /// The image manifest for this platform, checked against `pinned`
    /// (which may name an index), with its digest.
    async fn manifest(
        &self,
        reference: &Reference,
        pinned: Option<&Digest>,
    ) -> Result<(Digest, Vec<u8>), RegistryError> {
        let whole = reference.whole();
        let mut target = reference.clone();
        let mut expected = pinned.cloned();
        for _ in 0..2 {
            let (bytes, _) = self
                .client
                .pull_manifest_raw(&target, &RegistryAuth::Anonymous, &ACCEPTED)
                .await
                .map_err(|error| self.failed(&whole, "its manifest", &error))?;
            if bytes.len() as u64 > MAX_JSON {
                return Err(refused(
                    ErrorKind::Registry,
                    format!("the manifest of {whole} is larger than {MAX_JSON} bytes"),
                ));
            }
            let digest = Digest::of(&bytes);
            if let Some(expected) = &expected
                && *expected != digest
            {
                return Err(refused(
                    ErrorKind::Registry,
                    format!(
                        "digest mismatch: the manifest of {whole} hashes to {digest}, not {expected}"
                    ),
                ));
            }
            let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("the manifest of {whole} is not JSON: {error}"),
                )
            })?;
            let media_type = value
                .get("mediaType")
                .and_then(|m| m.as_str())
                .unwrap_or_default();
            if !(is_index(media_type) || value.get("manifests").is_some()) {
                return Ok((digest, bytes.to_vec()));
            }
            let index: ImageIndex = serde_json::from_value(value).map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("the index of {whole} does not parse: {error}"),
                )
            })?;
            let entry = image::pick(&index, false)
                .map_err(|error| refused(ErrorKind::Registry, format!("{whole}: {error}")))?;
            let entry_digest = crate::layout::digest_of(entry)
                .map_err(|error| refused(ErrorKind::Registry, format!("{whole}: {error}")))?;
            target = reference.clone_with_digest(entry_digest.to_string());
            expected = Some(entry_digest);
        }
        Err(refused(
            ErrorKind::Registry,
            format!("{whole}: an index names another index; one level is followed"),
        ))
    }

    /// Checks the manifest, then fetches what the store lacks of the image.
    async fn fetch(
        &self,
        reference: &Reference,
        digest: &Digest,
        manifest: &[u8],
    ) -> Result<Image, RegistryError> {
        let whole = reference.whole();
        let parsed: ImageManifest = serde_json::from_slice(manifest).map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("the manifest of {whole} does not parse: {error}"),
            )
        })?;
        let (layers, size) = image::layers(&parsed, manifest.len() as u64)
            .map_err(|error| refused(ErrorKind::Registry, format!("{whole}: {error}")))?;
        if size > self.config.max_image_size {
            return Err(refused(
                ErrorKind::Registry,
                format!(
                    "image {whole} is too large: {size} bytes, over this server's limit of {} bytes",
                    self.config.max_image_size
                ),
            ));
        }
        let layout = self.host.store().layout();
        layout.put(manifest).map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("cannot store the manifest of {whole}: {error}"),
            )
        })?;
        let config = crate::layout::digest_of(parsed.config())
            .map_err(|error| refused(ErrorKind::Registry, format!("{whole}: {error}")))?;
        let blobs = std::iter::once((config, parsed.config().size())).chain(
            layers
                .iter()
                .map(|layer| (layer.digest.clone(), layer.size)),
        );
        let mut fetched = 0u64;
        for (blob, size) in blobs {
            fetched += self.blob(reference, &blob, size).await?;
        }
        info!(reference = %whole, %digest, bytes = fetched, "image pulled");
        Image::load(layout, digest, Some(manifest.len() as u64))
            .map_err(|error| refused(ErrorKind::Registry, format!("{whole}: {error}")))
    }

    /// Streams one blob into the store unless it is there; returns the
    /// bytes fetched.
    async fn blob(
        &self,
        reference: &Reference,
        digest: &Digest,
        size: u64,
    ) -> Result<u64, RegistryError> {
        let store = self.host.store();
        let layout = store.layout();
        let _flight = store.flights().lock(&format!("blob {digest}")).await;
        if layout.has_blob(digest) {
            return Ok(0);
        }
        let whole = reference.whole();
        let what = format!("blob {digest}");
        let mut stream = self
            .client
            .pull_blob_stream(reference, digest.to_string().as_str())
            .await
            .map_err(|error| self.failed(&whole, &what, &error))?;
        let (path, file) = layout.temporary().map_err(|error| {
            refused(ErrorKind::Registry, format!("cannot store {what}: {error}"))
        })?;
        let partial = Partial(path);
        let mut file = tokio::fs::File::from_std(file);
        let mut hasher = Hasher::new();
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|error| {
                let mismatch = error
                    .get_ref()
                    .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>());
                refused(
                    ErrorKind::Registry,
                    if mismatch {
                        format!("digest mismatch: {what} of {whole}: {error}")
                    } else {
                        format!("cannot pull {what} of {whole}: {error}")
                    },
                )
            })?;
            hasher.update(&piece);
            if hasher.len() > size {
                return Err(refused(
                    ErrorKind::Registry,
                    format!("{what} of {whole} runs past its declared {size} bytes"),
                ));
            }
            file.write_all(&piece).await.map_err(|error| {
                refused(ErrorKind::Registry, format!("cannot store {what}: {error}"))
            })?;
        }
        file.flush().await.map_err(|error| {
            refused(ErrorKind::Registry, format!("cannot store {what}: {error}"))
        })?;
        let len = hasher.len();
        check(digest, Some(size), hasher).map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("digest mismatch: {what} of {whole}: {error}"),
            )
        })?;
        partial.keep(&layout.blob_path(digest)).map_err(|error| {
            refused(ErrorKind::Registry, format!("cannot store {what}: {error}"))
        })?;
        Ok(len)
    }

    fn failed(&self, whole: &str, what: &str, error: &OciDistributionError) -> RegistryError {
        if not_found(error) {
            return refused(
                ErrorKind::Registry,
                format!("not found: {what} of {whole}: {error}"),
            );
        }
        if matches!(error, OciDistributionError::DigestError(_)) {
            return refused(
                ErrorKind::Registry,
                format!("digest mismatch: {what} of {whole}: {error}"),
            );
        }
        refused(
            ErrorKind::Registry,
            format!("cannot pull {what} of {whole}: {error}"),
        )
    }
}

/// A blob being written: removed unless kept.
struct Partial(PathBuf);

impl Partial {
    fn keep(mut self, to: &std::path::Path) -> std::io::Result<()> {
        let from = std::mem::take(&mut self.0);
        std::fs::rename(from, to)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Registry for Pull {
    fn resolve(&self, reference: &str) -> BoxFuture<'_, Result<Arc<dyn Runtime>, RegistryError>> {
        let reference = reference.to_owned();
        Box::pin(async move {
            let runtime: Arc<dyn Runtime> = Arc::new(self.runtime(&reference).await?);
            Ok(runtime)
        })
    }
}
