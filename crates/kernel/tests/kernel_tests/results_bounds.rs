//! What leaves a kernel is honest and bounded: late output of a cell's
//! threads never lands in a later cell's streams (nor any end marker),
//! forged display and background frames are cut by the host, a kernel
//! killed at its process limit says so.

use std::collections::BTreeMap;
use std::time::Duration;

use cellhost_kernel::{CellResult, CellStatus, ExecOptions, Session};

use super::{config, python};

async fn exec(s: &mut Session, code: &str) -> CellResult {
    s.execute(code, ExecOptions::default()).await.expect("execute")
}

/// Lines `late <cell> <i>` with their counts, from `text`.
fn late_lines(text: &str, into: &mut BTreeMap<(u32, u32), u32>) {
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if w.next() == Some("late")
            && let (Some(c), Some(i)) = (w.next(), w.next())
            && let (Ok(c), Ok(i)) = (c.parse(), i.parse())
        {
            *into.entry((c, i)).or_default() += 1;
        }
    }
}

/// Every cell starts a thread that keeps printing after the cell ended
/// (`print` of one whole line and `sys.stdout.write`, each one write — a
/// `print` with its default `end` is two writes, which another thread's
/// write may separate — and
/// stderr lines):
/// each cell's own streams hold only its own lines, no end-marker text
/// ever shows, and every late line is found exactly once.
#[tokio::test]
async fn late_thread_output_goes_to_background_never_to_the_next_cell() {
    let _ = python();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Session::new(config(&dir));
    let cells = 40u32;
    let per = 12u32;
    let mut seen = BTreeMap::new();
    let mut all = String::new();
    for c in 0..cells {
        let code = format!(
            "import threading, os, sys\n\
             def _late(c={c}):\n\
             \x20   for i in range({per}):\n\
             \x20       if i % 3 == 0:\n\
             \x20           sys.stdout.write('late %d %d\\n' % (c, i))\n\
             \x20       else:\n\
             \x20           print('late %d %d\\n' % (c, i), end='', flush=True)\n\
             \x20           sys.stderr.write('x' * (i * 100) + '\\n')\n\
             threading.Thread(target=_late).start()\n\
             sys.stdout.write('cell {c}\\n')"
        );
        let r = exec(&mut s, &code).await;
        assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
        for line in r.stdout.lines() {
            let own = line == format!("cell {c}") || line.starts_with(&format!("late {c} "));
            assert!(
                own,
                "cell {c}'s stdout holds another cell's line {line:?}: {:?}",
                r.stdout
            );
        }
        late_lines(&r.stdout, &mut seen);
        if let Some(bg) = &r.background_output {
            assert_eq!(bg.dropped_bytes, 0, "keep the test under the background cap");
            late_lines(&bg.stdout, &mut seen);
            all.push_str(&bg.stdout);
            all.push_str(&bg.stderr);
        }
        all.push_str(&r.stdout);
        all.push_str(&r.stderr);
    }
    // A last cell waits for every thread; what they wrote since comes with it.
    let r = exec(
        &mut s,
        "import threading, time\nfor t in threading.enumerate():\n    if t is not threading.current_thread() and t.name != 'cellhost-control':\n        t.join(10)",
    )
    .await;
    let r2 = exec(&mut s, "pass").await;
    for r in [&r, &r2] {
        all.push_str(&r.stdout);
        late_lines(&r.stdout, &mut seen);
        if let Some(bg) = &r.background_output {
            late_lines(&bg.stdout, &mut seen);
            all.push_str(&bg.stdout);
            all.push_str(&bg.stderr);
        }
    }
    assert!(!all.contains("cellhost-end"), "an end marker leaked");
    assert!(!all.contains('\u{1}'), "a marker byte leaked");
    for c in 0..cells {
        for i in 0..per {
            assert_eq!(
                seen.get(&(c, i)),
                Some(&1),
                "late {c} {i} seen {:?} times",
                seen.get(&(c, i))
            );
        }
    }
    s.shutdown().await;
}

/// One `background` frame of 30 MiB forged by the cell comes back as
/// 16 KiB with the rest counted; a host that survives it runs the next cell.
#[tokio::test]
async fn forged_huge_background_frame_is_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Session::new(config(&dir));
    let forge = "import sys\nch = sys.modules['cellhost_worker.streams'].channel\n\
                 ch.send({'type': 'background', 'stream': 'stdout', 'text': 'B' * (30 << 20)})";
    let r = exec(&mut s, forge).await;
    assert_eq!(r.status, CellStatus::Ok, "{r:#?}");
    let bg = r.background_output.expect("background");
    assert_eq!(bg.stdout.len(), 16 * 1024);
    assert_eq!(bg.dropped_bytes, (30 << 20) - 16 * 1024);
    let r = exec(&mut s, "print('next')").await;
    assert_eq!(r.stdout, "next\n");
    assert!(r.background_output.is_none(), "{r:#?}");
    s.shutdown().await;
}

