//! Who may use the console, and which requests are theirs: tokens compared in constant time,
//! sessions behind an HttpOnly SameSite=Strict cookie, a CSRF token per session on every form,
//! and the origin a state-changing request comes from. Pure but for the session table and the
//! random bytes; the HTTP layer asks and carries out.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "outbox_console";

/// How long a login lasts.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// At most this many sessions are kept; the oldest go first (a flood of logins cannot grow
/// the table without bound).
const MAX_SESSIONS: usize = 1024;

/// One token: who it names and its SHA-256 (the token itself is not kept).
struct Token {
    name: String,
    digest: [u8; 32],
}

/// Who made a request: the name logged with their actions, and the key their CSRF token is
/// derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub name: String,
    session: String,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No valid token or session: 401.
    Unauthenticated,
    /// A Host that is not loopback on a console without tokens (a DNS rebinding page): 403.
    ForeignHost,
    /// A state-changing request from another origin, or without the form's CSRF token: 403.
    CrossSite,
}

pub struct Access {
    /// Empty: no token configured (loopback only, enforced at start-up).
    tokens: Vec<Token>,
    /// The secret CSRF tokens are derived from; new at each start.
    secret: [u8; 32],
    sessions: Mutex<HashMap<String, (Who, Instant)>>,
    /// The page is served over TLS: the cookie is `Secure` and the own origin `https`.
    pub tls: bool,
}

impl Access {
    /// Reads the token file: one token per line, `NAME:TOKEN` or a bare `TOKEN` (named
    /// `operator`); blank lines and `#` comments skipped. No error quotes a line of it.
    pub fn from_file(path: Option<&Path>, tls: bool) -> Result<Access, String> {
        let tokens = match path {
            None => Vec::new(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "cannot read the console's token file {}: {e}",
                        path.display()
                    )
                })?;
                let tokens = parse_tokens(&text).map_err(|line| {
                    format!(
                        "the console's token file {}: line {line} has an empty name or token",
                        path.display()
                    )
                })?;
                if tokens.is_empty() {
                    return Err(format!(
                        "the console's token file {} holds no token",
                        path.display()
                    ));
                }
                tokens
            }
        };
        Ok(Access {
            tokens,
            secret: random_bytes(),
            sessions: Mutex::new(HashMap::new()),
            tls,
        })
    }

    pub fn needs_token(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The token's owner, compared with every token in constant time (no early return, so
    /// the time does not tell how many tokens there are before a match, nor how close it was).
    pub fn token_owner(&self, token: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut owner = None;
        for t in &self.tokens {
            if bool::from(t.digest.ct_eq(&digest)) {
                owner = Some(t.name.clone());
            }
        }
        owner
    }

    /// Who sent a request with these headers: the bearer token, else the session cookie; on a
    /// console without tokens, anyone on loopback whose Host names loopback.
    pub fn who(&self, headers: &http::HeaderMap) -> Result<Who, Denied> {
        if !self.needs_token() {
            let host = header(headers, http::header::HOST).unwrap_or("");
            if !loopback_host(host) {
                return Err(Denied::ForeignHost);
            }
            return Ok(Who {
                name: "loopback".into(),
                session: String::new(),
            });
        }
        if let Some(token) =
            header(headers, http::header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "))
        {
            return match self.token_owner(token.trim()) {
                Some(name) => Ok(Who {
                    session: format!("bearer:{name}"),
                    name,
                }),
                None => Err(Denied::Unauthenticated),
            };
        }
        let id = cookie(headers, COOKIE).ok_or(Denied::Unauthenticated)?;
        let mut sessions = self.sessions.lock().expect("sessions lock");
        match sessions.get(id) {
            Some((who, until)) if *until > Instant::now() => Ok(who.clone()),
            Some(_) => {
                sessions.remove(id);
                Err(Denied::Unauthenticated)
            }
            None => Err(Denied::Unauthenticated),
        }
    }

    /// A new session for `name`; returns its `Set-Cookie` value.
    pub fn login(&self, name: String) -> String {
        let id = hex(&random_bytes());
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let now = Instant::now();
        sessions.retain(|_, (_, until)| *until > now);
        if sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            id.clone(),
            (
                Who {
                    name,
                    session: id.clone(),
                },
                now + SESSION_LIFETIME,
            ),
        );
        format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
            SESSION_LIFETIME.as_secs(),
            if self.tls { "; Secure" } else { "" }
        )
    }

    /// Ends the session of these headers; returns the `Set-Cookie` value that clears it.
    pub fn logout(&self, headers: &http::HeaderMap) -> String {
        if let Some(id) = cookie(headers, COOKIE) {
            self.sessions.lock().expect("sessions lock").remove(id);
        }
        format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// The CSRF token of `who`'s forms: derived from the session, so one session's token is
    /// worthless in another, and unguessable without the process's secret.
    pub fn csrf(&self, who: &Who) -> String {
        let mut h = Sha256::new();
        h.update(self.secret);
        h.update(who.session.as_bytes());
        hex(&h.finalize())
    }

    /// A state-changing request must come from the console's own pages: an `Origin` (or, where
    /// a browser sends none, `Sec-Fetch-Site`) of this console, and the form's CSRF token.
    pub fn check_post(
        &self,
        headers: &http::HeaderMap,
        who: &Who,
        form_csrf: Option<&str>,
    ) -> Result<(), Denied> {
        if !self.same_origin(headers) {
            return Err(Denied::CrossSite);
        }
        let expected = self.csrf(who);
        match form_csrf {
            Some(given) if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) => Ok(()),
            _ => Err(Denied::CrossSite),
        }
    }

    /// The request's `Origin` is this console's (scheme and the Host it was asked for);
    /// without one, `Sec-Fetch-Site` says same-origin or a user's own navigation; a client
    /// that sends neither (curl, a script) is not a browser another site can drive.
    pub fn same_origin(&self, headers: &http::HeaderMap) -> bool {
        let host = header(headers, http::header::HOST).unwrap_or("");
        let scheme = if self.tls { "https" } else { "http" };
        if let Some(origin) = header(headers, http::header::ORIGIN) {
            return origin == format!("{scheme}://{host}");
        }
        match header(headers, "sec-fetch-site") {
            Some(site) => site == "same-origin" || site == "none",
            None => true,
        }
    }
}

