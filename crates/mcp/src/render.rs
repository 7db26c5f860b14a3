//! A [`CellResult`] as MCP tool content: text written for a language model
//! (status first), the result JSON as `structuredContent`, figures as
//! `image` content.

use std::fmt::Write as _;
use std::path::Path;

use base64::Engine;
use cellhost_sessions::cell::{CellResult, MimeBundle};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

/// Largest image sent inline as `image` content (bigger ones are named by
/// path only).
pub const MAX_IMAGE_BYTES: u64 = 8 * 1024 * 1024;

/// Image MIME types sent as `image` content.
const IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];

/// Default image budget: an image larger than this many bytes is
/// downscaled (PNG) or sent as a resource link instead of inline base64
/// (256 KiB; the config's `mcp_image_max_kb`).
pub const DEFAULT_IMAGE_BUDGET: u64 = 256 * 1024;

/// The whole tool result of one cell, images within [`DEFAULT_IMAGE_BUDGET`].
///
/// A cell that ran is a *successful* tool call whatever its status — an
/// exception in the user's code, a timeout, an interrupt or a crash is
/// the cell's outcome, said by `status` (first line of the text and in
/// the structured content), not a failure of the tool: clients treat
/// `isError` as "the tool did not work" (pydantic-ai spends a model retry
/// on it). Tool failures (bad arguments, a busy session, a kernel that
/// cannot start) stay `isError` with their code.
pub fn cell_result(r: &CellResult) -> CallToolResult {
    cell_result_with(r, DEFAULT_IMAGE_BUDGET)
}

/// The whole tool result of one cell: each image up to `image_budget`
/// bytes inline as `image` content; a larger PNG downscaled until it fits
/// (the text gives both sizes and the full-size file's path), any other
/// larger image as a `resource_link` to its file (and the text says so),
/// so one figure cannot eat a model's context.
pub fn cell_result_with(r: &CellResult, image_budget: u64) -> CallToolResult {
    let mut images = Vec::new();
    let mut image_notes = Vec::new();
    let bundles = r.displays.iter().map(|d| &d.data).chain(r.result.as_ref());
    for bundle in bundles {
        collect_images(bundle, image_budget, &mut images, &mut image_notes);
    }
    let mut content = vec![ContentBlock::text(text(r, &image_notes))];
    content.extend(images);
    let mut out = CallToolResult::success(content);
    out.structured_content = serde_json::to_value(r).ok();
    out
}

fn collect_images(bundle: &MimeBundle, budget: u64, images: &mut Vec<ContentBlock>, notes: &mut Vec<String>) {
    for mime in IMAGE_TYPES {
        let Some(v) = bundle.get(mime) else { continue };
        let Some(path) = v.get("path").and_then(Value::as_str) else {
            continue;
        };
        let size = v.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        if size > budget
            && mime == "image/png"
            && let Some(small) = downscale_png(Path::new(path), budget)
        {
            images.push(ContentBlock::image(
                base64::engine::general_purpose::STANDARD.encode(&small.bytes),
                mime,
            ));
            notes.push(format!(
                "{mime} {path}: {size} bytes, over the image budget of {budget} bytes, so downscaled from {}x{} to {}x{} ({} bytes) as image {}; the full-size file is at that path",
                small.from.0,
                small.from.1,
                small.to.0,
                small.to.1,
                small.bytes.len(),
                images.len()
            ));
            break;
        }
        if size > budget {
            let name = Path::new(path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "image".into());
            let link = rmcp::model::Resource::new(format!("file://{path}"), name)
                .with_mime_type(mime)
                .with_size(size);
            images.push(ContentBlock::resource_link(link));
            notes.push(format!(
                "{mime} {path}: {size} bytes, over the image budget of {budget} bytes, so sent as a resource link (content {}), not inline; save the figure smaller (e.g. a lower dpi) to see it",
                images.len()
            ));
            break;
        }
        match read_image(Path::new(path)) {
            Ok(b64) => {
                images.push(ContentBlock::image(b64, mime));
                notes.push(format!("{mime} {path} (attached as image {})", images.len()));
            }
            Err(why) => notes.push(format!("{mime} {path} (not attached: {why})")),
        }
        break;
    }
}

/// A PNG made smaller to fit an image budget.
struct Downscaled {
    bytes: Vec<u8>,
    from: (u32, u32),
    to: (u32, u32),
}

/// Largest width or height of a PNG the budget decodes (a larger one is
/// sent as a resource link).
const MAX_DECODE_SIDE: u32 = 16_384;

