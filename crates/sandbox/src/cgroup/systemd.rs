//! A delegated cgroup v2 subtree from systemd for a host that is not root.
//!
//! The host asks its user manager (`systemd --user`) over D-Bus for a
//! transient scope with `Delegate=yes` that adopts the host process itself
//! (`StartTransientUnit` with `PIDs=[self]`), and waits for the job's
//! `JobRemoved` signal (after `Subscribe`: on a bus the manager emits its
//! signals only while someone is subscribed). The scope's directory then
//! belongs to the user, so the host can make `cellhost/<kernel>` groups in
//! it and move its kernels there.
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
//! The manager is reached on the user message bus (`DBUS_SESSION_BUS_ADDRESS`,
//! else `$XDG_RUNTIME_DIR/bus`; Debian's `dbus-user-session`), not on its
//! private socket (`$XDG_RUNTIME_DIR/systemd/private`): there the manager
//! names the sender of its messages `org.freedesktop.systemd1`, a name zbus
//! refuses as a message's sender (its connection thread panics on the
//! first reply and the call never returns; seen with systemd 252).
//!
//! Only `JobRemoved` is queued while the call waits (a match-rule iterator
//! with a queue of its own): a connection's unfiltered queue holds 64
//! messages, and one that nobody reads stops the connection from reading
//! anything, the reply included, once the manager has sent that many
//! signals.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use zbus::blocking::{Connection, MessageIterator};
use zbus::zvariant::{OwnedObjectPath, Value};
use zbus::{MatchRule, message};

/// How long the manager may take to start the scope. It answers in
/// milliseconds; this bounds a wedged manager, not a normal start.
const START_TIMEOUT: Duration = Duration::from_secs(20);

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// `JobRemoved` signals queued while the start call waits for its reply
/// (one per job the manager finishes meanwhile, any unit's).
const JOB_QUEUE: usize = 4096;

/// The address of the user message bus: `DBUS_SESSION_BUS_ADDRESS`, else
/// `unix:path=$XDG_RUNTIME_DIR/bus` (`/run/user/<uid>/bus` without
/// `XDG_RUNTIME_DIR`) when that socket exists.
///
/// # Errors
/// No address and no socket: the text names the path and the package that
/// provides a user bus.
fn user_bus() -> Result<String, String> {
    if let Some(a) = std::env::var("DBUS_SESSION_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
    {
        return Ok(a);
    }
    let uid = rustix::process::geteuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(format!("/run/user/{uid}")),
    };
    let bus = dir.join("bus");
    if bus.exists() {
        Ok(format!("unix:path={}", bus.display()))
    } else if dir.is_dir() {
        Err(format!(
            "no user message bus: DBUS_SESSION_BUS_ADDRESS is not set and {} does not exist (systemd's user manager is reached over the user bus: install dbus-user-session or dbus-broker; its private socket is not used)",
            bus.display()
        ))
    } else {
        Err(format!(
            "no systemd user manager for uid {uid}: {} does not exist (log in through a session, or `loginctl enable-linger`)",
            dir.display()
        ))
    }
}

/// A connection to the user bus at `address`.
fn connect(address: &str) -> Result<Connection, String> {
    zbus::blocking::connection::Builder::address(address)
        .and_then(|b| b.build())
        .map_err(|e| format!("user bus {address}: {e}"))
}

/// Moves this process into a new transient scope `unit` of the user
/// manager with `Delegate=yes` and returns once the scope runs.
///
/// # Errors
/// A text naming the socket, the call or the job result that failed.
pub fn adopt_self(unit: &str) -> Result<(), String> {
    adopt_pid(&user_bus()?, unit, std::process::id(), START_TIMEOUT)
}

/// Asks the user manager on the bus at `address` to start the scope `unit`
/// with `pid` in it, and waits at most `timeout` for the job.
fn adopt_pid(address: &str, unit: &str, pid: u32, timeout: Duration) -> Result<(), String> {
    let unit = unit.to_string();
    let address = address.to_string();
    within(timeout, move || start_scope(&connect(&address)?, &unit, pid))
}

/// Runs `call` on a thread of its own and waits at most `timeout` for it
/// (a wedged manager must not hold up the host).
fn within(
    timeout: Duration,
    call: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("cellhost-scope".into())
        .spawn(move || {
            let _ = tx.send(call());
        })
        .map_err(|e| format!("cannot start the D-Bus thread: {e}"))?;
    rx.recv_timeout(timeout).unwrap_or_else(|e| {
        Err(format!(
            "systemd's user manager did not start the scope within {}s: {e}",
            timeout.as_secs()
        ))
    })
}

