//! The one place where what a kernel produced is made fit to leave the
//! kernel crate: every text field redacted, everything the worker sent
//! bounded.
//!
//! [`seal_result`] destructures a [`CellResult`] and each of its parts
//! without `..`, so a field added to any of them does not compile until it
//! is handled here. The driver calls it on every result just before handing
//! it out (the caller, the journal and every surface see only sealed
//! results); live displays go through [`seal_display`] and variables
//! through [`seal_variables`].

use cellhost_capture::{Redactor, Truncation};
use serde_json::Value;

use crate::cell::Variables;
use crate::outputs::{self, value_size};
use crate::result::{
    BackgroundOutput, CellError, CellResult, CrashReport, DisplayOutput, DisplaysDropped, FilesOpened,
    InterruptReport, KernelRef, SandboxRef, Usage,
};
use crate::tools::ToolCallRecord;

/// Background output kept per stream for a result (README: 16 KiB).
pub(crate) const BACKGROUND_CAP: usize = 16 * 1024;
/// Longest working directory reported (Linux `PATH_MAX`).
const CWD_MAX: usize = 4096;
/// Longest exception class name.
const ENAME_MAX: usize = 256;
/// Longest exception message.
const EVALUE_MAX: usize = 16 * 1024;
/// Traceback lines kept, each at most `TB_LINE_MAX` bytes, at most
/// `TB_TOTAL` bytes in all.
const TB_LINES: usize = 200;
const TB_LINE_MAX: usize = 4096;
const TB_TOTAL: usize = 64 * 1024;
/// Paths kept per list of `files` (the worker's own cap), each at most
/// `CWD_MAX` bytes.
const FILES_MAX: usize = 256;
/// Longest string inside a variable's description.
const VAR_STRING_MAX: usize = 4096;
/// Bytes of variable descriptions answered at most.
const VARS_TOTAL: u64 = 1 << 20;
/// Most variables answered (the protocol's `limit` cap).
const VARS_MAX: usize = 500;
/// Longest worker `log` message passed to the host's log.
pub(crate) const LOG_MAX: usize = 4096;
/// Largest host-call arguments (JSON text) handed to a tool.
pub(crate) const HOST_CALL_ARGS_MAX: usize = 1 << 20;

/// Redacts a string in place (no copy when nothing is masked).
fn redact(s: &mut String, r: &Redactor) {
    if let std::borrow::Cow::Owned(o) = r.redact(s) {
        *s = o;
    }
}

/// Cuts `s` to at most `max` bytes (on a character boundary), appending
/// ` … [N bytes cut]`. Returns the bytes cut.
pub(crate) fn cut(s: &mut String, max: usize) -> u64 {
    if s.len() <= max {
        return 0;
    }
    let at = s.floor_char_boundary(max);
    let gone = (s.len() - at) as u64;
    s.truncate(at);
    s.push_str(&format!(" … [{gone} bytes cut]"));
    gone
}

/// Cuts `s` to at most `max` bytes silently; returns the bytes cut.
fn cut_quiet(s: &mut String, max: usize) -> u64 {
    if s.len() <= max {
        return 0;
    }
    let at = s.floor_char_boundary(max);
    let gone = (s.len() - at) as u64;
    s.truncate(at);
    gone
}

/// Appends `text` to `buf`, keeping `buf` within [`BACKGROUND_CAP`]; the
/// rest counts in `dropped`.
pub(crate) fn push_capped(buf: &mut String, dropped: &mut u64, text: &str) {
    let room = BACKGROUND_CAP.saturating_sub(buf.len());
    if text.len() <= room {
        buf.push_str(text);
    } else {
        let at = text.floor_char_boundary(room);
        buf.push_str(&text[..at]);
        *dropped = dropped.saturating_add((text.len() - at) as u64);
    }
}

