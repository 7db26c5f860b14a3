//! Host tools: functions on the host that a cell calls as
//! `cellhost.tools.NAME(**kwargs)` or `cellhost.call(NAME, args)`.
//!
//! Every call carries the id of the cell whose *authority* it claims. The
//! kernel answers a call only while that cell runs: a thread or child left
//! behind by a settled cell is refused. Each cell may make at most
//! [`crate::KernelConfig::tool_budget`] calls (DESIGN.md: 50). Calls from
//! several threads at once each get their own answer (frames carry ids).

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One call from a cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Session name.
    pub session: String,
    /// Cell id whose authority the call uses.
    pub cell: String,
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON object for `tools.NAME(**kwargs)`).
    pub args: Value,
}

/// The answer a tool gives: a JSON value, or an error message for the cell.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;

/// Provides the host tools of a kernel. Implemented by library users (a Rust
/// trait object) and by the sessions layer for external commands.
pub trait ToolHost: Send + Sync {
    /// Names of the tools cells may call.
    fn names(&self) -> Vec<String>;
    /// Runs one call. The future is polled on the kernel's runtime; the cell
    /// waits for it (the kernel's deadline still applies to the cell).
    fn call(&self, call: ToolCall) -> ToolFuture;
}

/// Tools whose names start with `cellhost.` are built into the host (the
/// package installer): always enabled, answered by the kernel's
/// [`ToolHost`] (an error when it has none), and counted in the budget.
pub fn is_builtin(name: &str) -> bool {
    name.starts_with("cellhost.")
}

/// What the result's `tool_calls` holds for each call.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text, redacted and cut to 200 characters.
    pub args_preview: String,
    /// Milliseconds from the call frame to the answer.
    pub duration_ms: u64,
    /// `ok`, `error` or `refused`.
    pub outcome: String,
    /// The error or refusal message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A preview of `args`: JSON text cut to `max` characters.
pub(crate) fn preview(args: &Value, max: usize) -> String {
    let text = args.to_string();
    if text.chars().count() <= max {
        return text;
    }
    let mut s: String = text.chars().take(max).collect();
    s.push('…');
    s
}
