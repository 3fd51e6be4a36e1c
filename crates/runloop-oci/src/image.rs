//! Images: a manifest, its configuration and its layers, read from a
//! layout and checked before anything is unpacked or run.
//!
//! An image's identity is its manifest's digest: that is what a catalog
//! entry pins, what a run request names, and what the unpacked root file
//! system is cached under. The manifest names the configuration (the
//! process to run: entrypoint, command, environment, working directory,
//! user) and the layers, each with its digest, size and compression.
//!
//! Both OCI and Docker (schema 2) manifests are read: they have the same
//! shape and differ in media types. An index (a multi-platform image) is
//! resolved to the one manifest for this host's platform.

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};

use crate::digest::{Digest, DigestError};
use crate::layout::{Layout, LayoutError, digest_of};

/// A layer's compression, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// tar + gzip.
    Gzip,
    /// tar + zstd.
    Zstd,
}

/// One layer of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The compressed blob's digest.
    pub digest: Digest,
    /// The compressed blob's size.
    pub size: u64,
    /// How it is compressed.
    pub compression: Compression,
}

/// The process an image runs, from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Process {
    /// Entrypoint then command.
    pub args: Vec<String>,
    /// `NAME=VALUE` pairs.
    pub env: Vec<String>,
    /// The working directory (absolute), `/` when the image names none.
    pub cwd: String,
    /// `USER[:GROUP]` as the image wrote it (names or numbers), if any.
    pub user: Option<String>,
    /// The signal that asks it to stop (`StopSignal`), if the image names one.
    pub stop_signal: Option<String>,
}

/// A checked image: its manifest's digest, its layers and its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The manifest's digest: the image's identity.
    pub digest: Digest,
    /// Its layers, bottom first.
    pub layers: Vec<Layer>,
    /// What it runs.
    pub process: Process,
    /// Manifest, configuration and compressed layers, bytes.
    pub size: u64,
}

/// Why an image cannot be read or run.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The layout or one of its blobs.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A descriptor naming a digest this crate does not read.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// The index has no image for this platform.
    #[error("the index lists no image for linux/{arch}")]
    NoImage {
        /// This host's architecture.
        arch: &'static str,
    },
    /// The index has several images for this platform.
    #[error(
        "the index lists {count} images for linux/{arch}; keep one (skopeo copy oci:DIR:TAG oci:NEWDIR)"
    )]
    Ambiguous {
        /// How many.
        count: usize,
        /// This host's architecture.
        arch: &'static str,
    },
    /// A blob of a kind this crate does not run.
    #[error("{what} has media type {media_type}, which is not {expected}")]
    MediaType {
        /// What the blob is.
        what: &'static str,
        /// Its media type.
        media_type: String,
        /// What was expected.
        expected: &'static str,
    },
    /// An image for another platform.
    #[error("the image is for {os}/{arch}; this host runs linux/{host}")]
    Platform {
        /// The image's OS.
        os: String,
        /// The image's architecture.
        arch: String,
        /// This host's architecture.
        host: &'static str,
    },
    /// A manifest with an unexpected schema version.
    #[error("the manifest has schemaVersion {0}, not 2")]
    Schema(u32),
    /// A configuration with nothing to run.
    #[error("the image configuration has neither Entrypoint nor Cmd")]
    NothingToRun,
    /// A relative working directory.
    #[error("the image's WorkingDir {0:?} is not absolute")]
    WorkingDir(String),
}

/// This host's architecture, as OCI names it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Whether a media type names an image manifest.
pub fn is_manifest(media_type: &str) -> bool {
    matches!(media_type, OCI_MANIFEST | DOCKER_MANIFEST)
}

/// Whether a media type names an index of manifests.
pub fn is_index(media_type: &str) -> bool {
    matches!(media_type, OCI_INDEX | DOCKER_LIST)
}

/// The media types a registry is asked for, manifests and indexes.
pub const ACCEPTED: [&str; 4] = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];

fn compression(media_type: &MediaType) -> Result<Compression, ImageError> {
    let text = media_type.to_string();
    let plain = text.ends_with(".tar") || text.ends_with(".v1.tar");
    if plain {
        Ok(Compression::None)
    } else if text.ends_with("tar+gzip") || text.ends_with("tar.gzip") {
        Ok(Compression::Gzip)
    } else if text.ends_with("tar+zstd") || text.ends_with("tar.zstd") {
        Ok(Compression::Zstd)
    } else {
        Err(ImageError::MediaType {
            what: "a layer",
            media_type: text,
            expected: "a tar layer (plain, gzip or zstd)",
        })
    }
}

