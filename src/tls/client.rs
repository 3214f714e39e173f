//! The client certificate (libpq's `sslcert` and `sslkey`): reading and checking its files,
//! and presenting it in the handshake.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, SignatureScheme};

/// The client certificate's files (libpq's `sslcert` and `sslkey`).
#[derive(Debug)]
pub(super) struct ClientFiles {
    /// The certificate, or a chain starting with it (`sslcert`).
    pub(super) cert: PathBuf,
    /// Its private key, unencrypted (`sslkey`).
    pub(super) key: PathBuf,
    /// Turns the key file's bytes into a signing key (and checks it suits the certificate).
    pub(super) provider: Arc<CryptoProvider>,
}

impl ClientFiles {
    /// What presents the files' certificate, as they are now, to a server that asks for one.
    pub(super) fn load_resolver(&self) -> Result<Arc<dyn ResolvesClientCert>, String> {
        Ok(Arc::new(Presents(self.load()?)))
    }

    /// Reads both files. A renewal that writes them one after the other (a Kubernetes secret
    /// swaps both at once; a script may not) can land between our two reads, so a key that
    /// does not belong to the certificate is read once more before it counts as an error.
    pub(super) fn load(&self) -> Result<Arc<CertifiedKey>, String> {
        match self.load_once() {
            Err(Mismatch::Keys) => self.load_once(),
            other => other,
        }
        .map_err(|e| match e {
            Mismatch::Keys => format!(
                "the client key {} does not belong to the client certificate {}: give the key the certificate was issued for",
                self.key.display(),
                self.cert.display()
            ),
            Mismatch::Other(text) => text,
        })
    }

    fn load_once(&self) -> Result<Arc<CertifiedKey>, Mismatch> {
        let chain = read_client_chain(&self.cert)?;
        let key = read_client_key(&self.key)?;
        let unusable = |e: rustls::Error| {
            Mismatch::Other(format!(
                "the client key file {} holds a key TLS cannot use ({e}): use an RSA, ECDSA (P-256, P-384) or Ed25519 key",
                self.key.display()
            ))
        };
        let signing = self
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(unusable)?;
        let identity = CertifiedKey::new(chain, signing);
        match identity.keys_match() {
            Ok(()) => Ok(Arc::new(identity)),
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                Err(Mismatch::Keys)
            }
            // The provider cannot tell (no public key to compare): the server will.
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
                Ok(Arc::new(identity))
            }
            Err(e) => Err(Mismatch::Other(format!(
                "the client certificate file {} holds an unusable certificate: {e}",
                self.cert.display()
            ))),
        }
    }
}

/// Why the client certificate and key could not be loaded.
enum Mismatch {
    /// Both read well, but the key is not the certificate's (perhaps read mid-renewal).
    Keys,
    /// The operator's line.
    Other(String),
}

impl From<String> for Mismatch {
    fn from(text: String) -> Mismatch {
        Mismatch::Other(text)
    }
}

fn read_client_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read the client certificate {shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read the client certificate {shown}: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "the client certificate file {shown} holds no PEM certificate"
        ));
    }
    Ok(chain)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) with libpq's rule on permissions.
/// No error quotes the file's content: the PEM parser's own messages may carry a line of it.
fn read_client_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    use std::io::Read;
    let shown = path.display();
    let mut file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read the client key {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read the client key {shown}: {e}"))?;
    key_permissions(path, &meta)?;
    let mut pem = Vec::new();
    file.read_to_end(&mut pem)
        .map_err(|e| format!("cannot read the client key {shown}: {e}"))?;
    let encrypted = |marker: &[u8]| pem.windows(marker.len()).any(|w| w == marker);
    if encrypted(b"ENCRYPTED PRIVATE KEY") || encrypted(b"Proc-Type: 4,ENCRYPTED") {
        return Err(format!(
            "the client key {shown} is encrypted, which is not supported (nor is sslpassword): decrypt it once, e.g. `openssl pkey -in KEY -out PLAIN_KEY`, readable by the relay's user only"
        ));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
        format!("the client key file {shown} holds no PEM private key (PKCS#8, RSA or EC)")
    })
}

