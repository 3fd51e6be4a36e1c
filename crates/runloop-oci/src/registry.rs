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
//! - no redirect is followed for a manifest; a blob's is followed only to
//!   the registry itself or a mirror the operator listed
//!   (`--registry-mirror`), and a mirror listed by name only at a public
//!   address (the rules in full: [`crate::distribution`]);
//! - no proxy but the operator's (`--registry-proxy`): the environment's
//!   `HTTP(S)_PROXY` would resolve names where the address rules cannot
//!   see;
//! - a manifest is read through a cap ([`MAX_JSON`]): refused at once when
//!   it declares more, and as soon as more arrives whatever it declared;
//! - the image (manifest, configuration and compressed layers, as the
//!   manifest declares them) must fit the configured size, checked before
//!   any layer is fetched, and no blob may run past its declared size;
//! - it may unpack to at most [`RegistryConfig::max_unpack_ratio`] times
//!   its compressed size (the unpacker's budget, within the host's own).
//!
//! A registry that does not connect within 30 s, or goes silent for 60 s
//! mid-answer, fails the pull; so does a pull that has not finished within
//! [`RegistryConfig::pull_timeout`], however steadily the bytes trickle.
//! At most [`RegistryConfig::max_pulls`] pulls fetch at once; the others
//! wait for a place within their own deadline. A tenant has its share of
//! them under way at most (half, unless its quota says otherwise: the
//! server's reckoning, handed in as a [`Puller`]); one more of its pulls is
//! refused at once, naming its limit, and other tenants still pull. A pull
//! whose run is given up (the caller went away) is dropped with it: its
//! connection closed, its partial blob removed.
//!
//! Blobs are kept in the store's layout under their digests and shared by
//! every image, until a collection sheds the image ([`crate::gc`]: a pull
//! holds the store busy until its run holds the image); a reference pinned
//! by digest whose image is already there runs without asking the registry. Two runs that ask for the same
//! reference at once fetch it once: the second waits for the first and
//! finds the blobs in the store.
//!
//! An image can be kept warm ([`Pull::keep_warm`], `serve --warm-image`)
//! once it is allowed and pinned: the server pulls it as its own (no
//! tenant's share), and a run that names a registry this server pulls
//! from and the same digest takes a warm container of it
//! ([`crate::pool`]), without a pull.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_client::Reference;
use oci_spec::image::{ImageIndex, ImageManifest, MediaType};
use runloop_proto::ErrorKind;
use runloop_proto::error_chain::Chain;
use runloop_runtime::{BoxFuture, Puller, Registry, RegistryError, Reserve, Runtime};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tracing::info;

use crate::OciRuntime;
use crate::digest::{Digest, Hasher};
use crate::distribution::{Distribution, FetchError, Target};
use crate::host::Host;
use crate::image::{self, ACCEPTED, Image, is_index};
use crate::layout::{MAX_JSON, check};
use crate::pool::PoolConfig;

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
    /// Hosts (`HOST[:PORT]`) a blob may be redirected to besides the
    /// registry itself: a registry's blob CDN.
    pub mirrors: Vec<String>,
    /// The HTTP proxy every registry request goes through (a URL); the
    /// environment's `HTTP(S)_PROXY` is never used.
    pub proxy: Option<String>,
    /// The largest image, bytes: manifest, configuration and compressed layers.
    pub max_image_size: u64,
    /// How long one pull (manifests and blobs) may take, all told.
    pub pull_timeout: Duration,
    /// Pulls fetching at once, server-wide.
    pub max_pulls: usize,
    /// How many times its compressed size an image may unpack to.
    pub max_unpack_ratio: u64,
}

impl RegistryConfig {
    /// Pulls from `allowed` over HTTPS and `insecure` over HTTP, with the
    /// defaults: no mirror, no proxy, images up to 2 GiB, 10 minutes a pull, 4 pulls
    /// at once, unpacked to at most 10 times their size.
    pub fn new(allowed: Vec<String>, insecure: Vec<String>) -> RegistryConfig {
        RegistryConfig {
            allowed,
            insecure,
            mirrors: Vec::new(),
            proxy: None,
            max_image_size: 2 << 30,
            pull_timeout: Duration::from_secs(600),
            max_pulls: 4,
            max_unpack_ratio: 10,
        }
    }
}

