//! Just enough PromQL reading to check queries against what the relay exports: the vector
//! selectors of an expression, the signal an alert compares with its threshold, and Grafana's
//! template variables. Not a parser: it knows the tokens, not the grammar.

use std::collections::HashMap;

/// A metric name and its label matchers as written (`{job="x"}`, or empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub matchers: String,
}

impl Selector {
    /// The selector as an instant query of its own.
    pub fn text(&self) -> String {
        format!("{}{}", self.metric, self.matchers)
    }
}

/// Words that are operators or modifiers, never metric names.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
];

/// Modifiers whose parenthesised list holds label names, not expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Aggregation operators: they may be followed by `by (...)` before their parentheses.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Every vector selector in `expr`, in order. A selector without a metric name
/// (`{__name__=~"..."}`) comes back with an empty `metric`.
pub fn selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '[' {
            i = skip_group(&chars, i, '[', ']');
        } else if c == '{' {
            let end = skip_group(&chars, i, '{', '}');
            found.push(Selector {
                metric: String::new(),
                matchers: chars[i..end].iter().collect(),
            });
            i = end;
        } else if c.is_ascii_digit() || c == '.' {
            // Numbers and durations: 60, 0.99, 5m, 1e3.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = next_non_space(&chars, i);
            let lower = word.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) {
                if let Some(open) = next.filter(|&n| chars[n] == '(') {
                    i = skip_group(&chars, open, '(', ')');
                }
            } else if KEYWORDS.contains(&lower.as_str())
                || AGGREGATIONS.contains(&lower.as_str())
                || next.is_some_and(|n| chars[n] == '(')
            {
                // An operator, or a function or aggregation: its arguments follow.
            } else {
                let matchers = match next.filter(|&n| chars[n] == '{') {
                    Some(open) => {
                        let end = skip_group(&chars, open, '{', '}');
                        let text = chars[open..end].iter().collect();
                        i = end;
                        text
                    }
                    None => String::new(),
                };
                found.push(Selector {
                    metric: word,
                    matchers,
                });
            }
        } else {
            i += 1;
        }
    }
    found
}

/// What an alert compares with its threshold: `expr` split at top-level `or` / `and` /
/// `unless`, each part without its comparison with a number, and `absent(x)` read as `x`.
/// Each signal must return series for its alert to be able to fire at all.
pub fn signals(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in split_top_level_words(expr, &["or", "and", "unless"]) {
        let part = strip_matching_modifier(part.trim());
        let sides = match split_comparison(part) {
            Some((lhs, rhs)) => {
                let rhs = rhs.trim();
                let rhs = rhs.strip_prefix("bool").map(str::trim).unwrap_or(rhs);
                match (is_number(lhs), is_number(rhs)) {
                    (false, true) => vec![lhs.trim().to_string()],
                    (true, false) => vec![rhs.to_string()],
                    _ => vec![lhs.trim().to_string(), rhs.to_string()],
                }
            }
            None => vec![part.to_string()],
        };
        for side in sides {
            out.push(strip_absent(&side));
        }
    }
    out
}

/// The labels `expr` aggregates by (`sum by (kind) (...)`), in order.
pub fn by_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by") {
        let before = rest[..at].chars().next_back();
        let after = rest[at + 2..].trim_start();
        let word_start = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if let Some(list) = after.strip_prefix('(').filter(|_| word_start) {
            let end = list.find(')').unwrap_or(list.len());
            out.extend(
                list[..end]
                    .split(',')
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty()),
            );
        }
        rest = &rest[at + 2..];
    }
    out
}

/// Replaces Grafana's template variables (`$name`, `${name}`, `${name:format}`, `[[name]]`)
/// with `values`; a variable that `values` lacks is an error.
pub fn substitute(text: &str, values: &HashMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['$', '[']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (name, used) = if let Some(braced) = tail.strip_prefix("${") {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {text}"))?;
            let inner = &braced[..end];
            (inner.split(':').next().unwrap_or(inner), end + 3)
        } else if let Some(bracketed) = tail.strip_prefix("[[") {
            let end = bracketed
                .find("]]")
                .ok_or_else(|| format!("unclosed [[ in {text}"))?;
            (&bracketed[..end], end + 4)
        } else if let Some(plain) = tail.strip_prefix('$') {
            let end = plain
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(plain.len());
            (&plain[..end], end + 1)
        } else {
            // A range's `[`, not a variable.
            out.push('[');
            rest = &tail[1..];
            continue;
        };
        if name.is_empty() {
            return Err(format!("a bare `$` in {text}"));
        }
        let value = values
            .get(name)
            .ok_or_else(|| format!("unknown template variable ${name} in {text}"))?;
        out.push_str(value);
        rest = &tail[used..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Index just past the string literal that starts at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    (i + 1).min(chars.len())
}

/// Index just past the group that opens at `start` with `open`, strings and nesting included.
fn skip_group(chars: &[char], start: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

fn next_non_space(chars: &[char], from: usize) -> Option<usize> {
    (from..chars.len()).find(|&i| !chars[i].is_whitespace())
}

/// Byte offsets of the characters of `s` outside strings and brackets of any kind.
fn top_level(s: &str) -> Vec<(usize, char)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (at, c) in s.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            _ if depth == 0 => out.push((at, c)),
            _ => {}
        }
    }
    out
}

