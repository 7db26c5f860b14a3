//! The bounded inline view (head + tail) and the spill file.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::error::CaptureError;
use crate::render::floor_boundary;

/// How one stream was cut to its inline size. All sizes are bytes of the
/// rendered, redacted stream (UTF-8).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// Bytes of the whole rendered, redacted stream.
    pub total_bytes: u64,
    /// Bytes returned inline (head + tail, without the omission line).
    pub shown_bytes: u64,
    /// `total_bytes - shown_bytes`.
    pub omitted_bytes: u64,
    /// File holding the stream from its first byte, if one was written.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub spill_path: Option<PathBuf>,
    /// Bytes in the spill file: `total_bytes`, or less when the spill cap
    /// was reached (cut on a character boundary) or writing failed.
    #[serde(default)]
    pub spill_bytes: u64,
    /// Why the spill file is missing or short, when writing it failed. The
    /// inline result is complete regardless.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_error: Option<String>,
}

/// A piece of a spill file read by [`read_spill`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpillChunk {
    /// The text, cut to whole characters.
    pub text: String,
    /// Byte offset of `text` in the file (the requested offset moved
    /// forward past the rest of a character it fell inside).
    pub offset: u64,
    /// Offset to ask for next, `None` at the end of the file.
    pub next_offset: Option<u64>,
    /// The file's size in bytes.
    pub total_bytes: u64,
}

/// Largest chunk [`read_spill`] returns, in bytes (16 MiB); a longer
/// `length` is cut to this and `next_offset` says where to go on.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;

