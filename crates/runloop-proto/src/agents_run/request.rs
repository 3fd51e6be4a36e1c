//! The `containers::agents::run` request: the container's members, flat on
//! the wire beside `agent`.
//!
//! `agent` is handed to the proxy's `/agent/register` verbatim, so it is kept
//! as the caller's JSON text ([`RawValue`]), never re-encoded: key order,
//! number spelling and unknown members all survive. Because serde's
//! `flatten` cannot carry a raw value through its buffer, decoding reads a
//! flat private mirror and splits it into [`Container`] and `agent`.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

#[cfg(doc)]
use super::image::DIGEST_RULE;
use super::image::{Image, ImageRef, RegistryImage, UNPINNED, is_valid_digest, is_valid_name};
use super::mounts::{FuseMount, IdentityMount, PathRule, VolumeMount};
use crate::codec::{Decode, Encode, Writer};

/// What the container is: its image, limits and mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// Where the image comes from.
    pub image: Image,
    /// Memory limit, bytes.
    pub memory: u64,
    /// Bytes the container may write to its own file system.
    pub disk: u64,
    /// Host volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Files by content identity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identity_file_mounts: Vec<IdentityMount>,
    /// Directories by content identity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identity_directory_mounts: Vec<IdentityMount>,
    /// Files served over FUSE by the caller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fuse_file_mounts: Vec<FuseMount>,
    /// Directories served over FUSE by the caller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fuse_directory_mounts: Vec<FuseMount>,
}

impl Container {
    /// A container of `image` with the given limits and no mounts.
    pub fn new(image: Image, memory: u64, disk: u64) -> Self {
        Container {
            image,
            memory,
            disk,
            volume_mounts: Vec::new(),
            identity_file_mounts: Vec::new(),
            identity_directory_mounts: Vec::new(),
            fuse_file_mounts: Vec::new(),
            fuse_directory_mounts: Vec::new(),
        }
    }

    /// Whether any of the five mount lists is non-empty.
    pub fn has_mounts(&self) -> bool {
        !(self.volume_mounts.is_empty()
            && self.identity_file_mounts.is_empty()
            && self.identity_directory_mounts.is_empty()
            && self.fuse_file_mounts.is_empty()
            && self.fuse_directory_mounts.is_empty())
    }

    /// Every mount's container path, with the list and index it came from.
    fn container_paths(&self) -> impl Iterator<Item = (&'static str, usize, &[String])> {
        let volumes = self
            .volume_mounts
            .iter()
            .enumerate()
            .map(|(i, m)| ("volume_mounts", i, &m.container_path[..]));
        let identity_files = self
            .identity_file_mounts
            .iter()
            .enumerate()
            .map(|(i, m)| ("identity_file_mounts", i, &m.container_path[..]));
        let identity_dirs = self
            .identity_directory_mounts
            .iter()
            .enumerate()
            .map(|(i, m)| ("identity_directory_mounts", i, &m.container_path[..]));
        let fuse_files = self
            .fuse_file_mounts
            .iter()
            .enumerate()
            .map(|(i, m)| ("fuse_file_mounts", i, &m.container_path[..]));
        let fuse_dirs = self
            .fuse_directory_mounts
            .iter()
            .enumerate()
            .map(|(i, m)| ("fuse_directory_mounts", i, &m.container_path[..]));
        volumes
            .chain(identity_files)
            .chain(identity_dirs)
            .chain(fuse_files)
            .chain(fuse_dirs)
    }
}

/// A `containers::agents::run` request.
#[derive(Debug, Clone, Serialize)]
pub struct RunRequest {
    /// The container's members.
    #[serde(flatten)]
    pub container: Container,
    /// Handed verbatim to the proxy's `/agent/register`; never read.
    pub agent: Box<RawValue>,
}

impl PartialEq for RunRequest {
    fn eq(&self, other: &Self) -> bool {
        self.container == other.container && self.agent.get() == other.agent.get()
    }
}

