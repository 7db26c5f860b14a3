//! [`Sys`] on the running Linux kernel: rustix's safe calls wherever rustix
//! has them; `unsafe` only for what it does not wrap (`unshare`, which
//! rustix marks unsafe for `CLONE_FILES`; the interface ioctls; the
//! helper `fork`; `mount_setattr`).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::mount::{
    MountFlags as RMountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};
use rustix::process::{Resource, Rlimit};
use rustix::thread::{CapabilitySet, CapabilitySets};

use super::{IdMapFile, LandlockOutcome, Limit, MountFlags, Sys};

/// The real system calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

fn resource(l: Limit) -> Resource {
    match l {
        Limit::Core => Resource::Core,
        Limit::Nofile => Resource::Nofile,
        Limit::Fsize => Resource::Fsize,
        Limit::AddressSpace => Resource::As,
    }
}

fn cstr(s: Option<&str>) -> io::Result<Option<CString>> {
    s.map(|s| CString::new(s).map_err(|_| io::Error::other("NUL in mount data")))
        .transpose()
}

const PROPAGATION: MountFlags = libc::MS_SHARED | libc::MS_PRIVATE | libc::MS_SLAVE | libc::MS_UNBINDABLE;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

impl Sys for Linux {
    fn geteuid(&self) -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn getegid(&self) -> u32 {
        rustix::process::getegid().as_raw()
    }

    fn ids(&self) -> (u32, u32, u32) {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }

    fn getrlimit(&self, limit: Limit) -> (Option<u64>, Option<u64>) {
        let r = rustix::process::getrlimit(resource(limit));
        (r.current, r.maximum)
    }

    fn setrlimit(&self, limit: Limit, soft: Option<u64>, hard: Option<u64>) -> io::Result<()> {
        rustix::process::setrlimit(
            resource(limit),
            Rlimit {
                current: soft,
                maximum: hard,
            },
        )
        .map_err(io::Error::from)
    }

    fn unshare(&self, flags: libc::c_int) -> io::Result<()> {
        if flags & libc::CLONE_FILES != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let f = rustix::thread::UnshareFlags::from_bits_retain(flags as u32);
        // SAFETY: rustix marks unshare unsafe for CLONE_FILES only, refused
        // above; the caller is single-threaded.
        unsafe { rustix::thread::unshare_unsafe(f) }.map_err(io::Error::from)
    }

    fn write_id_map(&self, file: IdMapFile, text: &str) -> io::Result<()> {
        fs::write(file.path(), text)
    }

    fn sethostname(&self, name: &[u8]) -> io::Result<()> {
        rustix::system::sethostname(name).map_err(io::Error::from)
    }

