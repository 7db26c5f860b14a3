//! Settling a cell: its captures finished, the worker's answer believed
//! only as far as it can be true, interrupts and crashes explained, the
//! result sealed (redacted, bounded) and sent to its caller.

use std::os::unix::process::ExitStatusExt;

use cellhost_capture::StreamCapture;
use cellhost_protocol::WorkerFrame;
use cellhost_sandbox::signal;
use serde_json::Value;

use super::io::push_capture;
use super::state::{Cause, Driver};
use crate::cell::LiveEvent;
use crate::error::KernelError;
use crate::hints;
use crate::link::{Stream, WorkerLink, describe_exit};
use crate::outputs;
use crate::result::{CellError, CellResult, CellStatus, CrashReport, InterruptReport, KernelRef, Usage};
use crate::seal;

impl<L: WorkerLink> Driver<L> {
    /// `Some(reason)` when the running cell hit the tree's process limit
    /// and processes other than the supervisor and the worker remain.
    pub(super) fn saturated_tree(&self) -> Option<String> {
        let cg = self.link.usage()?;
        let a = self.active.as_ref()?;
        if a.response.is_none() || cg.pids_limit_hits() <= a.pid_hits_at_start {
            return None;
        }
        let others = cg.processes().saturating_sub(2);
        (others > 0).then(|| {
            format!(
                "the cell's processes reached the kernel's process limit (pids.max {}) and {others} were still running; the kernel's whole tree was killed",
                cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string())
            )
        })
    }

    pub(super) fn settle(&mut self) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        for s in 0..2 {
            // A cell that never wrote its start marker (its worker died
            // first): what came was not its own.
            let early = a.start_scan[s].take_held();
            if !early.is_empty() {
                let text = cellhost_capture::render_once(&early);
                let b = &mut a.background;
                let buf = if s == 0 { &mut b.stdout } else { &mut b.stderr };
                seal::push_capped(buf, &mut b.dropped_bytes, &self.config.redactor.redact(&text));
            }
            let held = a.scan[s].take_held();
            let stream = Stream::BOTH[s];
            self.link
                .cell_output(stream, &held, &mut |b| push_capture(&mut a, s, b));
            self.link
                .flush_cell_output(stream, &mut |b| push_capture(&mut a, s, b));
        }
        let [out, err] = [a.capture[0].take(), a.capture[1].take()].map(|c| c.map(StreamCapture::finish));
        let mut truncated = std::collections::BTreeMap::new();
        let mut texts = [String::new(), String::new()];
        for (i, (fin, name)) in [(out, "stdout"), (err, "stderr")].into_iter().enumerate() {
            if let Some(fin) = fin {
                if !fin.live_tail.is_empty()
                    && let Some(live) = &a.q.options.live
                {
                    let ev = if i == 0 {
                        LiveEvent::Stdout(fin.live_tail.clone())
                    } else {
                        LiveEvent::Stderr(fin.live_tail.clone())
                    };
                    let _ = live.send(ev);
                }
                texts[i] = fin.text;
                if let Some(t) = fin.truncation {
                    truncated.insert(name.to_string(), t);
                }
            }
        }
        let [stdout, stderr] = texts;
        let redactor = self.config.redactor.clone();
        let mut status;
        // A cell whose kernel died before it answered still took a number
        // (the worker counts a cell as soon as it starts it).
        let mut execution_count = if a.q.options.silent {
            self.execution_count
        } else {
            self.execution_count.saturating_add(1)
        };
        let mut result = None;
        let mut error = None;
        let mut usage = None;
        let mut cwd = None;
        let mut crash = None;
        let mut files = None;
        let mut result_at = None;
        if let Some(WorkerFrame::Response {
            status: st,
            execution_count: ec,
            result: res,
            error: er,
            usage: us,
            cwd: c,
            files: fl,
            result_at: ra,
            ..
        }) = a.response.take()
        {
            result_at = ra;
            status = match st.as_str() {
                "ok" => CellStatus::Ok,
                "interrupted" => CellStatus::Interrupted,
                _ => CellStatus::Error,
            };
            // The worker's count is believed only where it can be true: the
            // previous count, or one more (a hostile worker must not make
            // the host's own count overflow or jump).
            let resumed = a.q.options.silent && a.q.options.resume_count == Some(ec);
            if resumed || ec == self.execution_count || ec == self.execution_count.saturating_add(1) {
                execution_count = ec;
            }
            self.execution_count = execution_count;
            result = res.and_then(|r| {
                if !a.budget.admit(outputs::bundle_size(&r, &serde_json::Map::new())) {
                    return None;
                }
                let max_text = self.config.display_limits.max_inline_text;
                match outputs::save_bundle(r, &self.config.session_dir, &a.dir, "result", &redactor, max_text)
                {
                    outputs::Saved::Bundle(b) => Some(b),
                    outputs::Saved::Withheld(mime) => {
                        a.budget.withheld();
                        Some(outputs::withheld_note(&mime).data)
                    }
                }
            });
            error = er.and_then(|e| parse_error(e, &redactor));
            usage = us.and_then(|u| serde_json::from_value::<Usage>(u).ok());
            cwd = c;
            files = fl.map(|mut f| {
                for p in f.read.iter_mut().chain(f.write.iter_mut()) {
                    *p = redactor.redact(p).into_owned();
                }
                f
            });
        } else if let Some(msg) = &self.protocol_error {
            status = CellStatus::Crashed;
            crash = Some(CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: format!(
                    "protocol error from the worker (kernel {} killed): {msg}",
                    self.label
                ),
                // A cell that could not be sent (the worker already dead)
                // never started.
                reason: (!a.started_code).then(|| crate::result::CRASH_NOT_STARTED.to_string()),
            });
        } else {
            status = CellStatus::Crashed;
            let mut report = self.crash_report(a.pid_hits_at_start, a.oom_kills_at_start);
            if !a.started_code && report.reason.is_none() {
                // The worker died before it took the cell (killed while
                // idle, before the host saw it die): none of the code ran.
                report.reason = Some(crate::result::CRASH_NOT_STARTED.to_string());
            }
            crash = Some(report);
        }
        let mut interrupt = None;
        if let Some(why) = &a.tree_killed {
            crash = None;
            if let Some(i) = &a.interrupt {
                status = match i.cause {
                    Cause::User => CellStatus::Interrupted,
                    Cause::Timeout => CellStatus::Timeout,
                };
                interrupt = Some(InterruptReport {
                    delivered: i.delivered,
                    target: Some(i.target.clone()),
                    escalated: true,
                    state_kept: false,
                    reason: Some(why.clone()),
                });
            } else {
                // Nobody interrupted the cell: the host killed its kernel
                // (process limit reached), whatever the worker answered.
                status = CellStatus::Crashed;
                crash = Some(CrashReport {
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    signal_name: Some(signal::signal_name(libc::SIGKILL)),
                    message: why.clone(),
                    reason: None,
                });
            }
        } else if let Some(i) = &a.interrupt {
            let escalated = i.escalation.is_some();
            if escalated || status != CellStatus::Ok {
                status = match i.cause {
                    Cause::User => CellStatus::Interrupted,
                    Cause::Timeout => CellStatus::Timeout,
                };
            }
            if escalated {
                crash = None;
            }
            let mut reason = i.escalation.clone().or_else(|| i.not_delivered.clone());
            if escalated
                && let Some(cg) = self.link.usage()
                && cg.pids_limit_hits() > a.pid_hits_at_start
            {
                let max = cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string());
                reason = Some(format!(
                    "the cell's processes reached the kernel's process limit (pids.max {max}); {}",
                    reason.unwrap_or_default()
                ));
            }
            interrupt = Some(InterruptReport {
                delivered: i.delivered,
                target: Some(i.target.clone()),
                escalated,
                state_kept: !escalated,
                reason,
            });
        }
        self.cells_settled += 1;
        let reused = self.cells_settled > 1;
        let truncated_any = !truncated.is_empty();
        let displays_dropped = a.budget.report();
        let mut displays = a.displays;
        let result_index = result_at
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| result.is_some() && n < displays.len());
        displays.extend(a.budget.drop_note());
        let fault = {
            let cg = self.link.usage();
            let evidence = crate::fault::Evidence {
                oom_kills: cg.map_or(0, |u| u.oom_kills().saturating_sub(a.oom_kills_at_start)),
                pids_hits: cg.map_or(0, |u| u.pids_limit_hits().saturating_sub(a.pid_hits_at_start)),
                signal: crash.as_ref().and_then(|c| c.signal),
                error: error.as_ref(),
            };
            crate::fault::classify(status, &evidence)
        };
        let mut res = CellResult {
            cell_id: a.q.id.clone(),
            status,
            execution_count,
            stdout,
            stderr,
            result,
            displays,
            result_index,
            displays_dropped,
            error,
            truncated,
            kernel: KernelRef {
                session: self.info.session.clone(),
                generation: self.info.generation,
                pid: self.info.pid,
                reused,
                state_reset: false,
                reset_reason: None,
                sandbox: crate::result::SandboxRef::of(&self.info.sandbox),
                placement: self.info.placement.clone(),
            },
            interrupt,
            crash,
            fault,
            duration_ms: a.started.elapsed().as_millis() as u64,
            queued_ms: a.started.saturating_duration_since(a.q.submitted).as_millis() as u64,
            settled_at: Some(std::time::SystemTime::now()),
            usage,
            tool_calls: std::mem::take(&mut a.tool_calls),
            background_output: (!a.background.is_empty()).then_some(a.background),
            cwd,
            hint: None,
            files,
            network: self.config.egress.as_ref().and_then(|e| e.log.take()),
            restored: None,
        };
        res.hint = hints::hint_for(&res, &self.config, truncated_any);
        // The one place a result leaves the kernel crate: every text field
        // redacted, everything the worker sent bounded.
        seal::seal_result(&mut res, &redactor);
        let settled = self.cells_settled;
        self.set_shared(|s| {
            s.running = None;
            s.cells_settled = settled;
        });
        let _ = a.q.reply.send(Ok(res));
    }

    /// How the worker died; `pid_hits_at_start` is the tree's
    /// process-limit hits when the cell started.
    fn crash_report(&self, pid_hits_at_start: u64, oom_kills_at_start: u64) -> CrashReport {
        if let Some(lost) = self.link.lost_reason() {
            return CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: format!("the kernel's worker is unreachable: {lost}; its state is gone"),
                reason: Some(lost),
            };
        }
        match self.exit {
            Some(st) => {
                let signal_num = st.signal();
                let code = st.code();
                let signal_name = signal_num.map(signal::signal_name);
                let mut message = format!("the worker process {}", describe_exit(st));
                let oom = self
                    .link
                    .usage()
                    .map_or(0, |u| u.oom_kills().saturating_sub(oom_kills_at_start));
                if oom > 0 {
                    message.push_str(&format!(
                        ": out of memory, the kernel's memory limit ({}) was reached and the OOM killer ended it",
                        self.config.limits.memory_bytes.map_or_else(|| "?".into(), |b| format!("{} MiB", b >> 20))
                    ));
                } else if let Some(cg) = self
                    .link
                    .usage()
                    .filter(|cg| cg.pids_limit_hits() > pid_hits_at_start)
                {
                    message.push_str(&format!(
                        ": the kernel's process limit (pids.max {}) was reached (threads count too)",
                        cg.pids_max().map_or_else(|| "?".into(), |n| n.to_string())
                    ));
                } else if signal_num == Some(libc::SIGSYS) {
                    message.push_str(": it made a system call the sandbox forbids (seccomp)");
                } else if signal_num == Some(libc::SIGKILL) {
                    message.push_str(" (killed from outside: often the out-of-memory killer)");
                }
                CrashReport {
                    exit_code: code,
                    signal: signal_num,
                    signal_name,
                    message,
                    reason: None,
                }
            }
            None => CrashReport {
                exit_code: None,
                signal: None,
                signal_name: None,
                message: "the worker's output ended without a result".into(),
                reason: None,
            },
        }
    }
}

fn parse_error(v: Value, redactor: &cellhost_capture::Redactor) -> Option<CellError> {
    let e: CellError = serde_json::from_value(v).ok()?;
    Some(CellError {
        ename: e.ename,
        evalue: redactor.redact(&e.evalue).into_owned(),
        traceback: e
            .traceback
            .iter()
            .map(|l| redactor.redact(l).into_owned())
            .collect(),
    })
}

pub(super) fn clone_dead(e: &KernelError) -> KernelError {
    match e {
        KernelError::Dead { kernel, reason } => KernelError::Dead {
            kernel: kernel.clone(),
            reason: reason.clone(),
        },
        other => KernelError::Dead {
            kernel: "?".into(),
            reason: other.to_string(),
        },
    }
}