/// Forged displays: 150 frames are cut to the count cap, big ones to the
/// byte cap, and the result says what was dropped; the files on disk stay
/// within the budget.
#[tokio::test]
async fn forged_displays_are_bounded_in_count_and_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.display_limits.max_bytes = 9 << 20;
    let session_dir = cfg.session_dir.clone();
    let mut s = Session::new(cfg);
    let forge = "import sys, base64\nch = sys.modules['cellhost_worker.streams'].channel\n\
                 small = base64.b64encode(b'\\x89PNG' + b'\\0' * 100).decode()\n\
                 for i in range(150):\n    ch.send({'type': 'display', 'id': 'x', 'data': {'image/png': small}})";
    let r = exec(&mut s, forge).await;
    assert_eq!(r.displays.len(), 101, "100 kept and the note");
    let d = r.displays_dropped.clone().expect("dropped");
    assert_eq!(d.count, 50);
    let note = r.displays.last().expect("note").data["text/plain"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(note.contains("50 display(s)"), "{note}");
    let big = "import sys, base64\nch = sys.modules['cellhost_worker.streams'].channel\n\
               big = base64.b64encode(b'\\x89PNG' + b'\\0' * (3 << 20)).decode()\n\
               for i in range(20):\n    ch.send({'type': 'display', 'id': 'x', 'data': {'image/png': big}})";
    let r = exec(&mut s, big).await;
    let kept = r
        .displays
        .iter()
        .filter(|d| d.data.contains_key("image/png"))
        .count();
    assert_eq!(kept, 2, "two 4 MiB base64 payloads fit 9 MiB");
    let d = r.displays_dropped.clone().expect("dropped");
    assert_eq!(d.count, 18);
    let cell_dir = session_dir.join("cells").join(&r.cell_id);
    let on_disk: u64 = std::fs::read_dir(&cell_dir)
        .expect("cell dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(on_disk <= 9 << 20, "{on_disk} bytes on disk");
    let r = exec(&mut s, "print('alive')").await;
    assert_eq!(r.stdout, "alive\n", "{r:#?}");
    s.shutdown().await;
}

/// A registered secret in the cwd, an exception, a display's text and
/// metadata, and inside PNG bytes: masked or withheld everywhere.
#[tokio::test]
async fn registered_secret_is_masked_in_cwd_and_withheld_from_images() {
    let secret = "Kq9-unit-secret-Zx31";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.register_secret(secret);
    let session_dir = cfg.session_dir.clone();
    let mut s = Session::new(cfg);
    let code = format!(
        "import os, base64, sys\nos.makedirs('{secret}', exist_ok=True)\nos.chdir('{secret}')\n\
         ch = sys.modules['cellhost_worker.streams'].channel\n\
         png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\ntEXt{secret}').decode()\n\
         ch.send({{'type': 'display', 'id': 'x', 'data': {{'image/png': png, 'text/plain': 'fig'}}, 'metadata': {{'t': '{secret}'}}}})\n\
         display({{'text/plain': 'shown {secret}'}}, raw=True)\n\
         raise ValueError('{secret}')"
    );
    let r = exec(&mut s, &code).await;
    let json = serde_json::to_string(&r).expect("json");
    assert!(!json.contains(secret), "{json}");
    assert!(
        r.cwd.as_deref().is_some_and(|c| c.contains("[redacted]")),
        "{:?}",
        r.cwd
    );
    assert_eq!(r.displays_dropped.as_ref().map(|d| d.withheld), Some(1), "{json}");
    assert!(json.contains("display withheld"), "{json}");
    let cell_dir = session_dir.join("cells").join(&r.cell_id);
    let pngs = std::fs::read_dir(&cell_dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "png"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(pngs, 0, "no image written");
    let r = exec(&mut s, "print('alive')").await;
    assert_eq!(r.stdout, "alive\n", "{r:#?}");
    s.shutdown().await;
}

/// A thread bomb that the cell survives (it catches the error) but whose
/// threads hold the process limit: the host kills the tree, and the
/// result says `crashed` and names the limit rather than `ok`.
#[tokio::test]
async fn thread_bomb_at_the_pids_limit_is_not_ok() {
    if !super::cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&dir);
    cfg.limits.pids_max = Some(64);
    let mut s = Session::new(cfg);
    let code = "import threading, time\nn = 0\ntry:\n    for _ in range(10000):\n        threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n        n += 1\nexcept RuntimeError:\n    pass\nprint(n)";
    let opts = ExecOptions {
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let r = s.execute(code, opts).await.expect("result");
    assert_ne!(r.status, CellStatus::Ok, "{r:#?}");
    let why = r
        .crash
        .as_ref()
        .map(|c| c.message.clone())
        .or_else(|| r.interrupt.as_ref().and_then(|i| i.reason.clone()))
        .unwrap_or_default();
    assert!(why.contains("process limit"), "{r:#?}");
    let r = exec(&mut s, "print('alive')").await;
    assert_eq!(r.stdout, "alive\n", "{r:#?}");
    s.shutdown().await;
}
