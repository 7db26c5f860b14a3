//! End-to-end tests of `cellhost-bench` and of `cellhost bench`, its
//! launcher in the `cellhost` binary.
//!
//! Every run starts in a fresh temporary directory outside the repository,
//! with its own `CELLHOST_STATE_DIR`, `XDG_RUNTIME_DIR` and an empty config
//! file, and an explicit `--python`: `CELLHOST_TEST_PYTHON`, else
//! `python3`. The `cellhost` binary is the one next to `cellhost-bench` in
//! cargo's target directory, built first (a no-op when it is up to date).
//! A guard kills the bench's process group when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn python() -> String {
    std::env::var("CELLHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn bench_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cellhost-bench")
}

/// `cellhost`, next to `cellhost-bench`: `cargo test -p cellhost-bench`
/// does not build other packages' binaries, so build it (in the same target
/// directory and profile) once per test run.
fn cellhost_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(bench_bin())
            .parent()
            .expect("the bench binary's directory");
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "--quiet", "-p", "cellhost", "--target-dir"])
            .arg(dir.parent().expect("the target directory"))
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if dir.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        let st = c.status().expect("run cargo build -p cellhost");
        assert!(st.success(), "cargo build -p cellhost: {st}");
        let bin = dir.join("cellhost");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

fn has_modules(mods: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {mods}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A test's directory outside the repository: the working directory of the
/// commands it runs, with their state, runtime and config.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("cellhost-bench-test-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("work")).expect("work dir");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        std::fs::write(dir.path().join("config.toml"), "").expect("config");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let repo = repo.canonicalize().expect("repository root");
        assert!(
            !dir.path().starts_with(&repo),
            "the test directory is inside the repository"
        );
        Env { dir }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn cmd(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(bin);
        c.args(args)
            .current_dir(self.work())
            .env("CELLHOST_STATE_DIR", self.dir.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("CELLHOST_CONFIG", self.dir.path().join("config.toml"))
            .env_remove("CELLHOST_LOG")
            .stdin(Stdio::null());
        c
    }

    /// Runs `cmd` to its end (at most `limit`), its output in files; the
    /// exit code, stdout and stderr.
    fn run(&self, mut cmd: Command, limit: Duration) -> Done {
        use std::os::unix::process::CommandExt;
        let out = self.dir.path().join("stdout");
        let err = self.dir.path().join("stderr");
        let child = cmd
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .process_group(0)
            .spawn()
            .expect("spawn");
        let mut guard = Group(child);
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = guard.0.try_wait().expect("wait") {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "{cmd:?} still running after {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Done {
            code: status.code(),
            stdout: std::fs::read_to_string(&out).expect("stdout"),
            stderr: std::fs::read_to_string(&err).expect("stderr"),
        }
    }
}

impl Env {
    /// Runs `cellhost-bench --python PY --cellhost CELLHOST ARGS…` to its
    /// end (at most `limit`).
    fn bench(&self, cellhost: &Path, args: &[&str], limit: Duration) -> Done {
        let mut c = self.cmd(Path::new(bench_bin()), args);
        c.arg("--python").arg(python()).arg("--cellhost").arg(cellhost);
        self.run(c, limit)
    }

    /// Runs the `cellhost` binary `bin` with `args` to its end (at most 60 s).
    fn cellhost(&self, bin: &Path, args: &[&str]) -> Done {
        self.run(self.cmd(bin, args), Duration::from_secs(60))
    }
}

/// Kills the process group of a command that has not ended (a failed test).
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = self.0.wait();
        }
    }
}

struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Done {
    fn expect_code(&self, what: &str, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.stdout,
            self.stderr
        );
    }
}

/// The report's row of `workload` for `system`: (n, p50, p99).
fn row(doc: &str, workload: &str, system: &str) -> (usize, f64, f64) {
    let line = doc
        .lines()
        .find(|l| l.starts_with(&format!("| {workload}")) && l.contains(&format!("| {system} |")))
        .unwrap_or_else(|| panic!("no {workload} row of {system} in:\n{doc}"));
    let cols: Vec<&str> = line.split('|').map(str::trim).collect();
    let num = |c: &str| -> f64 {
        c.trim_end_matches(" ms")
            .parse()
            .unwrap_or_else(|e| panic!("{c}: {e} in {line}"))
    };
    (cols[3].parse().expect("n"), num(cols[4]), num(cols[5]))
}