#[inline]
fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Reads `length` bytes of the spill file at `path` from byte `offset`,
/// cut to character boundaries: a start inside a character moves forward to
/// the next one, an end inside a character moves back (or forward, if the
/// chunk would otherwise be empty). `length` is capped at
/// [`MAX_READ_BYTES`]. An `offset` equal to the file size gives an empty
/// chunk with `next_offset: None`.
///
/// # Errors
/// [`CaptureError::SpillIo`] if the file cannot be opened or read;
/// [`CaptureError::OffsetOutOfRange`] if `offset` is past the end.
pub fn read_spill(path: &Path, offset: u64, length: u64) -> Result<SpillChunk, CaptureError> {
    let io = |op: &'static str| {
        move |source: std::io::Error| CaptureError::SpillIo {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let mut f = crate::hostfs::open_verified(path).map_err(io("open"))?;
    let total = f.metadata().map_err(io("open"))?.len();
    if offset > total {
        return Err(CaptureError::OffsetOutOfRange {
            path: path.to_path_buf(),
            offset,
            total_bytes: total,
        });
    }
    let want_end = offset.saturating_add(length.min(MAX_READ_BYTES)).min(total);
    let read_end = want_end.saturating_add(3).min(total);
    let n = usize::try_from(read_end - offset).unwrap_or(usize::MAX);
    let mut buf = vec![0u8; n];
    f.seek(SeekFrom::Start(offset)).map_err(io("seek"))?;
    f.read_exact(&mut buf).map_err(io("read"))?;
    let mut start = 0;
    while start < buf.len() && start < 3 && is_continuation(buf[start]) {
        start += 1;
    }
    let want = usize::try_from(want_end - offset).unwrap_or(usize::MAX);
    let mut end = want.max(start);
    while end > start && end < buf.len() && is_continuation(buf[end]) {
        end -= 1;
    }
    if end == start && want > start {
        // Less than one character asked for: return one whole character.
        end = start + 1;
        while end < buf.len() && is_continuation(buf[end]) {
            end += 1;
        }
    }
    let text = String::from_utf8_lossy(&buf[start..end]).into_owned();
    let abs_end = offset + end as u64;
    Ok(SpillChunk {
        text,
        offset: offset + start as u64,
        next_offset: (abs_end < total).then_some(abs_end),
        total_bytes: total,
    })
}

/// Bytes handed to the spill thread at a time.
const SPILL_BATCH: usize = 256 * 1024;
/// Batches queued for the spill thread before a write waits for it.
const SPILL_QUEUE: usize = 4;

/// Writes a spill file, on a thread of its own when one can be started:
/// copying big output into the page cache then overlaps with capturing it
/// (at most `SPILL_BATCH * (SPILL_QUEUE + 2)` bytes are in flight).
/// Otherwise it writes in place through a buffer.
enum SpillWriter {
    Thread {
        buf: Vec<u8>,
        tx: Option<SyncSender<Vec<u8>>>,
        thread: Option<JoinHandle<std::io::Result<()>>>,
    },
    Direct(BufWriter<File>),
}

impl SpillWriter {
    fn new(mut f: File) -> Self {
        let (tx, rx) = sync_channel::<Vec<u8>>(SPILL_QUEUE);
        // A second handle on the same open file, to write in place if no
        // thread can be started.
        let fallback = f.try_clone();
        let spawned = std::thread::Builder::new()
            .name("cellhost-spill".into())
            .spawn(move || {
                for chunk in rx {
                    f.write_all(&chunk)?;
                }
                f.flush()
            });
        match (spawned, fallback) {
            (Ok(thread), _) => SpillWriter::Thread {
                buf: Vec::with_capacity(SPILL_BATCH),
                tx: Some(tx),
                thread: Some(thread),
            },
            (Err(_), Ok(f)) => SpillWriter::Direct(BufWriter::with_capacity(64 * 1024, f)),
            // Neither: the first write reports the failure.
            (Err(_), Err(_)) => SpillWriter::Thread {
                buf: Vec::new(),
                tx: None,
                thread: None,
            },
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            SpillWriter::Direct(w) => w.write_all(bytes),
            SpillWriter::Thread { buf, .. } => {
                buf.extend_from_slice(bytes);
                if buf.len() >= SPILL_BATCH {
                    self.send()?;
                }
                Ok(())
            }
        }
    }

    /// Hands the buffered bytes to the thread; its error if it stopped.
    fn send(&mut self) -> std::io::Result<()> {
        let SpillWriter::Thread { buf, tx, thread } = self else {
            return Ok(());
        };
        if buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(buf, Vec::with_capacity(SPILL_BATCH));
        let sent = tx.as_ref().is_some_and(|tx| tx.send(chunk).is_ok());
        if sent {
            return Ok(());
        }
        // The thread ended early: it failed (or never started).
        *tx = None;
        Err(join(thread.take())
            .err()
            .unwrap_or_else(|| std::io::Error::other("the spill thread stopped")))
    }

    /// Writes what is buffered and waits until the file has all of it.
    fn finish(mut self) -> std::io::Result<()> {
        match &mut self {
            SpillWriter::Direct(w) => w.flush(),
            SpillWriter::Thread { .. } => {
                self.send()?;
                let SpillWriter::Thread { tx, thread, .. } = &mut self else {
                    return Ok(());
                };
                *tx = None;
                join(thread.take())
            }
        }
    }
}

impl Drop for SpillWriter {
    /// An unfinished stream (a capture dropped without `finish`) still gets
    /// what it captured written, as a buffered writer would on drop.
    fn drop(&mut self) {
        let _ = self.send();
        if let SpillWriter::Thread { tx, thread, .. } = self {
            *tx = None;
            let _ = join(thread.take());
        }
    }
}

/// Waits for the spill thread and returns its result.
fn join(thread: Option<JoinHandle<std::io::Result<()>>>) -> std::io::Result<()> {
    match thread.map(JoinHandle::join) {
        None => Ok(()),
        Some(Ok(r)) => r,
        Some(Err(_)) => Err(std::io::Error::other("the spill thread panicked")),
    }
}

enum Spill {
    /// No spill file configured (or a zero cap).
    Off,
    /// Configured, not created yet (the stream still fits inline).
    Pending(PathBuf),
    /// Being written.
    Active {
        path: PathBuf,
        w: SpillWriter,
        written: u64,
    },
    /// Cap reached; the file is complete.
    Full { path: PathBuf, written: u64 },
    /// Writing failed.
    Failed {
        path: PathBuf,
        written: u64,
        error: String,
    },
}

/// Keeps the head and tail of the stream and writes the spill file.
pub(crate) struct Sink {
    inline: usize,
    head_cap: usize,
    tail_cap: usize,
    spill_cap: u64,
    /// The trusted directory below which no link of the spill path is
    /// followed (the session directory a kernel can write).
    pub(crate) spill_root: Option<PathBuf>,
    head: String,
    head_closed: bool,
    /// The stream after the head; holds at least its last `tail_keep()` bytes.
    tail: String,
    total: u64,
    spill: Spill,
}

/// Writes the whole of `text` to the spill file, up to the cap.
fn spill_write(spill: &mut Spill, cap: u64, text: &str) {
    let Spill::Active { path, w, written } = spill else {
        return;
    };
    let room = usize::try_from(cap.saturating_sub(*written)).unwrap_or(usize::MAX);
    let (part, full) = if text.len() >= room {
        (&text[..floor_boundary(text, room)], true)
    } else {
        (text, false)
    };
    if let Err(e) = w.write_all(part.as_bytes()) {
        let path = std::mem::take(path);
        *spill = fail(path, "write", &e);
        return;
    }
    *written += part.len() as u64;
    if full && let Spill::Active { path, w, written } = std::mem::replace(spill, Spill::Off) {
        *spill = match w.finish() {
            Ok(()) => Spill::Full { path, written },
            Err(e) => fail(path, "flush", &e),
        };
    }
}

/// The failed state, with the size of what did reach the file.
fn fail(path: PathBuf, op: &str, e: &std::io::Error) -> Spill {
    let written = std::fs::metadata(&path).map_or(0, |m| m.len());
    Spill::Failed {
        error: format!("{op} {}: {e}", path.display()),
        path,
        written,
    }
}

/// Creates the spill file at `path` without following a link below
/// `root` (or below the file's own directory when there is no root), and
/// returns it with its canonical path.
fn create_spill(path: &Path, root: Option<&Path>) -> std::io::Result<(File, PathBuf)> {
    let (root, rel) = match root.and_then(|r| path.strip_prefix(r).ok().map(|rel| (r, rel))) {
        Some(x) => x,
        None => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            (dir, Path::new(path.file_name().unwrap_or_default()))
        }
    };
    crate::hostfs::create_beneath(root, rel)
}

