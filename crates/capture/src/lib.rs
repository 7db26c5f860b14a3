//! Output capture for cellhost: raw bytes of a cell's stdout or stderr in,
//! bounded, terminal-faithful, redacted text out.
//!
//! One [`StreamCapture`] per stream per cell runs this pipeline on whatever
//! pieces the pipe delivers:
//!
//! 1. **incremental UTF-8** decoding (split characters are joined, invalid
//!    bytes become U+FFFD exactly as [`String::from_utf8_lossy`] would);
//! 2. **terminal rendering** (`\r` overwrites, `\b` moves back, ANSI escape
//!    sequences removed, erase-line honoured, long lines wrapped into rows;
//!    see [`render_once`] for the rules);
//! 3. **redaction** of registered secrets and common credential patterns
//!    ([`Redactor`]), also across piece boundaries; registered values are
//!    masked before rendering as well, so overwriting part of a secret with
//!    `\r` or `\b` cannot reveal the rest;
//! 4. three outputs: the **live text** returned by [`StreamCapture::push`],
//!    the **inline text** (at most [`StreamLimits::inline_bytes`]: a 40%
//!    head and a 60% tail around one omission line) and the **spill file**
//!    with the whole stream (up to [`StreamLimits::spill_bytes`]), readable back with
//!    [`read_spill`].
//!
//! Memory per stream is bounded by the limits (about
//! `inline_bytes + 2·tail + max_line_bytes + a few KiB`), whatever the cell
//! writes: a 100 MB line without a newline costs the same as a short one.
//!
//! The crate does no process work and has no async: the caller reads the
//! pipe and feeds the bytes in.
//!
//! ```
//! use std::sync::Arc;
//! use cellhost_capture::{Redactor, RedactionConfig, StreamCapture, StreamLimits};
//!
//! let redactor = Arc::new(Redactor::new(RedactionConfig {
//!     secrets: vec!["sk-demo-3f9a1c7e5b2d4a6f8e0c".into()],
//!     ..RedactionConfig::default()
//! })?);
//! let mut cap = StreamCapture::new(StreamLimits::stdout_default(), redactor, None);
//! let mut live = cap.push(b"\x1b[32mstep 1\x1b[0m\rstep 2\n");
//! live += &cap.push(b"token: sk-demo-3f9a");
//! live += &cap.push(b"1c7e5b2d4a6f8e0c\n");
//! let done = cap.finish();
//! live += &done.live_tail;
//! assert_eq!(done.text, "step 2\ntoken: sk-d****[redacted]\n");
//! assert_eq!(live, done.text);
//! assert!(done.truncation.is_none());
//! # Ok::<(), cellhost_capture::CaptureError>(())
//! ```

#![forbid(unsafe_code)]

mod error;
pub mod hostfs;
mod redact;
mod render;
mod sink;
mod utf8;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use error::CaptureError;
pub use redact::{MASK, MIN_HOLD, MIN_SECRET_LEN, PEM_MASK, RedactionConfig, Redactor};
pub use render::MAX_STRING_SEQ;
pub use sink::{MAX_READ_BYTES, SpillChunk, Truncation, read_spill};

use redact::{RawExactStream, RedactStream};
use render::Renderer;
use sink::Sink;
use utf8::Utf8Decoder;

/// Default row width for rendering, in bytes.
pub const DEFAULT_MAX_LINE_BYTES: usize = 8192;

/// Size limits of one captured stream. All sizes are bytes of rendered,
/// redacted UTF-8 text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamLimits {
    /// Most bytes returned inline (50,000 for stdout, 10,000 for stderr).
    /// A longer stream is cut to head + tail around one omission line.
    pub inline_bytes: usize,
    /// Share of `inline_bytes` given to the head, 0.0–1.0 (default 0.4);
    /// the tail gets the rest. Out-of-range values are clamped, NaN means 0.4.
    pub head_fraction: f64,
    /// Most bytes written to the spill file (default 50,000,000). 0 means
    /// no spill file.
    pub spill_bytes: u64,
    /// Row width in bytes at which an unfinished line wraps (default 8192,
    /// at least 4). Bounds the renderer's memory; see [`render_once`].
    pub max_line_bytes: usize,
}

