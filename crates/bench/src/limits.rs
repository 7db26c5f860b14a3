//! "What limits each figure": one paragraph per workload, written under the
//! table of `BENCHMARKS.md`. Each states what a profile on the 2-core
//! benchmark machine showed dominates the figure, with the command that
//! shows it. Plain text: update a paragraph when a new profile changes it.

use std::fmt::Write as _;

/// Heading of the section.
pub const HEADING: &str = "## What limits each figure";

/// `(workload, the bench workloads it covers, paragraph)`, in table order.
/// Commands are run from the repository root with the release binary
/// (`target/release/cellhost`, `PY` = the venv's python); `perf report`
/// reads `perf.data`. Paragraphs name no peer: a run without `--peers`
/// mentions none.
pub const LIMITS: &[(&str, &[&str], &str)] = &[
    (
        "W1",
        &["W1"],
        "Two process wake-ups and the worker's own Python per cell. About 60% of the samples are in the worker (about 40% the interpreter running the worker's cell loop: frame decoding, compile, exec, usage, response; about 20% kernel time in socket and pipe wake-ups), about 30% in the host, most of it kernel time in epoll and wake-ups; the host's Rust code is under 10%. \
         `perf record -g -- cellhost bench --workload W1 --python PY` then `perf report --no-children -g none --sort comm,dso`.",
    ),
    (
        "W2",
        &["W2", "W2S"],
        "Starting Python and importing the worker. The worker's imports took 52 ms, 22 ms of it asyncio with ssl; asyncio is now imported on the first top-level await, and inspect not at all, leaving about 21 ms (json, socket, ast, the worker's modules). The sandbox adds 14–17 ms (the W2S rows); in a trace, its longest single step is the init writing its pid into the cgroup v1 `cgroup.procs`. \
         `PY -X importtime -c \"import sys; sys.path.insert(0, 'python'); import cellhost_worker.main\"`; `strace -f -tt -e trace=execve,openat cellhost run NOTEBOOK` shows the timeline.",
    ),
    (
        "W3",
        &["W3"],
        "The host thread that runs the capture. Large writes of `sys.stdout` (64 KiB or more) no longer cross the pipe: the worker copies them into a 4 MiB shared ring and puts a 60-byte token in the pipe in their place, and the host reads them with `pread`. The host thread has about 66% of the samples: user time about 41% (the aho-corasick Fat Teddy scan for the redaction triggers 21%, the renderer's line scan 14%, UTF-8 validation 5%), kernel time about 21% (the `pread` copy out of the ring's pages, their page-cache lookups). The worker has about 28%, 11% of it the copy into the ring. The capture alone runs at about 7 GB/s (`cargo run --release -p cellhost-capture --example capture_throughput 2000`); a pipe caps the stream at about 4 GB/s with a 1 MiB pipe (a bare C `read(2)` loop on the same writer: 1 GB in about 0.25 s), about 1 GB/s with the default 64 KiB. Output written at the fd level (C `printf`, subprocesses) still takes the pipe, switched to 1 MiB reads and a 1 MiB pipe while it is heavy. A mapping of the ring would save the `pread` copy, but the worker's code can write that memory at any time, so the host copies it out. Splitting the trigger scan in two slim Teddy scans of 21 literals each was no faster. \
         `perf record -g -- cellhost bench --workload W3 --python PY` then `perf report --no-children -g none --sort comm,dso,sym`.",
    ),
    (
        "W2T",
        &["W2T"],
        "Three process creations and two execs on the way to a forked kernel's first result, no imports. With the stack loaded the template is a ~100 MB process: each `fork` of it copies its page tables (1.75 ms p50 in the parent, more in the child as it touches copy-on-write pages), so the fork path copies it only twice (the kernel init and the worker) and starts the ns-init with `posix_spawn`. The worker joins its cgroups while the ns-init mounts its private `/tmp`, `/dev/shm` and `/proc`: the first write to a cgroup v1 `cgroup.procs` can wait 8–12 ms for an RCU grace period, which would otherwise sit on the critical path. Landlock, capabilities and the two seccomp programs take about 1.5 ms in the worker. The cold rows pay Python's start and the imports (about 0.45 s). \
         `strace -f -tt -e trace=clone,clone3,unshare,execve,mount,write,landlock_restrict_self,prctl cellhost bench --workload W2T --kernels 3 --python PY`.",
    ),
    (
        "W4",
        &["W4"],
        "When the code looks at the signal. `time.sleep` and a Python loop settle in under 1 ms: the SIGINT to the main thread ends the sleep, and the eval loop sees it at the next bytecode. A numpy matmul sees it only when the running BLAS call returns. One 400×400 matmul takes about 36 ms (p50) here with the other core busy, so the figure is what is left of the matmul in flight. \
         Timed with `PY -c \"import numpy as np, time; a = np.random.rand(400, 400); ...\"` in a `perf_counter` loop next to a `while True: pass` spinner.",
    ),
    (
        "W5",
        &["W5"],
        "The worker's side of the call. About 68% of the samples are in the worker: about 41% the interpreter (`cellhost.call`'s JSON framing, and handing the reply from the control-channel reader thread to the calling thread under the GIL) and about 22% kernel time in socket wake-ups. The host has about 16%. \
         `perf record -g -- cellhost bench --workload W5 --python PY` then `perf report --no-children -g none --sort comm,dso`.",
    ),
    (
        "W6/IDLE200",
        &["IDLE200"],
        "The idle worker interpreter. Of a kernel's RSS, the worker is about 14 MB: 7 MB private heap (the interpreter and the modules the worker imported) and 6 MB shared clean pages (libpython and other mapped files, counted again in each process's RSS). The kernel init is about 2.6 MB, mostly shared pages of the cellhost binary. The host's own growth is per-kernel bookkeeping (two 64 KiB read buffers, channels, the driver task). \
         `cellhost exec --python PY \"print(open('/proc/self/smaps_rollup').read())\"`, and the same for `os.getppid()` (the init).",
    ),
    (
        "W7",
        &["W7"],
        "The notebook's first cell: importing numpy, pandas and matplotlib.pyplot takes about 0.45–0.5 s of the run's 0.7 s. That is as long as in a plain `python -c`: measured alternately, 509/608, 595/571, 519/475 and 540/527 ms (plain/kernel). Then come the two figure cells (about 0.16 s together: cProfile shows `savefig(bbox_inches=\"tight\")` drawing each figure twice, and PNG encoding is about 12 ms of the 0.11 s), the kernel's start (about 45 ms), about 10 ms for each of the five other cells, and 25 ms of host CPU. Most of the peer's extra time is its kernel's start (about 0.4–0.5 s in W2's peer row); `jupyter execute` adds its own start-up and imports on top. \
         Per-cell times are on `cellhost run`'s stderr; `PY -X importtime -c \"import numpy, pandas, matplotlib.pyplot\"`; `/usr/bin/time cellhost run examples/penguins.ipynb`.",
    ),
    (
        "POOL",
        &["POOL"],
        "A warm acquire takes a ready kernel off the pool's queue: no process work at all. The cold row is a full spawn (W2's path), so the ratio is W2's figure over a queue pop. \
         The code path is `Registry::acquire` in crates/sessions; the cold figure's profile is W2's.",
    ),
];