/// `path` (a PNG the host saved) re-encoded at a smaller size within
/// `budget` bytes: scaled by the square root of the size ratio (with a
/// margin), then by 0.7 more at each of at most five tries. `None` when it
/// cannot be read, decoded within bounded memory, or made to fit.
fn downscale_png(path: &Path, budget: u64) -> Option<Downscaled> {
    use std::io::Read;
    let f = cellhost_sessions::cell::hostfs::open_verified(path).ok()?;
    let mut raw = Vec::new();
    f.take(MAX_IMAGE_BYTES).read_to_end(&mut raw).ok()?;
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(&raw), image::ImageFormat::Png);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_DECODE_SIDE);
    limits.max_image_height = Some(MAX_DECODE_SIDE);
    limits.max_alloc = Some(256 * 1024 * 1024);
    reader.limits(limits);
    let img = reader.decode().ok()?;
    let (w, h) = (img.width(), img.height());
    let mut scale = ((budget as f64) / (raw.len().max(1) as f64)).sqrt() * 0.9;
    for _ in 0..5 {
        let nw = ((f64::from(w) * scale) as u32).max(16);
        let nh = ((f64::from(h) * scale) as u32).max(16);
        if nw >= w && nh >= h {
            return None;
        }
        let small = img.resize(nw, nh, image::imageops::FilterType::Triangle);
        let mut out = std::io::Cursor::new(Vec::new());
        small.write_to(&mut out, image::ImageFormat::Png).ok()?;
        let bytes = out.into_inner();
        if bytes.len() as u64 <= budget {
            return Some(Downscaled {
                bytes,
                from: (w, h),
                to: (small.width(), small.height()),
            });
        }
        scale *= 0.7;
    }
    None
}

