//! POSIX shell quoting for the scripts a placement hands to `sbatch` and
//! to the remote shell of `ssh`.

use crate::PlacementError;

/// `value` as one single-quoted POSIX shell word (`'` becomes `'\''`).
///
/// # Errors
/// A NUL byte cannot be carried through a shell word or an `execve`
/// argument: [`PlacementError::Config`] naming `what`.
pub fn quote(name: &str, what: &str, value: &str) -> Result<String, PlacementError> {
    if value.contains('\0') {
        return Err(PlacementError::Config {
            name: name.to_owned(),
            message: format!("{what} contains a NUL byte"),
        });
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    Ok(out)
}

/// A portable environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A token safe as a file name, Slurm job name and Pod name part:
/// `[A-Za-z0-9-]`, 1 to 63 characters, not starting with `-`.
pub fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 63
        && !token.starts_with('-')
        && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_keeps_every_byte_but_nul_literal() {
        assert_eq!(quote("p", "x", "a b").ok().as_deref(), Some("'a b'"));
        assert_eq!(
            quote("p", "x", "it's $HOME `x`").ok().as_deref(),
            Some("'it'\\''s $HOME `x`'")
        );
        assert!(quote("p", "x", "a\0b").is_err());
    }

    #[test]
    fn tokens_and_env_names_are_checked() {
        assert!(is_token("cellhost-0123abcd"));
        assert!(!is_token("-rf"));
        assert!(!is_token("a/b"));
        assert!(!is_token(""));
        assert!(is_env_name("SLURM_JOB_ID"));
        assert!(!is_env_name("1X"));
        assert!(!is_env_name("A=B"));
    }
}
