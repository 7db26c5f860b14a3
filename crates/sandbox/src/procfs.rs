//! Reading the process tree from `/proc`.

use std::collections::HashMap;
use std::fs;

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// State letter (`R`, `S`, `D`, `Z`, …).
    pub state: char,
}

/// Parses the content of a `/proc/<pid>/stat` file. The command name may
/// hold spaces and parentheses, so fields are read after the last `)`.
pub fn parse_stat(pid: i32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(ProcStat { pid, ppid, state })
}

/// Every process visible in `/proc` (those that vanish while reading are skipped).
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        parse_stat(pid, &text)
    })
    .collect()
}

/// All descendants of `root` (not `root` itself), zombies included.
pub fn descendants(root: i32) -> Vec<ProcStat> {
    let procs = all_processes();
    let mut children: HashMap<i32, Vec<ProcStat>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        if let Some(kids) = children.get(&pid) {
            for k in kids {
                if k.pid != root {
                    out.push(*k);
                    stack.push(k.pid);
                }
            }
        }
    }
    out
}

/// Children of `pid` from `/proc/<pid>/task/<pid>/children` (pids as seen
/// from the caller's pid namespace).
pub fn children(pid: i32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|t| {
            t.split_ascii_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The pids of `pid` in each pid namespace it belongs to, outermost first
/// (the `NSpid` line of `/proc/<pid>/status`).
pub fn ns_pids(pid: i32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|v| {
                v.split_ascii_whitespace()
                    .filter_map(|s| s.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The host pid of the descendant of `root` whose pid in its own (innermost)
/// pid namespace is `inner_pid`, preferring one that lives in a nested
/// namespace (a kernel's worker in its sandbox) over a plain match.
pub fn host_pid_of(root: i32, inner_pid: i32) -> Option<i32> {
    let mut plain = None;
    for p in descendants(root) {
        let ns = ns_pids(p.pid);
        if ns.last() == Some(&inner_pid) {
            if ns.len() > 1 {
                return Some(p.pid);
            }
            plain.get_or_insert(p.pid);
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_in_the_name() {
        let s = parse_stat(42, "42 (a) b (c)) S 7 42 42 0 -1").expect("parse");
        assert_eq!(
            s,
            ProcStat {
                pid: 42,
                ppid: 7,
                state: 'S'
            }
        );
    }

    #[test]
    fn garbage_stat_is_none() {
        assert!(parse_stat(1, "no parens here").is_none());
        assert!(parse_stat(1, "1 (x) S notanumber").is_none());
    }

    #[test]
    fn this_test_is_a_descendant_of_its_parent() {
        let me = std::process::id() as i32;
        let parent = rustix::process::getppid()
            .map(|p| p.as_raw_nonzero().get())
            .unwrap_or(1);
        assert!(descendants(parent).iter().any(|p| p.pid == me));
    }
}
