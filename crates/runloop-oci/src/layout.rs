//! OCI image layouts: a directory holding `oci-layout`, `index.json` and
//! `blobs/sha256/…`, read with every blob checked against its digest.
//!
//! Two kinds of layout are read here: the operator's (`oci:DIR` in the
//! catalog, made by `docker buildx`, `buildah`, `skopeo` or `umoci`) and the
//! server's own store, where pulled blobs are written under their digests
//! and pulled images are recorded in `index.json` — so the store itself is
//! a layout those tools can read.
//!
//! Nothing read from a layout is trusted before it is hashed: JSON blobs
//! (indexes, manifests, configurations) are read whole, within
//! [`MAX_JSON`] bytes, and checked before they are parsed; a layer is
//! checked in full ([`Layout::verify`]) before it is unpacked. Writes go to
//! a temporary file in the blob directory and are renamed into place once
//! their digest is known, so a blob is either whole or absent.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use oci_spec::image::{Descriptor, ImageIndex, MediaType};
use serde::de::DeserializeOwned;

use crate::digest::{Digest, DigestError, Hasher};

/// The largest index, manifest or image configuration read, bytes.
pub const MAX_JSON: u64 = 4 << 20;

/// What `oci-layout` holds in every layout this crate reads or writes.
const LAYOUT_FILE: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// The annotation an index entry's name is kept in.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An image layout on disk.
#[derive(Debug)]
pub struct Layout {
    dir: PathBuf,
    /// Serializes `index.json` updates within this process.
    index: Mutex<()>,
}

