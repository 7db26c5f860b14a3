//! Whether a package index answers, for tests that install real packages
//! (they print why and skip when it does not).

use std::process::Command;

/// The index page the package tests install from (`tomli`, pure Python).
pub const TOMLI: &str = "https://pypi.org/simple/tomli/";

/// Whether `url` answers (curl, 20 s); prints why not.
pub fn reachable(url: &str) -> bool {
    let o = Command::new("curl")
        .args(["-sS", "-f", "-o", "/dev/null", "-m", "20", url])
        .output();
    match o {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            println!(
                "skipped: the package index {url} is unreachable: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            false
        }
        Err(e) => {
            println!("skipped: cannot run curl to reach {url}: {e}");
            false
        }
    }
}