/// Reads a figure the host saved, never through a link the kernel planted
/// in its session directory ([`cellhost_sessions::cell::hostfs::open_verified`]).
fn read_image(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let f = cellhost_sessions::cell::hostfs::open_verified(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len > MAX_IMAGE_BYTES {
        return Err(format!("{len} bytes, more than {MAX_IMAGE_BYTES}"));
    }
    let mut bytes = Vec::new();
    f.take(MAX_IMAGE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The text part: status line, then stdout, stderr, result, error,
/// truncation notes with how to page, interrupt, crash, hint.
pub fn text(r: &CellResult, image_notes: &[String]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "status: {} (execution_count {}, {} ms, session \"{}\", kernel generation {})",
        r.status.as_str(),
        r.execution_count,
        r.duration_ms,
        r.kernel.session,
        r.kernel.generation
    );
    s.push('\n');
    if !r.kernel.reused
        && let Some(line) = r.kernel.sandbox.degradation()
    {
        let _ = writeln!(s, "{line}");
    }
    if let Some(back) = &r.restored {
        let _ = writeln!(s, "RESTORED: {}", back.summary());
    } else if r.kernel.state_reset {
        let why = r.kernel.reset_reason.as_deref().unwrap_or("a new kernel");
        let _ = writeln!(
            s,
            "STATE RESET: variables of earlier cells are gone ({why}); re-run the cells that define them."
        );
    }
    section(&mut s, "stdout", &r.stdout);
    section(&mut s, "stderr", &r.stderr);
    if let Some(res) = &r.result {
        let shown = res
            .get("text/plain")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| {
                let kinds: Vec<&str> = res.keys().map(String::as_str).collect();
                format!("(a value shown as {})", kinds.join(", "))
            });
        section(&mut s, "result", &shown);
    }
    if let Some(e) = &r.error {
        let mut body = format!("{}: {}", e.ename, e.evalue);
        if !e.traceback.is_empty() {
            body.push('\n');
            body.push_str(&e.traceback.join("\n"));
        }
        section(&mut s, "error", &body);
    }
    if !image_notes.is_empty() {
        section(&mut s, "figures", &image_notes.join("\n"));
    }
    if let Some(d) = &r.displays_dropped {
        let _ = writeln!(
            s,
            "[displays not kept: {} dropped ({} bytes) over the cell's display limit, {} withheld because their data contained a registered secret]",
            d.count, d.bytes, d.withheld
        );
    }
    for (stream, t) in &r.truncated {
        let _ = writeln!(
            s,
            "[{stream} truncated: {} of {} bytes shown, {} omitted from the middle.",
            t.shown_bytes, t.total_bytes, t.omitted_bytes
        );
        if t.spill_path.is_some() {
            let _ = writeln!(
                s,
                " The full {stream} ({} bytes) can be paged with the read_output tool: {{\"cell\": \"{}\", \"stream\": \"{stream}\", \"offset\": 0, \"length\": 65536}}; each answer gives the next offset.]",
                t.spill_bytes, r.cell_id
            );
        } else {
            s.push_str(" The full stream was not kept.]\n");
        }
    }
    if let Some(i) = &r.interrupt {
        let _ = writeln!(
            s,
            "[interrupt: delivered {}, kernel killed {}, variables kept {}{}]",
            i.delivered,
            i.escalated,
            i.state_kept,
            i.reason.as_deref().map(|x| format!("; {x}")).unwrap_or_default()
        );
    }
    if let Some(c) = &r.crash {
        let _ = writeln!(s, "[crash: {}]", c.message);
    }
    if let Some(f) = r.fault {
        let _ = writeln!(s, "[fault: {f}: {}]", f.explain());
    }
    if let Some(bg) = &r.background_output
        && !bg.is_empty()
    {
        section(
            &mut s,
            "background output (threads or children of earlier cells)",
            &format!("{}{}", bg.stdout, bg.stderr),
        );
    }
    if let Some(h) = &r.hint {
        let _ = writeln!(s, "hint: {h}");
    }
    let _ = write!(s, "cell id: {}", r.cell_id);
    s
}

fn section(s: &mut String, name: &str, body: &str) {
    if body.is_empty() {
        return;
    }
    let _ = writeln!(s, "--- {name} ---");
    s.push_str(body);
    if !body.ends_with('\n') {
        s.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellhost_sessions::cell::{CellError, CellStatus, KernelRef, Truncation};

    fn result() -> CellResult {
        CellResult {
            cell_id: "c-1".into(),
            status: CellStatus::Error,
            execution_count: 3,
            stdout: "hello\n".into(),
            stderr: String::new(),
            result: None,
            displays: Vec::new(),
            result_index: None,
            displays_dropped: None,
            error: Some(CellError {
                ename: "ZeroDivisionError".into(),
                evalue: "division by zero".into(),
                traceback: vec!["Traceback (most recent call last):".into()],
            }),
            truncated: BTreeMap::from([(
                "stdout".to_string(),
                Truncation {
                    total_bytes: 200_000,
                    shown_bytes: 50_000,
                    omitted_bytes: 150_000,
                    spill_path: Some("/tmp/x.stdout".into()),
                    spill_bytes: 200_000,
                    spill_error: None,
                },
            )]),
            kernel: KernelRef {
                session: "default".into(),
                generation: 2,
                pid: 1,
                reused: true,
                state_reset: true,
                reset_reason: Some("the previous kernel died".into()),
                sandbox: Default::default(),
                placement: None,
            },
            interrupt: None,
            crash: None,
            fault: None,
            duration_ms: 12,
            queued_ms: 0,
            settled_at: None,
            usage: None,
            tool_calls: Vec::new(),
            background_output: None,
            cwd: None,
            hint: None,
            files: None,
            network: None,
            restored: None,
        }
    }

    use std::collections::BTreeMap;

    #[test]
    fn a_new_kernel_names_the_layers_not_in_force_once() {
        let mut r = result();
        r.kernel.reused = false;
        r.kernel.sandbox.missing = vec!["cgroup".into()];
        r.kernel.sandbox.reasons = BTreeMap::from([("cgroup".to_string(), "Permission denied".to_string())]);
        let t = text(&r, &[]);
        assert!(
            t.contains("sandbox auto: not in force here: cgroup (Permission denied)"),
            "{t}"
        );
        let v = cell_result(&r).structured_content.expect("structured");
        assert_eq!(
            v["kernel"]["sandbox"]["reasons"]["cgroup"], "Permission denied",
            "{v}"
        );
        r.kernel.reused = true;
        assert!(!text(&r, &[]).contains("not in force"), "said once per kernel");
    }

    #[test]
    fn status_first_then_streams_error_and_paging() {
        let r = result();
        let t = text(&r, &[]);
        assert!(t.starts_with("status: error (execution_count 3"), "{t}");
        assert!(t.contains("STATE RESET"), "{t}");
        let out = t.find("--- stdout ---").expect("stdout");
        let err = t.find("--- error ---").expect("error");
        assert!(out < err, "{t}");
        assert!(t.contains("ZeroDivisionError: division by zero"), "{t}");
        assert!(
            t.contains(r#"read_output tool: {"cell": "c-1", "stream": "stdout", "offset": 0"#),
            "{t}"
        );
        let call = cell_result(&r);
        // An exception in the cell is the cell's outcome, not a tool failure.
        assert_ne!(call.is_error, Some(true));
        let sc = call.structured_content.expect("structured");
        assert_eq!(sc["status"], "error");
        assert_eq!(sc["truncated"]["stdout"]["total_bytes"], 200_000);
    }
}
