//! The single-use bootstrap credential a placement hands to its agent.
//!
//! A credential names the host to dial and the SHA-256 of the host's
//! certificate (the agent pins it: no CA), and carries an HMAC-SHA256, with
//! a secret only the host holds, over (allocation id, epoch, expiry,
//! nonce). The host admits it once: the nonce is burned durably
//! ([`crate::NonceStore`]) at first use. It reaches the agent as a file
//! of mode 0600 ([`read_credential_file`] refuses anything else), never on
//! a command line or in the environment.

use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Version of the credential format.
pub const CREDENTIAL_VERSION: u32 = 1;

/// The credential file's content (JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Credential {
    /// [`CREDENTIAL_VERSION`].
    pub v: u32,
    /// `host:port` the agent dials.
    pub host: String,
    /// Lower-case hex SHA-256 of the host certificate's DER.
    pub cert_sha256: String,
    /// The allocation (one placement of one kernel generation).
    pub allocation: String,
    /// The kernel generation the host expects this agent to start.
    pub epoch: u64,
    /// Seconds since the Unix epoch after which the host refuses it.
    pub expiry: u64,
    /// 128 random bits, hex; burned at first use.
    pub nonce: String,
    /// Hex HMAC-SHA256 over the fields above but `host` and `cert_sha256`.
    pub mac: String,
}

fn mac_input(allocation: &str, epoch: u64, expiry: u64, nonce: &str) -> Vec<u8> {
    // Fields separated by NUL: none of them can contain one (hex, ids of
    // `[A-Za-z0-9-]`, decimal numbers).
    format!("cellhost-credential-v{CREDENTIAL_VERSION}\0{allocation}\0{epoch}\0{expiry}\0{nonce}")
        .into_bytes()
}

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

impl Credential {
    /// A new credential signed with `secret`.
    pub fn issue(
        secret: &[u8],
        host: String,
        cert_sha256: String,
        allocation: String,
        epoch: u64,
        expiry: u64,
    ) -> Self {
        let nonce = hex::encode(crate::random_bytes::<16>());
        let mut m = keyed(secret);
        m.update(&mac_input(&allocation, epoch, expiry, &nonce));
        let mac = hex::encode(m.finalize().into_bytes());
        Credential {
            v: CREDENTIAL_VERSION,
            host,
            cert_sha256,
            allocation,
            epoch,
            expiry,
            nonce,
            mac,
        }
    }

    /// The MAC is `secret`'s over this credential's fields (constant-time
    /// comparison).
    pub fn verify(&self, secret: &[u8]) -> bool {
        let Ok(given) = hex::decode(&self.mac) else {
            return false;
        };
        let mut m = keyed(secret);
        m.update(&mac_input(&self.allocation, self.epoch, self.expiry, &self.nonce));
        m.verify_slice(&given).is_ok()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a credential file's bytes.
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<Credential, String> {
        let c: Credential =
            serde_json::from_slice(b).map_err(|e| format!("not a cellhost credential: {e}"))?;
        if c.v != CREDENTIAL_VERSION {
            return Err(format!(
                "credential version {} (this agent reads {CREDENTIAL_VERSION})",
                c.v
            ));
        }
        Ok(c)
    }
}

/// Why a credential file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CredentialFileError {
    /// It cannot be read.
    #[error("cannot read the credential file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Readable by others than its owner, or owned by another user, or not
    /// a regular file.
    #[error(
        "credential file {path} refused: {reason} (it must be a regular file of mode 0600 owned by this user)"
    )]
    Permissions {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a credential.
    #[error("credential file {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Reads and checks a credential file: a regular file (no symlink), mode
/// 0600, owned by the effective user, at most 64 KiB.
///
/// # Errors
/// [`CredentialFileError`].
pub fn read_credential_file(path: &Path) -> Result<(Credential, Vec<u8>), CredentialFileError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display().to_string();
    let io = |source| CredentialFileError::Io {
        path: shown.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    let refuse = |reason: String| CredentialFileError::Permissions {
        path: shown.clone(),
        reason,
    };
    if !meta.file_type().is_file() {
        return Err(refuse("not a regular file".into()));
    }
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(refuse(format!(
            "owned by uid {}, this agent runs as uid {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o777 != 0o600 {
        return Err(refuse(format!("mode {:o}", meta.mode() & 0o777)));
    }
    let mut bytes = Vec::new();
    f.by_ref()
        .take(crate::wire::HANDSHAKE_CAP as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > crate::wire::HANDSHAKE_CAP {
        return Err(CredentialFileError::Invalid {
            path: shown,
            reason: "larger than 64 KiB".into(),
        });
    }
    let cred = Credential::from_bytes(&bytes).map_err(|reason| CredentialFileError::Invalid {
        path: shown.clone(),
        reason,
    })?;
    Ok((cred, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_binds_every_field_and_the_secret() {
        let c = Credential::issue(b"secret", "h:1".into(), "ab".into(), "a1".into(), 3, 100);
        assert!(c.verify(b"secret"));
        assert!(!c.verify(b"other"));
        for tamper in [
            |c: &mut Credential| c.epoch += 1,
            |c: &mut Credential| c.expiry += 1,
            |c: &mut Credential| c.allocation.push('x'),
            |c: &mut Credential| c.nonce = "00".into(),
            |c: &mut Credential| c.mac = "zz".into(),
        ] {
            let mut t = c.clone();
            tamper(&mut t);
            assert!(!t.verify(b"secret"), "{t:?}");
        }
    }

    #[test]
    fn credential_files_must_be_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("cred");
        let c = Credential::issue(b"s", "h:1".into(), "ab".into(), "a".into(), 1, 1);
        std::fs::write(&p, c.to_bytes()).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            read_credential_file(&p),
            Err(CredentialFileError::Permissions { .. })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read_credential_file(&p).expect("0600 accepted").0, c);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).expect("symlink");
        assert!(read_credential_file(&link).is_err(), "symlinks refused");
    }
}