/// The section as Markdown: the heading, then the paragraph of each
/// workload in `ran` (bench names, e.g. `W3`, `IDLE200`); empty when none
/// of them has one.
pub fn section(ran: &[String]) -> String {
    let mut out = String::new();
    for (name, covers, text) in LIMITS {
        if covers.iter().any(|c| ran.iter().any(|r| r == c)) {
            let _ = writeln!(out, "**{name}.** {text}\n");
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\n{HEADING}\n\n{out}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn section_has_one_paragraph_per_workload_with_a_command() {
        let all: Vec<String> = names(crate::ALL);
        let s = section(&all);
        assert!(s.contains(HEADING));
        for w in ["W1", "W2", "W3", "W4", "W5", "W6/IDLE200", "W7", "POOL"] {
            assert!(s.contains(&format!("**{w}.** ")), "{w} missing");
        }
        for (name, covers, text) in LIMITS {
            assert!(text.contains('`'), "{name}: no command");
            assert!(!text.contains("  "), "{name}: double space");
            for c in *covers {
                assert!(crate::ALL.contains(c), "{name}: unknown workload {c}");
            }
        }
    }

    #[test]
    fn section_covers_only_the_workloads_run() {
        let s = section(&names(&["W1", "IDLE200"]));
        assert!(s.contains("**W1.** ") && s.contains("**W6/IDLE200.** "));
        assert!(!s.contains("**W3.** "));
        assert_eq!(section(&names(&["HTTP"])), "");
    }
}