impl StreamLimits {
    /// stdout: 50,000 bytes inline, 40% head, 50 MB spill, 8192-byte rows.
    pub fn stdout_default() -> Self {
        StreamLimits {
            inline_bytes: 50_000,
            head_fraction: 0.4,
            spill_bytes: 50_000_000,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }

    /// stderr: 10,000 bytes inline, otherwise as [`stdout_default`](Self::stdout_default).
    pub fn stderr_default() -> Self {
        StreamLimits {
            inline_bytes: 10_000,
            ..Self::stdout_default()
        }
    }
}

impl Default for StreamLimits {
    /// Same as [`StreamLimits::stdout_default`].
    fn default() -> Self {
        Self::stdout_default()
    }
}

/// The end of a captured stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedStream {
    /// Text that became final at the end (the unfinished last line and
    /// anything held back for redaction): the last piece for live
    /// subscribers. All [`StreamCapture::push`] results followed by this
    /// equal the whole rendered, redacted stream.
    pub live_tail: String,
    /// The inline result: the whole stream, or head + omission line + tail
    /// when it was longer than [`StreamLimits::inline_bytes`].
    pub text: String,
    /// Set only when something was omitted from `text`.
    pub truncation: Option<Truncation>,
}

/// Captures one stream (stdout or stderr) of one cell; see the crate docs.
pub struct StreamCapture {
    redactor: Arc<Redactor>,
    decoder: Utf8Decoder,
    raw: RawExactStream,
    renderer: Renderer,
    stage: RedactStream,
    sink: Sink,
}

impl std::fmt::Debug for StreamCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCapture")
            .field("total_bytes", &self.sink.total())
            .finish_non_exhaustive()
    }
}

impl StreamCapture {
    /// A capture with the given limits and redactor. `spill_path` is where
    /// the full stream goes once it exceeds `limits.inline_bytes`; the file
    /// (and its parent directories) is created only then, mode 0600, and
    /// truncated if it exists. `None`: no spill file.
    pub fn new(limits: StreamLimits, redactor: Arc<Redactor>, spill_path: Option<PathBuf>) -> Self {
        StreamCapture {
            redactor,
            decoder: Utf8Decoder::default(),
            raw: RawExactStream::default(),
            renderer: Renderer::new(limits.max_line_bytes),
            stage: RedactStream::default(),
            sink: Sink::new(
                limits.inline_bytes,
                limits.head_fraction,
                limits.spill_bytes,
                spill_path,
            ),
        }
    }

    /// Creates the spill file without following any link below `root` (a
    /// directory the kernel can write, such as its session directory): a
    /// link, FIFO or hard link planted on the spill path makes the spill
    /// fail (`spill_error`) instead of writing elsewhere. `spill_path`
    /// must lie below `root`; the truncation record then gives the
    /// canonical path. Without it the file's own directory is the root.
    #[must_use]
    pub fn spill_beneath(mut self, root: PathBuf) -> Self {
        self.sink.spill_root = Some(root);
        self
    }

