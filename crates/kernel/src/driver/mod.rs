//! The task that owns one kernel: its [`WorkerLink`], its queue of cells,
//! caller commands and deadlines.
//!
//! Everything about a kernel happens here, in one place and in order:
//! frames, output bytes, the worker's exit, caller commands and deadlines.
//! A cell *settles* only when its `response` frame and its end marker on
//! both output streams have arrived (or the worker died), so no late byte
//! of a cell leaks into the next one. The driver knows the protocol and
//! the cell's rules; how bytes and frames move is the link's business.
//!
//! By concern: [`state`] (the types), this module (the event loop,
//! commands, frames, starting cells), `io` (output bytes and background
//! text), `host_calls`, `escalation` (interrupts, deadlines, kills),
//! `settle` (a cell's result).

use std::process::ExitStatus;
use std::time::Instant;

use cellhost_capture::{StreamCapture, StreamLimits};
use cellhost_protocol::frame::ExecuteOptions;
use cellhost_protocol::{HostFrame, WorkerFrame};

use crate::cell::{CellProgress, LiveEvent};
use crate::error::KernelError;
use crate::link::{LinkEvent, WorkerLink, describe_exit};
use crate::marker::MarkerScanner;
use crate::outputs;
use crate::result::DisplayOutput;
use crate::seal::{self, BACKGROUND_CAP};

mod escalation;
mod host_calls;
mod io;
mod settle;
pub(crate) mod state;
#[cfg(test)]
mod tests;

use escalation::escalation_reason;
use state::{ActiveCell, BACKGROUND_SLACK, Cause, DRAIN_AFTER_EXIT, KILL_GRACE, MARKER_WAIT};
pub(crate) use state::{Command, Driver, QueuedCell, Shared};