/// Redacts and bounds every field of a result.
pub(crate) fn seal_result(res: &mut CellResult, r: &Redactor) {
    let CellResult {
        cell_id: _,
        status: _,
        execution_count: _,
        stdout,
        stderr,
        result,
        displays,
        result_index: _,
        displays_dropped,
        error,
        truncated,
        kernel,
        interrupt,
        crash,
        fault: _,
        duration_ms: _,
        queued_ms: _,
        settled_at: _,
        usage,
        tool_calls,
        background_output,
        cwd,
        hint,
        files,
        network,
        restored: _,
    } = res;
    // A host name is text the cell chose (a secret spelled as a name
    // label, say): masked like every other.
    if let Some(n) = network {
        for d in n.denied.iter_mut() {
            redact(&mut d.host, r);
            if let Some(s) = d.sni.as_mut() {
                redact(s, r);
            }
        }
    }
    redact(stdout, r);
    redact(stderr, r);
    if let Some(b) = result.take() {
        *result = match outputs::redact_value(Value::Object(b), r) {
            Value::Object(b) => Some(b),
            _ => None,
        };
    }
    for d in displays.iter_mut() {
        seal_display(d, r);
    }
    // Counts only; destructured so that a text field added later must be
    // handled here.
    if let Some(DisplaysDropped {
        count: _,
        bytes: _,
        withheld: _,
    }) = displays_dropped
    {}
    if let Some(e) = error {
        seal_error(e, r);
    }
    for t in truncated.values_mut() {
        let Truncation {
            total_bytes: _,
            shown_bytes: _,
            omitted_bytes: _,
            spill_path,
            spill_bytes: _,
            spill_error,
        } = t;
        if let Some(p) = spill_path
            && let Some(text) = p.to_str()
            && let std::borrow::Cow::Owned(masked) = r.redact(text)
        {
            *p = masked.into();
        }
        if let Some(e) = spill_error {
            redact(e, r);
        }
    }
    let KernelRef {
        session,
        generation: _,
        pid: _,
        reused: _,
        state_reset: _,
        placement: _,
        reset_reason,
        sandbox:
            SandboxRef {
                mode: _,
                missing,
                reasons,
                enforced,
            },
    } = kernel;
    redact(session, r);
    for layer in missing.iter_mut().chain(enforced.iter_mut()) {
        redact(layer, r);
    }
    *reasons = std::mem::take(reasons)
        .into_iter()
        .map(|(mut layer, mut why)| {
            redact(&mut layer, r);
            redact(&mut why, r);
            (layer, why)
        })
        .collect();
    if let Some(why) = reset_reason {
        redact(why, r);
    }
    if let Some(InterruptReport {
        delivered: _,
        target,
        escalated: _,
        state_kept: _,
        reason,
    }) = interrupt
    {
        for s in [target, reason].into_iter().flatten() {
            redact(s, r);
        }
    }
    if let Some(CrashReport {
        exit_code: _,
        signal: _,
        signal_name,
        message,
        reason: _,
    }) = crash
    {
        if let Some(s) = signal_name {
            redact(s, r);
        }
        redact(message, r);
    }
    if let Some(Usage {
        cpu_s,
        peak_rss_kb: _,
    }) = usage
        && !(cpu_s.is_finite() && *cpu_s >= 0.0)
    {
        *cpu_s = 0.0;
    }
    for t in tool_calls.iter_mut() {
        let ToolCallRecord {
            name,
            args_preview,
            duration_ms: _,
            outcome,
            error,
        } = t;
        for s in [name, args_preview, outcome].into_iter().chain(error.as_mut()) {
            redact(s, r);
        }
    }
    if let Some(b) = background_output.as_mut() {
        let BackgroundOutput {
            stdout,
            stderr,
            dropped_bytes,
        } = b;
        for s in [stdout, stderr] {
            redact(s, r);
            *dropped_bytes = dropped_bytes.saturating_add(cut_quiet(s, BACKGROUND_CAP));
        }
    }
    if let Some(c) = cwd {
        redact(c, r);
        cut(c, CWD_MAX);
    }
    if let Some(h) = hint {
        redact(h, r);
    }
    if let Some(FilesOpened {
        read,
        write,
        truncated,
    }) = files
    {
        for list in [read, write] {
            if list.len() > FILES_MAX {
                list.truncate(FILES_MAX);
                *truncated = true;
            }
            for p in list.iter_mut() {
                redact(p, r);
                cut(p, CWD_MAX);
            }
        }
    }
}

