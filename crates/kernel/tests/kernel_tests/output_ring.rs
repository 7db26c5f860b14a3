//! Large writes of `sys.stdout`/`sys.stderr` travel through the output
//! rings; everything else through the pipes. The result must not show the
//! difference: same bytes, same order, same bounds.

use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, Kernel};

use super::config;

async fn kernel(dir: &tempfile::TempDir, inline: usize) -> Kernel {
    let mut cfg = config(dir);
    cfg.stdout_limits.inline_bytes = inline;
    cfg.stderr_limits.inline_bytes = inline;
    let k = Kernel::spawn(cfg).await.expect("spawn");
    assert_eq!(
        k.info().output_rings,
        vec!["stdout", "stderr"],
        "the host took no ring"
    );
    k
}

async fn run(k: &Kernel, code: &str) -> CellResult {
    k.execute(code, ExecOptions::default()).await.expect("execute")
}

#[tokio::test]
async fn large_writes_keep_their_place_among_fd_writes_threads_and_children() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 8 << 20).await;
    let code = r#"import os, sys, subprocess, threading
print("start")
sys.stdout.write("a" * 100000 + "\n")
os.write(1, b"fd-write\n")
sys.stdout.write("b" * 70000 + "\n")
subprocess.run(["echo", "child"])
sys.stdout.buffer.write(b"c" * 65536 + b"\n")
t = threading.Thread(target=lambda: sys.stdout.write("d" * 90000 + "\n"))
t.start(); t.join()
sys.stderr.write("e" * 80000 + "\n")
print("end")"#;
    for _ in 0..3 {
        let r = run(&k, code).await;
        assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
        let want = format!(
            "start\n{}\nfd-write\n{}\nchild\n{}\n{}\nend\n",
            "a".repeat(100000),
            "b".repeat(70000),
            "c".repeat(65536),
            "d".repeat(90000)
        );
        assert!(
            r.stdout == want,
            "stdout differs: {} vs {} bytes",
            r.stdout.len(),
            want.len()
        );
        assert_eq!(r.stderr, format!("{}\n", "e".repeat(80000)));
    }
    k.kill().await;
}

#[tokio::test]
async fn many_times_the_ring_wraps_and_waits_without_losing_a_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 60 << 20).await;
    // 40 MB in writes of up to 3 MB (rings are 4 MiB: every write waits
    // for room and wraps), numbered so any loss or reordering shows.
    let code = "import sys\nbig = ''.join('%08d\\n' % i for i in range(333334))\nfor i in range(12):\n    sys.stdout.write(big)";
    let r = run(&k, code).await;
    assert_eq!(r.status, CellStatus::Ok);
    let one: String = (0..333_334).map(|i| format!("{i:08}\n")).collect();
    assert_eq!(r.stdout.len(), one.len() * 12);
    assert!(r.stdout == one.repeat(12), "output differs");
    k.kill().await;
}

#[tokio::test]
async fn hk15_forged_ring_tokens_are_plain_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 1 << 20).await;
    let r = run(
        &k,
        r#"print("\x01cellhost-ring-0123456789abcdef0123456789abcdef:0:100\x01|\x01cellhost-ring-zz:1\x01")"#,
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok);
    // Control characters are dropped by the renderer; the text stays.
    assert_eq!(
        r.stdout,
        "cellhost-ring-0123456789abcdef0123456789abcdef:0:100|cellhost-ring-zz:1\n"
    );
    // And the ring still works after it.
    let r = run(&k, "import sys\nsys.stdout.write('z' * 200000)").await;
    assert_eq!(r.stdout, "z".repeat(200000));
    k.kill().await;
}

#[tokio::test]
async fn hk12_invalid_utf8_through_the_ring() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 4 << 20).await;
    // 300 KB of bytes that are not UTF-8, with a 2-byte character cut in
    // half between two large writes (the ring keeps the raw bytes).
    let r = run(
        &k,
        "import sys
b = sys.stdout.buffer
b.write(b'\\xff' * 150000 + b'\\xc3')
b.write(b'\\xa9' + b'x' * 150000)",
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let want = format!("{}é{}", "\u{fffd}".repeat(150000), "x".repeat(150000));
    assert!(r.stdout == want, "got {} chars", r.stdout.chars().count());
    k.kill().await;
}

#[tokio::test]
async fn redirected_fds_and_forked_children_bypass_the_ring() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 4 << 20).await;
    let r = run(
        &k,
        r#"import os, sys
f = os.open("redirected.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
saved = os.dup(1)
os.dup2(f, 1)
sys.stdout.write("r" * 100000)
os.dup2(saved, 1)
pid = os.fork()
if pid == 0:
    sys.stdout.write("k" * 100000 + "\n")
    os._exit(0)
os.waitpid(pid, 0)
print(os.path.getsize("redirected.txt"))"#,
    )
    .await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    assert_eq!(r.stdout, format!("{}\n100000\n", "k".repeat(100000)));
    k.kill().await;
}

#[tokio::test]
async fn an_interrupt_in_a_writing_loop_keeps_the_stream_in_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kernel(&dir, 1 << 20).await;
    for _ in 0..5 {
        let h = k
            .submit(
                "import sys\nchunk = 'w' * 300000\nwhile True:\n    sys.stdout.write(chunk)",
                ExecOptions::default(),
            )
            .expect("submit");
        loop {
            if h.peek()
                .await
                .is_some_and(|p| p.state == "running" && !p.stdout_tail.is_empty())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = h.interrupt().await;
        let r = h.wait().await.expect("result");
        assert_eq!(r.status, CellStatus::Interrupted);
        // Whatever was written is whole: only `w`s, no token text.
        let kept = r.stdout.replace(|c: char| c != 'w', "");
        assert!(!r.stdout.contains("cellhost-ring"), "a token leaked");
        assert!(!kept.is_empty());
        let r = run(
            &k,
            "import sys\nsys.stdout.write('x' * 150000 + '\\n')\nprint('after')",
        )
        .await;
        assert_eq!(r.stdout, format!("{}\nafter\n", "x".repeat(150000)));
    }
    k.kill().await;
}
