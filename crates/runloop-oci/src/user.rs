//! The image's user: `USER[:GROUP]` from its configuration, as the numeric
//! ids runc needs.
//!
//! Names are looked up in the image's own `/etc/passwd` and `/etc/group`,
//! opened inside its root (`RESOLVE_IN_ROOT`, like every other path of an
//! image), never the host's. As Docker does: a user without a group takes
//! its primary group from `passwd` (or 0 if it has no entry), and gets the
//! groups `group` lists it in as additional groups.
//!
//! And the ids the container's ids are on the host: every container runs
//! in a user namespace whose ids 0..COUNT are the host's START..START+COUNT
//! ([`IdMapping`]), so its root is an unprivileged user of the host — a
//! file or process the host's root owns is as foreign to it as to any
//! other user. runc 1.1 has no idmapped mounts, so images are unpacked
//! with their owners shifted into the range ([`IdRange::host`]), once per
//! range.

use std::io::Read;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Numeric ids for the container's process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Additional groups.
    pub groups: Vec<u32>,
}

/// One contiguous range of ids: the container's `0..count` are the host's
/// `start..start + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdRange {
    /// The host id of the container's id 0.
    pub start: u32,
    /// How many ids.
    pub count: u32,
}

/// The ids a server's containers run as: one range of user ids, one of
/// group ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdMapping {
    /// User ids.
    pub uids: IdRange,
    /// Group ids.
    pub gids: IdRange,
}

/// The range used when neither the operator nor `/etc/subuid` names one:
/// 65536 ids from 2,000,000,000, far above the ranges `useradd` gives out
/// (`SUB_UID_MAX` is 600,100,000 by default).
pub const DEFAULT_RANGE: IdRange = IdRange {
    start: 2_000_000_000,
    count: 65536,
};

/// The user whose `/etc/subuid` and `/etc/subgid` entries, when present,
/// are the default ranges (as Docker's `userns-remap` takes `dockremap`'s).
pub const SUBID_USER: &str = "runloop";

impl IdRange {
    /// The host id of the container's `id`, if the range holds it.
    pub fn host(&self, id: u32) -> Option<u32> {
        (id < self.count).then(|| self.start + id)
    }
}

/// Why a range is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Not `START:COUNT`.
    #[error("{0:?} is not START:COUNT (two numbers, e.g. 2000000000:65536)")]
    Syntax(String),
    /// Would map the container's root to the host's.
    #[error("a range starting at 0 would make the container's root the host's root")]
    HostRoot,
    /// Empty, or past the last id.
    #[error("{start}:{count} is empty or runs past the last id (4294967294)")]
    Bounds {
        /// Its start.
        start: u32,
        /// Its count.
        count: u32,
    },
}

impl std::str::FromStr for IdRange {
    type Err = RangeError;

    fn from_str(text: &str) -> Result<IdRange, RangeError> {
        let syntax = || RangeError::Syntax(text.to_owned());
        let (start, count) = text.split_once(':').ok_or_else(syntax)?;
        let start: u32 = start.trim().parse().map_err(|_| syntax())?;
        let count: u32 = count.trim().parse().map_err(|_| syntax())?;
        IdRange::checked(start, count)
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.start, self.count)
    }
}

impl IdRange {
    /// `start:count`, if it is a range a container may run as: not the
    /// host's root, not empty, and below `u32::MAX` (the kernel's "no id").
    pub fn checked(start: u32, count: u32) -> Result<IdRange, RangeError> {
        if start == 0 {
            return Err(RangeError::HostRoot);
        }
        if count == 0 || u64::from(start) + u64::from(count) > u64::from(u32::MAX) {
            return Err(RangeError::Bounds { start, count });
        }
        Ok(IdRange { start, count })
    }
}

impl IdMapping {
    /// The same range for users and groups.
    pub fn both(range: IdRange) -> IdMapping {
        IdMapping {
            uids: range,
            gids: range,
        }
    }

    /// The default: [`SUBID_USER`]'s entries in `/etc/subuid` and
    /// `/etc/subgid` when both have one, else [`DEFAULT_RANGE`] for both.
    pub fn default_for_host() -> IdMapping {
        let entry = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| subid_entry(&text, SUBID_USER))
        };
        match (entry("/etc/subuid"), entry("/etc/subgid")) {
            (Some(uids), Some(gids)) => IdMapping { uids, gids },
            _ => IdMapping::both(DEFAULT_RANGE),
        }
    }

    /// The host's own ids, unshifted (for unpacking outside any container).
    pub const fn identity() -> IdMapping {
        let all = IdRange {
            start: 0,
            count: u32::MAX,
        };
        IdMapping {
            uids: all,
            gids: all,
        }
    }

    /// Whether this is [`IdMapping::identity`].
    pub fn is_identity(&self) -> bool {
        *self == IdMapping::identity()
    }
}

/// The first range of `user` in a `/etc/subuid`-style text
/// (`NAME:START:COUNT` lines), if it is one a container may run as.
pub fn subid_entry(text: &str, user: &str) -> Option<IdRange> {
    text.lines().find_map(|line| {
        let mut fields = line.trim().splitn(3, ':');
        (fields.next()? == user).then_some(())?;
        let start = fields.next()?.parse().ok()?;
        let count = fields.next()?.parse().ok()?;
        IdRange::checked(start, count).ok()
    })
}

/// The longest passwd or group file read.
const MAX_FILE: u64 = 1 << 20;