/// Redacts and bounds an exception.
fn seal_error(e: &mut CellError, r: &Redactor) {
    let CellError {
        ename,
        evalue,
        traceback,
    } = e;
    redact(ename, r);
    cut(ename, ENAME_MAX);
    redact(evalue, r);
    cut(evalue, EVALUE_MAX);
    let lines = traceback.len();
    let mut total = 0usize;
    let mut kept = 0usize;
    for line in traceback.iter_mut() {
        if kept >= TB_LINES || total >= TB_TOTAL {
            break;
        }
        redact(line, r);
        cut(line, TB_LINE_MAX);
        total += line.len();
        kept += 1;
    }
    if kept < lines {
        traceback.truncate(kept);
        traceback.push(format!("… [{} traceback lines cut]", lines - kept));
    }
}

/// Redacts every string of a display (data and metadata).
pub(crate) fn seal_display(d: &mut DisplayOutput, r: &Redactor) {
    let DisplayOutput { data, metadata } = d;
    for map in [data, metadata] {
        let taken = std::mem::take(map);
        if let Value::Object(m) = outputs::redact_value(Value::Object(taken), r) {
            *map = m;
        }
    }
}

/// Redacts and bounds the worker's answer to `inspect_variables`: at most
/// `limit` (and 500) variables and 1 MiB of descriptions, each string at
/// most 4 KiB; `truncated` is set when anything was left out.
pub(crate) fn seal_variables(variables: Vec<Value>, truncated: bool, limit: u32, r: &Redactor) -> Variables {
    let max = (limit as usize).min(VARS_MAX);
    let mut out = Vec::with_capacity(variables.len().min(max));
    let mut total = 0u64;
    let mut truncated = truncated || variables.len() > max;
    for v in variables.into_iter().take(max) {
        let v = bound_strings(outputs::redact_value(v, r));
        total += value_size(&v);
        if total > VARS_TOTAL {
            truncated = true;
            break;
        }
        out.push(v);
    }
    Variables {
        variables: out,
        truncated,
    }
}

