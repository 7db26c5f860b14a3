//! Bearer tokens and the owners they stand for.
//!
//! A token file holds one token a line: `OWNER TOKEN [SCOPE]`, where
//! `SCOPE` is `rw` (the default: every route) or `ro` (read-only: `GET`
//! routes only; anything else answers 403). Blank lines and lines starting
//! with `#` are ignored. The file must not be readable by group or others
//! (mode 0600); [`Tokens::load_or_create`] makes one with a fresh token for
//! owner `local` at first start.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every route.
    ReadWrite,
    /// `GET` routes only (list, variables, output, history).
    ReadOnly,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The owner the token stands for: sessions are keyed by it.
    pub owner: String,
    /// What the token may do.
    pub scope: Scope,
}

/// The set of accepted tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(String, Caller)>,
}

/// A fresh random token (256 bits, hex).
pub fn new_token() -> String {
    let mut b = [0u8; 32];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: refuse to make a guessable token.
        panic!("no random source for a token");
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Parses a token file's text.
    ///
    /// # Errors
    /// A line that is not `OWNER TOKEN [rw|ro]`, or a token shorter than 16
    /// characters.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let scope = match parts.get(2).copied() {
                None | Some("rw") => Scope::ReadWrite,
                Some("ro") => Scope::ReadOnly,
                Some(other) => {
                    return Err(format!("line {}: scope must be rw or ro, got {other:?}", i + 1));
                }
            };
            if parts.len() < 2 || parts.len() > 3 {
                return Err(format!("line {}: expected `OWNER TOKEN [rw|ro]`", i + 1));
            }
            if parts[1].len() < 16 {
                return Err(format!("line {}: token shorter than 16 characters", i + 1));
            }
            entries.push((
                parts[1].to_string(),
                Caller {
                    owner: parts[0].to_string(),
                    scope,
                },
            ));
        }
        Ok(Tokens { entries })
    }

    /// One token for one owner.
    pub fn single(owner: &str, token: &str, scope: Scope) -> Tokens {
        Tokens {
            entries: vec![(
                token.to_string(),
                Caller {
                    owner: owner.to_string(),
                    scope,
                },
            )],
        }
    }

    /// Adds a token.
    pub fn add(&mut self, owner: &str, token: &str, scope: Scope) {
        self.entries.push((
            token.to_string(),
            Caller {
                owner: owner.to_string(),
                scope,
            },
        ));
    }

    /// Reads `path`, or creates it (mode 0600, parent directories 0700)
    /// with a fresh read-write token for owner `local`. Returns the tokens
    /// and whether the file was created.
    ///
    /// # Errors
    /// I/O errors, a malformed file, a file readable by group or others,
    /// or a file without tokens.
    pub fn load_or_create(path: &Path) -> Result<(Tokens, bool), String> {
        match std::fs::metadata(path) {
            Ok(m) => {
                if m.permissions().mode() & 0o077 != 0 {
                    return Err(format!(
                        "{}: token file is readable by others (mode {:o}); run chmod 600 on it",
                        path.display(),
                        m.permissions().mode() & 0o777
                    ));
                }
                let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let t = Tokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                if t.entries.is_empty() {
                    return Err(format!("{}: no tokens", path.display()));
                }
                Ok((t, false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
                }
                let token = new_token();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                writeln!(
                    f,
                    "# cellhost HTTP API tokens: OWNER TOKEN [rw|ro], one a line\nlocal {token} rw"
                )
                .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok((Tokens::single("local", &token, Scope::ReadWrite), true))
            }
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The caller a presented token stands for (compared in constant time
    /// against every token).
    pub fn check(&self, presented: &str) -> Option<Caller> {
        let mut found = None;
        for (t, c) in &self.entries {
            if ct_eq(t.as_bytes(), presented.as_bytes()) && found.is_none() {
                found = Some(c.clone());
            }
        }
        found
    }

    /// The first read-write token, if any (for printing at start).
    pub fn first(&self) -> Option<(&str, &Caller)> {
        self.entries.first().map(|(t, c)| (t.as_str(), c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_owners_and_scopes() {
        let t =
            Tokens::parse("# c\nalice aaaaaaaaaaaaaaaaaaaa\nbob bbbbbbbbbbbbbbbbbbbb ro\n").expect("parse");
        assert_eq!(
            t.check("aaaaaaaaaaaaaaaaaaaa").map(|c| c.scope),
            Some(Scope::ReadWrite)
        );
        assert_eq!(
            t.check("bbbbbbbbbbbbbbbbbbbb").map(|c| c.owner),
            Some("bob".into())
        );
        assert!(t.check("nope").is_none());
        assert!(Tokens::parse("x short").is_err());
        assert!(Tokens::parse("x aaaaaaaaaaaaaaaaaaaa admin").is_err());
    }

    #[test]
    fn created_file_is_private() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("server/tokens");
        let (t, created) = Tokens::load_or_create(&p).expect("create");
        assert!(created);
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (t2, created2) = Tokens::load_or_create(&p).expect("load");
        assert!(!created2);
        assert_eq!(
            t.first().map(|x| x.0.to_string()),
            t2.first().map(|x| x.0.to_string())
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(Tokens::load_or_create(&p).is_err());
    }
}
