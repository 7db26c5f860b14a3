//! TLS of the host ↔ agent connection: the host's self-signed certificate
//! and the agent's pin of it.
//!
//! There is no CA: the credential carries the SHA-256 of the host
//! certificate's DER, and the agent accepts exactly that certificate
//! ([`PinnedCert`]); the handshake's signatures are still verified with
//! the certificate's key, so a copy of the certificate alone is useless.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// The name the host certificate is issued for and the agent asks for.
pub const SERVER_NAME: &str = "cellhost-host";

/// The host's certificate and key.
#[derive(Clone)]
pub struct HostIdentity {
    cert: CertificateDer<'static>,
    key: Arc<PrivatePkcs8KeyDer<'static>>,
}

impl std::fmt::Debug for HostIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostIdentity")
            .field("cert_sha256", &self.cert_sha256())
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Hex SHA-256 of a certificate's DER.
pub fn cert_sha256(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

impl HostIdentity {
    /// A fresh self-signed certificate for [`SERVER_NAME`] (ECDSA P-256).
    ///
    /// # Errors
    /// The generator's message.
    pub fn generate() -> Result<HostIdentity, String> {
        let ck =
            rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()]).map_err(|e| e.to_string())?;
        Ok(HostIdentity {
            cert: ck.cert.der().clone(),
            key: Arc::new(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der())),
        })
    }

    /// The identity kept in `dir` (`host-cert.der`, `host-key.der`, the key
    /// 0600), made there on first use.
    ///
    /// # Errors
    /// I/O errors, or the generator's.
    pub fn load_or_create(dir: &Path) -> Result<HostIdentity, String> {
        let cert_p = dir.join("host-cert.der");
        let key_p = dir.join("host-key.der");
        if let (Ok(cert), Ok(key)) = (std::fs::read(&cert_p), std::fs::read(&key_p)) {
            return Ok(HostIdentity {
                cert: CertificateDer::from(cert),
                key: Arc::new(PrivatePkcs8KeyDer::from(key)),
            });
        }
        let id = HostIdentity::generate()?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        write_private(&key_p, id.key.secret_pkcs8_der())?;
        std::fs::write(&cert_p, id.cert.as_ref()).map_err(|e| format!("{}: {e}", cert_p.display()))?;
        Ok(id)
    }

    /// Hex SHA-256 of the certificate (what credentials pin).
    pub fn cert_sha256(&self) -> String {
        cert_sha256(&self.cert)
    }

    /// The listener's TLS configuration.
    ///
    /// # Errors
    /// rustls refused the key.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(cfg))
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Accepts exactly the certificate whose SHA-256 is pinned.
#[derive(Debug)]
pub struct PinnedCert {
    sha256: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if cert_sha256(end_entity).eq_ignore_ascii_case(&self.sha256) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the host's certificate is not the one the credential pins".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The agent's TLS configuration: the host certificate pinned by
/// `sha256` (hex), no client certificate.
///
/// # Errors
/// rustls refused the configuration.
pub fn client_config(sha256: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = provider();
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCert {
            sha256: sha256.to_string(),
            provider,
        }))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The server name the agent sends.
pub fn server_name() -> ServerName<'static> {
    ServerName::DnsName(
        rustls::pki_types::DnsName::try_from(SERVER_NAME)
            .unwrap_or_else(|_| unreachable!("a valid DNS name"))
            .to_owned(),
    )
}