fn parse_tokens(text: &str) -> Result<Vec<Token>, usize> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, token) = match line.split_once(':') {
            Some((name, token)) => (name.trim(), token.trim()),
            None => ("operator", line),
        };
        if name.is_empty() || token.is_empty() {
            return Err(i + 1);
        }
        tokens.push(Token {
            name: name.to_string(),
            digest: Sha256::digest(token.as_bytes()).into(),
        });
    }
    Ok(tokens)
}

fn header<K: http::header::AsHeaderName>(headers: &http::HeaderMap, key: K) -> Option<&str> {
    headers.get(key).and_then(|v| v.to_str().ok())
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `localhost`, a loopback IPv4 or `[::1]`, with or without a port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn random_bytes() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    // The OS's generator; without it no token of ours would be unguessable, so stop.
    getrandom::fill(&mut bytes).expect("the operating system's random number generator");
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn with_tokens(text: &str) -> Access {
        Access {
            tokens: parse_tokens(text).unwrap(),
            secret: random_bytes(),
            sessions: Mutex::new(HashMap::new()),
            tls: false,
        }
    }

    #[test]
    fn tokens_name_their_owner_and_others_open_nothing() {
        let access = with_tokens("# ops\nalice:s3cret-a\n\nbare-token\n");
        assert_eq!(access.token_owner("s3cret-a").as_deref(), Some("alice"));
        assert_eq!(
            access.token_owner("bare-token").as_deref(),
            Some("operator")
        );
        assert_eq!(access.token_owner("s3cret-"), None);
        assert_eq!(access.token_owner(""), None);
        assert_eq!(parse_tokens("alice:\n").err(), Some(1));
    }

    #[test]
    fn a_console_with_tokens_wants_one_on_every_request() {
        let access = with_tokens("alice:t1");
        let host = ("host", "127.0.0.1:8089");
        assert_eq!(access.who(&headers(&[host])), Err(Denied::Unauthenticated));
        assert_eq!(
            access.who(&headers(&[host, ("authorization", "Bearer nope")])),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            access
                .who(&headers(&[host, ("authorization", "Bearer t1")]))
                .unwrap()
                .name,
            "alice"
        );
        let set_cookie = access.login("alice".into());
        let value = set_cookie.split(';').next().unwrap().to_string();
        assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
        let who = access.who(&headers(&[host, ("cookie", &value)])).unwrap();
        assert_eq!(who.name, "alice");
        access.logout(&headers(&[("cookie", &value)]));
        assert_eq!(
            access.who(&headers(&[host, ("cookie", &value)])),
            Err(Denied::Unauthenticated)
        );
    }

    #[test]
    fn without_tokens_only_a_loopback_host_is_served() {
        let access = with_tokens("");
        for ok in ["127.0.0.1:8089", "localhost:1", "[::1]:8089", "localhost"] {
            assert!(access.who(&headers(&[("host", ok)])).is_ok(), "{ok}");
        }
        for bad in ["evil.example:8089", "evil.example", "10.0.0.1:8089", ""] {
            assert_eq!(
                access.who(&headers(&[("host", bad)])),
                Err(Denied::ForeignHost),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_post_needs_its_own_origin_and_its_sessions_csrf_token() {
        let access = with_tokens("alice:t1\nbob:t2");
        let alice = access
            .who(&headers(&[("host", "h:1"), ("authorization", "Bearer t1")]))
            .unwrap();
        let bob = access
            .who(&headers(&[("host", "h:1"), ("authorization", "Bearer t2")]))
            .unwrap();
        let token = access.csrf(&alice);
        assert_ne!(token, access.csrf(&bob));
        let own = headers(&[("host", "h:1"), ("origin", "http://h:1")]);
        assert_eq!(access.check_post(&own, &alice, Some(&token)), Ok(()));
        assert_eq!(
            access.check_post(&own, &bob, Some(&token)),
            Err(Denied::CrossSite)
        );
        assert_eq!(
            access.check_post(&own, &alice, None),
            Err(Denied::CrossSite)
        );
        let foreign = headers(&[("host", "h:1"), ("origin", "http://evil.example")]);
        assert_eq!(
            access.check_post(&foreign, &alice, Some(&token)),
            Err(Denied::CrossSite)
        );
        let cross = headers(&[("host", "h:1"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(
            access.check_post(&cross, &alice, Some(&token)),
            Err(Denied::CrossSite)
        );
    }
}