    /// Feeds raw bytes as read from the pipe (any split, any bytes). Returns
    /// the rendered, redacted text that became final with this push —
    /// completed lines and wrapped rows — for live subscribers; often empty.
    /// Never fails: spill errors are reported at [`finish`](Self::finish).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut out = String::new();
        self.push_with(bytes, |piece| out.push_str(piece));
        out
    }

    /// [`push`](Self::push), handing the text to `emit` in pieces, in
    /// order; their concatenation is what `push` returns. Whole lines of
    /// plain text that nothing masks are handed out as they are in `bytes`
    /// (no copy), so a caller that keeps only part of the text copies only
    /// that part.
    pub fn push_with(&mut self, bytes: &[u8], mut emit: impl FnMut(&str)) {
        let mut bytes = bytes;
        if self.redactor.has_exact() {
            // Exact values are masked before rendering: every stage it is.
            return emit_nonempty(&self.push_owned(bytes), &mut emit);
        }
        if !self.renderer.is_clean()
            && let Some(p) = memchr::memchr(b'\n', bytes)
        {
            // Finish the pending line first, so whole lines follow.
            emit_nonempty(&self.push_owned(&bytes[..=p]), &mut emit);
            bytes = &bytes[p + 1..];
        }
        if self.decoder.is_idle() && self.stage.takes_lines(&self.redactor) {
            let n = self.renderer.plain_lines(bytes);
            if n > 0
                && let Ok(lines) = std::str::from_utf8(&bytes[..n])
            {
                let out = self.stage.process_lines(&self.redactor, lines);
                self.sink.write(&out);
                emit_nonempty(&out, &mut emit);
                bytes = &bytes[n..];
            }
        }
        emit_nonempty(&self.push_owned(bytes), &mut emit);
    }

    /// [`push`](Self::push) through every stage.
    fn push_owned(&mut self, bytes: &[u8]) -> String {
        if bytes.is_empty() {
            return String::new();
        }
        let mut committed = String::with_capacity(bytes.len().min(1 << 20));
        let (raw, renderer, redactor) = (&mut self.raw, &mut self.renderer, &*self.redactor);
        self.decoder.decode(bytes, &mut |s| {
            raw.process(redactor, s, false, &mut |t| renderer.feed(t, &mut committed));
        });
        if committed.is_empty() {
            return committed;
        }
        let out = self.stage.process(&self.redactor, committed, false);
        self.sink.write(&out);
        out
    }

    /// Ends the stream: an unfinished character becomes U+FFFD, the
    /// unfinished line is committed as is (no newline added), held-back text
    /// is released, the spill file is flushed.
    pub fn finish(mut self) -> FinishedStream {
        let mut committed = String::new();
        let (raw, renderer, redactor) = (&mut self.raw, &mut self.renderer, &*self.redactor);
        self.decoder.finish(&mut |s| {
            raw.process(redactor, s, false, &mut |t| renderer.feed(t, &mut committed));
        });
        raw.process(redactor, "", true, &mut |t| renderer.feed(t, &mut committed));
        self.renderer.finish(&mut committed);
        let live_tail = self.stage.process(&self.redactor, committed, true);
        self.sink.write(&live_tail);
        let (text, truncation) = self.sink.finish();
        FinishedStream {
            live_tail,
            text,
            truncation,
        }
    }

    /// Bytes of rendered, redacted text emitted so far (text still held in
    /// the current line or for redaction is not counted yet).
    pub fn total_bytes(&self) -> u64 {
        self.sink.total()
    }

    /// Bytes of buffer capacity held, for memory tests.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.raw.buffered() + self.renderer.buffered() + self.stage.buffered() + self.sink.buffered()
    }
}

fn emit_nonempty(text: &str, emit: &mut impl FnMut(&str)) {
    if !text.is_empty() {
        emit(text);
    }
}