/// Starts the scope `unit` with `pid` in it through the manager on `conn`
/// and waits for the job's end.
fn start_scope(conn: &Connection, unit: &str, pid: u32) -> Result<(), String> {
    let call_err = |what: &str, e: zbus::Error| format!("systemd user manager, {what}: {e}");
    let rule = MatchRule::builder()
        .msg_type(message::Type::Signal)
        .path(PATH)
        .and_then(|b| b.interface(MANAGER))
        .and_then(|b| b.member("JobRemoved"))
        .map_err(|e| call_err("match rule", e))?
        .build();
    // Made before the call, so the job's end cannot be missed (this also
    // adds the match rule on the bus).
    let signals = MessageIterator::for_match_rule(rule, conn, Some(JOB_QUEUE))
        .map_err(|e| call_err("JobRemoved match", e))?;
    conn.call_method(Some(DEST), PATH, Some(MANAGER), "Subscribe", &())
        .map_err(|e| call_err("Subscribe", e))?;
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

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use zbus::blocking::connection::Builder;
    use zbus::zvariant::ObjectPath;

    use super::*;

    /// A connection to a user manager that behaves as systemd's on a bus:
    /// `JobRemoved` only after `Subscribe`, and for one `StartTransientUnit`
    /// the signals of the units and jobs that move (`flood` of them) before
    /// the reply, then `JobRemoved` with `result`. The manager's thread
    /// returns the PIDs it was asked to adopt.
    fn fake_manager(flood: usize, result: &'static str) -> (Connection, std::thread::JoinHandle<Vec<u32>>) {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let (ready_tx, ready_rx) = mpsc::channel();
        let manager = std::thread::spawn(move || {
            #[allow(deprecated)] // `async_io_unix_stream` is the same call without the tokio feature.
            let conn = Builder::unix_stream(theirs)
                .server(zbus::Guid::generate())
                .expect("server")
                .p2p()
                .build()
                .expect("server connection");
            // Messages that arrive before an iterator exists are dropped.
            let incoming = MessageIterator::from(&conn);
            ready_tx.send(()).expect("ready");
            let job = ObjectPath::try_from("/org/freedesktop/systemd1/job/42").expect("path");
            let mut subscribed = false;
            for msg in incoming {
                let Ok(msg) = msg else { break };
                let h = msg.header();
                match h.member().map(|m| m.to_string()).as_deref() {
                    Some("Subscribe") => {
                        subscribed = true;
                        conn.reply(&h, &()).expect("reply")
                    }
                    Some("StartTransientUnit") => {
                        type Props = Vec<(String, zbus::zvariant::OwnedValue)>;
                        let (unit, _mode, props, _aux): (String, String, Props, Vec<(String, Props)>) =
                            msg.body().deserialize().expect("arguments");
                        let pids: Vec<u32> = props
                            .iter()
                            .find(|(k, _)| k == "PIDs")
                            .and_then(|(_, v)| Vec::<u32>::try_from(v.try_clone().ok()?).ok())
                            .unwrap_or_default();
                        for n in 0..flood {
                            let unit_path = format!("/org/freedesktop/systemd1/unit/u{n}");
                            let changed: std::collections::HashMap<&str, Value<'_>> =
                                [("ActiveState", Value::from("active"))].into();
                            conn.emit_signal(
                                None::<&str>,
                                unit_path.as_str(),
                                "org.freedesktop.DBus.Properties",
                                "PropertiesChanged",
                                &("org.freedesktop.systemd1.Unit", changed, Vec::<&str>::new()),
                            )
                            .expect("flood");
                        }
                        conn.reply(&h, &job).expect("reply");
                        if subscribed {
                            conn.emit_signal(
                                None::<&str>,
                                PATH,
                                MANAGER,
                                "JobRemoved",
                                &(42u32, &job, unit.as_str(), result),
                            )
                            .expect("JobRemoved");
                        }
                        return pids;
                    }
                    _ => conn
                        .reply_error(&h, "org.freedesktop.DBus.Error.UnknownMethod", &"unknown")
                        .expect("reply"),
                }
            }
            Vec::new()
        });
        #[allow(deprecated)]
        let conn = Builder::unix_stream(ours)
            .p2p()
            .build()
            .expect("client connection");
        ready_rx.recv().expect("manager ready");
        (conn, manager)
    }

    /// Regression: the manager's signals filled the connection's unfiltered
    /// queue of 64 while nobody read it, and the reply was never read; and
    /// without `Subscribe` the manager never sent `JobRemoved` on a bus
    /// (a 20 s timeout in a Debian 12 guest, every kernel without limits).
    #[test]
    fn the_scope_starts_when_the_manager_floods_signals_before_its_reply() {
        let (conn, manager) = fake_manager(500, "done");
        within(Duration::from_secs(60), move || {
            start_scope(&conn, "cellhost-test.scope", 4242)
        })
        .expect("scope started");
        assert_eq!(manager.join().expect("manager"), vec![4242]);
    }

    #[test]
    fn a_failed_job_is_an_error_naming_the_unit_and_the_result() {
        let (conn, manager) = fake_manager(0, "failed");
        let e = within(Duration::from_secs(60), move || {
            start_scope(&conn, "cellhost-test.scope", 7)
        })
        .expect_err("failed job");
        assert!(e.contains("cellhost-test.scope") && e.contains("'failed'"), "{e}");
        manager.join().expect("manager");
    }

    #[test]
    fn no_bus_is_an_error_naming_its_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = format!("unix:path={}", dir.path().join("bus").display());
        let e = adopt_pid(&a, "cellhost-test.scope", 7, Duration::from_secs(60)).expect_err("no bus");
        assert!(e.contains(&a), "{e}");
    }
}
