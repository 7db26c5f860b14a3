//! The escape suite: every hole an adversarial review found, as an attack
//! that must fail while the host stays healthy. One module per class of
//! fault; each test names the attack, the surface and the sandbox mode it
//! drives, runs the attack from inside a real kernel (or as a hostile
//! client), and asserts both that it failed and that the host still serves.
//!
//! Runs as part of `scripts/test.sh`, as whatever user runs the tests:
//! `scripts/escape-nonroot.sh` runs it again as an unprivileged user.
//!
//! The interpreter is `CELLHOST_TEST_PYTHON` or `python3` on PATH.

mod common;
mod daemon_peer;
mod egress;
mod fds;
mod files;
mod fork;
mod hostile_code;
mod http_tenants;
mod install_egress;
mod kernel_view;
mod limits;
mod modes;
mod no_userns;
mod packages;
mod redteam;
mod remote_listener;
mod results;
mod setid;
mod slow_clients;

/// The suite's own plumbing works: a sandboxed one-shot cell runs.
#[test]
fn escape_suite_runs_a_sandboxed_cell() {
    let env = common::Env::new();
    let (code, v) = env.exec_json(&["--sandbox", "auto"], "print(6 * 7)");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["stdout"], "42\n", "{v}");
}