/// The layers a manifest names, with the image's total size (manifest,
/// configuration and layers), checked for form but not fetched.
pub fn layers(
    manifest: &ImageManifest,
    manifest_size: u64,
) -> Result<(Vec<Layer>, u64), ImageError> {
    if manifest.schema_version() != 2 {
        return Err(ImageError::Schema(manifest.schema_version()));
    }
    let mut size = manifest_size.saturating_add(manifest.config().size());
    let layers = manifest
        .layers()
        .iter()
        .map(|layer| {
            size = size.saturating_add(layer.size());
            Ok(Layer {
                digest: digest_of(layer)?,
                size: layer.size(),
                compression: compression(layer.media_type())?,
            })
        })
        .collect::<Result<Vec<_>, ImageError>>()?;
    Ok((layers, size))
}

impl Image {
    /// The one image a layout's `index.json` lists for this platform.
    pub fn from_layout(layout: &Layout) -> Result<Image, ImageError> {
        let index = layout.index()?;
        let (digest, size) = select(layout, &index, 0)?;
        Image::load(layout, &digest, Some(size))
    }

    /// The image whose manifest is the blob `digest` of `layout`; its
    /// configuration must be in the layout too (its layers need not be yet).
    pub fn load(layout: &Layout, digest: &Digest, size: Option<u64>) -> Result<Image, ImageError> {
        let (manifest, bytes): (ImageManifest, _) = layout.read_json("manifest", digest, size)?;
        if let Some(media_type) = manifest.media_type()
            && !is_manifest(media_type.as_ref())
        {
            return Err(ImageError::MediaType {
                what: "the manifest",
                media_type: media_type.to_string(),
                expected: "an image manifest",
            });
        }
        let (layers, size) = layers(&manifest, bytes.len() as u64)?;
        let config_digest = digest_of(manifest.config())?;
        let (config, _): (ImageConfiguration, _) = layout.read_json(
            "image configuration",
            &config_digest,
            Some(manifest.config().size()),
        )?;
        let (os, arch) = (config.os().to_string(), config.architecture().to_string());
        if os != "linux" || arch != host_arch() {
            return Err(ImageError::Platform {
                os,
                arch,
                host: host_arch(),
            });
        }
        Ok(Image {
            digest: digest.clone(),
            layers,
            process: process(&config)?,
            size,
        })
    }
}

/// Picks the manifest for this platform from an index, following one
/// level of nested index.
fn select(layout: &Layout, index: &ImageIndex, depth: u8) -> Result<(Digest, u64), ImageError> {
    let entry = pick(index, depth == 0)?;
    let digest = digest_of(entry)?;
    if is_index(entry.media_type().as_ref()) {
        let (nested, _): (ImageIndex, _) =
            layout.read_json("index", &digest, Some(entry.size()))?;
        return select(layout, &nested, depth + 1);
    }
    Ok((digest, entry.size()))
}

/// The one entry of an index for this platform (linux and this host's
/// architecture, or no platform named): an image manifest or, where
/// `nested` is allowed, an index to look in.
pub fn pick(index: &ImageIndex, nested: bool) -> Result<&Descriptor, ImageError> {
    let host = host_arch();
    let candidates: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|entry| {
            let media_type = entry.media_type().as_ref();
            is_manifest(media_type) || (nested && is_index(media_type))
        })
        .filter(|entry| {
            entry.platform().as_ref().is_none_or(|platform| {
                platform.os().to_string() == "linux" && platform.architecture().to_string() == host
            })
        })
        .collect();
    match candidates.as_slice() {
        [] => Err(ImageError::NoImage { arch: host }),
        [one] => Ok(one),
        many => Err(ImageError::Ambiguous {
            count: many.len(),
            arch: host,
        }),
    }
}

/// The process of an image configuration.
fn process(config: &ImageConfiguration) -> Result<Process, ImageError> {
    let Some(run) = config.config() else {
        return Err(ImageError::NothingToRun);
    };
    let args: Vec<String> = run
        .entrypoint()
        .iter()
        .chain(run.cmd())
        .flatten()
        .cloned()
        .collect();
    if args.is_empty() {
        return Err(ImageError::NothingToRun);
    }
    let cwd = match run.working_dir().as_deref() {
        None | Some("") => "/".to_owned(),
        Some(dir) if dir.starts_with('/') => dir.to_owned(),
        Some(dir) => return Err(ImageError::WorkingDir(dir.to_owned())),
    };
    Ok(Process {
        args,
        env: run.env().clone().unwrap_or_default(),
        cwd,
        user: run.user().clone().filter(|user| !user.is_empty()),
        stop_signal: run
            .stop_signal()
            .clone()
            .filter(|signal| !signal.is_empty()),
    })
}