/// The flat wire form, for decoding.
#[derive(Deserialize)]
struct Wire {
    image: Image,
    memory: u64,
    disk: u64,
    #[serde(default)]
    volume_mounts: Vec<VolumeMount>,
    #[serde(default)]
    identity_file_mounts: Vec<IdentityMount>,
    #[serde(default)]
    identity_directory_mounts: Vec<IdentityMount>,
    #[serde(default)]
    fuse_file_mounts: Vec<FuseMount>,
    #[serde(default)]
    fuse_directory_mounts: Vec<FuseMount>,
    agent: Box<RawValue>,
}

impl<'de> Deserialize<'de> for RunRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Ok(RunRequest {
            container: Container {
                image: wire.image,
                memory: wire.memory,
                disk: wire.disk,
                volume_mounts: wire.volume_mounts,
                identity_file_mounts: wire.identity_file_mounts,
                identity_directory_mounts: wire.identity_directory_mounts,
                fuse_file_mounts: wire.fuse_file_mounts,
                fuse_directory_mounts: wire.fuse_directory_mounts,
            },
            agent: wire.agent,
        })
    }
}

/// A request whose JSON is not of the request's form.
#[derive(Debug, thiserror::Error)]
#[error("containers::agents::run request did not parse")]
pub struct RunRequestError(#[source] pub serde_json::Error);

/// A request that parsed but breaks a rule; the message says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRequest {
    /// `memory` is zero.
    #[error("memory must be at least 1 byte")]
    NoMemory,
    /// An image name that is not a repository path without a host.
    #[error("image name {0:?} is not a repository path without a host")]
    ImageName(String),
    /// An image name with `@DIGEST` in it: the digest has a member of its
    /// own.
    #[error(
        "image name {0:?} holds a digest: the name goes in the image's name and the digest in its \
         digest (RunRequest::server(NAME).digest(DIGEST) in the Rust client)"
    )]
    DigestInName(String),
    /// An image digest that is not one runloop takes ([`DIGEST_RULE`]).
    #[error("image digest {0:?} is not sha256: followed by 64 lowercase hex digits")]
    ImageDigest(String),
    /// An empty registry reference.
    #[error("image registry reference is empty")]
    EmptyReference,
    /// A mount that breaks a path rule.
    #[error("{list}[{index}]: {rule}")]
    Mount {
        /// Which of the five lists.
        list: &'static str,
        /// The mount's index in it.
        index: usize,
        /// The rule it broke.
        rule: PathRule,
    },
    /// Two mounts at the same container path.
    #[error("{list}[{index}] mounts at /{path}, which {first_list}[{first_index}] already uses")]
    SamePath {
        /// The later mount's list.
        list: &'static str,
        /// Its index.
        index: usize,
        /// The earlier mount's list.
        first_list: &'static str,
        /// Its index.
        first_index: usize,
        /// The path both use, `/`-joined.
        path: String,
    },
}

/// The memory a request built by [`RunRequest::server`] or
/// [`RunRequest::registry`] asks for until told otherwise: 1 GiB, as
/// `runloop run` and the Python package do.
pub const DEFAULT_MEMORY: u64 = 1 << 30;

/// The disk such a request asks for until told otherwise: none, as
/// `runloop run` and the Python package do. A run asks for the disk it
/// will write: none holds nothing of the server's disk budget and is what
/// the demo and `exec:` agents take (an exec server refuses disk it cannot
/// hold, by default); a container needs a file system of a size only its
/// caller knows (1 MiB at least), and a refusal says so.
pub const DEFAULT_DISK: u64 = 0;

impl RunRequest {
    /// A request for `container` with `agent` as its registration value.
    pub fn new(container: Container, agent: Box<RawValue>) -> Self {
        RunRequest { container, agent }
    }