#[test]
fn bench_w1_runs_outside_the_repository_and_writes_the_report_there() {
    let env = Env::new();
    let py = python();
    let r = env.run(
        env.cmd(
            Path::new(bench_bin()),
            &["--workload", "W1", "--cells", "50", "--python", &py],
        ),
        Duration::from_secs(120),
    );
    r.expect_code("cellhost-bench --workload W1", 0);
    let doc = std::fs::read_to_string(env.work().join("BENCHMARKS.md"))
        .expect("BENCHMARKS.md in the working directory");
    let (n, p50, p99) = row(&doc, "W1 round trip", "cellhost");
    assert_eq!(n, 50, "{doc}");
    assert!(p50 > 0.0 && p50 <= p99, "p50 {p50}, p99 {p99}");
    assert!(
        !doc.contains("ipykernel"),
        "peers measured without --peers:\n{doc}"
    );
    assert!(doc.contains("**W1.** "), "no limits paragraph for W1:\n{doc}");
    assert!(r.stdout.contains("| cellhost | 50 |"), "stdout:\n{}", r.stdout);
    let left: Vec<_> = std::fs::read_dir(env.work())
        .expect("work dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        ["BENCHMARKS.md"],
        "the bench left files in its working directory"
    );
}

#[test]
fn bench_w7_runs_the_embedded_notebook_through_cellhost_run_outside_the_repository() {
    if !has_modules("numpy, pandas, matplotlib, palmerpenguins") {
        eprintln!("note: W7 skipped: the interpreter lacks numpy, pandas, matplotlib or palmerpenguins");
        return;
    }
    let env = Env::new();
    let out = env.dir.path().join("w7.md");
    let out = out.to_str().expect("utf-8 path");
    let r = env.bench(
        cellhost_bin(),
        &["--workload", "W7", "--output", out],
        Duration::from_secs(300),
    );
    r.expect_code("cellhost-bench --workload W7", 0);
    let doc = std::fs::read_to_string(out).expect("report");
    let (n, p50, _) = row(&doc, "W7 penguins notebook", "cellhost run");
    assert_eq!(n, 5, "{doc}");
    assert!(p50 > 0.0, "{doc}");
    assert!(!env.work().join("penguins.ipynb").exists());
}

#[test]
fn bench_w7_without_a_cellhost_binary_names_it_and_how_to_build_it() {
    let env = Env::new();
    let missing = env.dir.path().join("no/cellhost");
    let r = env.bench(&missing, &["--workload", "W7"], Duration::from_secs(60));
    r.expect_code("W7 without cellhost", 1);
    assert!(r.stderr.contains(&missing.display().to_string()), "{}", r.stderr);
    assert!(
        r.stderr.contains("cargo build --release -p cellhost"),
        "{}",
        r.stderr
    );
    assert!(!env.work().join("BENCHMARKS.md").exists());
}

#[test]
fn cellhost_bench_help_is_the_bench_binarys_through_the_launcher() {
    let env = Env::new();
    let r = env.cellhost(cellhost_bin(), &["bench", "--help"]);
    r.expect_code("cellhost bench --help", 0);
    assert!(
        r.stdout.contains("Usage: cellhost-bench"),
        "stdout:\n{}",
        r.stdout
    );
    for flag in ["--workload", "--peers", "--notebook", "--cellhost"] {
        assert!(r.stdout.contains(flag), "{flag} missing:\n{}", r.stdout);
    }
    // Arguments reach the bench as they are: its own usage error and code.
    let r = env.cellhost(cellhost_bin(), &["bench", "--workload", "W9"]);
    r.expect_code("cellhost bench --workload W9", 2);
    assert!(
        r.stderr.contains("cellhost-bench: unknown workload W9"),
        "{}",
        r.stderr
    );
    // `cellhost --config PATH bench` hands the file to the bench.
    let missing = env.dir.path().join("missing.toml");
    let r = env.cellhost(
        cellhost_bin(),
        &[
            "--config",
            missing.to_str().expect("utf-8"),
            "bench",
            "--workload",
            "W1",
        ],
    );
    r.expect_code("cellhost --config MISSING bench", 1);
    assert!(r.stderr.contains(&missing.display().to_string()), "{}", r.stderr);
}