/// Pulls `registry` images for a server and runs them on its host.
pub struct Pull {
    host: Arc<Host>,
    config: RegistryConfig,
    client: Distribution,
    places: Arc<Semaphore>,
    /// Pulls under way, by tenant.
    tenants: Arc<Mutex<HashMap<String, usize>>>,
    /// The images kept warm, by the digest their reference pins.
    pooled: Mutex<HashMap<Digest, OciRuntime>>,
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

impl Pull {
    /// Pulls into `host`'s store from the registries `config` allows.
    pub fn new(host: Arc<Host>, config: RegistryConfig) -> Result<Pull, FetchError> {
        let client = Distribution::new(
            config.insecure.clone(),
            config.mirrors.clone(),
            config.proxy.as_deref(),
            CONNECT_TIMEOUT,
            READ_TIMEOUT,
        )?;
        let places = Arc::new(Semaphore::new(
            config.max_pulls.clamp(1, Semaphore::MAX_PERMITS),
        ));
        Ok(Pull {
            host,
            config,
            client,
            places,
            tenants: Arc::default(),
            pooled: Mutex::default(),
        })
    }

    /// Keeps warm containers of the registry image `reference` — of a
    /// registry this server pulls from, pinned by digest
    /// (`HOST/REPO[:TAG]@sha256:…`) — pulled now as the server's own pull,
    /// as `config` says and claimed of `reserve` ([`OciRuntime::keep_warm`]);
    /// runs naming the same digest take them.
    pub async fn keep_warm(
        &self,
        reference: &str,
        config: PoolConfig,
        reserve: Arc<dyn Reserve>,
    ) -> Result<(), RegistryError> {
        let Some((_, pinned)) = reference.rsplit_once('@') else {
            return Err(refused(
                ErrorKind::Policy,
                format!("{reference} is kept warm only pinned by digest (@sha256:…)"),
            ));
        };
        let pinned: Digest = pinned.parse().map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("registry reference {reference:?} does not parse: {error}"),
            )
        })?;
        let server = Puller {
            tenant: "the server's warm pools".to_owned(),
            max_pulls: None,
        };
        let runtime = self.runtime(reference, &server).await?;
        runtime.keep_warm(config, reserve);
        self.pooled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(pinned, runtime);
        Ok(())
    }

    /// A place among the pulls `puller`'s tenant may have under way, or
    /// the refusal naming its limit.
    fn claim(&self, puller: &Puller) -> Result<TenantPull, RegistryError> {
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let under_way = tenants.entry(puller.tenant.clone()).or_default();
        if let Some(max) = puller.max_pulls
            && *under_way >= max
        {
            return Err(refused(
                ErrorKind::Policy,
                format!(
                    "tenant {} has as many registry pulls under way as it may (max-pulls {max}); \
                     try again later",
                    puller.tenant
                ),
            ));
        }
        *under_way += 1;
        Ok(TenantPull {
            tenants: Arc::clone(&self.tenants),
            tenant: puller.tenant.clone(),
        })
    }

    /// The runtime for `reference`, pulling what the store lacks for
    /// `puller`.
    pub async fn runtime(&self, text: &str, puller: &Puller) -> Result<OciRuntime, RegistryError> {
        // A digest is checked first, by the rule every digest here is held
        // to, so a bad one is named as such rather than as a bad reference.
        if let Some((_, digest)) = text.rsplit_once('@') {
            digest.parse::<Digest>().map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("registry reference {text:?} does not parse: {error}"),
                )
            })?;
        }
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
        // Kept warm: no pull, a warm container if the pool has one.
        if let Some(digest) = &pinned
            && let Some(pooled) = self
                .pooled
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(digest)
        {
            return Ok(pooled.clone());
        }
        let store = self.host.store();
        // No collection takes what this pull finds or fetches before its
        // run holds the image.
        let _busy = store.busy().await.map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("image {text}: {error}", error = Chain(&error)),
            )
        })?;
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
        let _share = self.claim(puller)?;
        let timeout = self.config.pull_timeout;
        let pulled = tokio::time::timeout(timeout, async {
            let _flight = store.flights().lock(&format!("pull {text}")).await;
            let _place = Arc::clone(&self.places).acquire_owned().await;
            let (digest, manifest) = self.manifest(&reference, pinned.as_ref()).await?;
            let image = self.fetch(&reference, &digest, &manifest).await?;
            Ok::<_, RegistryError>((digest, manifest, image))
        })
        .await
        .map_err(|_| {
            refused(
                ErrorKind::Registry,
                format!(
                    "cannot pull {}: not done within this server's pull timeout of {} s",
                    reference.whole(),
                    timeout.as_secs_f64()
                ),
            )
        })?;
        let (digest, manifest, image) = pulled?;
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
                    format!(
                        "cannot record {text} in the store: {error}",
                        error = Chain(&error)
                    ),
                )
            })?;
        self.unpacked(text, &image).await
    }

    async fn unpacked(&self, text: &str, image: &Image) -> Result<OciRuntime, RegistryError> {
        let unpacked = self
            .host
            .store()
            .unpack_within(
                self.host.store().layout(),
                image,
                image.size.saturating_mul(self.config.max_unpack_ratio),
            )
            .await
            .map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("image {text}: {error}", error = Chain(&error)),
                )
            })?;
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
        let endpoint = Target {
            registry: reference.registry().to_owned(),
            endpoint: reference.resolve_registry().to_owned(),
            repository: reference.repository().to_owned(),
        };
        for _ in 0..2 {
            let name = match target.digest() {
                Some(digest) => digest.to_owned(),
                None => target.tag().unwrap_or("latest").to_owned(),
            };
            let fetched = self
                .client
                .manifest(&endpoint, &name, &ACCEPTED, MAX_JSON)
                .await
                .map_err(|error| failed(&whole, "the manifest", &error))?;
            let bytes = fetched.bytes;
            let digest = Digest::of(&bytes);
            // The registry's own word on the digest, when it gives one in a
            // form read here, must match too (a tag names no digest).
            let said = fetched
                .digest
                .as_deref()
                .and_then(|said| said.parse::<Digest>().ok());
            if let Some(expected) = expected.as_ref().or(said.as_ref())
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
            let entry = image::pick(&index, false).map_err(|error| {
                refused(
                    ErrorKind::Registry,
                    format!("{whole}: {error}", error = Chain(&error)),
                )
            })?;
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
        let (layers, size) = image::layers(&parsed, manifest.len() as u64).map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("{whole}: {error}", error = Chain(&error)),
            )
        })?;
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
                format!(
                    "cannot store the manifest of {whole}: {error}",
                    error = Chain(&error)
                ),
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
        Image::load(layout, digest, Some(manifest.len() as u64)).map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("{whole}: {error}", error = Chain(&error)),
            )
        })
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
        let target = Target {
            registry: reference.registry().to_owned(),
            endpoint: reference.resolve_registry().to_owned(),
            repository: reference.repository().to_owned(),
        };
        let mut response = self
            .client
            .blob(&target, &digest.to_string())
            .await
            .map_err(|error| failed(&whole, &what, &error))?;
        if let Some(declared) = response.content_length()
            && declared > size
        {
            return Err(refused(
                ErrorKind::Registry,
                format!(
                    "{what} of {whole} declares {declared} bytes, past its descriptor's {size}"
                ),
            ));
        }
        let (path, file) = layout.temporary().map_err(|error| {
            refused(
                ErrorKind::Registry,
                format!("cannot store {what}: {error}", error = Chain(&error)),
            )
        })?;
        let partial = Partial(path);
        let mut file = tokio::fs::File::from_std(file);
        let mut hasher = Hasher::new();
        loop {
            let piece = response
                .chunk()
                .await
                .map_err(|error| failed(&whole, &what, &FetchError::Http(error)))?;
            let Some(piece) = piece else {
                break;
            };
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
}

