//! The image's user: `USER[:GROUP]` from its configuration, as the numeric
//! ids runc needs.
//!
//! Names are looked up in the image's own `/etc/passwd` and `/etc/group`,
//! opened inside its root (`RESOLVE_IN_ROOT`, like every other path of an
//! image), never the host's. As Docker does: a user without a group takes
//! its primary group from `passwd` (or 0 if it has no entry), and gets the
//! groups `group` lists it in as additional groups.

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