    fn loopback_up(&self) -> io::Result<()> {
        let s = rustix::net::socket_with(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::DGRAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let mut req = IfReq {
            name: [0; 16],
            flags: 0,
            pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        // SAFETY: two interface ioctls on a live socket and a live,
        // correctly sized ifreq (rustix has no safe SIOC[GS]IFFLAGS).
        unsafe {
            if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
                return Err(io::Error::last_os_error());
            }
            req.flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MountFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        let bits = flags as u32;
        if flags & PROPAGATION != 0 {
            let f = MountPropagationFlags::from_bits_retain(bits);
            return rustix::mount::mount_change(target, f).map_err(io::Error::from);
        }
        if flags & libc::MS_REMOUNT != 0 {
            let f = RMountFlags::from_bits_retain(bits & !(libc::MS_REMOUNT as u32));
            return rustix::mount::mount_remount(target, f, data.unwrap_or("")).map_err(io::Error::from);
        }
        if flags & libc::MS_BIND != 0 {
            let src = src.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
            let r = if flags & libc::MS_REC != 0 {
                rustix::mount::mount_bind_recursive(src, target)
            } else {
                rustix::mount::mount_bind(src, target)
            };
            return r.map_err(io::Error::from);
        }
        let data = cstr(data)?;
        rustix::mount::mount(
            src.unwrap_or(Path::new("none")),
            target,
            fstype.unwrap_or(""),
            RMountFlags::from_bits_retain(bits),
            data.as_deref(),
        )
        .map_err(io::Error::from)
    }

    fn mount_flags(&self, target: &Path) -> io::Result<MountFlags> {
        use rustix::fs::StatVfsMountFlags as St;
        let st = rustix::fs::statvfs(target)?;
        let mut flags = 0;
        for (st_flag, ms) in [
            (St::NODEV, libc::MS_NODEV),
            (St::NOEXEC, libc::MS_NOEXEC),
            (St::NOATIME, libc::MS_NOATIME),
            (St::NODIRATIME, libc::MS_NODIRATIME),
            (St::RELATIME, libc::MS_RELATIME),
            (St::RDONLY, libc::MS_RDONLY),
        ] {
            if st.f_flag.contains(st_flag) {
                flags |= ms;
            }
        }
        Ok(flags)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        rustix::process::pivot_root(new_root, put_old)?;
        std::env::set_current_dir("/")
    }

    fn umount_detach(&self, target: &Path) -> io::Result<()> {
        rustix::mount::unmount(target, UnmountFlags::DETACH).map_err(io::Error::from)
    }

    fn idmap_userns(&self, owner: (u32, u32), k: u32) -> io::Result<OwnedFd> {
        use rustix::pipe::{PipeFlags, pipe_with};
        let (ready_r, ready_w) = pipe_with(PipeFlags::CLOEXEC)?;
        let (hold_r, hold_w) = pipe_with(PipeFlags::CLOEXEC)?;
        // SAFETY: this process is single-threaded; the child only makes
        // raw system calls (no allocation, no lock) and then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(ready_r);
            drop(hold_w);
            let ok = self.unshare(libc::CLONE_NEWUSER).is_ok();
            let _ = rustix::io::write(&ready_w, &[u8::from(ok)]);
            let mut buf = [0u8; 1];
            let _ = rustix::io::read(&hold_r, &mut buf);
            // SAFETY: leaving the helper child without running any handler
            // of the parent's.
            unsafe { libc::_exit(0) };
        }
        drop(ready_w);
        drop(hold_r);
        let result = (|| -> io::Result<OwnedFd> {
            if pid < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut b = [0u8; 1];
            let n = rustix::io::read(&ready_r, &mut b)?;
            if n != 1 || b[0] != 1 {
                return Err(io::Error::other("the helper could not enter a user namespace"));
            }
            fs::write(format!("/proc/{pid}/uid_map"), format!("{} {k} 1", owner.0))?;
            fs::write(format!("/proc/{pid}/gid_map"), format!("{} {k} 1", owner.1))?;
            let f = fs::File::open(format!("/proc/{pid}/ns/user"))?;
            Ok(OwnedFd::from(f))
        })();
        // Closing our ends lets the helper exit; then it is reaped.
        drop(ready_r);
        drop(hold_w);
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
        }
        result
    }

    fn idmapped_bind(&self, src: BorrowedFd<'_>, userns: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
        let tree = rustix::mount::open_tree(
            src,
            c"",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
        )?;
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        let empty = c"";
        // SAFETY: mount_setattr (no rustix wrapper) reads one live,
        // correctly sized struct and a live empty path.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        rustix::mount::move_mount(
            &tree,
            c"",
            rustix::fs::CWD,
            target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(io::Error::from)
    }

    fn make_dir(&self, p: &Path, mode: u32, recursive: bool) -> io::Result<()> {
        fs::DirBuilder::new().recursive(recursive).mode(mode).create(p)
    }

    fn make_file(&self, p: &Path) -> io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(p)
            .map(drop)
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn remove_dir(&self, p: &Path) -> io::Result<()> {
        fs::remove_dir(p)
    }

    fn capbset_read(&self, cap: u32) -> io::Result<bool> {
        let set = cap_bit(cap)?;
        rustix::thread::capability_is_in_bounding_set(set).map_err(io::Error::from)
    }

    fn capbset_drop(&self, cap: u32) -> io::Result<()> {
        let set = cap_bit(cap)?;
        rustix::thread::remove_capability_from_bounding_set(set).map_err(io::Error::from)
    }

    fn clear_ambient(&self) -> io::Result<()> {
        rustix::thread::clear_ambient_capability_set().map_err(io::Error::from)
    }