    /// A request for the server's catalog image `name`, unpinned
    /// ([`UNPINNED`]), with [`DEFAULT_MEMORY`] and [`DEFAULT_DISK`], no mounts
    /// and `{}` as the agent's registration; the methods below change
    /// each:
    ///
    /// ```
    /// use runloop_proto::agents_run::{Image, RunRequest};
    ///
    /// let request = RunRequest::server("demo").memory(512 << 20).disk(0);
    /// assert!(matches!(&request.container.image, Image::Server(image) if image.name == "demo"));
    /// assert_eq!(request.container.memory, 512 << 20);
    /// assert_eq!(request.validate(), Ok(()));
    /// ```
    pub fn server(name: impl Into<String>) -> Self {
        let image = Image::Server(ImageRef {
            name: name.into(),
            digest: UNPINNED.to_owned(),
        });
        RunRequest::of(image)
    }

    /// A request for the registry image at `reference`
    /// (`HOST[:PORT]/REPO[:TAG][@DIGEST]`, protocol §5), with the defaults
    /// of [`RunRequest::server`]. The reference is not parsed here: the
    /// server refuses one that does not parse.
    pub fn registry(reference: impl Into<String>) -> Self {
        RunRequest::of(Image::Registry(RegistryImage {
            reference: reference.into(),
        }))
    }

    fn of(image: Image) -> Self {
        let agent = RawValue::from_string("{}".to_owned()).unwrap_or_else(|_| unreachable!());
        RunRequest::new(Container::new(image, DEFAULT_MEMORY, DEFAULT_DISK), agent)
    }

    /// Pins a `server` or `client` image to `digest` (`sha256:…`, checked
    /// by [`RunRequest::validate`] and by the server); a registry image
    /// names its digest in its reference, so it is left as it is.
    pub fn digest(mut self, digest: impl Into<String>) -> Self {
        if let Image::Server(image) | Image::Client(image) = &mut self.container.image {
            image.digest = digest.into();
        }
        self
    }

    /// The container's memory limit, in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.container.memory = bytes;
        self
    }

    /// The bytes the container may write; 0 asks for none.
    pub fn disk(mut self, bytes: u64) -> Self {
        self.container.disk = bytes;
        self
    }

    /// The agent's registration value, as JSON text kept verbatim; fails
    /// when `json` is not one JSON value.
    pub fn agent(mut self, json: &str) -> Result<Self, serde_json::Error> {
        self.agent = RawValue::from_string(json.to_owned())?;
        Ok(self)
    }

    /// Checks every rule the JSON's shape does not express.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        let container = &self.container;
        if container.memory == 0 {
            return Err(InvalidRequest::NoMemory);
        }
        match &container.image {
            Image::Client(ImageRef { name, digest }) | Image::Server(ImageRef { name, digest }) => {
                if name.contains('@') {
                    return Err(InvalidRequest::DigestInName(name.clone()));
                }
                if !is_valid_name(name) {
                    return Err(InvalidRequest::ImageName(name.clone()));
                }
                if !is_valid_digest(digest) {
                    return Err(InvalidRequest::ImageDigest(digest.clone()));
                }
            }
            Image::Registry(registry) => {
                if registry.reference.trim().is_empty() {
                    return Err(InvalidRequest::EmptyReference);
                }
            }
        }
        let mount = |list, index, rule| InvalidRequest::Mount { list, index, rule };
        for (i, m) in container.volume_mounts.iter().enumerate() {
            m.check().map_err(|rule| mount("volume_mounts", i, rule))?;
        }
        for (i, m) in container.identity_file_mounts.iter().enumerate() {
            m.check()
                .map_err(|rule| mount("identity_file_mounts", i, rule))?;
        }
        for (i, m) in container.identity_directory_mounts.iter().enumerate() {
            m.check()
                .map_err(|rule| mount("identity_directory_mounts", i, rule))?;
        }
        for (i, m) in container.fuse_file_mounts.iter().enumerate() {
            m.check()
                .map_err(|rule| mount("fuse_file_mounts", i, rule))?;
        }
        for (i, m) in container.fuse_directory_mounts.iter().enumerate() {
            m.check()
                .map_err(|rule| mount("fuse_directory_mounts", i, rule))?;
        }
        let mut seen = std::collections::HashMap::new();
        for (list, index, path) in container.container_paths() {
            if let Some(&(first_list, first_index)) = seen.get(path) {
                return Err(InvalidRequest::SamePath {
                    list,
                    index,
                    first_list,
                    first_index,
                    path: path.join("/"),
                });
            }
            seen.insert(path, (list, index));
        }
        Ok(())
    }
}