impl Sink {
    pub(crate) fn new(
        inline: usize,
        head_fraction: f64,
        spill_cap: u64,
        spill_path: Option<PathBuf>,
    ) -> Self {
        let frac = if head_fraction.is_nan() {
            0.4
        } else {
            head_fraction.clamp(0.0, 1.0)
        };
        // Truncation toward zero is the intended rounding here.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let head_cap = ((inline as f64) * frac).floor() as usize;
        let head_cap = head_cap.min(inline);
        let spill = match spill_path {
            Some(p) if spill_cap > 0 => Spill::Pending(p),
            _ => Spill::Off,
        };
        Sink {
            inline,
            head_cap,
            tail_cap: inline - head_cap,
            spill_cap,
            spill_root: None,
            head: String::new(),
            head_closed: false,
            tail: String::new(),
            total: 0,
            spill,
        }
    }

    /// Bytes the tail must keep: its share plus room for a character cut
    /// at the head, so that a stream that fits inline is kept whole.
    fn tail_keep(&self) -> usize {
        self.tail_cap + 4
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Bytes held (capacity), for memory accounting.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.head.capacity() + self.tail.capacity()
    }

    pub(crate) fn write(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.total + text.len() as u64 > self.inline as u64 {
            if let Spill::Pending(path) = &mut self.spill {
                // First time over the inline size: everything so far is
                // still in head + tail; write it, then keep streaming.
                let path = std::mem::take(path);
                self.spill = match create_spill(&path, self.spill_root.as_deref()) {
                    Ok((f, path)) => Spill::Active {
                        path,
                        w: SpillWriter::new(f),
                        written: 0,
                    },
                    Err(e) => fail(path, "create", &e),
                };
                let (head, tail) = (std::mem::take(&mut self.head), std::mem::take(&mut self.tail));
                spill_write(&mut self.spill, self.spill_cap, &head);
                spill_write(&mut self.spill, self.spill_cap, &tail);
                self.head = head;
                self.tail = tail;
            }
            spill_write(&mut self.spill, self.spill_cap, text);
        }
        self.total += text.len() as u64;

        let mut rest = text;
        if !self.head_closed {
            let room = self.head_cap - self.head.len();
            if rest.len() <= room {
                self.head.push_str(rest);
                if rest.len() == room {
                    self.head_closed = true;
                }
                return;
            }
            let cut = floor_boundary(rest, room);
            self.head.push_str(&rest[..cut]);
            self.head_closed = true;
            rest = &rest[cut..];
        }
        let keep = self.tail_keep();
        if rest.len() >= keep {
            self.tail.clear();
            let start = rest.ceil_char_boundary(rest.len() - keep);
            self.tail.push_str(&rest[start..]);
        } else {
            self.tail.push_str(rest);
            if self.tail.len() > 2 * keep.max(32 * 1024) {
                let start = self.tail.ceil_char_boundary(self.tail.len() - keep);
                self.tail.drain(..start);
            }
        }
    }

