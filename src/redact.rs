//! Secrets out of every log line, whoever wrote it.
//!
//! The relay's own messages never quote a secret, but its dependencies log at debug and trace
//! what they were given: the OTLP exporter prints its endpoint with the `user:token@` in it,
//! HTTP clients print URLs and headers. Filtering their targets would hide what an operator
//! turns debug on to see, so every formatted line is redacted instead, on its way to stderr:
//! the userinfo of any URL, and the value of any setting whose name says it is a secret
//! (`password=`, `"token":`, `X-Amz-Signature=`, `Authorization: Bearer …`).

use std::borrow::Cow;
use std::io::{self, Write};

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// `line` with URL userinfo and the values of secret-named settings masked; borrowed when
/// there was nothing to mask.
pub fn redact(line: &str) -> Cow<'_, str> {
    let mut line = redact_userinfo(line);
    for pass in [redact_bare_userinfo, redact_settings] {
        if let Cow::Owned(s) = pass(&line) {
            line = Cow::Owned(s);
        }
    }
    line
}

/// Characters that may stand in a userinfo (RFC 3986: unreserved, percent-encoded,
/// sub-delims, `:`), less the ones that separate fields in log lines (`,`, `;`, `(`, `)`,
/// quotes, `=`).
fn in_userinfo(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'-' | b'.' | b'_' | b'~' | b'%' | b'!' | b'$' | b'&' | b'*' | b'+' | b':'
        )
}

/// An authority without its scheme, as HTTP connection pools log their keys
/// (`("http", user:secret@host:port)`): `user:***@host`. Only with a colon: `name@host`
/// alone is as likely an e-mail address or a relay ID as a token.
fn redact_bare_userinfo(line: &str) -> Cow<'_, str> {
    let bytes = line.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    for (at, _) in line.match_indices('@') {
        let mut start = at;
        while start > copied && in_userinfo(bytes[start - 1]) {
            start -= 1;
        }
        // Right after `://`, the first pass has masked it already.
        if line[..start].ends_with("://") {
            continue;
        }
        let Some(colon) = line[start..at].find(':') else {
            continue;
        };
        let secret_start = start + colon + 1;
        if secret_start == at || &line[secret_start..at] == MASK {
            continue;
        }
        out.push_str(&line[copied..secret_start]);
        out.push_str(MASK);
        copied = at;
    }
    if copied == 0 {
        return Cow::Borrowed(line);
    }
    out.push_str(&line[copied..]);
    Cow::Owned(out)
}

/// Characters that end a URL's authority (RFC 3986: `/`, `?`, `#`), and those that end a URL
/// in running text.
fn ends_authority(c: char) -> bool {
    matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '\\' | '`') || c.is_whitespace()
}

/// `scheme://user:secret@host` -> `scheme://user:***@host`; a userinfo without a colon may be
/// a bare token, so all of it goes: `scheme://***@host`.
fn redact_userinfo(line: &str) -> Cow<'_, str> {
    if !line.contains("://") {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        let start = at + 3;
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let end = after.find(ends_authority).unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(userinfo_end) if userinfo_end > 0 => {
                let userinfo = &authority[..userinfo_end];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..=colon]);
                        out.push_str(MASK);
                    }
                    None => out.push_str(MASK),
                }
                out.push_str(&authority[userinfo_end..]);
                changed = true;
            }
            _ => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(line)
    }
}

/// Whether a setting of this name holds a secret. Names are compared lower-case with `-`
/// read as `_`, by their ending, so `lease_token` (a fencing number) and
/// `--database-password-file` (a path) are not secrets, while `X-Amz-Security-Token` and
/// `PGPASSWORD` are.
fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('-', "_");
    let name = name.trim_start_matches('_');
    const EXACT: &[&str] = &["token", "pwd", "pass", "secret", "auth", "apikey"];
    const ENDINGS: &[&str] = &[
        "password",
        "passwd",
        "secret",
        "secret_key",
        "secret_access_key",
        "session_token",
        "security_token",
        "access_token",
        "refresh_token",
        "auth_token",
        "id_token",
        "bearer_token",
        "api_token",
        "api_key",
        "signature",
        "credential",
        "authorization",
    ];
    EXACT.contains(&name) || ENDINGS.iter().any(|e| name.ends_with(e))
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// Characters that end an unquoted value.
fn ends_value(c: u8) -> bool {
    c.is_ascii_whitespace()
        || matches!(
            c,
            b'&' | b',' | b';' | b'"' | b'\'' | b'\\' | b'}' | b')' | b']' | b'>'
        )
}

