//! Output big enough to switch a stream's reading to bulk mode (bigger
//! reads, bigger pipe) arrives whole and in order, and the next cells'
//! small output is exact.
//!

use cellhost_kernel::{CellStatus, ExecOptions, Kernel};

use super::config;

/// `count` numbered lines, as the cell below writes them.
fn lines(tag: &str, count: usize) -> String {
    (0..count).map(|i| format!("{tag} {i:07}\n")).collect()
}

#[tokio::test]
async fn bulk_output_is_whole_and_later_small_output_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = Kernel::spawn(config(&dir)).await.expect("spawn");
    // ~6 MB on stdout in pieces of many sizes, ~2 MB on stderr, interleaved.
    let code = "import sys, os\n\
        out = ''.join('out %07d\\n' % i for i in range(500000))\n\
        err = ''.join('err %07d\\n' % i for i in range(160000))\n\
        i = j = 0\n\
        step = 1\n\
        while i < len(out) or j < len(err):\n\
        \x20   sys.stdout.write(out[i:i + step]); i += step\n\
        \x20   os.write(2, err[j:j + step // 3].encode()); j += step // 3\n\
        \x20   step = step * 7 % 1000003 + 1\n";
    for round in 0..2 {
        let r = k.execute(code, ExecOptions::default()).await.expect("execute");
        assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
        for (name, tag, count) in [("stdout", "out", 500_000), ("stderr", "err", 160_000)] {
            let want = lines(tag, count);
            let t = r.truncated.get(name).expect("truncated");
            assert_eq!(t.total_bytes, want.len() as u64, "round {round} {name}");
            let spill = std::fs::read_to_string(t.spill_path.as_ref().expect("spill")).expect("read spill");
            assert!(
                spill == want,
                "round {round}: {name} spill differs from what the cell wrote"
            );
        }
        let r = k
            .execute(
                "print('small'); import sys; print('e', file=sys.stderr)",
                ExecOptions::default(),
            )
            .await
            .expect("execute");
        assert_eq!(r.stdout, "small\n");
        assert_eq!(r.stderr, "e\n");
        assert!(r.truncated.is_empty());
        assert!(r.background_output.is_none(), "{:?}", r.background_output);
    }
    k.kill().await;
}