    /// The inline text and, if something was omitted, the truncation record.
    pub(crate) fn finish(mut self) -> (String, Option<Truncation>) {
        let (spill_path, spill_bytes, spill_error) = match std::mem::replace(&mut self.spill, Spill::Off) {
            Spill::Off | Spill::Pending(_) => (None, 0, None),
            Spill::Active { path, w, written } => match w.finish() {
                Ok(()) => (Some(path), written, None),
                Err(e) => match fail(path, "flush", &e) {
                    Spill::Failed { path, written, error } => (Some(path), written, Some(error)),
                    _ => (None, 0, None),
                },
            },
            Spill::Full { path, written } => (Some(path), written, None),
            Spill::Failed { path, written, error } => ((written > 0).then_some(path), written, Some(error)),
        };
        if self.total <= self.inline as u64 {
            let mut text = self.head;
            text.push_str(&self.tail);
            return (text, None);
        }
        let tail_start = self
            .tail
            .ceil_char_boundary(self.tail.len().saturating_sub(self.tail_cap));
        let tail = &self.tail[tail_start..];
        let shown = (self.head.len() + tail.len()) as u64;
        let omitted = self.total - shown;
        let mut text = String::with_capacity(self.head.len() + tail.len() + 200);
        text.push_str(&self.head);
        if !self.head.is_empty() && !self.head.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&omission_line(
            omitted,
            self.total,
            spill_path.as_deref(),
            spill_bytes,
            spill_error.as_deref(),
        ));
        text.push('\n');
        text.push_str(tail);
        let truncation = Truncation {
            total_bytes: self.total,
            shown_bytes: shown,
            omitted_bytes: omitted,
            spill_path,
            spill_bytes,
            spill_error,
        };
        (text, Some(truncation))
    }
}