/// Decodes and renders a complete byte string, without redaction or size
/// limits: for a crashed kernel's last output. Rules:
///
/// * invalid UTF-8 becomes U+FFFD (as [`String::from_utf8_lossy`]);
/// * `\r` returns to the line start and later text overwrites character by
///   character (`"abcdef\rXY"` → `"XYcdef"`); `\r\n` is a newline;
/// * `\b` moves back one character, not past the line start;
/// * ANSI escapes (CSI, OSC/DCS/… strings, two- and three-char escapes)
///   are removed; `ESC[K`, `ESC[1K`, `ESC[2K` erase, `ESC[nG/C/D` move;
/// * `\t` is kept, other control characters are dropped;
/// * a line longer than 8192 bytes wraps into rows (no newline is added;
///   a later `\r` returns to the start of the last row only);
/// * the last line is kept without adding a newline.
pub fn render_once(bytes: &[u8]) -> String {
    render::render_all(bytes, DEFAULT_MAX_LINE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: &str = "sk-demo-3f9a1c7e5b2d4a6f8e0c";

    /// xorshift64*: deterministic pseudo-random numbers for split tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Equality with a short report around the first difference.
    #[track_caller]
    fn assert_same(got: &str, want: &str, ctx: &str) {
        if got == want {
            return;
        }
        let at = got
            .bytes()
            .zip(want.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        let win = |s: &str| {
            let a = s.floor_char_boundary(at.saturating_sub(80));
            let b = s.ceil_char_boundary((at + 80).min(s.len()));
            format!("{:?}", &s[a..b])
        };
        panic!(
            "{ctx}: differ at byte {at} (len {} vs {}):\n got  {}\n want {}",
            got.len(),
            want.len(),
            win(got),
            win(want)
        );
    }

    /// The pipeline in one shot: decode, mask exact values, render, redact.
    fn reference(r: &Redactor, data: &[u8]) -> String {
        let decoded = String::from_utf8_lossy(data);
        let raw = r.redact_exact(&decoded);
        r.redact(&render_once(raw.as_bytes())).into_owned()
    }

    fn demo_redactor() -> Arc<Redactor> {
        Arc::new(
            Redactor::new(RedactionConfig {
                secrets: vec![DEMO.into()],
                ..RedactionConfig::default()
            })
            .expect("redactor"),
        )
    }

    fn run(limits: StreamLimits, r: Arc<Redactor>, pieces: &[&[u8]]) -> (String, FinishedStream) {
        let mut cap = StreamCapture::new(limits, r, None);
        let mut live = String::new();
        for p in pieces {
            live.push_str(&cap.push(p));
        }
        let done = cap.finish();
        live.push_str(&done.live_tail);
        (live, done)
    }

    fn random_pieces<'a>(rng: &mut Rng, data: &'a [u8], max_piece: usize) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < data.len() {
            let n = 1 + rng.below(max_piece);
            let j = (i + n).min(data.len());
            out.push(&data[i..j]);
            i = j;
        }
        out
    }

    /// A messy stream: text, multibyte, invalid bytes, escapes, `\r`,
    /// `\b`, secrets and assignments, long lines.
    fn messy_stream(rng: &mut Rng) -> Vec<u8> {
        let parts: &[&[u8]] = &[
            b"plain line\n",
            "üñíçødé ✓ 😀\n".as_bytes(),
            b"\x1b[1;31mred\x1b[0m\n",
            b"\x1b]0;title\x07after osc\n",
            b"progress 10%\rprogress 55%\rprogress 100%\n",
            b"abc\x08\x08XY\n",
            b"bad \xff\xfe bytes \xe2\x82\n",
            b"DEMO_TOKEN=sk-demo-3f9a1c7e5b2d4a6f8e0c\n",
            b"{'token': 'sk-demo-3f9a1c7e5b2d4a6f8e0c'}\n",
            b"sk-demo-3f",
            b"9a1c7e5b2d4a6f8e0c\n",
            b"PASSWORD=hunter2 and ghp_abcdefghijklmnopqrstuvwxyz0123456789\n",
            b"\x1b[2K\rerased\x1b[K\n",
            b"\t tabbed\x00\x07\n",
            b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n",
            b"no newline at all ",
        ];
        let mut data = Vec::new();
        for _ in 0..200 {
            data.extend_from_slice(parts[rng.below(parts.len())]);
            if rng.below(20) == 0 {
                let n = rng.below(20_000);
                data.extend(std::iter::repeat_n(b'w', n));
            }
        }
        data
    }

    #[test]
    fn live_concatenation_equals_full_stream_under_random_splits() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let r = demo_redactor();
        let big = StreamLimits {
            inline_bytes: usize::MAX / 2,
            ..StreamLimits::stdout_default()
        };
        splits_match_the_whole(&mut rng, &r, &big, |d| reference(&r, d), DEMO);
    }

    /// 40 random streams, each fed in pieces of several sizes: the live
    /// text and the final text equal `expected` of the whole stream, which
    /// never shows `secret`.
    fn splits_match_the_whole(
        rng: &mut Rng,
        r: &Arc<Redactor>,
        limits: &StreamLimits,
        expected: impl Fn(&[u8]) -> String,
        secret: &str,
    ) {
        for round in 0..40 {
            let data = messy_stream(rng);
            let expected = expected(&data);
            assert!(!expected.contains(secret));
            for max_piece in [1, 7, 100, 5000, 70_000] {
                let pieces = random_pieces(rng, &data, max_piece);
                let (live, done) = run(limits.clone(), r.clone(), &pieces);
                let ctx = format!("round {round}, pieces up to {max_piece}");
                assert_same(&live, &expected, &ctx);
                assert_same(&done.text, &expected, &ctx);
                assert!(!live.contains(secret));
            }
        }
    }

    #[test]
    fn live_concatenation_with_patterns_only_under_random_splits() {
        // No registered secrets: whole plain lines take the borrowed path.
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let r = Arc::new(Redactor::new(RedactionConfig::default()).expect("redactor"));
        let big = StreamLimits {
            inline_bytes: usize::MAX / 2,
            max_line_bytes: 512,
            ..StreamLimits::stdout_default()
        };
        splits_match_the_whole(
            &mut rng,
            &r,
            &big,
            |d| r.redact(&render::render_all(d, 512)).into_owned(),
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        );
    }

    #[test]
    fn push_with_hands_out_plain_lines_from_the_input_itself() {
        let r = Arc::new(Redactor::new(RedactionConfig::default()).expect("redactor"));
        let mut cap = StreamCapture::new(StreamLimits::stdout_default(), r, None);
        // (text, pieces that point into the input)
        let push = |cap: &mut StreamCapture, input: &[u8]| {
            let range = input.as_ptr_range();
            let mut text = String::new();
            let mut borrowed = Vec::new();
            cap.push_with(input, |piece| {
                if range.contains(&piece.as_ptr()) {
                    borrowed.push(piece.to_string());
                }
                text.push_str(piece);
            });
            (text, borrowed)
        };
        let (text, borrowed) = push(&mut cap, b"one\ntwo\nthr");
        assert_eq!(
            (text.as_str(), borrowed),
            ("one\ntwo\n", vec!["one\ntwo\n".to_string()])
        );
        // The pending "thr" line is finished first, then lines go out as is.
        let (text, borrowed) = push(&mut cap, b"ee\nfour\nfive\n");
        assert_eq!(
            (text.as_str(), borrowed),
            ("three\nfour\nfive\n", vec!["four\nfive\n".to_string()])
        );
        let (text, borrowed) = push(&mut cap, b"key: ghp_abcdefghijklmnopqrstuvwxyz0123456789\nok\n");
        assert_eq!(text, "key: ghp_****[redacted]\nok\n");
        assert!(borrowed.is_empty());
        let (text, borrowed) = push(&mut cap, b"a\x1b[1mb\x1b[0m\n");
        assert_eq!(text, "ab\n");
        assert!(borrowed.is_empty());
        let done = cap.finish();
        assert_eq!(
            done.text,
            "one\ntwo\nthree\nfour\nfive\nkey: ghp_****[redacted]\nok\nab\n"
        );
    }

    #[test]
    fn live_equals_render_once_without_redaction() {
        let mut rng = Rng(12345);
        let r = Arc::new(Redactor::disabled());
        for _ in 0..20 {
            let data = messy_stream(&mut rng);
            let expected = render_once(&data);
            let pieces = random_pieces(&mut rng, &data, 300);
            let (live, done) = run(StreamLimits::stdout_default(), r.clone(), &pieces);
            assert_same(&live, &expected, "live");
            if let Some(t) = &done.truncation {
                assert_eq!(t.total_bytes, expected.len() as u64);
            } else {
                assert_same(&done.text, &expected, "text");
            }
        }
    }

    #[test]
    fn hk11_progress_frames_render_to_the_last_frame() {
        let mut pieces: Vec<Vec<u8>> = (1..=5000)
            .map(|i| format!("\rstep {i}/5000").into_bytes())
            .collect();
        pieces.push(b"\n".to_vec());
        pieces.push(b"finished\n".to_vec());
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let (live, done) = run(StreamLimits::stdout_default(), demo_redactor(), &refs);
        assert_eq!(done.text, "step 5000/5000\nfinished\n");
        assert_eq!(live, done.text);
        assert_eq!(done.truncation, None);
    }

    #[test]
    fn hk11_tqdm_stderr_keeps_the_final_frame() {
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        for i in 0..=3000 {
            let pct = i * 100 / 3000;
            let filled = pct / 10;
            let bar = format!("{}{}", "█".repeat(filled), " ".repeat(10 - filled));
            pieces.push(format!("\r{pct:3}%|{bar}| {i}/3000 [00:00<00:00, 9999.00it/s]").into_bytes());
        }
        pieces.push(b"\n".to_vec());
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let (_, done) = run(StreamLimits::stderr_default(), demo_redactor(), &refs);
        assert_eq!(
            done.text,
            "100%|██████████| 3000/3000 [00:00<00:00, 9999.00it/s]\n"
        );
    }

    #[test]
    fn hk31_secret_never_reaches_the_output() {
        let r = demo_redactor();
        let stdout: &[&[u8]] = &[
            b"DEMO_TOKEN=sk-demo-3f9a1c7e5b2d4a6f8e0c\n",
            b"{'token': 'sk-demo-3f9a1c7e5b2d4a6f8e0c'}\n",
            b"sk-demo-3f",
            b"9a1c7e5b2d4a6f8e0c\n",
        ];
        let (live, done) = run(StreamLimits::stdout_default(), r.clone(), stdout);
        for text in [&live, &done.text] {
            assert!(!text.contains(DEMO), "{text}");
            assert!(!text.contains("sk-demo-3f"), "{text}");
            assert!(!text.contains("9a1c7e5b2d4a6f8e0c"), "{text}");
        }
        assert_eq!(
            done.text,
            "DEMO_TOKEN=sk-d****[redacted]\n{'token': 'sk-d****[redacted]'}\nsk-d****[redacted]\n"
        );
        let tb = r.redact("ValueError: bad token sk-demo-3f9a1c7e5b2d4a6f8e0c");
        assert_eq!(tb, "ValueError: bad token sk-d****[redacted]");
        // Every split point of the joined write, through the whole pipeline.
        let joined = b"sk-demo-3f9a1c7e5b2d4a6f8e0c\n";
        for i in 0..=joined.len() {
            let (live, done) = run(
                StreamLimits::stdout_default(),
                r.clone(),
                &[&joined[..i], &joined[i..]],
            );
            assert_eq!(live, "sk-d****[redacted]\n", "split {i}");
            assert_eq!(done.text, live);
        }
    }

    #[test]
    fn secret_destroyed_by_rendering_is_masked_before_it() {
        let r = Arc::new(
            Redactor::new(RedactionConfig {
                secrets: vec![DEMO.into(), "hunter2hunter2".into()],
                ..RedactionConfig::default()
            })
            .expect("redactor"),
        );
        let cases: &[&[u8]] = &[
            b"sk-demo-3f9a1c7e5b2d4a6f8e0c\rXX\n",
            b"pw hunter2hunter2\x08\x08\x08XYZ\n",
            b"pw hunter2hunter2\x1b[5D\x1b[K\n",
            b"\x1b[1mhunter2\x1b[0mhunter2\n",
        ];
        for data in cases {
            for i in 0..=data.len() {
                let (live, done) = run(
                    StreamLimits::stdout_default(),
                    r.clone(),
                    &[&data[..i], &data[i..]],
                );
                for text in [&live, &done.text] {
                    assert!(!text.contains("3f9a1c7e5b2d"), "{text:?}");
                    assert!(!text.contains("hunter2hun"), "{text:?}");
                    assert!(!text.contains("ter2hunter"), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn secret_in_a_long_unterminated_line_is_masked_across_rows() {
        let r = demo_redactor();
        let limits = StreamLimits {
            max_line_bytes: 64,
            inline_bytes: 1 << 30,
            ..StreamLimits::stdout_default()
        };
        let mut data = "q".repeat(10_000).into_bytes();
        data.extend_from_slice(DEMO.as_bytes());
        data.extend_from_slice("r".repeat(10_000).as_bytes());
        let mut rng = Rng(7);
        for _ in 0..20 {
            let pieces = random_pieces(&mut rng, &data, 3000);
            let (live, done) = run(limits.clone(), r.clone(), &pieces);
            assert!(!live.contains("3f9a1c7e"));
            assert_eq!(live, done.text);
            assert_eq!(live.len(), 20_000 + "sk-d****[redacted]".len());
        }
    }

    #[test]
    fn truncation_reports_rendered_redacted_bytes() {
        let r = demo_redactor();
        let limits = StreamLimits {
            inline_bytes: 1000,
            ..StreamLimits::stdout_default()
        };
        let mut cap = StreamCapture::new(limits, r, None);
        let mut expected_total = 0u64;
        for i in 0..1000 {
            let line = format!("\x1b[33m{i:05}\x1b[0m token={DEMO}\n");
            cap.push(line.as_bytes());
            expected_total += format!("{i:05} token=sk-d****[redacted]\n").len() as u64;
        }
        assert_eq!(cap.total_bytes(), expected_total);
        let done = cap.finish();
        let t = done.truncation.expect("truncated");
        assert_eq!(t.total_bytes, expected_total);
        assert_eq!(t.shown_bytes, 1000);
        assert_eq!(t.omitted_bytes, expected_total - 1000);
        assert_eq!(t.spill_path, None);
        assert!(done.text.starts_with("00000 token=sk-d****[redacted]\n"));
        assert!(done.text.ends_with("00999 token=sk-d****[redacted]\n"));
        assert!(!done.text.contains(DEMO));
    }

    #[test]
    fn spill_holds_the_full_redacted_stream_and_pages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cell-1.stdout");
        let limits = StreamLimits {
            inline_bytes: 500,
            ..StreamLimits::stdout_default()
        };
        let mut cap = StreamCapture::new(limits, demo_redactor(), Some(path.clone()));
        let mut full = String::new();
        for i in 0..2000 {
            let raw = format!("row {i} é DEMO_TOKEN={DEMO}\n");
            full.push_str(&cap.push(raw.as_bytes()));
        }
        let done = cap.finish();
        full.push_str(&done.live_tail);
        let t = done.truncation.expect("truncated");
        assert_eq!(t.spill_path.as_deref(), Some(path.as_path()));
        assert_eq!(t.spill_bytes, full.len() as u64);
        assert_eq!(std::fs::read_to_string(&path).expect("spill"), full);
        assert!(!full.contains(DEMO));
        let mut paged = String::new();
        let mut off = Some(0);
        while let Some(o) = off {
            let c = read_spill(&path, o, 777).expect("page");
            paged.push_str(&c.text);
            off = c.next_offset;
        }
        assert_eq!(paged, full);
    }

    /// HK10: one 100 MB line without a newline, fed in pipe-sized pieces.
    /// Not timed; checks the result and that memory stays bounded.
    #[test]
    fn hk10_100mb_line_without_newline_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.stdout");
        let r = demo_redactor();
        let mut cap = StreamCapture::new(StreamLimits::stdout_default(), r, Some(path.clone()));
        let chunk = vec![b'x'; 65_536];
        let total: usize = 100 * 1024 * 1024;
        let mut live_bytes = 0usize;
        let mut fed = 0;
        let mut peak = 0;
        while fed < total {
            let n = chunk.len().min(total - fed);
            let out = cap.push(&chunk[..n]);
            assert!(out.bytes().all(|b| b == b'x'));
            live_bytes += out.len();
            fed += n;
            peak = peak.max(cap.buffered());
        }
        assert!(peak < 512 * 1024, "held {peak} bytes");
        let done = cap.finish();
        live_bytes += done.live_tail.len();
        assert_eq!(live_bytes, total);
        let t = done.truncation.expect("truncated");
        assert_eq!(t.total_bytes, 104_857_600);
        assert_eq!(t.shown_bytes, 50_000);
        assert_eq!(t.omitted_bytes, 104_857_600 - 50_000);
        assert_eq!(t.spill_bytes, 50_000_000);
        assert_eq!(std::fs::metadata(&path).expect("spill").len(), 50_000_000);
        let head = &done.text[..20_000];
        assert!(head.bytes().all(|b| b == b'x'));
        assert!(done.text[done.text.len() - 30_000..].bytes().all(|b| b == b'x'));
        assert!(done.text.contains("[... 104807600 bytes omitted;"));
        assert_eq!(done.text.lines().count(), 3);
    }

    /// 10 MB of short lines; not timed.
    #[test]
    fn ten_mb_of_lines_is_bounded_and_exact() {
        let mut cap = StreamCapture::new(StreamLimits::stdout_default(), demo_redactor(), None);
        let mut data = Vec::with_capacity(10 * 1024 * 1024 + 100);
        let mut i = 0u64;
        while data.len() < 10 * 1024 * 1024 {
            data.extend_from_slice(format!("line {i:08} of plain output\n").as_bytes());
            i += 1;
        }
        let mut live = 0usize;
        let mut peak = 0;
        for c in data.chunks(65_536) {
            live += cap.push(c).len();
            peak = peak.max(cap.buffered());
        }
        assert!(peak < 512 * 1024, "held {peak} bytes");
        let done = cap.finish();
        live += done.live_tail.len();
        assert_eq!(live, data.len());
        let t = done.truncation.expect("truncated");
        assert_eq!(t.total_bytes, data.len() as u64);
        let text = done.text;
        assert!(text.starts_with("line 00000000 of plain output\n"));
        assert!(text.ends_with(&format!("line {:08} of plain output\n", i - 1)));
        assert!(text.len() < 50_200);
    }

    #[test]
    fn render_once_handles_bytes_and_terminal_rules() {
        assert_eq!(
            render_once(b"abcdef\rXY\n\x1b[31mred\x1b[0m\n\xff"),
            "XYcdef\nred\n\u{FFFD}"
        );
        assert_eq!(render_once(b""), "");
    }

    #[test]
    fn split_utf8_and_escapes_through_the_pipeline() {
        let data = "caf\u{e9} \x1b[1m😀\x1b[0m\r\nnext\n".as_bytes();
        for i in 0..=data.len() {
            let (live, done) = run(
                StreamLimits::stdout_default(),
                demo_redactor(),
                &[&data[..i], &data[i..]],
            );
            assert_eq!(live, "café 😀\nnext\n", "split {i}");
            assert_eq!(done.text, live);
        }
    }

    #[test]
    fn unfinished_line_is_released_at_finish() {
        let mut cap = StreamCapture::new(StreamLimits::stdout_default(), demo_redactor(), None);
        assert_eq!(cap.push(b"partial"), "");
        assert_eq!(cap.total_bytes(), 0);
        let done = cap.finish();
        assert_eq!(done.live_tail, "partial");
        assert_eq!(done.text, "partial");
    }

    #[test]
    fn capture_and_redactor_are_send_and_sync() {
        fn send<T: Send>() {}
        fn sync<T: Send + Sync>() {}
        send::<StreamCapture>();
        sync::<Redactor>();
    }
}
