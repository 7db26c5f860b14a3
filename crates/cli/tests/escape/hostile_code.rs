//! Item 10: the worker survives hostile user code. Each attack runs as a
//! cell of its own daemon session (`exec --session`), so what it broke is
//! still broken when the probe cell runs next in the same kernel: rebound
//! or deleted builtins, replaced or patched stdlib modules, tracers and
//! profilers, hooks, hostile `__repr__`/`__str__`/`__eq__`/`_repr_html_`,
//! a low recursion limit, an ignored or blocked SIGINT, closed or replaced
//! control and output descriptors, a patched `cellhost` module.
//!
//! For every attack: the attack cell settles with an honest status (never
//! `crashed`), the probe returns the right value with status `ok` (or the
//! right error), and the execution count keeps counting. Attacks that take
//! away every copy of the worker's control channel or output pipes are the
//! same as `os._exit`: the kernel ends, the cell says `crashed`, and the
//! session's next cell runs in a fresh kernel.

use serde_json::Value;

use crate::common::{self, Env};

/// What the cell after the attack checks.
#[derive(Clone, Copy, Debug)]
enum Probe {
    /// `x * 2 + 2` with `x = 20` from the attack cell: needs no builtin.
    Arith,
    /// A print and the same value: needs `print` and `sys.stdout`.
    Print,
    /// `1/0`: the error path (traceback formatting) still works.
    Error,
    /// A host call of a tool that does not exist: the reader thread routes
    /// the host's refusal back to the waiting cell.
    Tool,
}

impl Probe {
    fn code(self) -> &'static str {
        match self {
            Probe::Arith => "x * 2 + 2",
            Probe::Print => "print('probe-out'); x * 2 + 2",
            Probe::Error => "1/0",
            Probe::Tool => {
                "import cellhost\ntry:\n    cellhost.call('no_such_tool', {})\n    r = 'answered'\nexcept cellhost.ToolError:\n    r = 'refused'\nr"
            }
        }
    }

    /// Whether `v` is this probe's right answer; the reason if not.
    fn check(self, attack: &str, v: &Value) -> Result<(), String> {
        let status = v["status"].as_str();
        let plain = v["result"]["text/plain"].as_str();
        let fail = |what: &str| Err(format!("{attack}: probe {self:?}: {what}: {v}"));
        match self {
            Probe::Arith | Probe::Print => {
                if status != Some("ok") || plain != Some("42") {
                    return fail("not ok with 42");
                }
                if let Probe::Print = self
                    && v["stdout"] != "probe-out\n"
                {
                    return fail("stdout is not the print");
                }
            }
            Probe::Error => {
                let tb = v["error"]["traceback"].to_string();
                if status != Some("error")
                    || v["error"]["ename"] != "ZeroDivisionError"
                    || !tb.contains("ZeroDivisionError")
                {
                    return fail("not the ZeroDivisionError with its traceback");
                }
            }
            Probe::Tool => {
                if status != Some("ok") || plain != Some("'refused'") {
                    return fail("the host's refusal did not come back");
                }
            }
        }
        Ok(())
    }
}

