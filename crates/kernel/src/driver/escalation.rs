//! Interrupts, deadlines and kills: the wake-up and the `interrupt` frame,
//! the grace, the probe of the worker's reader thread, the escalation to a
//! kill of the whole tree, and the link's last resort.

use std::time::Instant;

use cellhost_protocol::HostFrame;
use cellhost_protocol::frame::SigintHandler;

use super::state::{Cause, Driver, Interrupt, KILL_GRACE, MARKER_WAIT, PROBE_WAIT};
use crate::cell::InterruptOutcome;
use crate::link::WorkerLink;

impl<L: WorkerLink> Driver<L> {
    pub(super) async fn interrupt(&mut self, cell: Option<String>, cause: Cause) -> InterruptOutcome {
        let target = self.link.interrupt_target();
        let Some(active) = self.active.as_mut() else {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: None,
                reason: Some("no cell is running".into()),
            };
        };
        if cell.as_ref().is_some_and(|c| *c != active.q.id) {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: cell.clone(),
                reason: Some("that cell is not running".into()),
            };
        }
        let id = active.q.id.clone();
        if let Some(i) = &active.interrupt {
            // A second interrupt during the grace changes nothing but is
            // reported; the escalation timer keeps running.
            return InterruptOutcome {
                delivered: i.delivered,
                target: Some(i.target.clone()),
                cell: Some(id),
                reason: Some("an interrupt is already in progress; the kernel is killed if the cell does not stop within the grace".into()),
            };
        }
        if active.response.is_some() {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: Some(id),
                reason: Some("the cell already finished".into()),
            };
        }
        // The frame is the authority. The wake-up (sent only once the worker
        // has said `started`, so it cannot land on another cell) wakes code
        // that sleeps or blocks; before `started`, the frame alone cancels
        // the cell, or the worker signals its own main thread.
        let signalled = active.started_code;
        let mut sent = if signalled { self.link.interrupt() } else { Ok(()) };
        if signalled
            && sent.is_ok()
            && let Some(reported) = self.link.interrupt_delivery().await
        {
            sent = reported;
        }
        let not_delivered = sent.as_ref().err().cloned();
        // The wait for the delivery report left the cell where it was (the
        // driver handles nothing else meanwhile).
        let Some(active) = self.active.as_mut() else {
            return InterruptOutcome {
                delivered: false,
                target: None,
                cell: Some(id),
                reason: Some("no cell is running".into()),
            };
        };
        active.interrupt = Some(Interrupt {
            cause,
            delivered: sent.is_ok(),
            signalled,
            target: target.clone(),
            not_delivered: not_delivered.clone(),
            escalate_at: Instant::now() + self.config.interrupt_grace,
            probe_until: None,
            handler: None,
            raised: 0,
            escalation: None,
        });
        let frame = HostFrame::Interrupt {
            id: id.clone(),
            signalled: signalled && sent.is_ok(),
        };
        let _ = self.link.send(&frame).await;
        InterruptOutcome {
            delivered: sent.is_ok(),
            target: Some(target),
            cell: Some(id),
            reason: not_delivered,
        }
    }

    pub(super) async fn on_timer(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.kill_requested
            && now >= t + KILL_GRACE
            && self.exit.is_none()
        {
            // The link's supervisor did not finish in time.
            self.link.force_kill();
            self.kill_requested = Some(now);
        }
        if self.drain_until.is_some_and(|t| now >= t) && self.out_open.contains(&true) {
            self.link.close_output();
            self.out_open = [false, false];
        }
        let mut to_interrupt = false;
        let mut escalate = false;
        if let Some(a) = self.active.as_mut() {
            if a.interrupt.is_none() && a.response.is_none() && a.deadline.is_some_and(|d| now >= d) {
                to_interrupt = true;
            }
            if let Some(i) = a.interrupt.as_mut()
                && i.escalation.is_none()
            {
                if let Some(p) = i.probe_until {
                    if now >= p {
                        i.escalation = Some(escalation_reason(i));
                        escalate = true;
                    }
                } else if now >= i.escalate_at {
                    if i.handler.is_some_and(|h| h != SigintHandler::Worker) {
                        i.escalation = Some(escalation_reason(i));
                        escalate = true;
                    } else {
                        i.probe_until = Some(now + PROBE_WAIT);
                        let id = a.q.id.clone();
                        let probe = HostFrame::Interrupt { id, signalled: true };
                        let _ = self.link.send(&probe).await;
                    }
                }
            }
            if a.response_at.is_some_and(|t| now >= t + MARKER_WAIT) {
                tracing::warn!(kernel = %self.label, "cell {} settled without its end markers", a.q.id);
                a.marker_seen = [true, true];
            }
        }
        if to_interrupt {
            self.interrupt(None, Cause::Timeout).await;
        }
        if escalate {
            self.request_kill();
        }
    }

    pub(super) fn request_kill(&mut self) {
        if self.kill_requested.is_some() || self.exit.is_some() {
            return;
        }
        self.kill_requested = Some(Instant::now());
        self.link.terminate();
    }
}

pub(super) fn escalation_reason(i: &Interrupt) -> String {
    match i.handler {
        Some(SigintHandler::Ignored) => {
            "the cell's code ignores SIGINT (signal.SIG_IGN); the kernel was killed".into()
        }
        Some(SigintHandler::User) => {
            "the cell's code replaced the SIGINT handler and kept running; the kernel was killed".into()
        }
        Some(SigintHandler::Default) => "the cell's code restored the default SIGINT action".into(),
        _ if i.raised > 0 => format!(
            "the code caught the KeyboardInterrupt ({} raised) and kept running; the kernel was killed",
            i.raised
        ),
        Some(SigintHandler::Worker) => {
            "the cell is still in native code that does not check for interrupts; the kernel was killed"
                .into()
        }
        None => "the worker did not answer (stuck in native code that holds the interpreter, or reading no control frames while the cell runs?); the kernel was killed"
            .into(),
    }
}
