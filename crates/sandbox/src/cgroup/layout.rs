//! Which cgroup hierarchies this host has, and where this process sits in
//! each: read from `/proc/self/mountinfo` (the mounts, their root and the
//! v1 controllers in their super options) and `/proc/self/cgroup` (the
//! host's group per hierarchy).
//!
//! Pure parsing over the two texts, so the path logic is tested without a
//! cgroupfs; [`Layout::read`] reads the real files.

use std::path::{Path, PathBuf};

/// The host's cgroup setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Only v1 controller hierarchies.
    V1,
    /// Only the unified (v2) hierarchy.
    V2,
    /// v1 controller hierarchies and a unified one beside them (usually at
    /// `/sys/fs/cgroup/unified`, with no controllers of its own).
    Hybrid,
    /// No cgroup file system is mounted.
    None,
}

impl Mode {
    /// `v1`, `v2`, `hybrid`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::V1 => "v1",
            Mode::V2 => "v2",
            Mode::Hybrid => "hybrid",
            Mode::None => "none",
        }
    }
}

/// One mounted hierarchy and the host's group in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted (`/sys/fs/cgroup/memory`).
    pub mount_point: PathBuf,
    /// v1: the controllers it carries (`cpu`, `cpuacct`; `name=systemd`
    /// for a named one). Empty for v2.
    pub controllers: Vec<String>,
    /// Directory of the host's own group (the mount point joined with the
    /// `/proc/self/cgroup` path less the mount's root).
    pub own_group: PathBuf,
}

/// All hierarchies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// v1, v2 or hybrid.
    pub mode: Mode,
    /// The unified hierarchy, if mounted.
    pub unified: Option<Mount>,
    /// The v1 hierarchies.
    pub v1: Vec<Mount>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The host's group `path` of a hierarchy mounted at `mount_point` with
/// root `root`: a path outside the mount's root (another cgroup namespace)
/// is taken as relative to it.
fn join_group(mount_point: &Path, root: &str, path: &str) -> PathBuf {
    let rel = match path.strip_prefix(root) {
        _ if root == "/" => path,
        Some(r) if r.is_empty() || r.starts_with('/') => r,
        _ => path,
    };
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount_point.to_path_buf()
    } else {
        mount_point.join(rel)
    }
}

