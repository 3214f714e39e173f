//! TLS to PostgreSQL with libpq's `sslmode` semantics, on rustls.
//!
//! tokio-postgres understands `sslmode=disable|prefer|require` only and refuses `verify-ca`,
//! `verify-full` and `sslrootcert`, so [`split`] takes the TLS settings out of the connection
//! string before tokio-postgres parses the rest, and [`PgTls`] does what libpq would:
//!
//! | sslmode | encrypted | certificate chain checked | host name checked |
//! |---|---|---|---|
//! | `disable` | no | | |
//! | `prefer` (default) | if the server offers TLS | no | no |
//! | `require` | yes | only when a root certificate is given (then as `verify-ca`) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! A client certificate (`sslcert` and `sslkey`, as in libpq) is presented whenever the server
//! asks for one. Its files are read again for every new connection, so a certificate renewed
//! on disk (cert-manager, a rotated Kubernetes secret) is used without a restart; they are also
//! read once when [`PgTls`] is built, so a missing or unusable file stops the start-up.
//!
//! The crypto provider is aws-lc-rs, the one the AWS SDK's HTTPS client already links, so the
//! binary carries one TLS stack.
//!
//! - `connstr`: the TLS settings of a connection string (`sslmode`, `sslrootcert`, `sslcert`,
//!   `sslkey`), taken out before tokio-postgres parses the rest.
//! - `verify`: the root certificates and the server certificate checks of each mode.
//! - `client`: the client certificate: its files, presenting it, the server refusing it.
//! - `stream`: the tokio-postgres connector and the TLS stream it makes.

mod client;
mod connstr;
mod stream;
mod verify;

pub use connstr::{
    split, with_client_cert, with_client_key, with_root_cert, RootCert, SslMode, TlsSettings,
};
pub use stream::{PgTls, PgTlsConnect, PgTlsStream};