impl<L: WorkerLink> Driver<L> {
    fn next_deadline(&self) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |x| x.min(t)));
            }
        };
        // Only timers that can still change something: a deadline left in
        // the past would fire on every turn of the loop.
        if self.out_open.contains(&true) {
            consider(self.drain_until);
        }
        if self.exit.is_none() {
            consider(self.kill_requested.map(|t| t + KILL_GRACE));
        }
        if let Some(a) = &self.active {
            if a.interrupt.is_none() && a.response.is_none() {
                consider(a.deadline);
            }
            if let Some(i) = a.interrupt.as_ref().filter(|i| i.escalation.is_none()) {
                consider(Some(i.probe_until.unwrap_or(i.escalate_at)));
            }
            consider(a.response_at.map(|t| t + MARKER_WAIT));
        }
        d
    }

    pub(crate) async fn run(mut self) {
        loop {
            if self.dead && self.active.is_none() && self.queue.is_empty() && !self.cmds_open {
                break;
            }
            if self.dead && !self.cmds_open {
                break;
            }
            let deadline = self.next_deadline();
            tokio::select! {
                cmd = self.cmd_rx.recv(), if self.cmds_open => match cmd {
                    Some(c) => self.on_command(c).await,
                    None => {
                        self.cmds_open = false;
                        if !self.dead {
                            self.request_kill();
                        }
                    }
                },
                ev = self.link.next_event() => self.on_link_event(ev).await,
                Some(done) = self.tool_done_rx.recv() => self.on_tool_done(done).await,
                _ = sleep_opt(deadline) => self.on_timer().await,
            }
            self.after_event().await;
        }
        self.finish_waiters();
    }

    fn finish_waiters(&mut self) {
        for w in self.kill_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    async fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Execute(cell) => {
                if self.dead || self.kill_requested.is_some() {
                    let err = self.dead_error();
                    self.set_shared(|s| s.queued = s.queued.saturating_sub(1));
                    let _ = cell.reply.send(Err(err));
                } else {
                    self.queue.push_back(*cell);
                }
            }
            Command::Interrupt { cell, reply } => {
                let out = self.interrupt(cell, Cause::User).await;
                let _ = reply.send(out);
            }
            Command::Inspect { limit, reply } => {
                if self.dead {
                    let _ = reply.send(Err(self.dead_error()));
                } else if let Some(a) = &self.active {
                    let _ = reply.send(Err(KernelError::KernelBusy {
                        kernel: self.label.clone(),
                        cell: a.q.id.clone(),
                    }));
                } else if !self.queue.is_empty() || self.inspect.is_some() {
                    let _ = reply.send(Err(KernelError::KernelBusy {
                        kernel: self.label.clone(),
                        cell: "queued".into(),
                    }));
                } else {
                    self.seq += 1;
                    let id = format!("v{}", self.seq);
                    match self
                        .link
                        .send(&HostFrame::InspectVariables {
                            id: id.clone(),
                            limit,
                        })
                        .await
                    {
                        Ok(()) => self.inspect = Some((id, limit, reply)),
                        Err(e) => {
                            let _ = reply.send(Err(KernelError::Protocol {
                                kernel: self.label.clone(),
                                source: e,
                            }));
                        }
                    }
                }
            }
            Command::Peek { cell, reply } => {
                let progress = if let Some(a) = self.active.as_ref().filter(|a| a.q.id == cell) {
                    Some(CellProgress {
                        cell_id: cell,
                        state: "running".into(),
                        stdout_tail: a.peek[0].clone(),
                        stderr_tail: a.peek[1].clone(),
                        elapsed_ms: a.started.elapsed().as_millis() as u64,
                    })
                } else if self.queue.iter().any(|q| q.id == cell) {
                    Some(CellProgress {
                        cell_id: cell,
                        state: "queued".into(),
                        stdout_tail: String::new(),
                        stderr_tail: String::new(),
                        elapsed_ms: 0,
                    })
                } else {
                    None
                };
                let _ = reply.send(progress);
            }
            Command::Kill { reply } => {
                if self.dead {
                    let _ = reply.send(());
                } else {
                    self.kill_waiters.push(reply);
                    self.request_kill();
                }
            }
        }
    }

    async fn on_link_event(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Frame(f) => self.on_frame(f).await,
            LinkEvent::ControlClosed => {}
            LinkEvent::ControlError(e) => {
                // A malformed or oversized frame: the channel cannot be
                // trusted. Fail the cell with a protocol error, kill the kernel.
                let msg = e.to_string();
                tracing::warn!(kernel = %self.label, "protocol error: {msg}");
                self.protocol_error = Some(msg);
                self.request_kill();
            }
            LinkEvent::Output { stream, bytes } => {
                self.on_bytes(stream, &bytes);
                self.link.recycle(stream, bytes);
            }
            LinkEvent::OutputClosed(stream) => self.out_open[stream.index()] = false,
            LinkEvent::Exited(status) => self.on_exit(status),
        }
    }

    async fn on_frame(&mut self, frame: WorkerFrame) {
        match frame {
            WorkerFrame::Response { ref id, .. } => {
                if let Some(a) = self.active.as_mut().filter(|a| a.q.id == *id) {
                    a.response = Some(frame);
                    a.response_at = Some(Instant::now());
                }
            }
            WorkerFrame::Display {
                id: _,
                data,
                metadata,
            } => {
                let Some(a) = self.active.as_mut() else {
                    return;
                };
                // Checked before anything is decoded or written: the host,
                // not the kernel's limits, pays for what is kept.
                if !a.budget.admit(outputs::bundle_size(&data, &metadata)) {
                    return;
                }
                let n = a.budget.kept();
                let redactor = &self.config.redactor;
                let max_text = self.config.display_limits.max_inline_text;
                let mut d = match outputs::save_bundle(
                    data,
                    &self.config.session_dir,
                    &a.dir,
                    &format!("display-{n}"),
                    redactor,
                    max_text,
                ) {
                    outputs::Saved::Bundle(data) => DisplayOutput { data, metadata },
                    outputs::Saved::Withheld(mime) => {
                        a.budget.withheld();
                        outputs::withheld_note(&mime)
                    }
                };
                seal::seal_display(&mut d, redactor);
                if let Some(live) = &a.q.options.live {
                    let _ = live.send(LiveEvent::Display(d.clone()));
                }
                a.displays.push(d);
            }
            WorkerFrame::HostCall {
                id,
                cell,
                method,
                args,
            } => self.on_host_call(id, cell, method, args).await,
            WorkerFrame::Variables {
                id,
                variables,
                truncated,
            } => {
                if self.inspect.as_ref().is_some_and(|(i, _, _)| *i == id)
                    && let Some((_, limit, reply)) = self.inspect.take()
                {
                    let _ = reply.send(Ok(seal::seal_variables(
                        variables,
                        truncated,
                        limit,
                        &self.config.redactor,
                    )));
                }
            }
            WorkerFrame::Background { stream, mut text } => {
                let idx = usize::from(stream == "stderr");
                let (buf, dropped) = match self.active.as_mut() {
                    Some(a) => {
                        let b = &mut a.background;
                        let buf = if idx == 0 { &mut b.stdout } else { &mut b.stderr };
                        (buf, &mut b.dropped_bytes)
                    }
                    None => (&mut self.background.text[idx], &mut self.background.dropped),
                };
                // Only what can still be kept is redacted (plus a margin so
                // a secret across the cut is masked whole); the rest of a
                // huge frame is counted, never copied.
                let room = BACKGROUND_CAP.saturating_sub(buf.len());
                let keep = text.floor_char_boundary(room.saturating_add(BACKGROUND_SLACK));
                *dropped = dropped.saturating_add((text.len() - keep) as u64);
                text.truncate(keep);
                let text = self.config.redactor.redact(&text);
                seal::push_capped(buf, dropped, &text);
            }
            WorkerFrame::InterruptAck {
                id, handler, raised, ..
            } => {
                if let Some(i) = self
                    .active
                    .as_mut()
                    .filter(|a| a.q.id == id)
                    .and_then(|a| a.interrupt.as_mut())
                {
                    i.handler = Some(handler);
                    i.raised = raised;
                    if i.probe_until.is_some() && i.escalation.is_none() {
                        i.escalation = Some(escalation_reason(i));
                        self.request_kill();
                    }
                }
            }
            WorkerFrame::Started { id } => {
                if let Some(a) = self.active.as_mut().filter(|a| a.q.id == id) {
                    a.started_code = true;
                    // An interrupt that came before `started` went out as the
                    // frame alone; a worker that reads frames only between
                    // cells gets the wake-up now, and the grace starts now.
                    if !self.config.runtime.reads_control_during_cells()
                        && let Some(i) = a
                            .interrupt
                            .as_mut()
                            .filter(|i| !i.signalled && i.escalation.is_none())
                    {
                        i.signalled = true;
                        match self.link.interrupt() {
                            Ok(()) => {
                                i.delivered = true;
                                i.not_delivered = None;
                            }
                            Err(e) => {
                                i.delivered = false;
                                i.not_delivered = Some(e);
                            }
                        }
                        i.escalate_at = Instant::now() + self.config.interrupt_grace;
                    }
                }
            }
            WorkerFrame::InterruptRaised { .. } | WorkerFrame::Ready { .. } => {}
            // The kernel init's report, read by the handshake.
            WorkerFrame::Sandbox { .. } => {}
            WorkerFrame::Log { mut msg } => {
                seal::cut(&mut msg, seal::LOG_MAX);
                let msg = self.config.redactor.redact(&msg);
                tracing::debug!(kernel = %self.label, "worker: {msg}");
            }
        }
    }

    fn on_exit(&mut self, status: ExitStatus) {
        self.exit = Some(status);
        self.drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
        let reason = if let Some(lost) = self.link.lost_reason() {
            lost
        } else if let Some(why) = &self.kill_reason {
            why.clone()
        } else if self.kill_requested.is_some() {
            "killed by the host".to_string()
        } else {
            describe_exit(status)
        };
        self.set_shared(|s| s.exit = Some(reason));
    }

    async fn after_event(&mut self) {
        // Background bytes between cells: decode and keep for the next result.
        self.flush_raw_background();
        let gone = self.exit.is_some() && !self.out_open.contains(&true);
        let saturated = self.saturated_tree();
        if let Some(a) = self.active.as_mut()
            && a.tree_killed.is_none()
            && a.response.is_some()
            && let Some(why) = saturated
        {
            // The cell's processes filled the kernel's process limit and are
            // still there: they would starve every later cell. Kill the tree.
            a.tree_killed = Some(why.clone());
            self.kill_reason = Some(why);
            self.request_kill();
        }
        if let Some(a) = &self.active {
            let complete = a.response.is_some() && a.marker_seen == [true, true] && a.tree_killed.is_none();
            // After a protocol error the cell settles once the kill is done,
            // so the caller never sees a result while the kernel still lives.
            if complete || gone {
                self.settle();
            }
        }
        if gone && !self.dead {
            self.dead = true;
            self.link.release();
            let err = self.dead_error();
            for q in self.queue.drain(..) {
                let _ = q.reply.send(Err(settle::clone_dead(&err)));
            }
            if let Some((_, _, reply)) = self.inspect.take() {
                let _ = reply.send(Err(settle::clone_dead(&err)));
            }
            self.set_shared(|s| {
                s.queued = 0;
                s.running = None;
            });
            self.finish_waiters();
        }
        if self.active.is_none() && !self.dead && self.kill_requested.is_none() {
            self.start_next().await;
        }
    }

    async fn start_next(&mut self) {
        let Some(q) = self.queue.pop_front() else {
            return;
        };
        let mut token = [0u8; 16];
        let _ = getrandom::fill(&mut token);
        let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let marker = format!("\u{1}cellhost-end-{hex}\u{1}");
        let dir = self.config.session_dir.join(crate::cell::CELLS_DIR).join(&q.id);
        let timeout = match q.options.timeout {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => self.config.cell_timeout,
        };
        let redactor = self.config.redactor.clone();
        let cap = |limits: &StreamLimits, name: &str| {
            StreamCapture::new(
                limits.clone(),
                redactor.clone(),
                Some(dir.join(format!("{name}.txt"))),
            )
            .spill_beneath(self.config.session_dir.clone())
        };
        let started = Instant::now();
        let rings = self.link.begin_cell(&hex);
        let frame = HostFrame::Execute {
            id: q.id.clone(),
            code: q.code.clone(),
            marker: marker.clone(),
            options: ExecuteOptions {
                silent: q.options.silent,
                session_dir: None,
                rings,
            },
        };
        let start = marker.replacen("cellhost-end-", "cellhost-start-", 1);
        let mut a = ActiveCell {
            start_scan: [
                MarkerScanner::new(start.as_bytes()),
                MarkerScanner::new(start.as_bytes()),
            ],
            start_seen: [false, false],
            scan: [
                MarkerScanner::new(marker.as_bytes()),
                MarkerScanner::new(marker.as_bytes()),
            ],
            marker_seen: [false, false],
            capture: [
                Some(cap(&self.config.stdout_limits, "stdout")),
                Some(cap(&self.config.stderr_limits, "stderr")),
            ],
            peek: [String::new(), String::new()],
            response: None,
            response_at: None,
            started_code: false,
            displays: Vec::new(),
            budget: outputs::DisplayBudget::new(self.config.display_limits.clone()),
            started,
            deadline: timeout.map(|t| started + t),
            interrupt: None,
            background: self.background.take(),
            dir,
            pid_hits_at_start: self.link.usage().map_or(0, |u| u.pids_limit_hits()),
            oom_kills_at_start: self.link.usage().map_or(0, |u| u.oom_kills()),
            tool_calls: Vec::new(),
            tool_count: 0,
            tree_killed: None,
            q,
        };
        self.set_shared(|s| {
            s.running = Some(a.q.id.clone());
            s.queued = s.queued.saturating_sub(1);
        });
        if let Err(e) = self.link.send(&frame).await {
            self.protocol_error = Some(format!("cannot send the cell: {e}"));
            a.marker_seen = [true, true];
        }
        self.active = Some(a);
    }

    fn dead_error(&self) -> KernelError {
        let reason = if let Some(lost) = self.link.lost_reason() {
            lost
        } else if let Some(p) = &self.protocol_error {
            format!("protocol error: {p}")
        } else if let Some(why) = &self.kill_reason {
            why.clone()
        } else if self.kill_requested.is_some() {
            "killed by the host".into()
        } else {
            self.exit.map(describe_exit).unwrap_or_else(|| "exited".into())
        };
        KernelError::Dead {
            kernel: self.label.clone(),
            reason,
        }
    }
}

async fn sleep_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