impl Layout {
    /// Parses the two texts.
    ///
    /// `mountinfo` is `/proc/self/mountinfo` (fields: id, parent, dev,
    /// root, mount point, options, optional fields, `-`, type, source,
    /// super options); `self_cgroup` is `/proc/self/cgroup`
    /// (`id:controllers:path`, `0::path` for v2).
    pub fn parse(mountinfo: &str, self_cgroup: &str) -> Layout {
        let mut groups_v1: Vec<(Vec<String>, String)> = Vec::new();
        let mut group_v2: Option<String> = None;
        for line in self_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if id == "0" && ctrls.is_empty() {
                group_v2 = Some(path.to_string());
            } else {
                groups_v1.push((ctrls.split(',').map(str::to_string).collect(), path.to_string()));
            }
        }
        let mut unified = None;
        let mut v1 = Vec::new();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 5 || r.len() < 3 {
                continue;
            }
            let (root, mount_point) = (unescape(l[3]), PathBuf::from(unescape(l[4])));
            match r[0] {
                "cgroup2" => {
                    let own = group_v2.as_deref().unwrap_or("/");
                    // The last cgroup2 mount wins (a later one hides an
                    // earlier one at the same place).
                    unified = Some(Mount {
                        own_group: join_group(&mount_point, &root, own),
                        mount_point,
                        controllers: Vec::new(),
                    });
                }
                "cgroup" => {
                    let known = |o: &&str| {
                        !matches!(
                            *o,
                            "rw" | "ro" | "noprefix" | "clone_children" | "xattr" | "nsdelegate"
                        ) && !o.starts_with("release_agent=")
                    };
                    let ctrls: Vec<String> = r[2].split(',').filter(known).map(str::to_string).collect();
                    if ctrls.is_empty() {
                        continue;
                    }
                    let own = groups_v1
                        .iter()
                        .find(|(c, _)| c.iter().any(|x| ctrls.contains(x)))
                        .map_or("/", |(_, p)| p.as_str());
                    v1.push(Mount {
                        own_group: join_group(&mount_point, &root, own),
                        mount_point,
                        controllers: ctrls,
                    });
                }
                _ => {}
            }
        }
        let has_v1 = v1
            .iter()
            .any(|m| m.controllers.iter().any(|c| !c.starts_with("name=")));
        let mode = match (has_v1, unified.is_some()) {
            (true, true) => Mode::Hybrid,
            (true, false) => Mode::V1,
            (false, true) => Mode::V2,
            (false, false) => Mode::None,
        };
        Layout { mode, unified, v1 }
    }

    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`; a file that
    /// cannot be read counts as empty (no hierarchy).
    pub fn read() -> Layout {
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Layout::parse(&mi, &cg)
    }

    /// The v1 hierarchy carrying `controller`.
    pub fn v1_for(&self, controller: &str) -> Option<&Mount> {
        self.v1
            .iter()
            .find(|m| m.controllers.iter().any(|c| c == controller))
    }
}

/// The controllers a v2 group offers its children (`cgroup.controllers`).
pub fn v2_controllers(group: &Path) -> Vec<String> {
    std::fs::read_to_string(group.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MI: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CG: &str = "\
9:name=systemd:/user.slice
8:pids:/
4:memory:/process_api/3a2b
2:cpu,cpuacct:/
0::/user.slice/session-2.scope
";

    #[test]
    fn hybrid_host_maps_each_controller_to_its_own_group() {
        let l = Layout::parse(HYBRID_MI, HYBRID_CG);
        assert_eq!(l.mode, Mode::Hybrid);
        let mem = l.v1_for("memory").expect("memory");
        assert_eq!(mem.own_group, Path::new("/sys/fs/cgroup/memory/process_api/3a2b"));
        assert_eq!(
            l.v1_for("cpu").expect("cpu").own_group,
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            l.v1_for("pids").expect("pids").own_group,
            Path::new("/sys/fs/cgroup/pids")
        );
        let u = l.unified.as_ref().expect("unified");
        assert_eq!(u.mount_point, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(
            u.own_group,
            Path::new("/sys/fs/cgroup/unified/user.slice/session-2.scope")
        );
        assert!(l.v1_for("io").is_none());
    }

    #[test]
    fn pure_v2_host_and_a_user_scope() {
        let mi = "25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let cg = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/cellhost-1.scope\n";
        let l = Layout::parse(mi, cg);
        assert_eq!(l.mode, Mode::V2);
        assert!(l.v1.is_empty());
        assert_eq!(
            l.unified.expect("unified").own_group,
            Path::new(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/cellhost-1.scope"
            )
        );
    }

    #[test]
    fn v1_only_and_no_cgroups() {
        let mi = "32 31 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        let l = Layout::parse(mi, "3:pids:/a/b\n");
        assert_eq!(l.mode, Mode::V1);
        assert_eq!(
            l.v1_for("pids").expect("pids").own_group,
            Path::new("/sys/fs/cgroup/pids/a/b")
        );
        let none = Layout::parse("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n", "");
        assert_eq!(none.mode, Mode::None);
        assert!(none.unified.is_none());
    }

    #[test]
    fn a_named_v1_hierarchy_alone_is_not_a_v1_host() {
        let mi = "\
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(Layout::parse(mi, "0::/\n").mode, Mode::V2);
    }

    #[test]
    fn mount_roots_and_escapes() {
        // A bind mount of a subtree (containers): the group path is made
        // relative to the mount's root; a path outside it (another cgroup
        // namespace) is taken as relative.
        let mi = "41 31 0:38 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = Layout::parse(mi, "0::/docker/abc/inner\n");
        assert_eq!(l.unified.expect("u").own_group, Path::new("/sys/fs/cgroup/inner"));
        let l = Layout::parse(mi, "0::/\n");
        assert_eq!(l.unified.expect("u").own_group, Path::new("/sys/fs/cgroup"));
        let mi = "41 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        let l = Layout::parse(mi, "0::/x\n");
        assert_eq!(l.unified.expect("u").own_group, Path::new("/mnt/cg two/x"));
    }

    #[test]
    fn reads_this_host() {
        // Whatever this machine has, reading it never fails and names
        // directories under its mount points.
        let l = Layout::read();
        if let Some(u) = &l.unified {
            assert!(u.own_group.starts_with(&u.mount_point));
        }
        for m in &l.v1 {
            assert!(m.own_group.starts_with(&m.mount_point));
        }
    }
}
