//! Host calls: a cell's authority, budget and tool names checked, the tool
//! run on its own task, the answer redacted and sent back.

use std::time::Instant;

use cellhost_protocol::HostFrame;
use serde_json::Value;

use super::state::{Driver, ToolDone};
use crate::link::WorkerLink;
use crate::outputs;
use crate::seal;
use crate::tools::{self, ToolCall, ToolCallRecord};

impl<L: WorkerLink> Driver<L> {
    /// Checks a host call's authority, budget and tool name, then runs it
    /// on its own task; refusals are answered at once.
    pub(super) async fn on_host_call(&mut self, id: String, cell: String, mut name: String, args: Value) {
        seal::cut(&mut name, 256);
        let args_preview = self
            .config
            .redactor
            .redact(&tools::preview(&args, 200))
            .into_owned();
        let budget = self.config.tool_budget;
        let names = self.config.tool_names();
        let args_len = args.to_string().len();
        let refusal = match self.active.as_mut() {
            Some(a) if a.q.id == cell && a.response.is_none() => {
                if args_len > seal::HOST_CALL_ARGS_MAX {
                    Some(format!(
                        "host call refused: its arguments are {args_len} bytes of JSON, more than the {} allowed",
                        seal::HOST_CALL_ARGS_MAX
                    ))
                } else if a.tool_count >= budget {
                    Some(format!(
                        "the tool budget of {budget} calls per cell is spent; split the work across cells"
                    ))
                } else if !names.contains(&name) && !tools::is_builtin(&name) {
                    Some(if names.is_empty() {
                        format!("tool '{name}' is not enabled: this session has no host tools")
                    } else {
                        format!(
                            "tool '{name}' is not enabled; enabled tools: {}",
                            names.join(", ")
                        )
                    })
                } else {
                    a.tool_count += 1;
                    None
                }
            }
            _ => Some(format!(
                "host call refused: cell {cell} has settled, and a cell's tool authority ends when the cell settles"
            )),
        };
        if let Some(error) = refusal {
            if let Some(a) = self.active.as_mut().filter(|a| a.q.id == cell) {
                a.tool_calls.push(ToolCallRecord {
                    name,
                    args_preview,
                    duration_ms: 0,
                    outcome: "refused".into(),
                    error: Some(error.clone()),
                });
            }
            let _ = self
                .link
                .send(&HostFrame::HostResponse {
                    id,
                    data: None,
                    error: Some(error),
                })
                .await;
            return;
        }
        let Some(host) = self.config.tool_host.clone() else {
            let error = format!("tool '{name}' is not available: this kernel has no tool host");
            if let Some(a) = self.active.as_mut().filter(|a| a.q.id == cell) {
                a.tool_calls.push(ToolCallRecord {
                    name,
                    args_preview,
                    duration_ms: 0,
                    outcome: "refused".into(),
                    error: Some(error.clone()),
                });
            }
            let _ = self
                .link
                .send(&HostFrame::HostResponse {
                    id,
                    data: None,
                    error: Some(error),
                })
                .await;
            return;
        };
        let call = ToolCall {
            session: self.info.session.clone(),
            cell: cell.clone(),
            name: name.clone(),
            args,
        };
        let tx = self.tool_done_tx.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            let answer = host.call(call).await;
            let _ = tx.send(ToolDone {
                id,
                cell,
                name,
                args_preview,
                started,
                answer,
            });
        });
    }

    pub(super) async fn on_tool_done(&mut self, done: ToolDone) {
        let redactor = self.config.redactor.clone();
        let (data, error) = match done.answer {
            Ok(v) => (Some(outputs::redact_value(v, &redactor)), None),
            Err(e) => (None, Some(redactor.redact(&e).into_owned())),
        };
        if let Some(a) = self.active.as_mut().filter(|a| a.q.id == done.cell) {
            a.tool_calls.push(ToolCallRecord {
                name: done.name,
                args_preview: done.args_preview,
                duration_ms: done.started.elapsed().as_millis() as u64,
                outcome: if error.is_some() { "error" } else { "ok" }.into(),
                error: error.clone(),
            });
        }
        let _ = self
            .link
            .send(&HostFrame::HostResponse {
                id: done.id,
                data,
                error,
            })
            .await;
    }
}
