//! The server's certificate: the trusted roots, the checks of each `sslmode`, and what a failed
//! check means for the operator.

use std::io;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::client::explain_refusal;
use super::stream::Names;
use super::RootCert;

pub(super) fn load_roots(root: &RootCert) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match root {
        RootCert::File(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read the database CA certificate {shown}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cannot read the database CA certificate {shown}: {e}"))?;
            if certs.is_empty() {
                return Err(format!(
                    "the database CA certificate file {shown} holds no PEM certificate"
                ));
            }
            for cert in certs {
                store.add(cert).map_err(|e| {
                    format!("the database CA certificate file {shown} holds an unusable certificate: {e}")
                })?;
            }
        }
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "sslrootcert=system: the operating system's trust store has no usable CA certificate"
                        .to_string(),
                );
            }
        }
    }
    Ok(store)
}

/// The verifier for every mode but `verify-full` (which uses rustls's own, host name included).
/// With roots (`verify-ca`, or `require` given a root certificate) the chain must lead to a
/// trusted root and the host name is not checked; without (`prefer`, `require`) it is
/// encryption against passive eavesdropping only, as in libpq. Either way the handshake's own
/// signatures are checked, so the session key belongs to whoever holds the certificate's key.
#[derive(Debug)]
pub(super) struct HostAgnostic {
    /// What the chain must lead to; `None`: the chain is not checked (`prefer`, `require`).
    pub(super) roots: Option<Arc<RootCertStore>>,
    /// The provider's signature algorithms, for the chain and the handshake's signatures.
    pub(super) algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for HostAgnostic {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Says what a failed certificate check means for the operator, in one line.
pub(super) fn explain(e: io::Error, host: &str, names: &Names) -> io::Error {
    let Some(rustls::Error::InvalidCertificate(cert)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return explain_refusal(e, names.client_cert.as_deref());
    };
    let roots = match &names.root_cert {
        Some(RootCert::File(path)) => format!("the CA certificate in {}", path.display()),
        Some(RootCert::System) => "the operating system's trusted CAs".to_string(),
        None => "the root certificate".to_string(),
    };
    let text = match cert {
        CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
            "the server's certificate is not signed by {roots}: set --db-ca-cert or sslrootcert to the CA that signed it"
        ),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => format!(
            "the server's certificate is not valid for the host name {host}: connect with a name the certificate lists, or use sslmode=verify-ca to check the chain only"
        ),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the server's certificate has expired: renew it".to_string()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet: check the clocks".to_string()
        }
        other => format!("the server's certificate was refused: {other}"),
    };
    io::Error::new(io::ErrorKind::InvalidData, text)
}