/// `s` split at the whole words `words` where they stand outside brackets and strings.
fn split_top_level_words<'a>(s: &'a str, words: &[&str]) -> Vec<&'a str> {
    let top: HashMap<usize, char> = top_level(s).into_iter().collect();
    let bytes = s.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut parts = Vec::new();
    let mut from = 0;
    let mut at = 0;
    while at < s.len() {
        let hit = words.iter().find(|w| {
            s[at..].starts_with(**w)
                && (0..w.len()).all(|k| top.contains_key(&(at + k)))
                && (at == 0 || !is_word(bytes[at - 1]))
                && bytes.get(at + w.len()).is_none_or(|&b| !is_word(b))
        });
        match hit {
            Some(w) => {
                parts.push(&s[from..at]);
                at += w.len();
                from = at;
            }
            None => at += s[at..].chars().next().map_or(1, char::len_utf8),
        }
    }
    parts.push(&s[from..]);
    parts
}

/// A part after `and on (x)` / `or ignoring (x)` starts with its matching modifier; drop it.
fn strip_matching_modifier(part: &str) -> &str {
    for modifier in ["on", "ignoring"] {
        if let Some(rest) = part.strip_prefix(modifier) {
            let rest = rest.trim_start();
            if rest.starts_with('(') {
                let chars: Vec<char> = rest.chars().collect();
                let end = skip_group(&chars, 0, '(', ')');
                let skipped: usize = chars[..end].iter().map(|c| c.len_utf8()).sum();
                return rest[skipped..].trim();
            }
        }
    }
    part
}

/// The two sides of the top-level comparison in `s`, if it has one.
fn split_comparison(s: &str) -> Option<(&str, &str)> {
    let top = top_level(s);
    for (k, &(at, c)) in top.iter().enumerate() {
        let next = top
            .get(k + 1)
            .filter(|(n, _)| *n == at + 1)
            .map(|(_, c)| *c);
        let len = match (c, next) {
            ('=', Some('=')) | ('!', Some('=')) | ('>', Some('=')) | ('<', Some('=')) => 2,
            ('>', _) | ('<', _) => 1,
            _ => continue,
        };
        return Some((&s[..at], &s[at + len..]));
    }
    None
}

fn is_number(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty() && s.parse::<f64>().is_ok()
}

/// `absent(x)` and `absent_over_time(x[d])` as `x`: what must exist for them to say anything.
fn strip_absent(s: &str) -> String {
    let s = s.trim();
    for function in ["absent_over_time", "absent"] {
        if let Some(inner) = s
            .strip_prefix(function)
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('('))
            .and_then(|r| r.strip_suffix(')'))
        {
            let inner = inner.trim();
            let inner = match inner.rfind('[') {
                Some(at) if inner.ends_with(']') => &inner[..at],
                _ => inner,
            };
            return inner.trim().to_string();
        }
    }
    s.to_string()
}

#[test]
fn selectors_skip_functions_modifiers_label_lists_strings_and_durations() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(outbox_send_duration_seconds_bucket{job=~"$job", instance=~"a{b}"}[5m]))) * 60
        or max without (instance, pod) (outbox_relays{state="refused"}) > bool 0
        and on (job) up offset 1m"#;
    let found: Vec<String> = selectors(expr).iter().map(Selector::text).collect();
    assert_eq!(
        found,
        [
            r#"outbox_send_duration_seconds_bucket{job=~"$job", instance=~"a{b}"}"#,
            r#"outbox_relays{state="refused"}"#,
            "up",
        ]
    );
}

#[test]
fn signals_drop_thresholds_split_set_operators_and_read_absent_as_its_argument() {
    let expr = r#"sum without (reason) (increase(x_total{job="j"}[15m])) > 0
        or max without (instance) (delta(y{job="j"}[15m])) > 0"#;
    assert_eq!(
        signals(expr),
        [
            r#"sum without (reason) (increase(x_total{job="j"}[15m]))"#,
            r#"max without (instance) (delta(y{job="j"}[15m]))"#,
        ]
    );
    assert_eq!(
        signals(r#"up{job="j"} == 0 or absent(up{job="j"})"#),
        [r#"up{job="j"}"#, r#"up{job="j"}"#]
    );
    assert_eq!(
        signals(r#"changes(a{k="or"}[5m]) == 0 and a > 0"#),
        [r#"changes(a{k="or"}[5m])"#, "a"]
    );
}

#[test]
fn by_labels_lists_what_an_aggregation_keeps() {
    assert_eq!(
        by_labels(
            "histogram_quantile(0.5, sum by (le) (rate(x_bucket[1m]))) + sum by(kind, job) (y)"
        ),
        ["le", "kind", "job"]
    );
    assert!(by_labels("max without (instance) (standby_rows)").is_empty());
}

#[test]
fn substitute_fills_every_variable_form_and_refuses_unknown_ones() {
    let values: HashMap<String, String> = [("job", "outbox-relay"), ("__rate_interval", "4s")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        substitute(
            r#"rate(x{job=~"$job"}[$__rate_interval]) + y{j="${job:regex}",k="[[job]]"}[5m]"#,
            &values
        )
        .unwrap(),
        r#"rate(x{job=~"outbox-relay"}[4s]) + y{j="outbox-relay",k="outbox-relay"}[5m]"#
    );
    assert!(substitute("x{instance=~\"$instance\"}", &values)
        .unwrap_err()
        .contains("$instance"));
}