/// (name, attack cell, probe).
const ATTACKS: &[(&str, &str, Probe)] = &[
    (
        "del-builtin-len",
        "import builtins; del builtins.len",
        Probe::Arith,
    ),
    (
        "builtins-set-to-none",
        "import builtins\nfor n in ('len','str','repr','isinstance','print','open','getattr','type','hasattr','iter','next','min','max','dict','list','tuple','int','bool','set','range','id','vars','issubclass','callable','sorted','any','all','abs','round','bytes','bytearray','memoryview','object','super','property','enumerate','zip','map','filter','hash','format','chr','ord','sum','float','frozenset','slice','compile','eval','exec','globals','locals','setattr','delattr'):\n    setattr(builtins, n, None)",
        Probe::Arith,
    ),
    (
        "exception-classes-rebound",
        "import builtins\nfor n in ('Exception','BaseException','KeyboardInterrupt','SystemExit','OSError','ValueError','TypeError','KeyError','AttributeError','RuntimeError','ImportError','StopIteration','UnicodeEncodeError','BlockingIOError','InterruptedError','EOFError','NameError','IndexError','RecursionError'):\n    setattr(builtins, n, int)",
        Probe::Arith,
    ),
    (
        "import-and-build-class-rebound",
        "import builtins; builtins.__import__ = lambda *a, **k: 1/0; builtins.__build_class__ = None",
        Probe::Arith,
    ),
    (
        "builtins-wiped",
        "import builtins; d = vars(builtins); [d.pop(k) for k in list(d)]",
        Probe::Arith,
    ),
    (
        "builtins-lying",
        "import builtins; builtins.isinstance = lambda *a: True; builtins.len = lambda *a: -1; builtins.str = lambda *a, **k: 1/0; builtins.repr = lambda *a: 1/0; builtins.type = lambda *a: int",
        Probe::Arith,
    ),
    ("main-namespace-builtins", "__builtins__ = {}", Probe::Arith),
    (
        "stdlib-modules-none",
        "import sys\nfor m in ('json','os','traceback','threading','io','codecs','signal','time','base64','types','socket','select','struct','fcntl','mmap','resource','queue','ast','linecache','itertools','ctypes','_json','_socket','_signal','_thread','posix','errno','sysconfig','collections','functools','re','enum','_queue','builtins'):\n    sys.modules[m] = None",
        Probe::Print,
    ),
    (
        "stdlib-modules-deleted",
        "import sys\nfor m in ('json','os','traceback','threading','io','codecs','signal','time','base64','types','socket','ast','linecache'):\n    sys.modules.pop(m, None)",
        Probe::Print,
    ),
    (
        "sys-modules-cleared",
        "import sys; sys.modules.clear()",
        Probe::Arith,
    ),
    (
        "sys-modules-rebound",
        "import sys; sys.modules = {}; sys.meta_path = []; sys.path_hooks = []",
        Probe::Print,
    ),
    (
        "json-patched",
        "import json, json.encoder, json.decoder, json.scanner\njson.dumps = None; json.loads = None; json.JSONEncoder = None; json.JSONDecoder = None; json.encoder.c_make_encoder = None; json.encoder.encode_basestring = None; json.encoder.encode_basestring_ascii = None; json.decoder.scanstring = None; json.scanner.c_make_scanner = None; json._default_decoder = None; json._default_encoder = None",
        Probe::Print,
    ),
    (
        "os-patched",
        "import os\nos.write = print; os.read = None; os.getpid = lambda: 1; os.fstat = None; os.dup2 = None; os.close = None; os.getcwd = lambda: 1/0; os.dup = None; os._exit = None; os.fsdecode = None; os.listdir = None; os.path.abspath = None",
        Probe::Print,
    ),
    (
        "socket-patched",
        "import socket\nsocket.socket.send = None; socket.socket.sendall = None; socket.socket.recv = None; socket.socket.fileno = None; socket.recv_fds = None",
        Probe::Tool,
    ),
    (
        "threading-patched",
        "import threading, _thread\nthreading.Thread = None; threading.Lock = None; threading.RLock = None; threading.Event = None; threading.Condition = None; threading.get_ident = lambda: 0; threading.enumerate = lambda: 1/0; threading.current_thread = None; _thread.get_ident = lambda: 0; _thread.allocate_lock = None",
        Probe::Tool,
    ),
    (
        "signal-patched",
        "import signal\nsignal.signal = None; signal.getsignal = None; signal.pthread_kill = None; signal.SIGINT = 0; signal.SIG_IGN = 99",
        Probe::Print,
    ),
    (
        "traceback-patched",
        "import traceback, linecache\ntraceback.TracebackException = None; traceback.format_exception = None; traceback.StackSummary = None; linecache.cache = None; linecache.getline = None",
        Probe::Error,
    ),
    (
        "misc-stdlib-patched",
        "import base64, io, codecs, time, types, resource, ast\nbase64.b64encode = None; io.BytesIO = None; io.TextIOBase = None; codecs.lookup = None; time.perf_counter = None; time.time = None; types.ModuleType = None; resource.getrusage = None; ast.Expr = None; ast.parse = None; ast.Expression = None; ast.copy_location = None; ast.PyCF_ONLY_AST = 0",
        Probe::Print,
    ),
    (
        "cellhost-module-patched",
        "import cellhost, sys\ncellhost.display = None; cellhost.call = None; sys.modules['cellhost'] = None",
        Probe::Print,
    ),
    (
        "settrace-raising",
        "import sys\ndef t(*a):\n    raise RuntimeError('tracer')\nsys.settrace(t)\ndef g(): pass\ng()",
        Probe::Print,
    ),
    (
        "setprofile-raising",
        "import sys\ndef t(*a):\n    raise RuntimeError('profiler')\nsys.setprofile(t)",
        Probe::Tool,
    ),
    (
        "settrace-everywhere",
        "import sys\ndef t(frame, ev, arg):\n    frame.f_locals\n    return t\nsys.settrace(t)",
        Probe::Print,
    ),
    (
        "threading-settrace-all",
        "import threading\ndef t(*a):\n    raise RuntimeError('tracer')\nthreading.settrace(t); threading.setprofile(t)\nfor f in ('settrace_all_threads', 'setprofile_all_threads'):\n    if hasattr(threading, f): getattr(threading, f)(t)",
        Probe::Tool,
    ),
    (
        "hooks-raising",
        "import sys, threading\ndef h(*a):\n    raise RuntimeError('hook')\nsys.excepthook = h; sys.displayhook = h; sys.unraisablehook = h; sys.breakpointhook = h; threading.excepthook = h",
        Probe::Error,
    ),
    (
        "hooks-and-streams-deleted",
        "import sys\nsys.excepthook = None; sys.displayhook = None; sys.unraisablehook = None; del sys.stdout; del sys.stderr; sys.__stdout__ = None",
        Probe::Print,
    ),
    (
        "stdout-write-patched",
        "import sys\ndef w(s):\n    raise SystemExit('write')\nsys.stdout.write = w; sys.stderr.write = w; sys.stdout.flush = w; type(sys.stdout).flush = w",
        Probe::Print,
    ),
    (
        "stdout-replaced",
        "import sys\nclass S:\n    def write(self, s): raise KeyboardInterrupt\n    def flush(self): raise SystemExit\n    def __getattr__(self, n): raise SystemExit\nsys.stdout = S(); sys.stderr = S()",
        Probe::Print,
    ),
    (
        "gc-callbacks-and-del",
        "import gc\ndef cb(*a):\n    raise RuntimeError('gc')\ngc.callbacks.append(cb)\nclass D:\n    def __del__(self): raise SystemExit('del')\nfor i in range(3):\n    a = D(); a.me = a\ndel a\ngc.collect()",
        Probe::Print,
    ),
    (
        "del-displays-during-worker-sends",
        "import gc, cellhost\ngc.set_threshold(1, 1, 1)\nclass D:\n    def __del__(self):\n        cellhost.display('from-del')\n        print('p' * 70000)\ndef mk():\n    for i in range(200):\n        a = D(); a.me = a\nmk()",
        Probe::Arith,
    ),
    (
        "atexit-raising",
        "import atexit\ndef f(): raise SystemExit(3)\natexit.register(f)",
        Probe::Print,
    ),
    (
        "recursion-limit-30",
        "import sys; sys.setrecursionlimit(30)",
        Probe::Arith,
    ),
    (
        "recursion-limit-30-error",
        "import sys; sys.setrecursionlimit(30)",
        Probe::Error,
    ),
    (
        "switch-interval",
        "import sys; sys.setswitchinterval(1e-6)",
        Probe::Print,
    ),
    (
        "repr-raises",
        "class E:\n    def __repr__(self): raise RuntimeError('repr')\nE()",
        Probe::Arith,
    ),
    (
        "repr-raises-systemexit",
        "class E:\n    def __repr__(self): raise SystemExit('repr')\nE()",
        Probe::Arith,
    ),
    (
        "repr-raises-keyboardinterrupt",
        "class E:\n    def __repr__(self): raise KeyboardInterrupt\nE()",
        Probe::Arith,
    ),
    (
        "repr-returns-non-str",
        "class E:\n    def __repr__(self): return 42\nE()",
        Probe::Arith,
    ),
    (
        "repr-returns-100-mb",
        "class E:\n    def __repr__(self): return 'x' * (100 * 1024 * 1024)\nE()",
        Probe::Arith,
    ),
    (
        "repr-returns-str-subclass",
        "class S(str):\n    def encode(self, *a): raise SystemExit('enc')\n    def __len__(self): raise SystemExit('len')\nclass E:\n    def __repr__(self): return S('weird')\nE()",
        Probe::Arith,
    ),
    (
        "rich-reprs-hostile",
        "class E:\n    def _repr_html_(self): raise SystemExit('html')\n    def _repr_png_(self): return 'notbytes' * 3\n    def _repr_json_(self): return {object(): 1}\n    def _repr_markdown_(self): return b'\\xff\\xfe'\n    def _repr_mimebundle_(self, **k): raise KeyboardInterrupt\nE()",
        Probe::Arith,
    ),
    (
        "rich-reprs-bytes",
        "class E:\n    def _repr_html_(self): return b'<b>\\xff</b>'\n    def _repr_json_(self): return float('nan')\nE()",
        Probe::Arith,
    ),
    (
        "json-nan-and-infinity",
        "class E:\n    def _repr_json_(self): return {'a': float('nan'), 'b': [float('inf')]}\n    def __repr__(self): return 'E()'\nimport cellhost\ncellhost.display({'application/json': float('nan'), 'text/plain': 'shown'}, raw=True, metadata={'m': float('nan')})\nE()",
        Probe::Arith,
    ),
    (
        "tool-args-nan",
        "import cellhost\ntry:\n    cellhost.call('no_such_tool', {'x': float('nan')})\nexcept cellhost.ToolError:\n    pass",
        Probe::Tool,
    ),
    (
        "metaclass-getattribute",
        "class M(type):\n    def __getattribute__(cls, n): raise SystemExit(n)\nclass E(metaclass=M):\n    pass\nE()",
        Probe::Arith,
    ),
    (
        "dunder-class-eq-hash-format-str",
        "class E:\n    @property\n    def __class__(self): raise SystemExit('class')\n    def __eq__(self, o): raise SystemExit('eq')\n    def __hash__(self): raise SystemExit('hash')\n    def __format__(self, s): raise SystemExit('format')\n    def __str__(self): raise SystemExit('str')\n    def __getattr__(self, n): raise SystemExit(n)\nE()",
        Probe::Arith,
    ),
    (
        "display-hostile",
        "import cellhost\nclass E:\n    def __repr__(self): raise SystemExit('repr')\n    def _repr_html_(self): return 42\nclass M(type):\n    @property\n    def __name__(cls): raise SystemExit('name')\nclass F(metaclass=M):\n    def __repr__(self): raise SystemExit('r')\ncellhost.display(E()); cellhost.display(F()); display(E(), raw=True); display({object(): object()}, raw=True); display({'text/plain': E()}, raw=True)",
        Probe::Print,
    ),
    (
        "display-dict-subclass",
        "import cellhost\nclass D(dict):\n    def items(self): raise SystemExit('items')\ncellhost.display({'application/json': D(a=1)}, raw=True, metadata=D(b=2))",
        Probe::Print,
    ),
    (
        "display-over-frame-cap",
        "import cellhost\ncellhost.display({'application/json': {'a': 'j' * (80 * 1024 * 1024)}}, raw=True)",
        Probe::Print,
    ),
    (
        "error-over-frame-cap",
        "raise ValueError('e' * (80 * 1024 * 1024))",
        Probe::Print,
    ),
    (
        "exception-str-raises",
        "class X(Exception):\n    def __str__(self): raise SystemExit('str')\n    def __repr__(self): raise SystemExit('repr')\nraise X()",
        Probe::Arith,
    ),
    (
        "exception-metaclass-names",
        "class M(type):\n    @property\n    def __name__(cls): raise SystemExit('name')\nclass X(Exception, metaclass=M):\n    pass\nraise X('boom')",
        Probe::Arith,
    ),
    (
        "exception-metaclass-getattribute",
        "class M(type):\n    def __getattribute__(cls, n): raise SystemExit(n)\nclass X(Exception, metaclass=M):\n    pass\nraise X('boom')",
        Probe::Arith,
    ),
    (
        "exception-traceback-property",
        "class X(Exception):\n    @property\n    def __notes__(self): raise SystemExit('notes')\n    @property\n    def __traceback__(self): raise SystemExit('tb')\nraise X('boom')",
        Probe::Arith,
    ),
    ("raise-systemexit", "raise SystemExit(5)", Probe::Print),
    (
        "sigint-ignored",
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)",
        Probe::Print,
    ),
    (
        "sigint-handler-raising",
        "import signal\ndef h(*a): raise SystemExit('sig')\nsignal.signal(signal.SIGINT, h)",
        Probe::Print,
    ),
    (
        "sigint-blocked",
        "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})",
        Probe::Print,
    ),
    (
        "control-fd-closed",
        "import os\nfds = sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if fd > 2 and os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('socket:'))\nos.close(fds[0])",
        Probe::Tool,
    ),
    (
        "control-fd-replaced",
        "import os, socket\nfds = sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if fd > 2 and os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('socket:'))\na, b = socket.socketpair()\nos.dup2(a.fileno(), fds[0])",
        Probe::Tool,
    ),
    (
        "stdio-closed",
        "import os\nos.close(1); os.close(2)",
        Probe::Print,
    ),
    (
        "stdio-redirected",
        "import os\nn = os.open('/dev/null', os.O_WRONLY)\nos.dup2(n, 1); os.dup2(n, 2)",
        Probe::Print,
    ),
    (
        "threads-writing",
        "import threading, _thread, time, sys\ndef spin():\n    while True:\n        sys.stdout.write('bg\\n')\n        time.sleep(0.005)\nfor i in range(2): threading.Thread(target=spin, daemon=True).start()\n_thread.start_new_thread(spin, ())",
        Probe::Print,
    ),
    (
        "codecs-poisoned",
        "import codecs, encodings, sys\ncodecs.register(lambda n: 1/0)\nsys.modules['encodings.utf_8'] = None; encodings._cache.clear()",
        Probe::Print,
    ),
    ("lone-surrogate-result", "'\\udc80' + 'x'", Probe::Arith),
];

