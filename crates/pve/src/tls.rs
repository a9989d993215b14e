//! How a node's certificate is trusted, and the one rustls configuration that does it.
//! Proxmox nodes present self-signed certificates; Proxmox's own clients pin the SHA-256
//! fingerprint of the leaf certificate, ignoring its chain and names, and so does [`Trust::Pin`].

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// How to trust a node's TLS certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Only the leaf certificate with this SHA-256 fingerprint (`AB:CD:...` or plain hex).
    Pin(String),
    /// Certificates signed by the CA certificates in this PEM text (`pve-root-ca.pem`).
    CaPem(Vec<u8>),
    /// Any certificate: only when the user asked for it (`--insecure`), or for the lab's own
    /// plain-HTTP and loopback calls.
    Insecure,
}

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The fingerprint is not 32 hex bytes.
    #[error(
        "`{0}` is not a SHA-256 fingerprint\nhint: write it as `pvenode cert info` prints it, 32 hex bytes `AB:CD:...`"
    )]
    BadFingerprint(String),
    /// The CA file holds no usable certificate.
    #[error("the CA file holds no usable PEM certificate: {0}")]
    BadCa(String),
    /// rustls refused the configuration.
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// SHA-256 fingerprint of a DER certificate as Proxmox prints it (`AB:CD:...`).
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A fingerprint in either accepted spelling, as `AB:CD:...`; `None` when it is not one.
pub fn normalize_fingerprint(fp: &str) -> Option<String> {
    let hex: String = fp.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let upper = hex.to_ascii_uppercase();
    Some(
        upper
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// Accepts the leaf whose fingerprint is pinned (any leaf when `pin` is `None`); handshake
/// signatures are still verified, so the peer must hold the certificate's key.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<String>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = fingerprint(end_entity.as_ref());
        match &self.pin {
            Some(want) if *want != fp => Err(rustls::Error::General(format!(
                "certificate fingerprint {fp} is not the pinned {want}"
            ))),
            _ => Ok(ServerCertVerified::assertion()),
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

/// The rustls client configuration for `trust` (ring provider, TLS 1.2 and 1.3).
pub fn client_config(trust: &Trust) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match trust {
        Trust::Pin(fp) => {
            let pin =
                normalize_fingerprint(fp).ok_or_else(|| TlsError::BadFingerprint(fp.clone()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                    pin: Some(pin),
                    provider,
                }))
                .with_no_client_auth()
        }
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pin: None,
                provider,
            }))
            .with_no_client_auth(),
        Trust::CaPem(pem) => {
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TlsError::BadCa(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsError::BadCa(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(TlsError::BadCa("no CERTIFICATE block".into()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_in_both_spellings() {
        let colon = "5E:1C:0B:7A:9D:22:41:6F:88:03:C7:5A:E1:94:2B:60:7D:1F:C8:39:A2:4E:6B:11:90:55:3F:08:D6:72:BE:AC";
        let plain = colon.replace(':', "").to_lowercase();
        assert_eq!(normalize_fingerprint(&plain).as_deref(), Some(colon));
        assert_eq!(normalize_fingerprint(colon).as_deref(), Some(colon));
        assert!(normalize_fingerprint("AB:CD").is_none());
        assert!(matches!(
            client_config(&Trust::Pin("nope".into())),
            Err(TlsError::BadFingerprint(_))
        ));
        assert!(matches!(
            client_config(&Trust::CaPem(b"garbage".to_vec())),
            Err(TlsError::BadCa(_))
        ));
    }
}
