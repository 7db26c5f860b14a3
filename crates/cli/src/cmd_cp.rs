//! `cellhost cp LOCAL SESSION:PATH` and `cellhost cp SESSION:PATH LOCAL`:
//! copy a file into or out of a daemon session's working directory (the
//! session `exec --session SESSION` runs in from this directory), through
//! the daemon's `write_file` / `read_file` requests — the same request
//! layer as HTTP's and MCP's files, so the path is kept below the
//! session's workdir and the write is atomic. Files up to 12 MiB.
//!
//! An argument is remote when it is `NAME:PATH` with `NAME` a session name
//! (no `/`); write `./a:b` for a local file whose name holds a colon.
//! Exit 0 when copied, 2 for a usage error (bad arguments, a refused path,
//! no such file), 1 when the daemon or a local file failed.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use cellhost_server::daemon::{MAX_FILE_BYTES, Reply, Request};

use crate::KernelArgs;
use crate::cmd_daemon;
use crate::cmd_sessions::caller_cwd;
use crate::common::{self, EXIT_USAGE};

/// Arguments of `cp`.
#[derive(Debug, clap::Args)]
pub struct CpArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// What to copy: a local file, or `SESSION:PATH`.
    #[arg(value_name = "SRC")]
    src: String,
    /// Where to: `SESSION:PATH`, or a local file or directory.
    #[arg(value_name = "DST")]
    dst: String,
}

/// `NAME:PATH` as (session, path) when `arg` names a session's file.
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (name, path) = arg.split_once(':')?;
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.contains('/')
        && !name.starts_with('.')
        && !name.chars().any(char::is_control);
    ok.then_some((name, path))
}

/// Runs `cp`.
pub fn run(args: CpArgs) -> u8 {
    let (src, dst) = (remote(&args.src), remote(&args.dst));
    let cwd = caller_cwd();
    let req = match (src, dst) {
        (None, Some((session, path))) => {
            let local = Path::new(&args.src);
            let bytes = match std::fs::metadata(local) {
                Ok(m) if m.len() > MAX_FILE_BYTES => {
                    eprintln!(
                        "cellhost: {}: {} bytes, more than cp carries ({MAX_FILE_BYTES})",
                        local.display(),
                        m.len()
                    );
                    return EXIT_USAGE;
                }
                Ok(m) if !m.is_file() => {
                    eprintln!("cellhost: {}: not a regular file", local.display());
                    return EXIT_USAGE;
                }
                Ok(_) => match std::fs::read(local) {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("cellhost: {}: {e}", local.display());
                        return 1;
                    }
                },
                Err(e) => {
                    eprintln!("cellhost: {}: {e}", local.display());
                    return EXIT_USAGE;
                }
            };
            // `s:` or `s:dir/` names the local file's name there.
            let mut path = path.to_string();
            if path.is_empty() || path.ends_with('/') {
                path.push_str(
                    &local
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                );
            }
            Request::WriteFile {
                session: session.to_string(),
                path,
                data: base64::engine::general_purpose::STANDARD.encode(bytes),
                cwd,
            }
        }
        (Some((session, path)), None) => Request::ReadFile {
            session: session.to_string(),
            path: path.to_string(),
            cwd,
        },
        _ => {
            eprintln!("cellhost: cp copies between a local file and SESSION:PATH (exactly one of the two)");
            return EXIT_USAGE;
        }
    };
    let rt = match common::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: cannot start the runtime: {e}");
            return 1;
        }
    };
    let reply = rt.block_on(async {
        let mut c = cmd_daemon::connect(&args.kernel).await?;
        c.call(&req).await
    });
    match reply {
        Ok(Reply::FileWritten { written }) => {
            eprintln!("cellhost: wrote {} ({} bytes)", written.path, written.size);
            0
        }
        Ok(Reply::File { path, data, .. }) => {
            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.as_bytes()) else {
                eprintln!("cellhost: the daemon sent data that is not base64");
                return 1;
            };
            let mut local = PathBuf::from(&args.dst);
            if local.is_dir() {
                local.push(
                    Path::new(&path)
                        .file_name()
                        .unwrap_or(std::ffi::OsStr::new("file")),
                );
            }
            match write_atomic(&local, &bytes) {
                Ok(()) => {
                    eprintln!(
                        "cellhost: copied {path} to {} ({} bytes)",
                        local.display(),
                        bytes.len()
                    );
                    0
                }
                Err(e) => {
                    eprintln!("cellhost: {}: {e}", local.display());
                    1
                }
            }
        }
        Ok(Reply::Error { message, usage, code }) => {
            eprintln!("cellhost: {message} ({code})");
            if usage { EXIT_USAGE } else { 1 }
        }
        Ok(other) => {
            eprintln!("cellhost: unexpected reply {other:?}");
            1
        }
        Err(e) => {
            eprintln!("cellhost: cannot reach the daemon: {e}");
            1
        }
    }
}

/// Writes `bytes` to `path` through a new temporary file beside it,
/// renamed over `path` once complete.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("names no file"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".cellhost-{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    #[test]
    fn remote_arguments_are_session_colon_path() {
        assert_eq!(super::remote("s1:data/x.csv"), Some(("s1", "data/x.csv")));
        assert_eq!(super::remote("s1:"), Some(("s1", "")));
        assert_eq!(super::remote("./a:b"), None);
        assert_eq!(super::remote("/tmp/a:b"), None);
        assert_eq!(super::remote("plain.txt"), None);
    }
}
