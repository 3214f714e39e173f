//! The tokio-postgres connector honouring `sslmode`, and the TLS stream it makes.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::client::{explain_refusal, ClientFiles};
use super::verify::{explain, load_roots, HostAgnostic};
use super::{RootCert, SslMode, TlsSettings};

/// A tokio-postgres TLS connector honouring libpq's `sslmode` (see the module's table).
#[derive(Clone)]
pub struct PgTls {
    /// `None` with `sslmode=disable`, when tokio-postgres never asks for a handshake.
    config: Option<Arc<ClientConfig>>,
    /// Named in errors so the operator knows which file the server's chain failed against.
    root_cert: Option<RootCert>,
    /// Read again for each connection, so a renewed certificate needs no restart.
    client: Option<Arc<ClientFiles>>,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls")
            .field("enabled", &self.config.is_some())
            .field("root_cert", &self.root_cert)
            .field("client_cert", &self.client.as_ref().map(|c| &c.cert))
            .finish()
    }
}

impl PgTls {
    /// Builds the connector, reading the root certificates and the client certificate now so
    /// that a missing or unusable file stops the start-up rather than the first connection.
    pub fn new(settings: &TlsSettings) -> Result<PgTls, String> {
        let mode = settings.effective_mode()?;
        if mode == SslMode::Disable {
            return Ok(PgTls {
                config: None,
                root_cert: None,
                client: None,
            });
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let roots = match &settings.root_cert {
            Some(root) => Some(Arc::new(load_roots(root)?)),
            None => None,
        };
        let client = match (&settings.client_cert, &settings.client_key) {
            (Some(cert), Some(key)) => {
                let files = ClientFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    provider: Arc::clone(&provider),
                };
                files.load()?;
                Some(Arc::new(files))
            }
            _ => None,
        };
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        // The client certificate is set per connection (see `make_tls_connect`); until then
        // the configuration presents none.
        let config = match (mode, roots) {
            (SslMode::VerifyFull, Some(roots)) => {
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            // libpq: `require` with a root certificate verifies the chain like `verify-ca`.
            (SslMode::VerifyCa | SslMode::Require, Some(roots)) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(HostAgnostic {
                    roots: Some(roots),
                    algorithms,
                }))
                .with_no_client_auth(),
            (SslMode::Prefer, _) | (SslMode::Require, None) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(HostAgnostic {
                    roots: None,
                    algorithms,
                }))
                .with_no_client_auth(),
            (SslMode::Disable | SslMode::VerifyCa | SslMode::VerifyFull, _) => {
                unreachable!(
                    "effective_mode refuses verification without roots; disable returned early"
                )
            }
        };
        Ok(PgTls {
            config: Some(Arc::new(config)),
            root_cert: settings.root_cert.clone(),
            client,
        })
    }

    /// The configuration for one new connection: the shared one, with the client certificate
    /// as the files hold it now.
    fn config_for_connection(&self) -> Result<Option<Arc<ClientConfig>>, String> {
        let (Some(config), Some(client)) = (&self.config, &self.client) else {
            return Ok(self.config.clone());
        };
        let mut config = ClientConfig::clone(config);
        config.client_auth_cert_resolver = client.load_resolver()?;
        Ok(Some(Arc::new(config)))
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    /// Called once per connection attempt (the relay's sessions and the logical wake-up's replication
    /// connection alike), which is where the client certificate's files are read again. The
    /// read blocks the task briefly: two small local files, once per connection.
    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, io::Error> {
        Ok(PgTlsConnect {
            config: self.config_for_connection().map_err(io::Error::other)?,
            // Empty for Unix sockets, where PostgreSQL never offers TLS; the handshake that
            // would need the name then never happens.
            server_name: ServerName::try_from(domain.to_string()).ok(),
            names: Names {
                root_cert: self.root_cert.clone(),
                client_cert: self.client.as_ref().map(|c| c.cert.clone()),
            },
        })
    }
}

/// The files behind a connection's certificate checks, named when one fails.
#[derive(Debug, Clone)]
pub(super) struct Names {
    /// What the server's chain was checked against.
    pub(super) root_cert: Option<RootCert>,
    /// The certificate we presented, if any.
    pub(super) client_cert: Option<PathBuf>,
}

/// One handshake's worth of [`PgTls`], for one host.
pub struct PgTlsConnect {
    /// This connection's configuration, client certificate included; `None`: TLS is off.
    config: Option<Arc<ClientConfig>>,
    /// The host the certificate must be valid for (`verify-full`); `None` over a Unix socket.
    server_name: Option<ServerName<'static>>,
    /// For the one-line explanation of a failed handshake.
    names: Names,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is off (sslmode=disable)"))?;
            let name = self.server_name.ok_or_else(|| {
                io::Error::other("no host name to check the server's certificate against")
            })?;
            let shown = name.to_str().into_owned();
            let names = self.names;
            match tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
            {
                Ok(stream) => Ok(PgTlsStream {
                    stream,
                    client_cert: names.client_cert,
                }),
                Err(e) => Err(explain(e, &shown, &names)),
            }
        })
    }
}

/// A TLS session to PostgreSQL.
pub struct PgTlsStream<S> {
    /// The session itself.
    stream: tokio_rustls::client::TlsStream<S>,
    /// Named if the server refuses it after the handshake (see [`explain_refusal`]).
    client_cert: Option<PathBuf>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => {
                Poll::Ready(Err(explain_refusal(e, this.client_cert.as_deref())))
            }
            other => other,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    /// No `tls-server-end-point` binding: it needs the hash named by the certificate's
    /// signature algorithm, and a wrong guess would fail SCRAM authentication outright.
    /// tokio-postgres then uses plain SCRAM-SHA-256 (`channel_binding=require` is refused).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_reported_with_its_path() {
        let s = TlsSettings {
            mode: Some(SslMode::VerifyFull),
            root_cert: Some(RootCert::File(PathBuf::from("/nonexistent/ca.pem"))),
            ..TlsSettings::default()
        };
        let err = PgTls::new(&s).unwrap_err();
        assert!(
            err.starts_with("cannot read the database CA certificate /nonexistent/ca.pem"),
            "{err}"
        );
        assert!(PgTls::new(&TlsSettings::default()).is_ok());
    }
}
