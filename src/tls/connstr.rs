//! The TLS settings of a connection string: libpq's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey`, taken out of a URL or key=value string before tokio-postgres parses the rest.

use std::path::{Path, PathBuf};

/// libpq's `sslmode`, minus `allow` (plain first, TLS only if refused), which protects nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, String> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            "allow" => Err(
                "sslmode=allow is not supported: use prefer, require, verify-ca or verify-full"
                    .to_string(),
            ),
            // The value is not echoed: a mangled URL could have put anything here.
            _ => Err(
                "sslmode must be one of disable, prefer, require, verify-ca, verify-full"
                    .to_string(),
            ),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres should do on the wire; certificate checks are [`super::PgTls`]'s.
    pub fn wire(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// Where the trusted root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of one or more CA certificates (`sslrootcert=PATH`, `--db-ca-cert`).
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`, as in libpq 16).
    System,
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `None` when the string does not say; libpq's default is `prefer`.
    pub mode: Option<SslMode>,
    /// What the server's certificate must chain to (`sslrootcert`); `None`: nothing checked
    /// unless the mode asks, which is then an error.
    pub root_cert: Option<RootCert>,
    /// PEM file of the client certificate, or a chain starting with it (`sslcert`).
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (`sslkey`).
    pub client_key: Option<PathBuf>,
}

impl TlsSettings {
    /// The mode in effect, after libpq's defaults: `prefer`, or `verify-full` with
    /// `sslrootcert=system`. Refuses combinations libpq refuses, verification without
    /// anything to verify against, and a client certificate that could never be presented
    /// (no key, no certificate, or no TLS at all).
    pub fn effective_mode(&self) -> Result<SslMode, String> {
        let mode = self.server_mode()?;
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => Err(
                "a client certificate needs its key: set --db-client-key (OUTBOX_DB_CLIENT_KEY) or sslkey in --database-url, or drop the certificate".to_string(),
            ),
            (None, Some(_)) => Err(
                "a client key needs its certificate: set --db-client-cert (OUTBOX_DB_CLIENT_CERT) or sslcert in --database-url, or drop the key".to_string(),
            ),
            (Some(_), Some(_)) if mode == SslMode::Disable => Err(
                "sslmode=disable sends no client certificate: use sslmode=require or stricter, or drop sslcert and sslkey".to_string(),
            ),
            _ => Ok(mode),
        }
    }

    fn server_mode(&self) -> Result<SslMode, String> {
        let mode = match (self.mode, &self.root_cert) {
            (None, Some(RootCert::System)) => SslMode::VerifyFull,
            (None, _) => SslMode::Prefer,
            (Some(mode), _) => mode,
        };
        match (mode, &self.root_cert) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => Err(format!(
                "sslmode={} needs the CA certificate that signed the server's: set --db-ca-cert (OUTBOX_DB_CA_CERT) or sslrootcert in --database-url",
                mode.as_str()
            )),
            (m, Some(RootCert::System)) if m != SslMode::VerifyFull => Err(format!(
                "sslrootcert=system checks the server against public CAs and needs sslmode=verify-full, not {}",
                m.as_str()
            )),
            _ => Ok(mode),
        }
    }
}

/// The connection parameters [`split`] takes for itself; tokio-postgres knows none but
/// `sslmode`, and refuses the others.
const TLS_KEYS: [&str; 5] = ["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"];

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of a libpq URL or key=value
/// string (the last of each wins, as in libpq) and returns the rest, for tokio-postgres, with
/// the settings. An empty value unsets, as in libpq.
///
/// Errors never quote the string: it holds the password.
pub fn split(conn: &str) -> Result<(String, TlsSettings), String> {
    let (rest, params) = match url_query(conn) {
        Some((head, query)) => {
            let mut kept = Vec::new();
            let mut params = Vec::new();
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                let key = percent_decode(key)?;
                if TLS_KEYS.contains(&key.as_str()) {
                    params.push((key, percent_decode(value)?));
                } else {
                    kept.push(pair);
                }
            }
            let rest = if kept.is_empty() {
                head.to_string()
            } else {
                format!("{head}?{}", kept.join("&"))
            };
            (rest, params)
        }
        None if is_url(conn) => (conn.to_string(), Vec::new()),
        None => {
            let mut kept = Vec::new();
            let mut params = Vec::new();
            for (key, value, raw) in key_values(conn)? {
                if TLS_KEYS.contains(&key) {
                    params.push((key.to_string(), value));
                } else {
                    kept.push(raw);
                }
            }
            (kept.join(" "), params)
        }
    };
    let mut settings = TlsSettings::default();
    let path = |value: String| (!value.is_empty()).then(|| PathBuf::from(value));
    for (key, value) in params {
        match key.as_str() {
            "sslmode" => settings.mode = Some(SslMode::parse(&value)?),
            "sslrootcert" if value == "system" => settings.root_cert = Some(RootCert::System),
            "sslrootcert" => settings.root_cert = path(value).map(RootCert::File),
            "sslcert" => settings.client_cert = path(value),
            "sslkey" => settings.client_key = path(value),
            // The value is a passphrase: never echoed.
            _ if value.is_empty() => {}
            _ => {
                return Err(
                    "sslpassword is not supported (encrypted client keys are not): decrypt the key once, e.g. `openssl pkey -in KEY -out PLAIN_KEY`, keep it readable by the relay's user only, and drop sslpassword"
                        .to_string(),
                )
            }
        }
    }
    Ok((rest, settings))
}

/// Adds `sslrootcert=PATH` at the end of a connection string, where it overrides any earlier
/// one (see [`split`]): this is how `--db-ca-cert` reaches the connection.
pub fn with_root_cert(conn: &str, path: &Path) -> Result<String, String> {
    with_path(conn, "sslrootcert", "--db-ca-cert", path)
}

/// Adds `sslcert=PATH`, as [`with_root_cert`] does for `--db-client-cert`.
pub fn with_client_cert(conn: &str, path: &Path) -> Result<String, String> {
    with_path(conn, "sslcert", "--db-client-cert", path)
}

/// Adds `sslkey=PATH`, as [`with_root_cert`] does for `--db-client-key`.
pub fn with_client_key(conn: &str, path: &Path) -> Result<String, String> {
    with_path(conn, "sslkey", "--db-client-key", path)
}

fn with_path(conn: &str, keyword: &str, flag: &str, path: &Path) -> Result<String, String> {
    let Some(path) = path.to_str() else {
        return Err(format!("{flag} must be a UTF-8 path"));
    };
    if path.is_empty() {
        return Err(format!("{flag} must not be empty"));
    }
    if is_url(conn) {
        let separator = if url_query(conn).is_some() { '&' } else { '?' };
        return Ok(format!(
            "{conn}{separator}{keyword}={}",
            percent_encode(path)
        ));
    }
    let quoted = path.replace('\\', "\\\\").replace('\'', "\\'");
    Ok(format!("{} {keyword}='{quoted}'", conn.trim_end()))
}

fn is_url(conn: &str) -> bool {
    conn.starts_with("postgres://") || conn.starts_with("postgresql://")
}

/// A URL's part before `?` and its query, found the way tokio-postgres finds them: the
/// credentials end at the first `@`, and the query starts at the first `?` after that.
fn url_query(conn: &str) -> Option<(&str, &str)> {
    let prefix = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|p| conn.starts_with(p))?;
    let after_prefix = prefix.len();
    let after_credentials = conn[after_prefix..]
        .find('@')
        .map_or(after_prefix, |at| after_prefix + at + 1);
    let question = after_credentials + conn[after_credentials..].find('?')?;
    Some((&conn[..question], &conn[question + 1..]))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out)
        .map_err(|_| "a connection parameter is not valid UTF-8 after percent-decoding".to_string())
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `key = value` pairs of a libpq key=value string with their raw text, tokenised as
/// tokio-postgres does (values may be single-quoted; a backslash escapes the next character).
fn key_values(conn: &str) -> Result<Vec<(&str, String, &str)>, String> {
    let mut pairs = Vec::new();
    let mut chars = conn.char_indices().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::CharIndices>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            return Ok(pairs);
        };
        while chars
            .next_if(|(_, c)| !c.is_whitespace() && *c != '=')
            .is_some()
        {}
        let key_end = chars.peek().map_or(conn.len(), |&(i, _)| i);
        let key = &conn[start..key_end];
        skip_ws(&mut chars);
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            return Err("a keyword without `= value`".to_string());
        }
        skip_ws(&mut chars);
        let mut value = String::new();
        if chars.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated quoted value".to_string()),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next().map(|(_, c)| c));
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err("a keyword without a value".to_string());
            }
        }
        let end = chars.peek().map_or(conn.len(), |&(i, _)| i);
        pairs.push((key, value, &conn[start..end]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(conn: &str) -> (String, TlsSettings) {
        split(conn).unwrap()
    }

    #[test]
    fn url_parameters_are_taken_out_and_the_rest_kept() {
        let (rest, s) = settings(
            "postgres://u:p%3Fw@db:5432/app?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20file.pem&connect_timeout=3",
        );
        assert_eq!(
            rest,
            "postgres://u:p%3Fw@db:5432/app?application_name=x&connect_timeout=3"
        );
        assert_eq!(s.mode, Some(SslMode::VerifyFull));
        assert_eq!(
            s.root_cert,
            Some(RootCert::File(PathBuf::from("/etc/ca file.pem")))
        );
        let (rest, s) = settings("postgresql://db/app?sslmode=require");
        assert_eq!(rest, "postgresql://db/app");
        assert_eq!(s.mode, Some(SslMode::Require));
        let (rest, s) = settings("postgres://db/app");
        assert_eq!(rest, "postgres://db/app");
        assert_eq!(s, TlsSettings::default());
    }

    #[test]
    fn a_question_mark_in_the_password_is_not_the_query() {
        let (rest, s) = settings("postgres://u:pa?ss@db/app");
        assert_eq!(rest, "postgres://u:pa?ss@db/app");
        assert_eq!(s.mode, None);
    }

    #[test]
    fn key_value_strings_keep_their_other_parameters_verbatim() {
        let (rest, s) = settings(
            "host=db password='it\\'s x' sslmode = verify-ca sslrootcert='/tmp/my ca.pem' dbname=app",
        );
        // The password is written exactly as it was; tokio-postgres parses it.
        assert_eq!(rest, "host=db password='it\\'s x' dbname=app");
        assert_eq!(s.mode, Some(SslMode::VerifyCa));
        assert_eq!(
            s.root_cert,
            Some(RootCert::File(PathBuf::from("/tmp/my ca.pem")))
        );
    }

    #[test]
    fn the_last_setting_wins_so_the_flag_overrides_the_url() {
        let url = "postgres://u:pw@db/app?sslrootcert=/old.pem&sslmode=verify-full";
        let merged = with_root_cert(url, Path::new("/new ca.pem")).unwrap();
        let (rest, s) = settings(&merged);
        assert_eq!(rest, "postgres://u:pw@db/app");
        assert_eq!(
            s.root_cert,
            Some(RootCert::File(PathBuf::from("/new ca.pem")))
        );
        let merged = with_root_cert("postgres://db/app", Path::new("/ca.pem")).unwrap();
        assert_eq!(merged, "postgres://db/app?sslrootcert=/ca.pem");
        let merged = with_root_cert("host=db sslrootcert=/old", Path::new("/it's.pem")).unwrap();
        let (rest, s) = settings(&merged);
        assert_eq!(rest, "host=db");
        assert_eq!(
            s.root_cert,
            Some(RootCert::File(PathBuf::from("/it's.pem")))
        );
    }

    #[test]
    fn modes_follow_libpq() {
        let mode = |conn: &str| settings(conn).1.effective_mode();
        assert_eq!(mode("postgres://db/app"), Ok(SslMode::Prefer));
        assert_eq!(
            mode("postgres://db/app?sslrootcert=system"),
            Ok(SslMode::VerifyFull)
        );
        assert_eq!(
            mode("postgres://db/app?sslmode=require&sslrootcert=/ca"),
            Ok(SslMode::Require)
        );
        let err = mode("postgres://db/app?sslmode=verify-full").unwrap_err();
        assert!(err.contains("set --db-ca-cert"), "{err}");
        let err = mode("host=db sslmode=verify-ca").unwrap_err();
        assert!(err.contains("sslmode=verify-ca needs"), "{err}");
        assert!(mode("postgres://db/app?sslmode=require&sslrootcert=system").is_err());
        assert!(split("postgres://db/app?sslmode=allow").is_err());
    }

    #[test]
    fn errors_never_quote_the_connection_string() {
        for bad in [
            "postgres://u:s3cret@db/app?sslmode=s3cret",
            "host=db password=s3cret sslmode=s3cret",
            "host=db password='s3cret",
            "host=db s3cret",
        ] {
            let err = split(bad).unwrap_err();
            assert!(!err.contains("s3cret"), "{bad}: {err}");
        }
    }

    #[test]
    fn client_certificate_parameters_are_taken_out_and_the_flags_win() {
        let (rest, s) = settings(
            "postgres://u@db/app?sslcert=%2Fetc%2Frelay%20tls.crt&application_name=x&sslkey=/etc/tls.key&sslmode=verify-ca&sslrootcert=/ca",
        );
        assert_eq!(rest, "postgres://u@db/app?application_name=x");
        assert_eq!(s.client_cert, Some(PathBuf::from("/etc/relay tls.crt")));
        assert_eq!(s.client_key, Some(PathBuf::from("/etc/tls.key")));
        assert_eq!(s.effective_mode(), Ok(SslMode::VerifyCa));

        let (rest, s) = settings("host=db sslcert='/a b.crt' sslkey=/a.key dbname=app");
        assert_eq!(rest, "host=db dbname=app");
        assert_eq!(s.client_cert, Some(PathBuf::from("/a b.crt")));
        assert_eq!(s.client_key, Some(PathBuf::from("/a.key")));

        let url = "postgres://db/app?sslcert=/old.crt&sslkey=/old.key";
        let merged = with_client_cert(url, Path::new("/new.crt")).unwrap();
        let merged = with_client_key(&merged, Path::new("/it's new.key")).unwrap();
        let (_, s) = settings(&merged);
        assert_eq!(s.client_cert, Some(PathBuf::from("/new.crt")));
        assert_eq!(s.client_key, Some(PathBuf::from("/it's new.key")));
        let merged = with_client_key("host=db sslkey=/old.key", Path::new("/it's.key")).unwrap();
        assert_eq!(
            settings(&merged).1.client_key,
            Some(PathBuf::from("/it's.key"))
        );
        // An empty value unsets, as in libpq.
        let (_, s) = settings("postgres://db/app?sslcert=/a.crt&sslcert=");
        assert_eq!(s.client_cert, None);
        let err = with_client_cert(url, Path::new("")).unwrap_err();
        assert_eq!(err, "--db-client-cert must not be empty");
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_tls() {
        let mode = |conn: &str| settings(conn).1.effective_mode();
        let err = mode("postgres://db/app?sslcert=/c.crt").unwrap_err();
        assert!(
            err.starts_with("a client certificate needs its key"),
            "{err}"
        );
        let err = mode("host=db sslkey=/c.key").unwrap_err();
        assert!(
            err.starts_with("a client key needs its certificate"),
            "{err}"
        );
        let err =
            mode("postgres://db/app?sslmode=disable&sslcert=/c.crt&sslkey=/c.key").unwrap_err();
        assert!(
            err.starts_with("sslmode=disable sends no client certificate"),
            "{err}"
        );
        // prefer (the default) presents it whenever the server speaks TLS, as libpq does.
        assert_eq!(
            mode("postgres://db/app?sslcert=/c.crt&sslkey=/c.key"),
            Ok(SslMode::Prefer)
        );
        // The server-side rules still come first.
        let err = mode("postgres://db/app?sslmode=verify-full&sslcert=/c.crt").unwrap_err();
        assert!(err.contains("needs the CA certificate"), "{err}");
    }

    #[test]
    fn sslpassword_is_refused_without_echoing_it() {
        for conn in [
            "postgres://u:pw@db/app?sslpassword=s3cret&sslkey=/k",
            "host=db sslpassword='s3cret'",
        ] {
            let err = split(conn).unwrap_err();
            assert!(err.starts_with("sslpassword is not supported"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
        // An empty one means none, as in libpq.
        assert!(split("postgres://db/app?sslpassword=").is_ok());
    }
}
