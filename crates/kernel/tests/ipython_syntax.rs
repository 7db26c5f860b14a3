//! IPython syntax and IPython's display rules in real kernels, on both
//! paths: IPython's own transformers and magics (the test interpreter
//! `CELLHOST_TEST_PYTHON` with IPython installed) and the built-in set
//! (the same interpreter with `CELLHOST_IPYTHON=0`, and an interpreter
//! without IPython: `CELLHOST_TEST_PYTHON_PLAIN`, else `/usr/bin/python3`
//! when it has no IPython). A path whose interpreter is missing is skipped
//! with a message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, KernelConfig, Session};
use tempfile::TempDir;

fn python() -> PathBuf {
    match std::env::var_os("CELLHOST_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => cellhost_kernel::resolve_python(None).expect("python3 for tests"),
    }
}

fn imports(python: &Path, module: &str) -> bool {
    std::process::Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// An interpreter without IPython, if this machine has one.
fn plain_python() -> Option<PathBuf> {
    let p = std::env::var_os("CELLHOST_TEST_PYTHON_PLAIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"));
    (p.is_file() && !imports(&p, "IPython")).then_some(p)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path_ {
    /// IPython's own transformers and magics.
    IPython,
    /// The built-in set, forced with `CELLHOST_IPYTHON=0`.
    Forced,
    /// The built-in set, on an interpreter without IPython.
    Plain,
}

struct Fixture {
    session: Session,
    dir: TempDir,
    path: Path_,
}

/// A session on `path`, or None (with a message) when this machine has no
/// interpreter for it.
fn fixture(path: Path_) -> Option<Fixture> {
    let py = match path {
        Path_::IPython | Path_::Forced => python(),
        Path_::Plain => plain_python()?,
    };
    if path == Path_::IPython && !imports(&py, "IPython") {
        eprintln!("skipped: IPython is not installed in {}", py.display());
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = KernelConfig::new(py, dir.path().join("session"));
    cfg.session = "ipython-syntax".into();
    cfg.cwd = Some(dir.path().to_path_buf());
    if path == Path_::Forced {
        cfg.env.push(("CELLHOST_IPYTHON".into(), "0".into()));
    }
    Some(Fixture {
        session: Session::new(cfg),
        dir,
        path,
    })
}

impl Fixture {
    async fn run(&mut self, code: &str) -> CellResult {
        self.session
            .execute(code, ExecOptions::default())
            .await
            .expect("execute")
    }

    async fn ok(&mut self, code: &str) -> CellResult {
        let r = self.run(code).await;
        assert_eq!(
            r.status,
            CellStatus::Ok,
            "{:?}: {code:?} failed: {r:#?}",
            self.path
        );
        r
    }
}

fn plain(r: &CellResult) -> String {
    r.result
        .as_ref()
        .and_then(|b| b.get("text/plain"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

const PATHS: [Path_; 3] = [Path_::IPython, Path_::Forced, Path_::Plain];

#[tokio::test]
async fn line_magics_shell_escapes_and_help_run_on_every_path() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        // The imports beside a magic run: the magic is not a SyntaxError
        // for the whole cell.
        let r = f.ok("import math\n%time z = math.sqrt(16)\nprint(z)").await;
        assert!(r.stdout.contains("Wall time:"), "{path:?}: {r:#?}");
        assert!(r.stdout.ends_with("4.0\n"), "{path:?}: {:?}", r.stdout);
        let r = f.ok("x = 1\n%timeit -n 3 -r 2 x + 1\nprint('after')").await;
        assert!(r.stdout.contains("per loop (mean"), "{path:?}: {:?}", r.stdout);
        assert!(r.stdout.ends_with("after\n"), "{path:?}: {:?}", r.stdout);
        let r = f.ok("!echo shell says hi").await;
        assert_eq!(r.stdout, "shell says hi\n", "{path:?}");
        let r = f.ok("word = 'braced'\n!echo {word}").await;
        assert_eq!(r.stdout, "braced\n", "{path:?}");
        let r = f.ok("lines = !printf 'a\\nb\\n'\nlines").await;
        assert!(
            plain(&r).contains("'a'") && plain(&r).contains("'b'"),
            "{path:?}: {r:#?}"
        );
        let r = f.ok("os_dir = %pwd\nos_dir").await;
        assert_eq!(
            plain(&r).trim_matches('\''),
            f.dir.path().to_string_lossy(),
            "{path:?}"
        );
        f.ok("import os\nos.mkdir('sub')").await;
        f.ok("%cd sub").await;
        let r = f.ok("%pwd").await;
        assert!(plain(&r).ends_with("sub'"), "{path:?}: {r:#?}");
        f.ok("%cd ..").await;
        let r = f
            .ok("%env CELLHOST_DEMO=forty two\nimport os\nos.environ['CELLHOST_DEMO']")
            .await;
        assert_eq!(plain(&r), "'forty two'", "{path:?}: {r:#?}");
        f.ok("%matplotlib inline\n%config InlineBackend.figure_format = 'retina'")
            .await;
        let r = f.ok("len?").await;
        assert!(r.stdout.contains("Docstring"), "{path:?}: {:?}", r.stdout);
        let r = f.ok("%who").await;
        assert!(
            r.stdout.contains("x") && r.stdout.contains("math"),
            "{path:?}: {:?}",
            r.stdout
        );
        assert!(!r.stdout.contains("In\t"), "{path:?}: {:?}", r.stdout);
        let r = f.ok("%whos").await;
        assert!(
            r.stdout.contains("Variable") && r.stdout.contains("int"),
            "{path:?}: {:?}",
            r.stdout
        );
        let r = f.ok("get_ipython().run_line_magic('pwd', '')").await;
        assert!(
            plain(&r).contains(&*f.dir.path().to_string_lossy()),
            "{path:?}: {r:#?}"
        );
        let r = f.ok("%pip --version").await;
        assert!(r.stdout.contains("pip "), "{path:?}: {:?}", r.stdout);
        // Any other magic: an error naming it.
        let r = f.run("%nosuchmagic 1").await;
        assert_eq!(r.status, CellStatus::Error, "{path:?}");
        let e = r.error.expect("error");
        assert_eq!(e.ename, "UsageError", "{path:?}: {e:?}");
        assert!(e.evalue.contains("%nosuchmagic"), "{path:?}: {e:?}");
        if path != Path_::IPython {
            assert!(e.evalue.contains("install IPython"), "{path:?}: {e:?}");
        }
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn cell_magics_run_on_every_path() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        let r = f.ok("%%time\na = 6\na * 7").await;
        assert!(r.stdout.contains("Wall time:"), "{path:?}: {r:#?}");
        assert_eq!(plain(&r), "42", "{path:?}: {r:#?}");
        let r = f.ok("%%timeit -n 2 -r 2 b = 2\nb * b").await;
        assert!(r.stdout.contains("per loop"), "{path:?}: {r:#?}");
        let r = f.ok("%%capture captured\nprint('kept aside')").await;
        assert_eq!(r.stdout, "", "{path:?}");
        let r = f.ok("captured.stdout").await;
        assert_eq!(plain(&r), "'kept aside\\n'", "{path:?}");
        let r = f.ok("%%writefile note.txt\nline one\nline two\n").await;
        assert!(r.stdout.contains("note.txt"), "{path:?}: {:?}", r.stdout);
        let text = std::fs::read_to_string(f.dir.path().join("note.txt")).expect("written");
        assert_eq!(text, "line one\nline two\n", "{path:?}");
        std::fs::write(
            f.dir.path().join("script.py"),
            "import sys\nran_with = sys.argv[1:]\nprint('ran')\n",
        )
        .expect("script");
        let r = f.ok("%run script.py one two\nran_with").await;
        assert_eq!(r.stdout, "ran\n", "{path:?}");
        assert_eq!(plain(&r), "['one', 'two']", "{path:?}");
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn autoreload_picks_up_an_edited_module() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        let module = f.dir.path().join("edited_mod.py");
        std::fs::write(&module, "def value():\n    return 1\n").expect("module");
        let r = f
            .ok("%load_ext autoreload\n%autoreload 2\nimport sys, edited_mod\nedited_mod.value()")
            .await;
        assert_eq!(plain(&r), "1", "{path:?}");
        std::fs::write(&module, "def value():\n    return 2\n").expect("module");
        // A later mtime, whatever the file system's resolution.
        f.ok("import os, time\nst = os.stat('edited_mod.py')\nos.utime('edited_mod.py', (st.st_atime + 10, st.st_mtime + 10))")
            .await;
        let r = f.ok("edited_mod.value()").await;
        assert_eq!(plain(&r), "2", "{path:?}: {r:#?}");
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn magic_cells_keep_interrupts_deadlines_and_await() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        let opts = ExecOptions {
            timeout: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let r = f
            .session
            .execute("import time\n%time time.sleep(120)", opts)
            .await
            .expect("execute");
        assert_eq!(r.status, CellStatus::Timeout, "{path:?}: {r:#?}");
        let r = f
            .ok("import asyncio\n%time q = 1\nawait asyncio.sleep(0)\nq + 1")
            .await;
        assert_eq!(plain(&r), "2", "{path:?}: {r:#?}");
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn results_follow_ipython_display_rules() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        let r = f.ok("list(range(30))").await;
        let text = plain(&r);
        assert!(text.starts_with("[0,\n 1,\n 2,"), "{path:?}: {text:?}");
        let r = f.ok("[1, 2, 3]").await;
        assert_eq!(plain(&r), "[1, 2, 3]", "{path:?}");
        let r = f.ok("class Opaque:\n    pass\n[Opaque()]").await;
        assert!(
            plain(&r).starts_with("[<__main__.Opaque at 0x"),
            "{path:?}: {r:#?}"
        );
        let r = f.ok("Opaque").await;
        assert_eq!(plain(&r), "__main__.Opaque", "{path:?}");
        let r = f.ok("{'b': 1, 'a': 2}").await;
        assert_eq!(plain(&r), "{'b': 1, 'a': 2}", "{path:?}");
        // _, __, ___, Out[n], In[n]
        let first = f.ok("10").await.execution_count;
        f.ok("20").await;
        f.ok("30").await;
        let r = f.ok("(_, __, ___)").await;
        assert_eq!(plain(&r), "(30, 20, 10)", "{path:?}");
        let r = f.ok(&format!("Out[{first}], In[{first}]")).await;
        assert_eq!(plain(&r), "(10, '10')", "{path:?}: {r:#?}");
        // A trailing ; hides the result and does not store it.
        let r = f.ok("99;").await;
        assert!(r.result.is_none(), "{path:?}");
        let n = r.execution_count;
        let r = f.ok(&format!("{n} in Out, _")).await;
        assert_eq!(plain(&r), "(False, (10, '10'))", "{path:?}");
        let r = f.ok("%time 5;").await;
        assert!(r.result.is_none(), "{path:?}: {r:#?}");
        // The kernel's own names stay out of variable listings.
        let vars = f.session.inspect_variables(None, 100).await.expect("variables");
        assert!(
            !vars
                .variables
                .iter()
                .any(|v| v["name"] == "In" || v["name"] == "Out"),
            "{path:?}: {vars:?}"
        );
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn the_interpreters_bin_dir_comes_first_on_path() {
    let Some(mut f) = fixture(Path_::Forced) else {
        return;
    };
    let bin = python().parent().expect("bin dir").to_path_buf();
    let r = f.ok("import os\nos.environ['PATH'].split(os.pathsep)[0]").await;
    assert_eq!(plain(&r), format!("'{}'", bin.display()));
    if bin.join("pip").is_file() {
        let r = f.ok("import shutil\nshutil.which('pip')").await;
        assert_eq!(plain(&r), format!("'{}'", bin.join("pip").display()));
    }
    f.session.shutdown().await;
}

#[tokio::test]
async fn module_not_found_hint_names_the_distribution() {
    let Some(mut f) = fixture(Path_::Forced) else {
        return;
    };
    if imports(&python(), "sklearn") {
        eprintln!("skipped: sklearn is installed");
        return;
    }
    let r = f.run("import sklearn").await;
    assert_eq!(r.error.expect("error").ename, "ModuleNotFoundError");
    let hint = r.hint.unwrap_or_default();
    assert!(hint.contains("pip install scikit-learn"), "{hint}");
    f.session.shutdown().await;
}

#[tokio::test]
async fn the_result_comes_before_the_figures_flushed_at_the_end() {
    for path in [Path_::IPython, Path_::Forced] {
        let Some(mut f) = fixture(path) else { continue };
        if !imports(&python(), "matplotlib") {
            eprintln!("skipped: matplotlib is not installed in {}", python().display());
            return;
        }
        let r = f.ok("import matplotlib.pyplot as plt\nplt.plot([1, 2])").await;
        assert_eq!(r.displays.len(), 1, "{path:?}: {r:#?}");
        assert!(r.displays[0].data.contains_key("image/png"), "{path:?}");
        assert_eq!(r.result_index, Some(0), "{path:?}");
        assert!(
            plain(&r).starts_with("[<matplotlib.lines.Line2D at 0x"),
            "{path:?}: {r:#?}"
        );
        // A display shown before the result stays before it.
        let r = f.ok("display('first')\n'second'").await;
        assert_eq!(r.displays.len(), 1, "{path:?}");
        assert_eq!(r.result_index, None, "{path:?}");
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn exit_still_ends_the_cell_once_the_shell_exists() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        f.ok("%time v = 1").await;
        let r = f.run("exit()").await;
        assert_eq!(r.status, CellStatus::Error, "{path:?}: {r:#?}");
        assert_eq!(r.error.expect("error").ename, "SystemExit", "{path:?}");
        let r = f.ok("v").await;
        assert_eq!(plain(&r), "1", "{path:?}");
        f.session.shutdown().await;
    }
}

#[tokio::test]
async fn escapes_inside_blocks_and_strings_and_real_syntax_errors() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        let r = f.ok("for i in range(2):\n    !echo line {i}").await;
        assert_eq!(r.stdout, "line 0\nline 1\n", "{path:?}");
        // A `%` line inside a string is the string's, in a cell that also
        // needs the transform.
        let r = f
            .ok("s = '''\n%d items\n!not a command\n'''\n%time t = 1\nprint(s.strip())")
            .await;
        assert!(
            r.stdout.ends_with("%d items\n!not a command\n"),
            "{path:?}: {:?}",
            r.stdout
        );
        // A cell that is neither Python nor IPython syntax keeps its SyntaxError.
        let r = f.run("x = (1,\n%time y = 2").await;
        assert_eq!(r.status, CellStatus::Error, "{path:?}");
        assert_eq!(r.error.expect("error").ename, "SyntaxError", "{path:?}");
        let r = f.run("def broken(:\n    pass").await;
        assert_eq!(r.error.expect("error").ename, "SyntaxError", "{path:?}");
        // Indented pasted code runs, as in IPython.
        let r = f.ok("    a = 3\n    a * 2").await;
        assert_eq!(plain(&r), "6", "{path:?}");
        f.session.shutdown().await;
    }
}

/// Regression (Python Data Science Handbook, chapter 1): one-line cells
/// IPython runs as a magic without `%` (automagic: `cd dir`) or as a shell
/// alias (`mkdir tmp`, `ls`) were a SyntaxError or a NameError under
/// cellhost. IPython's path only; a bound name stays Python.
#[tokio::test]
async fn one_line_automagic_and_aliases_run_as_in_ipython() {
    let Some(mut f) = fixture(Path_::IPython) else {
        return;
    };
    f.ok("mkdir made_here").await;
    assert!(f.dir.path().join("made_here").is_dir());
    let r = f.ok("ls").await;
    assert!(r.stdout.contains("made_here"), "{r:#?}");
    let r = f.ok("cd made_here").await;
    assert!(r.stdout.contains("made_here"), "{r:#?}");
    let r = f.ok("import os; os.getcwd()").await;
    assert!(plain(&r).contains("made_here"), "{r:#?}");
    // A name the cell bound is Python, not the alias.
    f.ok("ls = 'mine'").await;
    let r = f.ok("ls").await;
    assert_eq!(plain(&r), "'mine'", "{r:#?}");
    // An unbound name that is neither stays a NameError.
    let r = f.run("not_a_magic_or_alias").await;
    assert_eq!(r.status, CellStatus::Error, "{r:#?}");
    assert_eq!(r.error.as_ref().map(|e| e.ename.as_str()), Some("NameError"));
    f.session.shutdown().await;
}

/// Regression: showing `Out` itself shifted `_`/`__`/`___` (IPython skips
/// it, so `__` is the result before).
#[tokio::test]
async fn showing_out_leaves_the_underscores_alone() {
    for path in PATHS {
        let Some(mut f) = fixture(path) else { continue };
        f.ok("1").await;
        f.ok("2").await;
        f.ok("Out").await;
        let r = f.ok("(_, __)").await;
        assert_eq!(plain(&r), "(2, 1)", "{path:?}: {r:#?}");
        f.session.shutdown().await;
    }
}