/// `password=x`, `password='x y'`, `"token":"x"`, `Authorization: Bearer x`, `Some("x")`
/// after a secret's name: the value becomes [`MASK`].
fn redact_settings(line: &str) -> Cow<'_, str> {
    let bytes = line.as_bytes();
    let mut out = String::new();
    // Up to here `line` has been copied to `out` (only once something was masked).
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !is_name_char(bytes[i]) || (i > 0 && is_name_char(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let name_start = i;
        while i < bytes.len() && is_name_char(bytes[i]) {
            i += 1;
        }
        if !is_secret_name(&line[name_start..i]) {
            continue;
        }
        if let Some((value_start, value_end)) = value_after(bytes, i) {
            out.push_str(&line[copied..value_start]);
            out.push_str(MASK);
            copied = value_end;
            i = value_end;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(line);
    }
    out.push_str(&line[copied..]);
    Cow::Owned(out)
}

/// Where the value of the setting whose name ends at `i` lies, if a separator follows.
fn value_after(bytes: &[u8], mut i: usize) -> Option<(usize, usize)> {
    let skip_spaces = |mut i: usize| {
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        i
    };
    // The closing quote of a JSON key or a quoted name.
    if i < bytes.len() && matches!(bytes[i], b'"' | b'\'') {
        i += 1;
    }
    i = skip_spaces(i);
    if i >= bytes.len() || !matches!(bytes[i], b'=' | b':') {
        return None;
    }
    i = skip_spaces(i + 1);
    // A Rust `Debug` of an `Option`.
    if bytes[i..].starts_with(b"Some(") {
        i += 5;
    }
    // An escaped quote, as a JSON log line renders a quoted value inside a message.
    if bytes[i..].starts_with(b"\\\"") {
        i += 1;
    }
    let start = i;
    let end = match bytes.get(i) {
        Some(&q) if q == b'"' || q == b'\'' => {
            let mut j = i + 1;
            while j < bytes.len() && !(bytes[j] == q && bytes[j - 1] != b'\\') {
                j += 1;
            }
            (j + 1).min(bytes.len())
        }
        _ => {
            let mut j = i;
            while j < bytes.len() && !ends_value(bytes[j]) {
                j += 1;
            }
            // `Bearer <token>`, `Basic <credentials>`: the scheme is not the secret.
            let scheme = &bytes[i..j];
            if scheme.eq_ignore_ascii_case(b"bearer") || scheme.eq_ignore_ascii_case(b"basic") {
                j = skip_spaces(j);
                while j < bytes.len() && !ends_value(bytes[j]) {
                    j += 1;
                }
            }
            j
        }
    };
    (end > start).then_some((start, end))
}

/// Makes a [`RedactingWriter`] per log event, for `tracing_subscriber`'s `with_writer`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedactedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactedStderr {
    type Writer = RedactingWriter;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter::default()
    }
}

/// Collects one event's formatted text and writes it to stderr redacted when dropped: a
/// secret split over two writes would otherwise escape both.
#[derive(Debug, Default)]
pub struct RedactingWriter {
    buffer: Vec<u8>,
}

impl Write for RedactingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.drain_into(&mut io::stderr().lock())
    }
}

impl RedactingWriter {
    /// Writes what was collected, redacted, to `out`.
    fn drain_into(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buffer);
        let result = out.write_all(redact(&text).as_bytes());
        self.buffer.clear();
        result
    }
}

impl Drop for RedactingWriter {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_userinfo_is_masked_wherever_the_url_is() {
        for (line, expected) in [
            (
                "HttpClient.NetworkError url=http://user:TOKEN@127.0.0.1:4318/v1/traces",
                "HttpClient.NetworkError url=http://user:***@127.0.0.1:4318/v1/traces",
            ),
            (
                r#"{"url":"https://TOKEN@collector:4318"}"#,
                r#"{"url":"https://***@collector:4318"}"#,
            ),
            (
                "postgres://relay:p%40ss:w@db:5432/app and http://a:b@c",
                "postgres://relay:***@db:5432/app and http://a:***@c",
            ),
            (
                "endpoint Uri(http://k:s3cr;t@sqs.local?x=y@z)",
                "endpoint Uri(http://k:***@sqs.local?x=y@z)",
            ),
            (
                r#"checkout waiting for idle connection: ("http", user:TOKEN@127.0.0.1:4318)"#,
                r#"checkout waiting for idle connection: ("http", user:***@127.0.0.1:4318)"#,
            ),
        ] {
            assert_eq!(redact(line), expected, "{line}");
        }
    }

    #[test]
    fn a_line_without_secrets_is_left_as_it_is() {
        for line in [
            "relay started relay_id=a queue_url=http://127.0.0.1:4566/000000000000/q",
            "password authentication failed for user \"relay\"",
            "--database-password-file: cannot read the password file /x: not found",
            "lease lost lease_token=42 owner=me@host",
            "sent to someone@example.com at 09:19:17",
        ] {
            assert!(matches!(redact(line), Cow::Borrowed(_)), "{line}");
        }
    }

    #[test]
    fn values_of_secret_settings_are_masked() {
        for (line, expected) in [
            (
                "host=db password=hunter2 dbname=app",
                "host=db password=*** dbname=app",
            ),
            (
                "host=db password='hunter 2' dbname=app",
                "host=db password=*** dbname=app",
            ),
            (
                r#"{"password":"hunter2","user":"u"}"#,
                r#"{"password":***,"user":"u"}"#,
            ),
            (
                "db:5432/?Action=connect&X-Amz-Credential=AKID%2F1&X-Amz-Security-Token=T0K&X-Amz-Signature=abc",
                "db:5432/?Action=connect&X-Amz-Credential=***&X-Amz-Security-Token=***&X-Amz-Signature=***",
            ),
            (
                "headers: {\"authorization\": \"Bearer abc.def\"}",
                "headers: {\"authorization\": ***}",
            ),
            ("authorization: Bearer abc.def, x", "authorization: ***, x"),
            ("Config { password: Some(\"pw\") }", "Config { password: Some(***) }"),
            (
                "aws_secret_access_key=wJalr PGPASSWORD=x",
                "aws_secret_access_key=*** PGPASSWORD=***",
            ),
        ] {
            assert_eq!(redact(line), expected, "{line}");
        }
    }

    #[test]
    fn the_writer_redacts_what_it_was_given_in_pieces() {
        let mut w = RedactingWriter::default();
        w.write_all(b"url=http://user:TO").unwrap();
        w.write_all(b"KEN@host:1/\n").unwrap();
        let mut out = Vec::new();
        w.drain_into(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "url=http://user:***@host:1/\n"
        );
        assert!(w.buffer.is_empty());
    }
}
