//! Per-cell `metadata.execution` timestamps, as nbclient records them.

use std::time::SystemTime;

use serde_json::{Map, Value};

/// When a cell ran, in nbclient's four keys (its `record_timing`):
/// `iopub.status.busy` and `iopub.execute_input` when the kernel started
/// the cell, `shell.execute_reply` and `iopub.status.idle` when it
/// settled. Each is written as nbclient's `timestamp()` writes a message
/// date: UTC, `%Y-%m-%dT%H:%M:%S.%fZ` (microseconds, `Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionTiming {
    /// The kernel started running the cell.
    pub started: SystemTime,
    /// The cell settled (its result is final).
    pub settled: SystemTime,
}

impl ExecutionTiming {
    /// The `metadata.execution` object.
    pub fn to_json(&self) -> Value {
        let (start, end) = (stamp(self.started), stamp(self.settled));
        let mut m = Map::new();
        m.insert("iopub.execute_input".into(), Value::String(start.clone()));
        m.insert("iopub.status.busy".into(), Value::String(start));
        m.insert("iopub.status.idle".into(), Value::String(end.clone()));
        m.insert("shell.execute_reply".into(), Value::String(end));
        Value::Object(m)
    }
}

/// `t` as nbclient writes a timestamp: `2024-01-31T09:05:07.123456Z`.
pub fn stamp(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_have_microseconds_and_z() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_706_691_907_123_456);
        assert_eq!(stamp(t), "2024-01-31T09:05:07.123456Z");
        assert_eq!(stamp(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let timing = ExecutionTiming {
            started: t,
            settled: t + Duration::from_millis(5),
        };
        let v = timing.to_json();
        assert_eq!(v["iopub.status.busy"], "2024-01-31T09:05:07.123456Z");
        assert_eq!(v["shell.execute_reply"], "2024-01-31T09:05:07.128456Z");
        assert_eq!(v.as_object().map(Map::len), Some(4));
    }
}