#[test]
fn cellhost_bench_without_the_bench_binary_names_it_and_how_to_build_it() {
    let env = Env::new();
    let alone = env.dir.path().join("alone");
    std::fs::create_dir_all(&alone).expect("mkdir");
    let copy = alone.join("cellhost");
    if std::fs::hard_link(cellhost_bin(), &copy).is_err() {
        std::fs::copy(cellhost_bin(), &copy).expect("copy cellhost");
    }
    let r = env.cellhost(&copy, &["bench", "--workload", "W1"]);
    r.expect_code("cellhost bench without cellhost-bench", 1);
    assert!(
        r.stderr
            .contains(&alone.join("cellhost-bench").display().to_string()),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("cargo build --release -p cellhost-bench"),
        "{}",
        r.stderr
    );
    // The CLI itself still works there.
    let r = env.cellhost(&copy, &["--version"]);
    r.expect_code("cellhost --version", 0);
}

#[test]
fn the_cellhost_binary_holds_no_bench_code() {
    let cellhost = std::fs::read(cellhost_bin()).expect("read cellhost");
    let bench = std::fs::read(bench_bin()).expect("read cellhost-bench");
    // Text only the bench embeds: its report's section, the peers' script,
    // a workload's row name.
    for marker in [
        "## What limits each figure",
        "Peer measurements for `cellhost bench`",
        "W2T kernel with numpy+pandas+matplotlib ready",
    ] {
        assert!(
            memchr::memmem::find(&bench, marker.as_bytes()).is_some(),
            "the marker {marker:?} is not in cellhost-bench: pick another"
        );
        assert!(
            memchr::memmem::find(&cellhost, marker.as_bytes()).is_none(),
            "cellhost holds bench code ({marker:?})"
        );
    }
}

/// An interpreter without numpy, for a W2T that cannot run.
fn python_without_numpy() -> Option<&'static str> {
    let py = "/usr/bin/python3";
    let has = Command::new(py)
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?
        .success();
    (!has).then_some(py)
}

#[test]
fn bench_a_workload_that_cannot_run_is_reported_and_the_others_still_run() {
    let Some(py) = python_without_numpy() else {
        eprintln!("note: skipped: /usr/bin/python3 is missing or has numpy");
        return;
    };
    let env = Env::new();
    // W2T imports numpy, pandas and matplotlib: with this interpreter it
    // cannot run. W1 before it and KILL after it must still be measured.
    let r = env.run(
        env.cmd(
            Path::new(bench_bin()),
            &[
                "--workload",
                "W1,W2T,KILL",
                "--cells",
                "20",
                "--kernels",
                "1",
                "--python",
                py,
            ],
        ),
        Duration::from_secs(300),
    );
    r.expect_code("cellhost-bench --workload W1,W2T,KILL without numpy", 1);
    let doc = std::fs::read_to_string(env.work().join("BENCHMARKS.md")).expect("BENCHMARKS.md");
    assert_eq!(row(&doc, "W1 round trip", "cellhost").0, 20, "{doc}");
    assert_eq!(row(&doc, "kill to reaped", "cellhost").0, 10, "{doc}");
    let note = doc
        .lines()
        .find(|l| l.starts_with("- W2T did not run: "))
        .unwrap_or_else(|| panic!("no note for W2T:\n{doc}"));
    assert!(note.contains("numpy"), "the reason is not named: {note}");
    assert!(
        r.stderr.contains("workloads that did not run: W2T"),
        "stderr:\n{}",
        r.stderr
    );
}

#[test]
fn bench_as_user_refuses_root_an_unknown_user_and_a_caller_that_is_not_root() {
    let env = Env::new();
    let py = python();
    let is_root = rustix::process::geteuid().is_root();
    for (user, want) in [
        (
            "no_such_user_xyz",
            if is_root { "no such user" } else { "needs root" },
        ),
        ("root", if is_root { "that is root" } else { "needs root" }),
    ] {
        let r = env.run(
            env.cmd(
                Path::new(bench_bin()),
                &[
                    "--workload",
                    "W1",
                    "--cells",
                    "5",
                    "--as-user",
                    user,
                    "--python",
                    &py,
                ],
            ),
            Duration::from_secs(60),
        );
        r.expect_code(&format!("--as-user {user}"), 2);
        assert!(r.stderr.contains(want), "--as-user {user}: {}", r.stderr);
        assert!(!env.work().join("BENCHMARKS.md").exists(), "a report was written");
    }
}
