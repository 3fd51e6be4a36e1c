//! The five mount lists and the rules their paths must keep.
//!
//! Paths travel as arrays of components, never as strings, so that no
//! separator, `..` or empty component can hide inside one: a component must
//! be non-empty, must not be `.` or `..`, and must not contain `/` or NUL. A
//! container path must have at least one component (nothing mounts over the
//! root); a host-relative path may be empty (the volume's own root).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// A host volume mounted into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's name on the host.
    pub host_name: String,
    /// A path inside the volume; empty for its root.
    pub host_relative_path: Vec<String>,
    /// Where it appears in the container.
    pub container_path: Vec<String>,
}

/// A file or directory, named by the hash of its content, mounted read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityMount {
    /// Where it appears in the container.
    pub container_path: Vec<String>,
    /// `<size>:<base64url sha256, unpadded>`.
    pub identity: String,
}

/// A FUSE file system the caller serves, mounted into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseMount {
    /// Where it appears in the container.
    pub container_path: Vec<String>,
    /// Which of the caller's FUSE sessions serves it.
    pub id: u64,
    /// Mounted read-only; absent means writable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// A rule a mount broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRule {
    /// A container path with no components.
    #[error("container_path is empty: nothing may be mounted over the root")]
    EmptyContainerPath,
    /// An empty component.
    #[error("{field} has an empty component")]
    EmptyComponent {
        /// `container_path` or `host_relative_path`.
        field: &'static str,
    },
    /// A `.` or `..` component.
    #[error("{field} has a `{component}` component")]
    DotComponent {
        /// `container_path` or `host_relative_path`.
        field: &'static str,
        /// `.` or `..`.
        component: &'static str,
    },
    /// A component containing `/` or NUL.
    #[error("{field} has a component containing a separator or NUL")]
    Separator {
        /// `container_path` or `host_relative_path`.
        field: &'static str,
    },
    /// A volume with no name, or one containing `/` or NUL.
    #[error("host_name must be a non-empty name without `/` or NUL")]
    HostName,
    /// An identity that is not `<size>:<base64url sha256>`.
    #[error("identity is not `<size>:<base64url sha256>`: {0}")]
    Identity(&'static str),
}

/// Checks one path's components.
pub(crate) fn check_path(field: &'static str, path: &[String]) -> Result<(), PathRule> {
    for component in path {
        match component.as_str() {
            "" => return Err(PathRule::EmptyComponent { field }),
            "." => {
                return Err(PathRule::DotComponent {
                    field,
                    component: ".",
                });
            }
            ".." => {
                return Err(PathRule::DotComponent {
                    field,
                    component: "..",
                });
            }
            c if c.contains(['/', '\0']) => return Err(PathRule::Separator { field }),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a container path: components, and not the root.
pub(crate) fn check_container_path(path: &[String]) -> Result<(), PathRule> {
    if path.is_empty() {
        return Err(PathRule::EmptyContainerPath);
    }
    check_path("container_path", path)
}

impl VolumeMount {
    pub(crate) fn check(&self) -> Result<(), PathRule> {
        if self.host_name.is_empty() || self.host_name.contains(['/', '\0']) {
            return Err(PathRule::HostName);
        }
        check_path("host_relative_path", &self.host_relative_path)?;
        check_container_path(&self.container_path)
    }
}

impl IdentityMount {
    pub(crate) fn check(&self) -> Result<(), PathRule> {
        check_container_path(&self.container_path)?;
        check_identity(&self.identity).map_err(PathRule::Identity)
    }
}

impl FuseMount {
    pub(crate) fn check(&self) -> Result<(), PathRule> {
        check_container_path(&self.container_path)
    }
}

/// `<size>:<hash>`: a decimal size without leading zeros, and 32 bytes of
/// SHA-256 in unpadded base64url.
fn check_identity(identity: &str) -> Result<(), &'static str> {
    let (size, hash) = identity.split_once(':').ok_or("no `:`")?;
    let canonical = size == "0" || !size.starts_with('0');
    if size.is_empty() || !canonical || size.parse::<u64>().is_err() {
        return Err("the size is not a decimal number");
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(hash)
        .map_err(|_| "the hash is not unpadded base64url")?;
    if bytes.len() != 32 {
        return Err("the hash is not 32 bytes");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(components: &[&str]) -> Vec<String> {
        components.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn path_rules() {
        assert_eq!(check_container_path(&path(&["work", "src"])), Ok(()));
        assert_eq!(check_container_path(&[]), Err(PathRule::EmptyContainerPath));
        assert_eq!(
            check_container_path(&path(&["a", ""])),
            Err(PathRule::EmptyComponent {
                field: "container_path"
            })
        );
        assert_eq!(
            check_container_path(&path(&[".."])),
            Err(PathRule::DotComponent {
                field: "container_path",
                component: ".."
            })
        );
        assert_eq!(
            check_path("host_relative_path", &path(&["a/b"])),
            Err(PathRule::Separator {
                field: "host_relative_path"
            })
        );
        assert_eq!(
            check_path("container_path", &path(&["a\0"])),
            Err(PathRule::Separator {
                field: "container_path"
            })
        );
        assert_eq!(check_path("host_relative_path", &[]), Ok(()));
    }

    #[test]
    fn identities() {
        let hash = "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU";
        assert_eq!(check_identity(&format!("0:{hash}")), Ok(()));
        assert_eq!(check_identity(&format!("1024:{hash}")), Ok(()));
        for bad in [
            hash.to_owned(),
            format!("01:{hash}"),
            format!("-1:{hash}"),
            format!(":{hash}"),
            format!("1:{hash}="),
            "1:abc".to_owned(),
            format!("1:{}", &hash[..42]),
        ] {
            assert!(check_identity(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volume_host_names() {
        let mount = |host: &str| VolumeMount {
            host_name: host.into(),
            host_relative_path: vec![],
            container_path: path(&["data"]),
        };
        assert_eq!(mount("vol").check(), Ok(()));
        assert_eq!(mount("").check(), Err(PathRule::HostName));
        assert_eq!(mount("a/b").check(), Err(PathRule::HostName));
    }
}