/// Resolves `user` (`None`: root) against the image at `rootfs`.
pub fn resolve(rootfs: &Path, user: Option<&str>) -> Result<Ids, String> {
    let Some(user) = user else {
        return Ok(Ids::default());
    };
    let (name, group) = match user.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (user, None),
    };
    let passwd = read(rootfs, "etc/passwd");
    // name:password:uid:gid:…
    let entry = passwd.as_deref().and_then(|passwd| {
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let (entry_name, uid, gid) = (fields.first()?, fields.get(2)?, fields.get(3)?);
            let uid: u32 = uid.parse().ok()?;
            let matches = *entry_name == name || name.parse::<u32>() == Ok(uid);
            matches.then(|| Some((entry_name.to_string(), uid, gid.parse::<u32>().ok()?)))?
        })
    });
    let (user_name, uid, primary) = match (name.parse::<u32>(), entry) {
        (_, Some((entry_name, uid, gid))) => (Some(entry_name), uid, gid),
        (Ok(uid), None) => (None, uid, 0),
        (Err(_), None) => {
            return Err(format!(
                "the image's user {name:?} is not in its /etc/passwd"
            ));
        }
    };
    let groups = read(rootfs, "etc/group").unwrap_or_default();
    // name:password:gid:member,member
    let group_entries: Vec<(&str, u32, Vec<&str>)> = groups
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let gid = fields.get(2)?.parse().ok()?;
            let members = fields
                .get(3)
                .map_or_else(Vec::new, |m| m.split(',').collect());
            Some((*fields.first()?, gid, members))
        })
        .collect();
    let gid = match group {
        None => primary,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_entries
                .iter()
                .find(|(entry, _, _)| *entry == group)
                .map(|(_, gid, _)| *gid)
                .ok_or_else(|| format!("the image's group {group:?} is not in its /etc/group"))?,
        },
    };
    let groups = match (&user_name, group) {
        (Some(user_name), None) => group_entries
            .iter()
            .filter(|(_, gid, members)| *gid != primary && members.contains(&user_name.as_str()))
            .map(|(_, gid, _)| *gid)
            .collect(),
        _ => Vec::new(),
    };
    Ok(Ids { uid, gid, groups })
}

/// A small text file of the image, opened inside its root; `None` if it
/// is missing, unreadable or too large.
fn read(rootfs: &Path, path: &str) -> Option<String> {
    let root = rustix::fs::open(
        rootfs,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let file = rustix::fs::openat2(
        &root,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    let mut text = String::new();
    std::fs::File::from(file)
        .take(MAX_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_the_host_root_and_overflow() {
        assert_eq!(
            "100000:65536".parse::<IdRange>(),
            Ok(IdRange {
                start: 100_000,
                count: 65536
            })
        );
        assert_eq!("0:65536".parse::<IdRange>(), Err(RangeError::HostRoot));
        assert_eq!(
            "4294967295:1".parse::<IdRange>(),
            Err(RangeError::Bounds {
                start: u32::MAX,
                count: 1
            })
        );
        assert!(matches!(
            "4294960000:65536".parse::<IdRange>(),
            Err(RangeError::Bounds { .. })
        ));
        assert!(matches!(
            "100000:0".parse::<IdRange>(),
            Err(RangeError::Bounds { .. })
        ));
        assert!(matches!(
            "100000".parse::<IdRange>(),
            Err(RangeError::Syntax(_))
        ));
        assert_eq!(
            RangeError::HostRoot.to_string(),
            "a range starting at 0 would make the container's root the host's root"
        );
        let range = DEFAULT_RANGE;
        assert_eq!(range.host(0), Some(2_000_000_000));
        assert_eq!(range.host(65535), Some(2_000_065_535));
        assert_eq!(range.host(65536), None);
        assert_eq!(
            subid_entry("alice:100000:65536\nrunloop:300000:65536\n", "runloop"),
            Some(IdRange {
                start: 300_000,
                count: 65536
            })
        );
        assert_eq!(subid_entry("runloop:0:65536\n", "runloop"), None);
        assert_eq!(subid_entry("alice:100000:65536\n", "runloop"), None);
    }

    #[test]
    fn users_resolve_by_name_number_and_group() {
        let root = tempfile::tempdir().expect("temp");
        std::fs::create_dir(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n",
        )
        .expect("passwd");
        std::fs::write(
            root.path().join("etc/group"),
            "root:x:0:\nagent:x:1000:\nstaff:x:50:agent,other\naudio:x:29:other\n",
        )
        .expect("group");
        let ids = |user: Option<&str>| resolve(root.path(), user);
        assert_eq!(ids(None), Ok(Ids::default()));
        assert_eq!(
            ids(Some("agent")),
            Ok(Ids {
                uid: 1000,
                gid: 1000,
                groups: vec![50]
            })
        );
        assert_eq!(
            ids(Some("1000")),
            Ok(Ids {
                uid: 1000,
                gid: 1000,
                groups: vec![50]
            })
        );
        assert_eq!(
            ids(Some("agent:audio")),
            Ok(Ids {
                uid: 1000,
                gid: 29,
                groups: vec![]
            })
        );
        assert_eq!(
            ids(Some("4242:7")),
            Ok(Ids {
                uid: 4242,
                gid: 7,
                groups: vec![]
            })
        );
        assert_eq!(
            ids(Some("nobody")),
            Err("the image's user \"nobody\" is not in its /etc/passwd".to_owned())
        );
        assert_eq!(
            ids(Some("agent:wheel")),
            Err("the image's group \"wheel\" is not in its /etc/group".to_owned())
        );
    }
}