/// Why a layout or one of its blobs cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The directory is not an image layout.
    #[error("{path} is not an OCI image layout: {why}")]
    NotALayout {
        /// The directory.
        path: PathBuf,
        /// What is missing or wrong.
        why: String,
    },
    /// A blob the layout names is not there.
    #[error("blob {digest} is missing from {dir}")]
    Missing {
        /// The blob.
        digest: Digest,
        /// The layout.
        dir: PathBuf,
    },
    /// A blob's content does not hash to its name.
    #[error("blob {digest} does not match its digest: its content hashes to {actual}")]
    Mismatch {
        /// The digest it should have.
        digest: Digest,
        /// The digest it has.
        actual: Digest,
    },
    /// A blob is not the size its descriptor says.
    #[error("blob {digest} is {actual} bytes; its descriptor says {expected}")]
    Size {
        /// The blob.
        digest: Digest,
        /// The descriptor's size.
        expected: u64,
        /// The size read.
        actual: u64,
    },
    /// A JSON blob larger than [`MAX_JSON`].
    #[error("{what} {digest} is larger than {max} bytes")]
    TooLarge {
        /// What the blob is.
        what: &'static str,
        /// The blob.
        digest: Digest,
        /// The bound.
        max: u64,
    },
    /// A JSON blob that does not parse as what it should be.
    #[error("{what} {digest} does not parse")]
    Json {
        /// What the blob is.
        what: &'static str,
        /// The blob.
        digest: Digest,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A descriptor with a digest this crate does not read.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// Reading or writing failed: the file, and the system's error.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The digest a descriptor names.
pub fn digest_of(descriptor: &Descriptor) -> Result<Digest, DigestError> {
    descriptor.digest().to_string().parse()
}

impl Layout {
    /// Opens an existing layout, checking its `oci-layout` file.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Layout, LayoutError> {
        let dir = dir.into();
        let not = |why: String| LayoutError::NotALayout {
            path: dir.clone(),
            why,
        };
        let marker = fs::read(dir.join("oci-layout"))
            .map_err(|error| not(format!("cannot read its oci-layout file: {error}")))?;
        let version = serde_json::from_slice::<serde_json::Value>(&marker)
            .ok()
            .and_then(|value| value.get("imageLayoutVersion")?.as_str().map(str::to_owned));
        if version.as_deref() != Some("1.0.0") {
            return Err(not(
                "its oci-layout file does not say imageLayoutVersion 1.0.0".to_owned(),
            ));
        }
        Ok(Layout {
            dir,
            index: Mutex::new(()),
        })
    }

    /// Opens the layout at `dir`, making it (with an empty index) if it
    /// does not exist yet.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Layout, LayoutError> {
        let dir = dir.into();
        let blobs = dir.join("blobs").join("sha256");
        fs::create_dir_all(&blobs).map_err(io_at(&blobs))?;
        let marker = dir.join("oci-layout");
        if !marker.exists() {
            write_atomically(&marker, LAYOUT_FILE.as_bytes()).map_err(io_at(&marker))?;
        }
        let index = dir.join("index.json");
        if !index.exists() {
            let empty = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
            write_atomically(&index, empty).map_err(io_at(&index))?;
        }
        Layout::open(dir)
    }

    /// The layout's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob `digest` lives (whether or not it is there).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs").join("sha256").join(digest.hex())
    }

    /// Whether the blob is present (not checked).
    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// The layout's `index.json`.
    pub fn index(&self) -> Result<ImageIndex, LayoutError> {
        let path = self.dir.join("index.json");
        let bytes = read_bounded(&path, MAX_JSON).map_err(io_at(&path))?;
        let bytes = bytes.ok_or_else(|| LayoutError::NotALayout {
            path: self.dir.clone(),
            why: format!("its index.json is larger than {MAX_JSON} bytes"),
        })?;
        serde_json::from_slice(&bytes).map_err(|error| LayoutError::NotALayout {
            path: self.dir.clone(),
            why: format!("its index.json does not parse: {error}"),
        })
    }

    /// Reads a JSON blob whole, checks it against `digest` (and `size`,
    /// when known), and parses it. Returns the value and its bytes.
    pub fn read_json<T: DeserializeOwned>(
        &self,
        what: &'static str,
        digest: &Digest,
        size: Option<u64>,
    ) -> Result<(T, Vec<u8>), LayoutError> {
        let path = self.blob_path(digest);
        let bytes = match read_bounded(&path, MAX_JSON) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                return Err(LayoutError::TooLarge {
                    what,
                    digest: digest.clone(),
                    max: MAX_JSON,
                });
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(self.missing(digest));
            }
            Err(error) => return Err(io_at(&path)(error)),
        };
        let mut hasher = Hasher::new();
        hasher.update(&bytes);
        check(digest, size, hasher)?;
        let value = serde_json::from_slice(&bytes).map_err(|source| LayoutError::Json {
            what,
            digest: digest.clone(),
            source,
        })?;
        Ok((value, bytes))
    }

    /// Hashes the blob in full and checks it against `digest` and `size`.
    pub fn verify(&self, digest: &Digest, size: u64) -> Result<(), LayoutError> {
        let path = self.blob_path(digest);
        let mut file = self.open_blob(digest)?;
        let mut hasher = Hasher::new();
        let mut buffer = vec![0u8; 256 << 10];
        loop {
            let read = file.read(&mut buffer).map_err(io_at(&path))?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
            if hasher.len() > size {
                break;
            }
        }
        check(digest, Some(size), hasher)
    }

    /// Opens a blob for reading (not checked: see [`Layout::verify`]).
    pub fn open_blob(&self, digest: &Digest) -> Result<File, LayoutError> {
        let path = self.blob_path(digest);
        File::open(&path).map_err(|error| {
            if error.kind() == io::ErrorKind::NotFound {
                self.missing(digest)
            } else {
                io_at(&path)(error)
            }
        })
    }

    /// Writes `bytes` as a blob; returns its digest.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, LayoutError> {
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !path.is_file() {
            write_atomically(&path, bytes).map_err(io_at(&path))?;
        }
        Ok(digest)
    }

    /// A temporary file in the blob directory, for a blob written in
    /// pieces; it is removed when dropped unless renamed into place.
    pub fn temporary(&self) -> Result<(PathBuf, File), LayoutError> {
        let path = self
            .dir
            .join("blobs")
            .join("sha256")
            .join(format!(".partial-{}", crate::random_name()));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_at(&path))?;
        Ok((path, file))
    }

    /// Records `manifest` (a blob already in the layout) in `index.json`
    /// under `name`, replacing an entry of the same name.
    pub fn add_manifest(
        &self,
        name: &str,
        digest: &Digest,
        size: u64,
        media_type: MediaType,
    ) -> Result<(), LayoutError> {
        let _held = self
            .index
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut index = self.index()?;
        let mut manifests: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|entry| {
                entry
                    .annotations()
                    .as_ref()
                    .and_then(|notes| notes.get(REF_NAME))
                    .is_none_or(|existing| existing != name)
            })
            .cloned()
            .collect();
        let descriptor_digest: oci_spec::image::Digest =
            digest
                .to_string()
                .parse()
                .map_err(|error: oci_spec::OciSpecError| LayoutError::NotALayout {
                    path: self.dir.clone(),
                    why: format!("cannot name {digest} in its index: {error}"),
                })?;
        let mut entry = Descriptor::new(media_type, size, descriptor_digest);
        entry.set_annotations(Some([(REF_NAME.to_owned(), name.to_owned())].into()));
        manifests.push(entry);
        index.set_manifests(manifests);
        self.write_index(&index, digest)
    }

    /// Removes every entry of `index.json` naming the manifest `digest`
    /// (its blobs stay).
    pub fn remove_manifests(&self, digest: &Digest) -> Result<(), LayoutError> {
        let _held = self
            .index
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut index = self.index()?;
        let named = digest.to_string();
        let kept: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|entry| entry.digest().to_string() != named)
            .cloned()
            .collect();
        index.set_manifests(kept);
        self.write_index(&index, digest)
    }

    fn write_index(&self, index: &ImageIndex, digest: &Digest) -> Result<(), LayoutError> {
        let path = self.dir.join("index.json");
        let bytes = serde_json::to_vec(index).map_err(|source| LayoutError::Json {
            what: "index",
            digest: digest.clone(),
            source,
        })?;
        write_atomically(&path, &bytes).map_err(io_at(&path))
    }

    fn missing(&self, digest: &Digest) -> LayoutError {
        LayoutError::Missing {
            digest: digest.clone(),
            dir: self.dir.clone(),
        }
    }
}

/// Checks a finished hash against a digest and an expected size.
pub(crate) fn check(digest: &Digest, size: Option<u64>, hasher: Hasher) -> Result<(), LayoutError> {
    let (actual, len) = hasher.finish();
    if let Some(expected) = size
        && expected != len
    {
        return Err(LayoutError::Size {
            digest: digest.clone(),
            expected,
            actual: len,
        });
    }
    if actual != *digest {
        return Err(LayoutError::Mismatch {
            digest: digest.clone(),
            actual,
        });
    }
    Ok(())
}

/// A file's bytes, or `None` if it holds more than `max`.
fn read_bounded(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    File::open(path)?.take(max + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

/// Writes a file whole under a temporary name, then renames it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".partial-{}", crate::random_name()));
    let temporary = PathBuf::from(temporary);
    let written = File::create_new(&temporary)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}