/// The one line that stands for the omitted middle of a stream.
fn omission_line(
    omitted: u64,
    total: u64,
    path: Option<&Path>,
    spill_bytes: u64,
    error: Option<&str>,
) -> String {
    match (path, error) {
        (Some(p), None) if spill_bytes >= total => format!(
            "[... {omitted} bytes omitted; full output ({total} bytes) in {}: page it by byte offset and length instead of re-running the cell ...]",
            p.display()
        ),
        (Some(p), None) => format!(
            "[... {omitted} bytes omitted; the first {spill_bytes} of {total} bytes are in {} (spill cap reached): page it by byte offset and length instead of re-running the cell ...]",
            p.display()
        ),
        (_, Some(e)) => format!("[... {omitted} bytes omitted; spill file failed: {e} ...]"),
        (None, None) => format!("[... {omitted} bytes omitted ...]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink_text(inline: usize, pieces: &[&str]) -> (String, Option<Truncation>) {
        let mut s = Sink::new(inline, 0.4, 0, None);
        for p in pieces {
            s.write(p);
        }
        s.finish()
    }

    #[test]
    fn small_stream_is_kept_whole() {
        let (text, t) = sink_text(100, &["hello\n", "world\n"]);
        assert_eq!(text, "hello\nworld\n");
        assert_eq!(t, None);
        let exact = "x".repeat(100);
        let (text, t) = sink_text(100, &[&exact[..33], &exact[33..]]);
        assert_eq!(text, exact);
        assert_eq!(t, None);
    }

    #[test]
    fn fits_inline_even_when_head_cut_falls_inside_a_char() {
        // head_cap 40 falls inside a 4-byte char: the head closes early and
        // the tail holds the rest; nothing is omitted.
        let s = format!("{}😀{}", "a".repeat(38), "b".repeat(58));
        assert_eq!(s.len(), 100);
        let (text, t) = sink_text(100, &[&s]);
        assert_eq!(text, s);
        assert_eq!(t, None);
    }

    #[test]
    fn head_and_tail_with_one_marker_line() {
        let body: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        let (text, t) = sink_text(1000, &[&body]);
        let t = t.expect("truncated");
        assert_eq!(t.total_bytes, body.len() as u64);
        assert_eq!(t.shown_bytes, 1000);
        assert_eq!(t.omitted_bytes, body.len() as u64 - 1000);
        assert!(text.starts_with(&body[..400]));
        assert!(text.ends_with(&body[body.len() - 600..]));
        let marker = format!("[... {} bytes omitted ...]\n", t.omitted_bytes);
        assert_eq!(text.matches("bytes omitted").count(), 1);
        assert_eq!(
            text,
            format!("{}{marker}{}", &body[..400], &body[body.len() - 600..])
        );
    }

    #[test]
    fn cuts_on_char_boundaries() {
        let body = "é".repeat(10_000);
        let mut s = Sink::new(1001, 0.4, 0, None);
        for piece in body.split_inclusive(|_| true) {
            s.write(piece);
        }
        let (text, t) = s.finish();
        let t = t.expect("truncated");
        assert!(t.shown_bytes <= 1001);
        assert_eq!(t.shown_bytes % 2, 0);
        assert_eq!(t.total_bytes, 20_000);
        assert!(text.starts_with(&"é".repeat(200)));
        assert!(text.ends_with(&"é".repeat(300)));
    }

    #[test]
    fn zero_inline_shows_only_the_marker() {
        let (text, t) = sink_text(0, &["abc"]);
        assert_eq!(text, "[... 3 bytes omitted ...]\n");
        assert_eq!(t.expect("truncated").shown_bytes, 0);
    }

    #[test]
    fn spill_is_lazy_and_complete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/stdout.txt");
        let mut s = Sink::new(100, 0.4, 1_000_000, Some(path.clone()));
        s.write(&"a".repeat(60));
        s.write(&"b".repeat(40));
        assert!(
            !path.exists(),
            "spill created before the inline size was exceeded"
        );
        s.write("c");
        assert!(path.exists());
        s.write(&"d".repeat(1000));
        let (text, t) = s.finish();
        let t = t.expect("truncated");
        let full = format!("{}{}c{}", "a".repeat(60), "b".repeat(40), "d".repeat(1000));
        assert_eq!(std::fs::read_to_string(&path).expect("spill"), full);
        assert_eq!(t.spill_path.as_deref(), Some(path.as_path()));
        assert_eq!(t.spill_bytes, full.len() as u64);
        assert!(text.contains(&path.display().to_string()));
        assert!(text.contains("page it by byte offset and length"));
    }

    #[test]
    fn no_spill_file_when_output_fits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stdout.txt");
        let mut s = Sink::new(100, 0.4, 1_000_000, Some(path.clone()));
        s.write("small\n");
        let (_, t) = s.finish();
        assert_eq!(t, None);
        assert!(!path.exists());
    }

    #[test]
    fn spill_cap_cuts_on_a_char_boundary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.txt");
        let mut s = Sink::new(10, 0.4, 101, Some(path.clone()));
        for _ in 0..100 {
            s.write("é");
        }
        let (text, t) = s.finish();
        let t = t.expect("truncated");
        assert_eq!(t.spill_bytes, 100);
        assert_eq!(std::fs::read(&path).expect("spill").len(), 100);
        assert!(text.contains("spill cap reached"));
    }

    #[test]
    fn spill_error_keeps_the_inline_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").expect("write");
        // A path below a regular file cannot be created.
        let path = blocker.join("stdout.txt");
        let mut s = Sink::new(10, 0.4, 1000, Some(path));
        s.write(&"z".repeat(50));
        let (text, t) = s.finish();
        let t = t.expect("truncated");
        assert!(t.spill_error.is_some());
        assert_eq!(t.spill_path, None);
        assert_eq!(t.total_bytes, 50);
        assert!(text.starts_with("zzzz"));
        assert!(text.ends_with("zzzzzz"));
        assert!(text.contains("spill file failed"));
    }

    #[test]
    fn spill_write_error_on_the_spill_thread_is_reported() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        // Every write to /dev/full fails (ENOSPC), after the open succeeded.
        let mut s = Sink::new(1000, 0.4, 50_000_000, Some(full.to_path_buf()));
        let line = "y".repeat(99) + "\n";
        for _ in 0..30_000 {
            s.write(&line);
        }
        let (text, t) = s.finish();
        let t = t.expect("truncated");
        assert_eq!(t.total_bytes, 3_000_000);
        let err = t.spill_error.expect("spill error");
        assert!(err.contains("/dev/full"), "{err}");
        assert!(text.contains("spill file failed"));
        assert!(text.ends_with(&line));
    }

    #[test]
    fn dropped_sink_still_writes_its_spill() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.txt");
        let mut s = Sink::new(100, 0.4, 50_000_000, Some(path.clone()));
        let body: String = (0..200_000).map(|i| format!("{i:09}\n")).collect();
        for piece in body.as_bytes().chunks(70_001) {
            s.write(std::str::from_utf8(piece).expect("ascii"));
        }
        drop(s);
        assert!(std::fs::read_to_string(&path).expect("spill") == body);
    }

    #[test]
    fn read_spill_pages_on_char_boundaries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.txt");
        let content = "ab€cd😀e";
        std::fs::write(&path, content).expect("write");
        let total = content.len() as u64;
        // Page through with every chunk size; the pieces reassemble exactly.
        for len in 1..=total {
            let mut got = String::new();
            let mut off = 0;
            loop {
                let c = read_spill(&path, off, len).expect("read");
                assert_eq!(c.offset, off);
                assert_eq!(c.total_bytes, total);
                got.push_str(&c.text);
                match c.next_offset {
                    Some(n) => {
                        assert!(n > off);
                        off = n;
                    }
                    None => break,
                }
            }
            assert_eq!(got, content, "len {len}");
        }
        // An offset inside a character moves forward.
        let c = read_spill(&path, 3, 3).expect("read");
        assert_eq!(c.offset, 5);
        assert_eq!(c.text, "c");
        assert_eq!(c.next_offset, Some(6));
        // The end.
        let c = read_spill(&path, total, 10).expect("read");
        assert_eq!(c.text, "");
        assert_eq!(c.next_offset, None);
        // Past the end.
        match read_spill(&path, total + 1, 1) {
            Err(CaptureError::OffsetOutOfRange {
                offset, total_bytes, ..
            }) => {
                assert_eq!(offset, total + 1);
                assert_eq!(total_bytes, total);
            }
            other => panic!("unexpected {other:?}"),
        }
        // Missing file.
        assert!(matches!(
            read_spill(&dir.path().join("nope"), 0, 1),
            Err(CaptureError::SpillIo { op: "open", .. })
        ));
    }
}