/// Cuts every string inside `v` to [`VAR_STRING_MAX`] bytes.
fn bound_strings(v: Value) -> Value {
    match v {
        Value::String(mut s) => {
            cut(&mut s, VAR_STRING_MAX);
            Value::String(s)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(bound_strings).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(mut k, v)| {
                    cut(&mut k, VAR_STRING_MAX);
                    (k, bound_strings(v))
                })
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{CellStatus, MimeBundle};
    use serde_json::json;

    const SECRET: &str = "Zq7-very-secret-Value";

    fn redactor() -> Redactor {
        let mut r = Redactor::new(Default::default()).expect("redactor");
        r.add_secrets([SECRET.to_string()]);
        r
    }

    fn bundle(text: &str) -> MimeBundle {
        let mut m = MimeBundle::new();
        m.insert("text/plain".into(), Value::String(text.into()));
        m
    }

    /// A result with the secret in every text field it has.
    fn poisoned() -> CellResult {
        let s = SECRET.to_string();
        let mut truncated = std::collections::BTreeMap::new();
        truncated.insert(
            "stdout".to_string(),
            Truncation {
                total_bytes: 1,
                shown_bytes: 1,
                omitted_bytes: 0,
                spill_path: Some(format!("/tmp/{s}/stdout.txt").into()),
                spill_bytes: 0,
                spill_error: Some(s.clone()),
            },
        );
        CellResult {
            cell_id: "c1".into(),
            status: CellStatus::Error,
            execution_count: 1,
            stdout: s.clone(),
            stderr: s.clone(),
            result: Some(bundle(&s)),
            displays: vec![DisplayOutput {
                data: bundle(&s),
                metadata: json!({ "title": s }).as_object().cloned().unwrap_or_default(),
            }],
            result_index: None,
            displays_dropped: None,
            error: Some(CellError {
                ename: s.clone(),
                evalue: s.clone(),
                traceback: vec![s.clone()],
            }),
            truncated,
            kernel: KernelRef {
                session: "default".into(),
                generation: 1,
                pid: 1,
                reused: false,
                state_reset: true,
                reset_reason: Some(s.clone()),
                sandbox: SandboxRef {
                    mode: cellhost_sandbox::profile::SandboxMode::Auto,
                    missing: vec![s.clone()],
                    reasons: [(s.clone(), s.clone())].into(),
                    enforced: vec![s.clone()],
                },
                placement: None,
            },
            interrupt: Some(InterruptReport {
                delivered: true,
                target: None,
                escalated: false,
                state_kept: true,
                reason: Some(s.clone()),
            }),
            crash: Some(CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: s.clone(),
                reason: None,
            }),
            fault: Some(crate::fault::Fault::Oom),
            duration_ms: 0,
            queued_ms: 0,
            settled_at: None,
            usage: Some(Usage {
                cpu_s: f64::NAN,
                peak_rss_kb: 0,
            }),
            tool_calls: vec![ToolCallRecord {
                name: "t".into(),
                args_preview: s.clone(),
                duration_ms: 0,
                outcome: "error".into(),
                error: Some(s.clone()),
            }],
            background_output: Some(BackgroundOutput {
                stdout: s.clone(),
                stderr: "x".repeat(3 * BACKGROUND_CAP),
                dropped_bytes: 0,
            }),
            cwd: Some(format!("/work/{s}")),
            hint: Some(s.clone()),
            files: Some(FilesOpened {
                read: vec![format!("/work/{s}"); 300],
                write: vec![],
                truncated: false,
            }),
            network: Some(cellhost_egress::NetworkReport {
                denied: vec![cellhost_egress::Denial {
                    host: s.clone(),
                    port: 443,
                    reason: cellhost_egress::DenyReason::NotAllowed,
                    sni: Some(s.clone()),
                }],
                dropped: 0,
            }),
            restored: None,
        }
    }

    #[test]
    fn every_text_field_is_redacted() {
        let mut res = poisoned();
        let raw = serde_json::to_string(&res).expect("json");
        assert!(
            raw.matches(SECRET).count() > 15,
            "the fixture holds the secret everywhere"
        );
        seal_result(&mut res, &redactor());
        let sealed = serde_json::to_string(&res).expect("json");
        assert!(!sealed.contains(SECRET), "{sealed}");
        assert!(!sealed.contains("very-secret"), "{sealed}");
    }

    #[test]
    fn worker_supplied_fields_are_bounded() {
        let mut res = poisoned();
        res.cwd = Some("/".to_string() + &"d".repeat(1 << 20));
        res.error = Some(CellError {
            ename: "E".repeat(10_000),
            evalue: "v".repeat(1 << 20),
            traceback: vec!["line".repeat(2000); 5000],
        });
        seal_result(&mut res, &Redactor::disabled());
        assert!(res.cwd.as_ref().expect("cwd").len() < CWD_MAX + 64);
        let e = res.error.as_ref().expect("error");
        assert!(e.ename.len() < ENAME_MAX + 64 && e.evalue.len() < EVALUE_MAX + 64);
        assert!(e.traceback.len() <= TB_LINES + 1);
        assert!(e.traceback.iter().map(String::len).sum::<usize>() < TB_TOTAL + TB_LINE_MAX + 128);
        assert!(e.traceback.last().expect("note").contains("traceback lines cut"));
        let bg = res.background_output.as_ref().expect("bg");
        assert_eq!(bg.stderr.len(), BACKGROUND_CAP);
        assert_eq!(bg.dropped_bytes, 2 * BACKGROUND_CAP as u64);
        let f = res.files.as_ref().expect("files");
        assert!(f.read.len() == FILES_MAX && f.truncated);
        assert_eq!(res.usage.as_ref().expect("usage").cpu_s, 0.0);
    }

    #[test]
    fn variables_are_redacted_and_bounded() {
        let vars: Vec<Value> = (0..600)
            .map(|i| json!({"name": format!("v{i}"), "preview": format!("{SECRET} {}", "p".repeat(10_000))}))
            .collect();
        let v = seal_variables(vars, false, 100, &redactor());
        assert_eq!(v.variables.len(), 100);
        assert!(v.truncated);
        let text = serde_json::to_string(&v.variables).expect("json");
        assert!(!text.contains(SECRET));
        assert!(text.len() < (VARS_TOTAL as usize) + 4096);
        let v = seal_variables(
            vec![json!({"preview": "x".repeat(1 << 20)}); 500],
            false,
            500,
            &redactor(),
        );
        assert!(v.truncated && v.variables.len() < 500);
    }
}