/// The refusal a failed request is, its kind said first (`not found`) where
/// there is one.
fn failed(whole: &str, what: &str, error: &FetchError) -> RegistryError {
    let text = match error {
        FetchError::NotFound(_) => format!("{what} of {whole}: {error}"),
        _ => format!("cannot pull {what} of {whole}: {}", Chain(error)),
    };
    refused(ErrorKind::Registry, text)
}

/// One pull of a tenant under way: counted until dropped.
struct TenantPull {
    tenants: Arc<Mutex<HashMap<String, usize>>>,
    tenant: String,
}

impl Drop for TenantPull {
    fn drop(&mut self) {
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(under_way) = tenants.get_mut(&self.tenant) {
            *under_way -= 1;
            if *under_way == 0 {
                tenants.remove(&self.tenant);
            }
        }
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
    fn resolve(
        &self,
        reference: &str,
        puller: Puller,
    ) -> BoxFuture<'_, Result<Arc<dyn Runtime>, RegistryError>> {
        let reference = reference.to_owned();
        Box::pin(async move {
            let runtime: Arc<dyn Runtime> = Arc::new(self.runtime(&reference, &puller).await?);
            Ok(runtime)
        })
    }

    fn max_pulls(&self) -> usize {
        self.config.max_pulls
    }
}
