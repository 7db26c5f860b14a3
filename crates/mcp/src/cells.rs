//! Cells that outlive a call: `submit_code`, `get_cell`, `cancel_cell` —
//! adapters over the request layer's [`SubmitRequest`] and
//! [`CancelCellRequest`] and the registry's submitted cells
//! ([`cellhost_sessions::detached`]). A long job is submitted, and its
//! status, output so far and result are fetched by later calls, so no
//! single call has to outlast a client's timeout.

use std::time::Duration;

use cellhost_sessions::Origin;
use cellhost_sessions::detached::DetachedStatus;
use cellhost_sessions::requests::{CancelCellRequest, SubmitRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;

use crate::{CellhostMcp, params_error, request_tool_error, session_name, text_result};

/// Longest `wait_s` of `get_cell`.
const MAX_WAIT_S: f64 = 60.0;

/// Parameters of `submit_code`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SubmitCodeParams {
    /// Python source of one cell.
    pub code: String,
    /// Session name (default "default").
    #[serde(default)]
    pub session: Option<String>,
    /// Deadline in seconds from when the cell starts running (default 300;
    /// 0 = none).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Limits of a session this call creates (as execute_code's `limits`):
    /// checked before the cell is submitted.
    #[serde(default)]
    pub limits: Option<crate::LimitsParam>,
    /// Network policy of a session this call creates (as execute_code's
    /// `network`).
    #[serde(default)]
    pub network: Option<crate::NetworkParam>,
}

/// Parameters of `get_cell`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct GetCellParams {
    /// The id submit_code answered.
    pub cell: String,
    /// Wait up to this many seconds (at most 60, default 0) for the cell to
    /// finish before answering.
    #[serde(default)]
    pub wait_s: Option<f64>,
}

/// Parameters of `cancel_cell`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CancelCellParams {
    /// The id submit_code answered.
    pub cell: String,
}

#[tool_router(router = cells_router, vis = "pub(crate)")]
impl CellhostMcp {
    #[tool(
        description = "Submit a cell of Python code to run in the background of a session and \
return at once with its cell id (use for work longer than a minute or two). The cell runs after \
the session's earlier submitted cells, with the same state as execute_code's cells of that \
session. Poll it with get_cell {cell, wait_s}, stop it with cancel_cell {cell}."
    )]
    async fn submit_code(
        &self,
        Parameters(p): Parameters<SubmitCodeParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_name(p.session)?;
        let deadline = cellhost_sessions::Deadline::from_secs(p.timeout_s)
            .map_err(|e| params_error(format!("timeout_s: {e}")))?;
        let mut spec = self.spec(&session);
        let notes = match self.apply_session_settings(&mut spec, p.limits, p.network.as_ref()) {
            Ok(n) => n,
            Err(refused) => return Ok(refused),
        };
        let req = SubmitRequest {
            session: spec,
            code: p.code,
            deadline,
            origin: Origin::new("mcp"),
        };
        match req.execute(&self.inner.registry) {
            Ok(h) => Ok(crate::session_settings::with_notes(
                text_result(
                    format!(
                        "submitted cell {} to session \"{session}\" ({} submitted cells ahead of it); \
                         call get_cell {{\"cell\": \"{}\", \"wait_s\": 30}} for its output and result",
                        h.cell, h.ahead, h.cell
                    ),
                    json!(h),
                ),
                notes,
            )),
            Err(e) => Ok(request_tool_error("submit_code failed", &e)),
        }
    }

    #[tool(
        description = "Status of a submitted cell (queued, running, done, failed, cancelled), its \
output so far, and its full result once done. `wait_s` (at most 60) waits for it to finish first."
    )]
    async fn get_cell(&self, Parameters(p): Parameters<GetCellParams>) -> Result<CallToolResult, ErrorData> {
        let wait = p.wait_s.unwrap_or(0.0);
        if !wait.is_finite() || !(0.0..=MAX_WAIT_S).contains(&wait) {
            return Err(params_error(format!("wait_s must be 0 to {MAX_WAIT_S}")));
        }
        let Some(t) = self.inner.registry.detached().get(&self.owner(), &p.cell) else {
            let e = cellhost_sessions::RequestError::CellNotFound { cell: p.cell };
            return Ok(request_tool_error("get_cell failed", &e));
        };
        if wait > 0.0 {
            let mut follow = t.follow();
            let _ = tokio::time::timeout(Duration::from_secs_f64(wait), async {
                while !t.status().is_final() {
                    if follow.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
        let snap = t.snapshot();
        if let Some(r) = &snap.result {
            let mut out = crate::render::cell_result_with(r, self.inner.limits.image_max_bytes);
            if let Some(rmcp::model::ContentBlock::Text(tx)) = out.content.first_mut() {
                tx.text = format!("submitted cell {}: done\n{}", snap.cell, tx.text);
            }
            return Ok(out);
        }
        let status = match snap.status {
            DetachedStatus::Queued => "queued",
            DetachedStatus::Running => "running",
            DetachedStatus::Done => "done",
            DetachedStatus::Failed => "failed",
            DetachedStatus::Cancelled => "cancelled",
        };
        let mut text = format!(
            "submitted cell {}: {status} (session \"{}\")\n",
            snap.cell, snap.session
        );
        if !snap.stdout.is_empty() {
            text.push_str(&format!(
                "--- stdout so far ---\n{}\n",
                crate::tail(&snap.stdout, 16 * 1024)
            ));
        }
        if !snap.stderr.is_empty() {
            text.push_str(&format!(
                "--- stderr so far ---\n{}\n",
                crate::tail(&snap.stderr, 8 * 1024)
            ));
        }
        if let Some(e) = &snap.error {
            text.push_str(&format!("error: {e}\n"));
        }
        Ok(text_result(text, json!(snap)))
    }

    #[tool(
        description = "Stop a submitted cell: a queued one is dropped without running, a running \
one is interrupted (like the interrupt tool)."
    )]
    async fn cancel_cell(
        &self,
        Parameters(p): Parameters<CancelCellParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = CancelCellRequest {
            owner: self.owner(),
            cell: p.cell,
        };
        match req.execute(&self.inner.registry).await {
            Ok(c) => Ok(text_result(format!("cell {}: {}", c.cell, c.action), json!(c))),
            Err(e) => Ok(request_tool_error("cancel_cell failed", &e)),
        }
    }
}