/// Attacks after which the kernel cannot go on, like `os._exit`: each
/// takes away every copy of what the worker talks to the host through.
const FATAL: &[(&str, &str)] = &[
    ("os-exit", "import os; os._exit(3)"),
    (
        "every-socket-closed",
        "import os\nfor fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n        if os.readlink('/proc/self/fd/%d' % fd).startswith('socket:'): os.close(fd)\n    except OSError: pass",
    ),
    (
        "every-pipe-closed",
        "import os\nfor fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n        if os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:'): os.close(fd)\n    except OSError: pass",
    ),
];

/// One session of the daemon, killed (with its kernel) on drop.
struct Sess<'a> {
    env: &'a Env,
    name: String,
}

impl<'a> Sess<'a> {
    fn new(env: &'a Env, name: &str) -> Sess<'a> {
        Sess {
            env,
            name: format!("hostile-{name}"),
        }
    }

    fn exec(&self, code: &str) -> Value {
        let py = common::python();
        let o = self.env.run(&[
            "exec",
            "--python",
            py.as_str(),
            "--session",
            &self.name,
            "--timeout",
            "60",
            "--json",
            code,
        ]);
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", self.name, common::text(&o)))
    }
}

impl Drop for Sess<'_> {
    fn drop(&mut self) {
        let _ = self.env.run(&["kill", &self.name]);
    }
}

