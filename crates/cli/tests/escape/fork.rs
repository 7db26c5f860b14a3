//! A forked session's sandbox is no weaker than a cold kernel's
//! (`cellhost fork`): its own pid namespace, no shared `/tmp`, no
//! capability, seccomp and Landlock on (it cannot write into its parent's
//! directory), and killing one of the two leaves the other. As root and as
//! another user (`scripts/escape-nonroot.sh`).

use serde_json::Value;

use crate::common::{self, Env};

/// What a cell sees of its own confinement; prints one JSON object.
const PROBE: &str = r#"
import json, os
st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
def can_write(path):
    try:
        with open(path, 'w') as f:
            f.write('x')
        return True
    except OSError:
        return False
print(json.dumps({
    'pidns': os.readlink('/proc/self/ns/pid'),
    'mntns': os.readlink('/proc/self/ns/mnt'),
    'pid': os.getpid(),
    'cap_eff': st['CapEff'].strip(),
    'seccomp': st['Seccomp'].strip(),
    'no_new_privs': st['NoNewPrivs'].strip(),
    'cwd': os.getcwd(),
    'tmp': sorted(os.listdir('/tmp')),
    'write_parent': can_write(os.environ.get('PARENT_DIR', '/nonexistent') + '/from-fork'),
}))
"#;

fn exec(env: &Env, session: &str, code: &str) -> Value {
    let (rc, v) = env.exec_json(&["--session", session, "--sandbox", "auto"], code);
    assert_eq!(rc, 0, "{v}");
    v
}

fn probe(env: &Env, session: &str, parent_dir: &str) -> Value {
    let code = format!("import os\nos.environ['PARENT_DIR'] = {parent_dir:?}\n{PROBE}");
    let v = exec(env, session, &code);
    serde_json::from_str(v["stdout"].as_str().unwrap_or_default().trim()).expect("probe JSON")
}

#[test]
fn escape_fork_gets_its_own_sandbox_and_outlives_its_parent() {
    let env = Env::new();
    exec(
        &env,
        "parent",
        "import os\nsecret = 41\nopen('/tmp/parent-only', 'w').write('x')\nopen('data.txt', 'w').write('d')",
    );
    let o = env.run(&["fork", "parent", "child", "--sandbox", "auto", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::text(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("report JSON");
    assert_eq!(report["parent"], "parent");
    let child_pid = report["pid"].as_i64().expect("pid") as i32;

    let p = probe(&env, "parent", "/nonexistent");
    let parent_dir = p["cwd"].as_str().expect("cwd").to_string();
    let c = probe(&env, "child", &parent_dir);
    // State carried, files copied, its own /tmp.
    assert_eq!(exec(&env, "child", "secret + 1")["result"]["text/plain"], "42");
    assert_eq!(
        exec(&env, "child", "open('data.txt').read()")["result"]["text/plain"],
        "'d'"
    );
    assert!(
        p["tmp"]
            .as_array()
            .expect("tmp")
            .iter()
            .any(|t| t == "parent-only"),
        "{p}"
    );
    assert!(
        !c["tmp"]
            .as_array()
            .expect("tmp")
            .iter()
            .any(|t| t == "parent-only"),
        "{c}"
    );
    // Own pid and mount namespaces; no capability; seccomp and no_new_privs.
    assert_ne!(p["pidns"], c["pidns"], "{p} {c}");
    assert_ne!(p["mntns"], c["mntns"], "{p} {c}");
    assert_ne!(c["cwd"], p["cwd"], "{c}");
    for v in [&p, &c] {
        assert_eq!(v["cap_eff"], "0000000000000000", "{v}");
        assert_eq!(v["seccomp"], "2", "{v}");
        assert_eq!(v["no_new_privs"], "1", "{v}");
    }
    // The fork cannot write into its parent's directory: whatever the
    // fork's own view lets it write at that path (its private /tmp holds the
    // path's parents when the directory is below /tmp), the parent's
    // directory on the host stays without the file.
    let planted = std::path::Path::new(&parent_dir).join("from-fork");
    assert!(
        !planted.exists(),
        "the fork wrote into its parent's directory ({c})"
    );
    let seen = exec(&env, "parent", "import os\nos.path.exists('from-fork')");
    assert_eq!(seen["result"]["text/plain"], "False", "{seen}");

    // Killing the parent leaves the fork.
    let o = env.run(&["kill", "parent"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::text(&o));
    assert!(common::alive(child_pid), "the fork died with its parent");
    assert_eq!(exec(&env, "child", "secret")["result"]["text/plain"], "41");
    // A taken name is refused with exit 2.
    exec(&env, "other", "1");
    let o = env.run(&["fork", "child", "other", "--sandbox", "auto"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("exists"),
        "{}",
        common::text(&o)
    );
}
