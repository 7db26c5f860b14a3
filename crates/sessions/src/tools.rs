//! Host tools that run external commands declared in the config:
//!
//! ```toml
//! [tools.search]
//! command = ["/usr/local/bin/search-tool", "--json"]
//! timeout_s = 30
//! description = "Full-text search over the docs"
//! ```
//!
//! Each call runs `command` (no shell) in its own process group, writes
//! `{"name", "args", "session", "cell"}` as JSON on its stdin and reads one
//! JSON value from its stdout. The reply is the tool's answer, except an
//! object `{"error": "..."}`, which is an error for the cell. A non-zero
//! exit, a reply that is not JSON or a timeout is an error too; at the
//! timeout the whole process group is killed.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::{ToolCall, ToolFuture, ToolHost};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest reply read from a tool's stdout.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

/// One tool declared in the config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Program and arguments (never run through a shell).
    pub command: Vec<String>,
    /// Seconds a call may take before the command's process group is killed.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// What the tool does (shown to agents).
    #[serde(default)]
    pub description: String,
}

fn default_timeout() -> f64 {
    30.0
}

/// A [`ToolHost`] over external commands.
#[derive(Debug, Clone, Default)]
pub struct CommandTools {
    tools: Arc<BTreeMap<String, ToolSpec>>,
}

impl CommandTools {
    /// Tools by name.
    pub fn new(tools: BTreeMap<String, ToolSpec>) -> Self {
        CommandTools {
            tools: Arc::new(tools),
        }
    }

    /// The declared tools.
    pub fn specs(&self) -> &BTreeMap<String, ToolSpec> {
        &self.tools
    }
}

impl ToolHost for CommandTools {
    fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let spec = self.tools.get(&call.name).cloned();
        Box::pin(async move {
            let Some(spec) = spec else {
                return Err(format!("tool '{}' is not declared", call.name));
            };
            run_command(&spec, &call).await
        })
    }
}

fn tail(bytes: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let t = s.trim();
    if t.len() <= n {
        return t.to_string();
    }
    let mut cut = t.len() - n;
    while !t.is_char_boundary(cut) {
        cut += 1;
    }
    format!("…{}", &t[cut..])
}

async fn run_command(spec: &ToolSpec, call: &ToolCall) -> Result<Value, String> {
    let name = &call.name;
    let Some((prog, args)) = spec.command.split_first() else {
        return Err(format!("tool '{name}' has an empty command"));
    };
    let mut std_cmd = std::process::Command::new(prog);
    // A tool gets its three pipes and nothing else the host holds open.
    cellhost_sandbox::fds::close_inherited_on_exec(&mut std_cmd);
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("tool '{name}': cannot run {prog}: {e}"))?;
    let pgid = child.id();
    let request = serde_json::json!({
        "name": call.name, "args": call.args, "session": call.session, "cell": call.cell,
    });
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(mut w) = stdin.take() {
            // A tool that does not read its stdin is fine: ignore EPIPE.
            let _ = w.write_all(request.to_string().as_bytes()).await;
            let _ = w.write_all(b"\n").await;
            drop(w);
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(o) = stdout.as_mut() {
                let _ = o.take(MAX_REPLY as u64 + 1).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(e) = stderr.as_mut() {
                let _ = e.take(64 * 1024).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (out, err, status)
    };
    let timeout = Duration::from_secs_f64(spec.timeout_s.max(0.001));
    let (out, err, status) = match tokio::time::timeout(timeout, work).await {
        Ok(x) => x,
        Err(_) => {
            if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            return Err(format!(
                "tool '{name}' timed out after {} s; its processes were killed",
                spec.timeout_s
            ));
        }
    };
    let status = status.map_err(|e| format!("tool '{name}': {e}"))?;
    if !status.success() {
        return Err(format!("tool '{name}' failed ({status}): {}", tail(&err, 2000)));
    }
    if out.len() > MAX_REPLY {
        return Err(format!("tool '{name}' replied with more than {MAX_REPLY} bytes"));
    }
    let v: Value = serde_json::from_slice(&out)
        .map_err(|e| format!("tool '{name}' did not reply with JSON ({e}): {}", tail(&out, 500)))?;
    if let Some(e) = v
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("error"))
    {
        return Err(match e.as_str() {
            Some(s) => s.to_string(),
            None => e.to_string(),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(cmd: &[&str], timeout_s: f64) -> CommandTools {
        let mut m = BTreeMap::new();
        m.insert(
            "t".to_string(),
            ToolSpec {
                command: cmd.iter().map(|s| s.to_string()).collect(),
                timeout_s,
                description: String::new(),
            },
        );
        CommandTools::new(m)
    }

    fn call() -> ToolCall {
        ToolCall {
            session: "s".into(),
            cell: "c1".into(),
            name: "t".into(),
            args: serde_json::json!({"x": 1}),
        }
    }

    #[tokio::test]
    async fn echoes_the_request_as_json() {
        let t = tool(&["cat"], 5.0);
        let v = t.call(call()).await.expect("reply");
        assert_eq!(v["args"]["x"], 1);
        assert_eq!(v["session"], "s");
        assert_eq!(v["cell"], "c1");
    }

    #[tokio::test]
    async fn errors_are_clear() {
        let t = tool(&["sh", "-c", "echo '{\"error\": \"nope\"}'"], 5.0);
        assert_eq!(t.call(call()).await, Err("nope".into()));
        let t = tool(&["sh", "-c", "echo boom >&2; exit 3"], 5.0);
        let e = t.call(call()).await.expect_err("fails");
        assert!(e.contains("boom"), "{e}");
        let t = tool(&["sh", "-c", "echo not json"], 5.0);
        assert!(t.call(call()).await.expect_err("not json").contains("JSON"));
        let t = tool(&["/nonexistent/tool"], 5.0);
        assert!(t.call(call()).await.is_err());
    }

    #[tokio::test]
    async fn timeout_kills_the_process_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let t = tool(&["sh", "-c", &script], 0.5);
        let t0 = std::time::Instant::now();
        let e = t.call(call()).await.expect_err("timeout");
        assert!(e.contains("timed out"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid");
        // The grandchild (sleep) went with the group.
        let mut gone = false;
        for _ in 0..100 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "sleep {pid} survived the timeout");
    }
}