    fn capset_clear(&self) -> io::Result<()> {
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: CapabilitySet::empty(),
                permitted: CapabilitySet::empty(),
                inheritable: CapabilitySet::empty(),
            },
        )
        .map_err(io::Error::from)
    }

    fn setgroups_empty(&self) -> io::Result<()> {
        rustix::thread::set_thread_groups(&[]).map_err(io::Error::from)
    }

    fn setresgid(&self, g: u32) -> io::Result<()> {
        let g = rustix::process::Gid::from_raw(g);
        rustix::thread::set_thread_res_gid(g, g, g).map_err(io::Error::from)
    }

    fn setresuid(&self, u: u32) -> io::Result<()> {
        let u = rustix::process::Uid::from_raw(u);
        rustix::thread::set_thread_res_uid(u, u, u).map_err(io::Error::from)
    }

    fn set_dumpable(&self, dumpable: bool) -> io::Result<()> {
        use rustix::process::DumpableBehavior;
        let b = if dumpable {
            DumpableBehavior::Dumpable
        } else {
            DumpableBehavior::NotDumpable
        };
        rustix::process::set_dumpable_behavior(b).map_err(io::Error::from)
    }

    fn set_pdeathsig(&self, sig: libc::c_int) -> io::Result<()> {
        let s = rustix::process::Signal::from_named_raw(sig)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        rustix::process::set_parent_process_death_signal(Some(s)).map_err(io::Error::from)
    }

    fn set_child_subreaper(&self) -> io::Result<()> {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(io::Error::from)
    }

    fn set_no_new_privs(&self) -> io::Result<()> {
        rustix::thread::set_no_new_privs(true).map_err(io::Error::from)
    }

    fn landlock_abi(&self) -> i64 {
        // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a
        // number (no rustix wrapper).
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32, // LANDLOCK_CREATE_RULESET_VERSION
            )
        };
        v.max(0)
    }

    fn landlock_restrict(&self, ro: &[PathBuf], rw: &[PathBuf]) -> io::Result<LandlockOutcome> {
        use landlock::{
            ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
            RulesetStatus, Scope, path_beneath_rules,
        };
        let abi = ABI::V6;
        let ro_access = AccessFs::from_read(abi);
        // No device nodes, even where writing is allowed.
        let rw_access = AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
        let status = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|r| r.scope(Scope::from_all(abi)))
            .and_then(|r| r.create())
            .and_then(|r| r.add_rules(path_beneath_rules(ro, ro_access)))
            .and_then(|r| r.add_rules(path_beneath_rules(rw, rw_access)))
            .and_then(|r| r.restrict_self())
            .map_err(io::Error::other)?;
        Ok(match status.ruleset {
            RulesetStatus::FullyEnforced => LandlockOutcome::Full,
            RulesetStatus::PartiallyEnforced => LandlockOutcome::Partial,
            RulesetStatus::NotEnforced => LandlockOutcome::None,
        })
    }

    fn seccomp_install(&self, program: &seccompiler::BpfProgram) -> io::Result<()> {
        seccompiler::apply_filter(program).map_err(io::Error::other)
    }

    fn join_cgroup(&self, procs: &Path) -> io::Result<()> {
        fs::write(procs, "0")
    }

    fn getppid(&self) -> i32 {
        rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get())
    }

    fn setsid(&self) -> io::Result<()> {
        rustix::process::setsid().map(drop).map_err(io::Error::from)
    }

    fn setns_path(&self, path: &Path, nstype: libc::c_int) -> io::Result<()> {
        use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
        use std::os::fd::AsFd;
        let kind = match nstype {
            libc::CLONE_NEWUSER => LinkNameSpaceType::User,
            libc::CLONE_NEWNS => LinkNameSpaceType::Mount,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        };
        let f = fs::File::open(path)?;
        move_into_link_name_space(f.as_fd(), Some(kind)).map_err(io::Error::from)
    }
}

/// The one-capability set of capability number `cap`.
fn cap_bit(cap: u32) -> io::Result<CapabilitySet> {
    if cap >= 64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(CapabilitySet::from_bits_retain(1u64 << cap))
}
