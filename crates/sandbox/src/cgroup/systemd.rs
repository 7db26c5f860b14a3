//! A delegated cgroup v2 subtree from systemd for a host that is not root.
//!
//! The host asks its user manager (`systemd --user`) over D-Bus for a
//! transient scope with `Delegate=yes` that adopts the host process itself
//! (`StartTransientUnit` with `PIDs=[self]`), and waits for the job's
//! `JobRemoved` signal. The scope's directory then belongs to the user, so
//! the host can make `cellhost/<kernel>` groups in it and move its kernels
//! there.
//!
//! Why adopt the host rather than run each kernel under
//! `systemd-run --user --scope`: a process may only move between two groups
//! whose common ancestor's `cgroup.procs` it can write. A kernel init (or a
//! template's forked kernel) starts in the host's group; unless the host's
//! group is inside the delegated subtree, no kernel could join its own
//! group there. With the host inside, cold and forked kernels join their
//! groups exactly as on v1 and as root, and the per-kernel cost is a
//! `mkdir`, not a D-Bus round trip and an extra exec per kernel. Why D-Bus
//! rather than `systemd-run`: `systemd-run --scope` only starts a new
//! command, it cannot adopt a running process. The user manager moves a
//! process it cannot move itself (a login session's) by asking the system
//! manager (`AttachProcessesToUnit`), as `systemd-run --user --scope` relies
//! on.
//!
//! The manager is reached on its private socket
//! (`$XDG_RUNTIME_DIR/systemd/private`, peer to peer, which exists with or
//! without a user message bus; `systemctl --user` prefers it too), else on
//! the user bus.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use zbus::blocking::{Connection, MessageIterator};
use zbus::zvariant::{OwnedObjectPath, Value};

/// How long the manager may take to start the scope. It answers in
/// milliseconds; this bounds a wedged manager, not a normal start.
const START_TIMEOUT: Duration = Duration::from_secs(20);

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// The runtime directory of the user manager.
fn runtime_dir() -> Result<PathBuf, String> {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
        _ => {
            let uid = rustix::process::geteuid().as_raw();
            let d = PathBuf::from(format!("/run/user/{uid}"));
            if d.is_dir() {
                Ok(d)
            } else {
                Err(format!(
                    "XDG_RUNTIME_DIR is not set and {} does not exist (no systemd user manager for uid {uid}: log in through a session, or `loginctl enable-linger`)",
                    d.display()
                ))
            }
        }
    }
}

/// A connection to the user manager and whether it is a bus (not peer to
/// peer).
fn connect() -> Result<(Connection, bool), String> {
    let dir = runtime_dir()?;
    let private = dir.join("systemd/private");
    let p2p_err = if private.exists() {
        match zbus::blocking::connection::Builder::address(
            format!("unix:path={}", private.display()).as_str(),
        )
        .and_then(|b| b.p2p().build())
        {
            Ok(c) => return Ok((c, false)),
            Err(e) => format!("{}: {e}", private.display()),
        }
    } else {
        format!("{} does not exist", private.display())
    };
    let bus = dir.join("bus");
    let address = std::env::var("DBUS_SESSION_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| format!("unix:path={}", bus.display()));
    let c = zbus::blocking::connection::Builder::address(address.as_str())
        .and_then(|b| b.build())
        .map_err(|e| format!("no systemd user manager: {p2p_err}; user bus {address}: {e}"))?;
    Ok((c, true))
}

/// Moves this process into a new transient scope `unit` of the user
/// manager with `Delegate=yes` and returns once the scope runs.
///
/// # Errors
/// A text naming the socket, the call or the job result that failed.
pub fn adopt_self(unit: &str) -> Result<(), String> {
    let unit = unit.to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("cellhost-scope".into())
        .spawn(move || {
            let _ = tx.send(start_scope(&unit));
        })
        .map_err(|e| format!("cannot start the D-Bus thread: {e}"))?;
    rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|e| {
        Err(format!(
            "systemd's user manager did not start the scope within {}s: {e}",
            START_TIMEOUT.as_secs()
        ))
    })
}

fn start_scope(unit: &str) -> Result<(), String> {
    let (conn, is_bus) = connect()?;
    let call_err = |what: &str, e: zbus::Error| format!("systemd user manager, {what}: {e}");
    if is_bus {
        // On a bus the manager's signals reach only those who match them;
        // peer to peer it sends them all.
        let rule =
            format!("type='signal',sender='{DEST}',path='{PATH}',interface='{MANAGER}',member='JobRemoved'");
        conn.call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "AddMatch",
            &rule,
        )
        .map_err(|e| call_err("AddMatch", e))?;
    }
    // Made before the call, so the job's end cannot be missed.
    let signals = MessageIterator::from(&conn);
    let pid = std::process::id();
    let props: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from("cellhost kernels")),
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        // Gone from the manager once empty, also after a failure.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    let reply = conn
        .call_method(
            Some(DEST),
            PATH,
            Some(MANAGER),
            "StartTransientUnit",
            &(unit, "fail", props, aux),
        )
        .map_err(|e| call_err("StartTransientUnit", e))?;
    let job: OwnedObjectPath = reply
        .body()
        .deserialize()
        .map_err(|e| call_err("StartTransientUnit reply", e))?;
    for msg in signals {
        let msg = msg.map_err(|e| call_err("waiting for the job", e))?;
        let h = msg.header();
        if h.member().map(|m| m.as_str()) != Some("JobRemoved")
            || h.interface().map(|i| i.as_str()) != Some(MANAGER)
        {
            continue;
        }
        let Ok((_id, path, _unit, result)) =
            msg.body().deserialize::<(u32, OwnedObjectPath, String, String)>()
        else {
            continue;
        };
        if path == job {
            return if result == "done" {
                Ok(())
            } else {
                Err(format!(
                    "systemd user manager: starting {unit} ended with '{result}'"
                ))
            };
        }
    }
    Err("systemd user manager: the connection closed before the scope started".into())
}
