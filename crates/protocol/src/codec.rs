//! Length-capped JSON-lines codec.
//!
//! [`FrameReader::next`] is cancel-safe: it can sit in a `tokio::select!`
//! arm; bytes already read stay in the reader for the next call.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::MAX_FRAME_BYTES;

/// A frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A line grew past the cap before its newline arrived.
    #[error("frame exceeds {limit} bytes (at least {seen} bytes without a newline)")]
    Oversized {
        /// The cap in bytes.
        limit: usize,
        /// Bytes seen so far.
        seen: usize,
    },
    /// A line was not a JSON frame of a known type.
    #[error("malformed frame: {detail}; frame starts with {preview:?}")]
    Malformed {
        /// The JSON error.
        detail: String,
        /// First 200 bytes of the line, lossily decoded.
        preview: String,
    },
    /// The channel closed in the middle of a frame.
    #[error("channel closed in the middle of a frame ({partial_bytes} bytes)")]
    TruncatedFrame {
        /// Bytes of the unfinished frame.
        partial_bytes: usize,
    },
    /// The channel failed.
    #[error("control channel I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A frame could not be encoded (never happens for the types here).
    #[error("cannot encode frame: {0}")]
    Encode(String),
}

/// Reads newline-terminated JSON frames, at most `max` bytes each.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
    max: usize,
    poisoned: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader with the protocol cap ([`MAX_FRAME_BYTES`]).
    pub fn new(inner: R) -> Self {
        Self::with_limit(inner, MAX_FRAME_BYTES)
    }

    /// A reader with another cap (tests use small ones).
    pub fn with_limit(inner: R, max: usize) -> Self {
        FrameReader {
            inner: BufReader::with_capacity(64 * 1024, inner),
            line: Vec::new(),
            max,
            poisoned: false,
        }
    }

    /// Next frame, or `Ok(None)` at a clean end of stream.
    ///
    /// # Errors
    /// [`ProtocolError::Oversized`] once a line passes the cap (the reader
    /// then refuses all further reads with the same error: the stream has no
    /// frame boundary it can trust), [`ProtocolError::Malformed`] for a line
    /// that is not a frame (the reader stays usable),
    /// [`ProtocolError::TruncatedFrame`] at EOF inside a line, and I/O errors.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtocolError> {
        if self.poisoned {
            return Err(ProtocolError::Oversized {
                limit: self.max,
                seen: self.line.len(),
            });
        }
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if self.line.is_empty() {
                    return Ok(None);
                }
                let partial_bytes = self.line.len();
                self.line.clear();
                return Err(ProtocolError::TruncatedFrame { partial_bytes });
            }
            let (take, complete) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            if self.line.len() + take > self.max {
                let seen = self.line.len() + take;
                self.poisoned = true;
                self.line.clear();
                return Err(ProtocolError::Oversized {
                    limit: self.max,
                    seen,
                });
            }
            self.line.extend_from_slice(&available[..take]);
            self.inner.consume(if complete { take + 1 } else { take });
            if complete {
                let line = std::mem::take(&mut self.line);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map(Some).map_err(|e| {
                    let end = line.len().min(200);
                    ProtocolError::Malformed {
                        detail: e.to_string(),
                        preview: String::from_utf8_lossy(&line[..end]).into_owned(),
                    }
                });
            }
        }
    }
}

/// Writes frames as JSON lines.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Wraps a writer.
    pub fn new(inner: W) -> Self {
        FrameWriter { inner }
    }

    /// Writes one frame and flushes it.
    ///
    /// # Errors
    /// I/O errors of the channel.
    pub async fn send<T: Serialize>(&mut self, frame: &T) -> Result<(), ProtocolError> {
        let mut bytes = serde_json::to_vec(frame).map_err(|e| ProtocolError::Encode(e.to_string()))?;
        bytes.push(b'\n');
        self.inner.write_all(&bytes).await?;
        self.inner.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{HostFrame, WorkerFrame};

    async fn read_all(bytes: &[u8], max: usize) -> Vec<Result<Option<WorkerFrame>, String>> {
        let mut reader = FrameReader::with_limit(bytes, max);
        let mut out = Vec::new();
        loop {
            let r = reader.next::<WorkerFrame>().await;
            let stop = !matches!(r, Ok(Some(_)) | Err(ProtocolError::Malformed { .. }));
            out.push(r.map_err(|e| e.to_string()));
            if stop {
                break;
            }
        }
        out
    }

    #[tokio::test]
    async fn reads_frames_split_anywhere() {
        let text = b"{\"type\":\"log\",\"msg\":\"a\"}\n\n{\"type\":\"log\",\"msg\":\"b\\u00e9\"}\n";
        // A reader over a slice returns everything at once; a duplex pipe with
        // one-byte writes checks that a frame split across reads is joined.
        let (mut tx, rx) = tokio::io::duplex(1);
        let writer = tokio::spawn(async move {
            for b in text.iter() {
                tx.write_all(&[*b]).await.expect("duplex write");
            }
        });
        let mut reader = FrameReader::new(rx);
        let a: WorkerFrame = reader.next().await.expect("frame a").expect("some");
        let b: WorkerFrame = reader.next().await.expect("frame b").expect("some");
        assert_eq!(a, WorkerFrame::Log { msg: "a".into() });
        assert_eq!(b, WorkerFrame::Log { msg: "bé".into() });
        writer.await.expect("writer task");
        assert!(reader.next::<WorkerFrame>().await.expect("eof").is_none());
    }

    #[tokio::test]
    async fn oversized_frame_is_an_error_and_poisons() {
        let mut line = vec![b'x'; 100];
        line.push(b'\n');
        let out = read_all(&line, 50).await;
        assert_eq!(out.len(), 1);
        assert!(
            out[0].as_ref().is_err_and(|e| e.contains("exceeds 50 bytes")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn malformed_frame_is_reported_and_reading_goes_on() {
        let out = read_all(
            b"not json\n{\"type\":\"nope\"}\n{\"type\":\"log\",\"msg\":\"ok\"}\n",
            1024,
        )
        .await;
        assert!(
            out[0]
                .as_ref()
                .is_err_and(|e| e.contains("malformed") && e.contains("not json"))
        );
        assert!(out[1].as_ref().is_err_and(|e| e.contains("malformed")));
        assert_eq!(out[2], Ok(Some(WorkerFrame::Log { msg: "ok".into() })));
        assert_eq!(out[3], Ok(None));
    }

    #[tokio::test]
    async fn eof_inside_a_frame_is_truncation() {
        let out = read_all(b"{\"type\":\"log\"", 1024).await;
        assert!(out[0].as_ref().is_err_and(|e| e.contains("middle of a frame")));
    }

    #[tokio::test]
    async fn writer_emits_one_line_per_frame() {
        let mut buf = Vec::new();
        let mut w = FrameWriter::new(&mut buf);
        w.send(&HostFrame::Shutdown {}).await.expect("send");
        w.send(&HostFrame::Interrupt {
            id: "c1".into(),
            signalled: true,
        })
        .await
        .expect("send");
        assert_eq!(
            String::from_utf8(buf).expect("utf8"),
            "{\"type\":\"shutdown\"}\n{\"type\":\"interrupt\",\"id\":\"c1\",\"signalled\":true}\n"
        );
    }
}