impl Decode<'_> for RunRequest {
    type Error = RunRequestError;

    fn decode(json: &[u8]) -> Result<Self, RunRequestError> {
        crate::codec::from_object(json).map_err(RunRequestError)
    }
}

impl Encode for RunRequest {
    type Error = serde_json::Error;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(out, self)
    }

    fn size_hint(&self) -> usize {
        256 + self.agent.get().len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::RegistryImage;
    use super::*;

    fn sha() -> String {
        format!("sha256:{}", "0".repeat(64))
    }

    fn request(json: &str) -> RunRequest {
        RunRequest::decode(json.as_bytes()).expect("decodes")
    }

    fn server_json(extra: &str) -> String {
        format!(
            r#"{{"image":{{"server":{{"name":"demo","digest":"{}"}}}},"memory":1048576,"disk":0{extra},"agent":{{"z":1, "a":[2.50]}}}}"#,
            sha()
        )
    }

    #[test]
    fn the_builder_writes_the_request_a_server_reads() {
        let request = RunRequest::server("agents/echo")
            .digest(format!("sha256:{}", "a".repeat(64)))
            .memory(1 << 20)
            .disk(0)
            .agent(r#"{"model": "x"}"#)
            .expect("JSON");
        assert_eq!(request.validate(), Ok(()));
        let encoded = String::from_utf8(request.to_vec().expect("encodes")).expect("utf-8");
        assert_eq!(
            encoded,
            format!(
                r#"{{"image":{{"server":{{"name":"agents/echo","digest":"sha256:{}"}}}},"memory":1048576,"disk":0,"agent":{{"model": "x"}}}}"#,
                "a".repeat(64)
            )
        );
        let unpinned = RunRequest::server("demo");
        assert_eq!(unpinned.container.memory, DEFAULT_MEMORY);
        assert_eq!(unpinned.container.disk, 0);
        assert_eq!(RunRequest::registry("r/x:1").container.disk, DEFAULT_DISK);
        assert_eq!(unpinned.agent.get(), "{}");
        assert!(
            matches!(&unpinned.container.image, Image::Server(image) if image.digest == UNPINNED)
        );
        let registry = RunRequest::registry("127.0.0.1:5000/echo:1").digest("ignored");
        assert!(matches!(
            &registry.container.image,
            Image::Registry(image) if image.reference == "127.0.0.1:5000/echo:1"
        ));
        assert!(RunRequest::server("demo").agent("{").is_err());
        assert_eq!(
            RunRequest::server("Demo").validate(),
            Err(InvalidRequest::ImageName("Demo".into()))
        );
        let pinned = RunRequest::server(format!("demo@sha256:{}", "0".repeat(64))).validate();
        let Err(refused @ InvalidRequest::DigestInName(_)) = pinned else {
            panic!("not refused for its digest: {pinned:?}");
        };
        assert!(
            refused
                .to_string()
                .contains(".digest(DIGEST) in the Rust client"),
            "{refused}"
        );
    }

    #[test]
    fn agent_is_kept_verbatim() {
        let r = request(&server_json(""));
        assert_eq!(r.agent.get(), r#"{"z":1, "a":[2.50]}"#);
        let encoded = String::from_utf8(r.to_vec().expect("encodes")).expect("utf-8");
        assert!(
            encoded.ends_with(r#""agent":{"z":1, "a":[2.50]}}"#),
            "{encoded}"
        );
        assert_eq!(
            RunRequest::decode(encoded.as_bytes()).expect("round trip"),
            r
        );
    }

    #[test]
    fn absent_mount_lists_are_empty_and_not_written() {
        let r = request(&server_json(""));
        assert!(!r.container.has_mounts());
        let encoded = String::from_utf8(r.to_vec().expect("encodes")).expect("utf-8");
        assert!(!encoded.contains("mounts"), "{encoded}");
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn shape_errors() {
        for bad in [
            "".to_owned(),
            "{}".to_owned(),
            r#"{"image":{"server":{"name":"demo","digest":"x"}},"memory":1,"disk":1}"#.to_owned(),
            server_json("").replace("1048576", "-1"),
            server_json("").replace(r#""disk":0"#, r#""disk":"0""#),
            server_json(r#","volume_mounts":{}"#),
            format!("{} junk", server_json("")),
        ] {
            let err = RunRequest::decode(bad.as_bytes()).expect_err(&bad);
            assert_eq!(
                err.to_string(),
                "containers::agents::run request did not parse"
            );
            let why = std::error::Error::source(&err).expect("the JSON error");
            assert!(why.is::<serde_json::Error>(), "{why}");
        }
    }

    #[test]
    fn every_mount_list_parses_and_validates() {
        let hash = "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU";
        let r = request(&server_json(&format!(
            r#","volume_mounts":[{{"host_name":"v","host_relative_path":[],"container_path":["data"]}}],
            "identity_file_mounts":[{{"container_path":["etc","key"],"identity":"32:{hash}"}}],
            "identity_directory_mounts":[{{"container_path":["opt"],"identity":"0:{hash}"}}],
            "fuse_file_mounts":[{{"container_path":["f"],"id":3}}],
            "fuse_directory_mounts":[{{"container_path":["g"],"id":4,"readonly":true}}]"#
        )));
        assert!(r.container.has_mounts());
        assert_eq!(r.container.fuse_directory_mounts[0].readonly, Some(true));
        assert_eq!(r.validate(), Ok(()));
        let again = RunRequest::decode(&r.to_vec().expect("encodes")).expect("round trip");
        assert_eq!(again, r);
    }

    #[test]
    fn validation_says_which_rule() {
        let base = request(&server_json(""));
        let with = |f: &dyn Fn(&mut Container)| {
            let mut r = base.clone();
            f(&mut r.container);
            r.validate().expect_err("invalid").to_string()
        };
        assert_eq!(with(&|c| c.memory = 0), "memory must be at least 1 byte");
        assert_eq!(
            with(&|c| c.image = Image::Server(ImageRef {
                name: "Bad".into(),
                digest: sha()
            })),
            r#"image name "Bad" is not a repository path without a host"#
        );
        assert_eq!(
            with(&|c| c.image = Image::Client(ImageRef {
                name: "a".into(),
                digest: "md5".into()
            })),
            r#"image digest "md5" is not sha256: followed by 64 lowercase hex digits"#
        );
        assert_eq!(
            with(&|c| c.image = Image::Registry(RegistryImage {
                reference: " ".into()
            })),
            "image registry reference is empty"
        );
        assert_eq!(
            with(&|c| c.fuse_file_mounts.push(FuseMount {
                container_path: vec![],
                id: 1,
                readonly: None
            })),
            "fuse_file_mounts[0]: container_path is empty: nothing may be mounted over the root"
        );
        assert_eq!(
            with(&|c| {
                c.fuse_file_mounts.push(FuseMount {
                    container_path: vec!["x".into()],
                    id: 1,
                    readonly: None,
                });
                c.fuse_directory_mounts.push(FuseMount {
                    container_path: vec!["x".into()],
                    id: 2,
                    readonly: None,
                });
            }),
            "fuse_directory_mounts[0] mounts at /x, which fuse_file_mounts[0] already uses"
        );
        assert_eq!(
            with(&|c| c.volume_mounts.push(VolumeMount {
                host_name: "v".into(),
                host_relative_path: vec!["..".into()],
                container_path: vec!["x".into()],
            })),
            "volume_mounts[0]: host_relative_path has a `..` component"
        );
    }
}
