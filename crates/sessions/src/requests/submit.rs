//! `submit`: run a cell that outlives the call — answered at once with a
//! handle ([`crate::detached`]); the cell runs in the session's turn, its
//! events and result kept for `get_cell`, its event stream and `wait`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cellhost_kernel::LiveEvent;
use serde::Serialize;

use super::{Deadline, ExecuteRequest, RequestError, SessionSpec};
use crate::detached::DetachedStatus;
use crate::registry::{Origin, Registry};

/// Submit `code` to a session; it runs after the session's earlier
/// submitted cells (and behind any cell running there: submitted cells
/// always queue).
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    /// The session.
    pub session: SessionSpec,
    /// The cell's code.
    pub code: String,
    /// Its deadline, counted from the moment it starts running.
    pub deadline: Deadline,
    /// Who asks and why (journaled with the cell).
    pub origin: Origin,
}

/// The handle of a submitted cell.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Submitted {
    /// The cell's id (`GET /v1/cells/{cell}`, `get_cell`, `cellhost wait`).
    pub cell: String,
    /// Its session.
    pub session: String,
    /// Submitted cells of the session ahead of it (0: it starts at once
    /// unless another surface's cell runs).
    pub ahead: usize,
}

impl SubmitRequest {
    /// Registers the cell and starts its task; returns at once.
    ///
    /// # Errors
    /// `bad_request` (name), `sandbox_below_floor`; everything else (the
    /// kernel failing, the registry full) is the cell's `failed` status.
    pub fn execute(self, reg: &Arc<Registry>) -> Result<Submitted, RequestError> {
        let key = self.session.key(reg)?;
        let owner = self.session.owner.clone();
        let scope = super::CwdScope::Exactly(key.cwd.clone());
        let ahead = reg.detached().pending(&owner, &key.session, &scope).len();
        let (tracked, turn) = reg.detached().add(&owner, &key.session, key.cwd.clone());
        let handle = Submitted {
            cell: tracked.id.clone(),
            session: key.session.clone(),
            ahead,
        };
        let reg = reg.clone();
        tokio::spawn(async move {
            let _turn = turn.lock_owned().await;
            let stop = Arc::new(AtomicBool::new(false));
            if !tracked.start(stop.clone()) {
                return;
            }
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut req = ExecuteRequest::new(self.session, self.code, self.origin);
            req.deadline = self.deadline;
            req.queue = true;
            req.live = Some(tx);
            req.cancel = Some(stop);
            let run = req.execute(&reg);
            tokio::pin!(run);
            let mut open = true;
            let outcome = loop {
                tokio::select! {
                    ev = rx.recv(), if open => match ev {
                        Some(ev) => forward(&tracked, ev),
                        None => open = false,
                    },
                    r = &mut run => break r,
                }
            };
            while let Ok(ev) = rx.try_recv() {
                forward(&tracked, ev);
            }
            match outcome {
                Ok(x) => tracked.finish(x.result),
                Err(e) => tracked.fail(e.to_json()),
            }
        });
        Ok(handle)
    }
}

fn forward(t: &crate::detached::Tracked, ev: LiveEvent) {
    match ev {
        LiveEvent::Stdout(s) => t.output("stdout", s),
        LiveEvent::Stderr(s) => t.output("stderr", s),
        LiveEvent::Display(d) => t.display(serde_json::to_value(d).unwrap_or_default()),
    }
}

/// Stop a submitted cell: drop it from the queue, or interrupt it when it
/// runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelCellRequest {
    /// The owner.
    pub owner: String,
    /// The cell's id.
    pub cell: String,
}

/// What a cancel did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CellCancelled {
    /// The cell.
    pub cell: String,
    /// `dequeued` (it never ran), `interrupted` (the interrupt was
    /// delivered), `not_delivered` (it runs but the interrupt found no cell
    /// yet; it is stopped when it starts) or `finished` (nothing to do).
    pub action: String,
}

impl CancelCellRequest {
    /// Runs the request.
    ///
    /// # Errors
    /// `cell_not_found`: no such cell of this owner.
    pub async fn execute(&self, reg: &Registry) -> Result<CellCancelled, RequestError> {
        let t = reg
            .detached()
            .get(&self.owner, &self.cell)
            .ok_or_else(|| RequestError::CellNotFound {
                cell: self.cell.clone(),
            })?;
        let action = if t.dequeue() {
            "dequeued"
        } else if t.status() == DetachedStatus::Running {
            if let Some(f) = t.stop_flag() {
                f.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let asked = super::InterruptRequest {
                owner: self.owner.clone(),
                session: t.session.clone(),
                cwd: super::CwdScope::Exactly(t.cwd.clone()),
            };
            match asked.execute(reg).await {
                Ok(o) if o.delivered => "interrupted",
                _ => "not_delivered",
            }
        } else {
            "finished"
        };
        Ok(CellCancelled {
            cell: self.cell.clone(),
            action: action.into(),
        })
    }
}