/// Attacks whose own cell must end with the error they raised (its real
/// class name, whatever the class says about itself).
fn expected_error(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "exception-str-raises"
        | "exception-metaclass-names"
        | "exception-metaclass-getattribute"
        | "exception-traceback-property" => Some(("error", "X")),
        "error-over-frame-cap" => Some(("error", "ValueError")),
        "raise-systemexit" | "repr-raises-systemexit" => Some(("error", "SystemExit")),
        "repr-raises-keyboardinterrupt" => Some(("interrupted", "KeyboardInterrupt")),
        _ => None,
    }
}

fn count(v: &Value) -> i64 {
    v["execution_count"].as_i64().unwrap_or(-1)
}

/// Every attack of [`ATTACKS`], each in its own session: the attack cell
/// settles (not `crashed`), the probe after it in the same kernel answers
/// right, and the execution count keeps counting. Then one more session
/// shows the daemon still serves.
#[test]
fn escape_10_hostile_code_does_not_break_the_worker() {
    let env = Env::new();
    let mut failures = Vec::new();
    for &(name, attack, probe) in ATTACKS {
        let s = Sess::new(&env, name);
        let a = s.exec(&format!("x = 20\n{attack}"));
        let status = a["status"].as_str().unwrap_or("?").to_string();
        if status == "crashed" || status == "?" {
            failures.push(format!("{name}: the attack cell ended {status}: {a}"));
            continue;
        }
        if let Some((want, ename)) = expected_error(name)
            && (status != want || a["error"]["ename"] != ename)
        {
            failures.push(format!(
                "{name}: the attack cell should end {want} with {ename}: {a}"
            ));
            continue;
        }
        let p = s.exec(probe.code());
        if let Err(e) = probe.check(name, &p) {
            failures.push(e);
            continue;
        }
        let n = s.exec("x + 22");
        if n["status"] != "ok" || n["result"]["text/plain"] != "42" {
            failures.push(format!("{name}: the cell after the probe: {n}"));
            continue;
        }
        if count(&p) != count(&a) + 1
            || count(&n) != count(&a) + 2
            || n["kernel"]["generation"] != a["kernel"]["generation"]
        {
            failures.push(format!(
                "{name}: execution counts {} {} {} (generations {} {}): the kernel was replaced or the count stalled",
                count(&a),
                count(&p),
                count(&n),
                a["kernel"]["generation"],
                n["kernel"]["generation"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} attacks broke the worker:\n{}",
        failures.len(),
        ATTACKS.len(),
        failures.join("\n")
    );
    let s = Sess::new(&env, "after-all");
    let v = s.exec("6 * 7");
    assert_eq!(v["status"], "ok", "the daemon no longer serves: {v}");
    assert_eq!(v["result"]["text/plain"], "42", "{v}");
}

/// A cell that takes away every copy of the control channel or of an
/// output pipe ends its kernel, as `os._exit` does: the cell says
/// `crashed` at once (no hang until the timeout), and the session's next
/// cell runs in a fresh kernel that says its state was reset.
#[test]
fn escape_10_closing_every_channel_copy_is_an_honest_crash() {
    let env = Env::new();
    for &(name, attack) in FATAL {
        let s = Sess::new(&env, name);
        let a = s.exec(&format!("x = 20\n{attack}"));
        assert_eq!(a["status"], "crashed", "{name}: {a}");
        let n = s.exec("6 * 7");
        assert_eq!(n["status"], "ok", "{name}: the session's next cell: {n}");
        assert_eq!(n["result"]["text/plain"], "42", "{name}: {n}");
        assert_eq!(n["kernel"]["state_reset"], true, "{name}: {n}");
        assert_ne!(
            n["kernel"]["generation"], a["kernel"]["generation"],
            "{name}: {n}"
        );
    }
}