/// Refuses a key file with more access than libpq allows (see [`access_refused`]).
fn key_permissions(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    if !meta.is_file() {
        return Err(format!("the client key {shown} is not a regular file"));
    }
    let mode = meta.mode() & 0o7777;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if access_refused(mode, meta.uid(), euid) {
        return Err(format!(
            "the client key {shown} has group or world access (mode {mode:04o}); like libpq the relay refuses it: make it 0600 (0640 if owned by root; for a Kubernetes secret, defaultMode 0640 with the pod's fsGroup)"
        ));
    }
    Ok(())
}

/// libpq's rule: a key file owned by the relay's user must not be readable by anyone else
/// (0600 or less); one owned by root may be readable by its group (0640 or less), which is how
/// a mounted Kubernetes secret with an `fsGroup` looks. libpq checks no other owner. The key
/// is the credential, so like libpq the relay refuses rather than warns.
fn access_refused(mode: u32, owner: u32, euid: u32) -> bool {
    if owner == euid {
        mode & 0o077 != 0
    } else if owner == 0 {
        mode & 0o037 != 0
    } else {
        false
    }
}

/// Presents one certificate (chain) and key whenever the server asks for a client certificate.
#[derive(Debug)]
struct Presents(Arc<CertifiedKey>);

impl ResolvesClientCert for Presents {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server's TLS alert about our certificate, in one line. With TLS 1.3 the server judges
/// the client certificate after our side of the handshake is done, so its alert arrives with
/// the first read rather than from the handshake: both paths come here.
pub(super) fn explain_refusal(e: io::Error, client_cert: Option<&Path>) -> io::Error {
    let Some(rustls::Error::AlertReceived(alert)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return e;
    };
    let text = match (client_cert, alert) {
        (None, AlertDescription::CertificateRequired) => {
            "the server requires a client certificate: set --db-client-cert and --db-client-key (or sslcert and sslkey in --database-url)".to_string()
        }
        (Some(cert), AlertDescription::UnknownCA) => format!(
            "the server refused the client certificate {}: it is not signed by a CA the server trusts (its ssl_ca_file)",
            cert.display()
        ),
        (Some(cert), AlertDescription::CertificateExpired) => format!(
            "the server refused the client certificate {}: it has expired (or is not valid yet); renew it",
            cert.display()
        ),
        (
            Some(cert),
            AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => format!(
            "the server refused the client certificate {} (TLS alert {alert:?})",
            cert.display()
        ),
        _ => return e,
    };
    io::Error::new(io::ErrorKind::PermissionDenied, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_access_follows_libpq() {
        const RELAY: u32 = 1000;
        // Owned by the relay's user: 0600 or less.
        for fine in [0o600, 0o400, 0o700] {
            assert!(!access_refused(fine, RELAY, RELAY), "{fine:o}");
        }
        for open in [0o640, 0o604, 0o644, 0o660, 0o610] {
            assert!(access_refused(open, RELAY, RELAY), "{open:o}");
        }
        // Owned by root (a mounted secret): its group may read, nobody else.
        for fine in [0o640, 0o600, 0o440] {
            assert!(!access_refused(fine, 0, RELAY), "{fine:o}");
        }
        for open in [0o644, 0o660, 0o604, 0o650] {
            assert!(access_refused(open, 0, RELAY), "{open:o}");
        }
        // The relay running as root is the owner case.
        assert!(access_refused(0o640, 0, 0));
        // Another owner: libpq does not check, nor does the relay.
        assert!(!access_refused(0o644, 2000, RELAY));
    }

    #[test]
    fn a_directory_is_not_a_key() {
        let dir = std::env::temp_dir();
        let err = key_permissions(&dir, &std::fs::metadata(&dir).unwrap()).unwrap_err();
        assert!(err.ends_with("is not a regular file"), "{err}");
    }
}
