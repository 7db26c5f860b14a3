//! Secret redaction of rendered text, one-shot and streaming.
//!
//! Two sources of secrets are masked:
//!
//! * **exact values** registered with [`RedactionConfig::secrets`] or
//!   [`Redactor::add_secrets`] (for example the host's env values withheld
//!   from the kernel), plus their JSON/Python-escaped and percent-encoded
//!   forms and their whitespace-trimmed form;
//! * a **pattern set** of common credentials: provider keys (`sk-…`, also
//!   `sk-proj-…`, `sk-ant-…`), GitHub tokens (`ghp_`, `gho_`, `ghu_`, `ghs_`,
//!   `ghr_`, `github_pat_`), AWS access key ids (`AKIA…`, `ASIA…`), Slack
//!   tokens (`xoxb-…` etc.), Google API keys (`AIza…`), Hugging Face tokens
//!   (`hf_…`), JWTs, PEM private key blocks (multi-line, also when streamed
//!   in pieces, and the one-line `\n`-escaped form found in JSON), passwords
//!   in URLs (`scheme://user:pass@host`), `Authorization:` headers and
//!   `Bearer` tokens, and `NAME=value` / `"name": "value"` / `name: value`
//!   assignments whose name looks secret (password, passwd, secret, token,
//!   credential, auth, cookie, api_key, `KEY`, …; see [`classify_name`]),
//!   except a bare short ordinary word after a name that is not env-style
//!   (`passwd = hello` is kept; `PASSWD=hello`, `"passwd": "hello"` and
//!   `passwd = hello1` are masked; see `is_plain_word`).
//!
//! # Mask format
//!
//! A masked value becomes [`MASK`] (`****[redacted]`). When the masked text
//! is at least 16 characters long its first 4 characters are kept in front
//! (`sk-demo-3f9a1c7e5b2d4a6f8e0c` → `sk-d****[redacted]`), so an agent can
//! tell two masked tokens apart; shorter values keep nothing. Only the value
//! of an assignment, URL or header is masked, never its name. The body of a
//! PEM private key is replaced by one [`PEM_MASK`] line; its `BEGIN`/`END`
//! lines stay.
//!
//! # Streaming
//!
//! [`RedactStream`] redacts committed text as it arrives and emits text that
//! can no longer become part of a secret: everything up to the last newline
//! (no pattern spans a line, and a registered secret without a newline
//! cannot either), and of a very long unfinished line all but a held-back
//! tail (at least [`MIN_HOLD`] bytes and `max_secret_len()` bytes, extended
//! back to the start of the word it cuts). A secret split across two writes,
//! two pipe reads or two wrapped rows is therefore masked as a whole. Secrets
//! containing a newline are also held back across lines (the last
//! `len - 1` bytes). Everything is emitted at the end of the stream.
//!
//! In a [`StreamCapture`](crate::StreamCapture), exact values are masked
//! twice: in the decoded text *before* terminal rendering (so that
//! `secret\rXY`, which renders as `XYcret…`, or a secret partly erased with
//! `\b` or `ESC[K`, cannot leak its remainder) and in the rendered text
//! (for values that rendering assembles, e.g. around colour escapes). The
//! pattern set runs on the rendered text.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

use aho_corasick::{AhoCorasick, MatchKind};
use memchr::{memchr, memmem, memrchr, memrchr2};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::CaptureError;
use crate::render::floor_boundary;

/// Shortest registered secret, in bytes, that is matched. Shorter values are
/// ignored: they would mask common words and numbers all over the output,
/// and they would turn the mask into an oracle (print candidates, see which
/// one gets masked), which for so few bytes guesses the value quickly.
pub const MIN_SECRET_LEN: usize = 6;

/// What a masked value is replaced by (after an optional 4-char prefix).
pub const MASK: &str = "****[redacted]";

/// The start of a PEM block's `BEGIN` line.
const PEM_BEGIN: &str = "-----BEGIN";

/// What the body of a PEM private key is replaced by.
pub const PEM_MASK: &str = "****[redacted private key]";

/// Masked text at least this many characters long keeps a prefix.
const PREFIX_MIN_CHARS: usize = 16;
/// Characters kept in front of the mask for long values.
const PREFIX_CHARS: usize = 4;
/// Least number of bytes held back from a long unfinished line.
pub const MIN_HOLD: usize = 256;
/// How far the held-back tail may extend back to reach the start of a word.
const RUN_MAX: usize = 4096;
/// Longest match at the end of the buffer that is held whole.
const HOLD_CAP: usize = 64 * 1024;
/// Context of the current line kept after emitting part of it, so that a
/// value is recognised when its name was emitted already.
const CTX_MAX: usize = 256;

/// Redaction settings.
///
/// `Debug` never prints the secret values, and serializing skips them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedactionConfig {
    /// Master switch (default `true`). When false nothing is masked.
    pub enabled: bool,
    /// Exact values to mask wherever they appear (at least
    /// [`MIN_SECRET_LEN`] bytes; shorter ones are ignored).
    #[serde(skip_serializing)]
    pub secrets: Vec<String>,
    /// Apply the built-in pattern set (default `true`).
    pub patterns: bool,
}

impl Default for RedactionConfig {
    fn default() -> Self {
        RedactionConfig {
            enabled: true,
            secrets: Vec::new(),
            patterns: true,
        }
    }
}

impl fmt::Debug for RedactionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedactionConfig")
            .field("enabled", &self.enabled)
            .field("secrets", &format_args!("<{} values>", self.secrets.len()))
            .field("patterns", &self.patterns)
            .finish()
    }
}

/// How a span of text is replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// [`MASK`], with a 4-char prefix when the text is long.
    Prefixed,
    /// [`MASK`] alone (a piece of a value whose start is not in view).
    Plain,
    /// [`PEM_MASK`].
    Pem,
    /// Removed (a PEM body line after the first).
    Drop,
}

/// A byte range of text to replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) style: Style,
}

impl Span {
    fn new(start: usize, end: usize, style: Style) -> Self {
        Span { start, end, style }
    }
}

#[derive(Debug, Clone, Copy)]
enum RuleKind {
    /// Mask the whole match; `random` requires a digit or mixed case.
    Token { random: bool },
    /// Mask the `v` group.
    Group,
    /// Mask the `v` group as a private key.
    PemInline,
    /// `name = value` assignment, filtered by name and value.
    Assign,
}

#[derive(Debug, Clone)]
struct Rule {
    re: Regex,
    kind: RuleKind,
    /// Capture group indices (`usize::MAX` when absent).
    g: Groups,
}

#[derive(Debug, Clone, Copy)]
struct Groups {
    v: usize,
    n: usize,
    q: usize,
    dq: usize,
    sq: usize,
    bare: usize,
}

impl Groups {
    fn of(re: &Regex) -> Self {
        let idx = |name: &str| {
            re.capture_names()
                .position(|n| n == Some(name))
                .unwrap_or(usize::MAX)
        };
        Groups {
            v: idx("v"),
            n: idx("n"),
            q: idx("q"),
            dq: idx("dq"),
            sq: idx("sq"),
            bare: idx("bare"),
        }
    }
}

/// The compiled pattern set: a trigger scan gates which rules run on a line.
#[derive(Debug, Clone)]
struct Patterns {
    triggers: AhoCorasick,
    trigger_rules: Vec<u32>,
    rules: Vec<Rule>,
    /// Rule bits whose trigger is `-----BEGIN` (the pem-inline rule): a
    /// hit means the text may hold a PEM block.
    pem_rules: u32,
}

/// Rule table: name, regex, kind, trigger literals (case-sensitive).
const RULES: &[(&str, &str, RuleKind, &[&str])] = &[
    (
        "provider-key",
        r"\bsk-[A-Za-z0-9_\-]{16,}",
        RuleKind::Token { random: true },
        &["sk-"],
    ),
    (
        "github-token",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
        RuleKind::Token { random: false },
        &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
    ),
    (
        "github-pat",
        r"\bgithub_pat_[A-Za-z0-9_]{30,}",
        RuleKind::Token { random: false },
        &["github_pat_"],
    ),
    (
        "aws-access-key-id",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        RuleKind::Token { random: false },
        &["AKIA", "ASIA"],
    ),
    (
        "slack-token",
        r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
        RuleKind::Token { random: true },
        &["xox"],
    ),
    (
        "google-api-key",
        r"\bAIza[0-9A-Za-z_\-]{35}",
        RuleKind::Token { random: false },
        &["AIza"],
    ),
    (
        "huggingface-token",
        r"\bhf_[A-Za-z0-9]{30,}",
        RuleKind::Token { random: true },
        &["hf_"],
    ),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
        RuleKind::Token { random: false },
        &["eyJ"],
    ),
    (
        "url-password",
        r#"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@'"<>]*:(?P<v>[^\s/?#@'"<>]+)@"#,
        RuleKind::Group,
        &["://"],
    ),
    (
        "pem-inline",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?P<v>(?:\\[rn]|[A-Za-z0-9+/=])+)",
        RuleKind::PemInline,
        &[PEM_BEGIN],
    ),
    (
        "bearer",
        r"\b(?:[Bb]earer|BEARER)[ \t]+(?P<v>[A-Za-z0-9\-._~+/]{16,}=*)",
        RuleKind::Group,
        &["Bearer", "bearer", "BEARER"],
    ),
    (
        "authorization-header",
        r#"(?i)\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic|token|digest|negotiate)[ \t]+)?(?P<v>[^\s"',;]+)"#,
        RuleKind::Group,
        &["auth", "Auth", "AUTH"],
    ),
    (
        "secret-assignment",
        r#"(?i)(?P<n>[a-z0-9_.\-]*(?:key|token|secret|passw(?:or)?d|pwd|credential|auth|cookie)[a-z0-9_.\-]*)(?P<q>["'])?[ \t]*(?::=|[:=])[ \t]*(?:(?:bearer|basic|token)[ \t]+)?(?:"(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s"',;()\[\]{}<>=][^\s"',;()\[\]{}<>]*))"#,
        RuleKind::Assign,
        &[
            "key",
            "Key",
            "KEY",
            "token",
            "Token",
            "TOKEN",
            "secret",
            "Secret",
            "SECRET",
            "passw",
            "Passw",
            "PASSW",
            "pwd",
            "Pwd",
            "PWD",
            "credential",
            "Credential",
            "CREDENTIAL",
            "auth",
            "Auth",
            "AUTH",
            "cookie",
            "Cookie",
            "COOKIE",
        ],
    ),
];

/// The pattern set compiled once per process (clones share the programs).
static COMPILED: std::sync::OnceLock<Patterns> = std::sync::OnceLock::new();

impl Patterns {
    fn get() -> Result<Self, CaptureError> {
        if let Some(p) = COMPILED.get() {
            return Ok(p.clone());
        }
        let p = Self::compile()?;
        Ok(COMPILED.get_or_init(|| p).clone())
    }

    fn compile() -> Result<Self, CaptureError> {
        let mut rules = Vec::with_capacity(RULES.len());
        let mut literals: Vec<&str> = Vec::new();
        let mut trigger_rules: Vec<u32> = Vec::new();
        for (i, (name, re, kind, triggers)) in RULES.iter().enumerate() {
            let re = Regex::new(re).map_err(|source| CaptureError::Pattern {
                name,
                source: Box::new(source),
            })?;
            let g = Groups::of(&re);
            rules.push(Rule { re, kind: *kind, g });
            for t in *triggers {
                match literals.iter().position(|l| l == t) {
                    Some(p) => trigger_rules[p] |= 1 << i,
                    None => {
                        literals.push(t);
                        trigger_rules.push(1 << i);
                    }
                }
            }
        }
        // The multi-line PEM scan is skipped when no `-----BEGIN` trigger
        // fired, so that literal must stay a trigger.
        let pem_rules = literals
            .iter()
            .zip(&trigger_rules)
            .filter(|(l, _)| **l == PEM_BEGIN)
            .fold(0, |acc, (_, m)| acc | m);
        if pem_rules == 0 {
            return Err(CaptureError::Pattern {
                name: "triggers",
                source: "no trigger for -----BEGIN".into(),
            });
        }
        let triggers = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(&literals)
            .map_err(|e| CaptureError::Pattern {
                name: "triggers",
                source: Box::new(e),
            })?;
        Ok(Patterns {
            triggers,
            trigger_rules,
            rules,
            pem_rules,
        })
    }

    /// Adds the spans of every rule match in `text`. Returns whether a
    /// `-----BEGIN` trigger occurs in `text` (a PEM block may start there).
    fn collect(&self, text: &str, spans: &mut Vec<Span>) -> bool {
        let bytes = text.as_bytes();
        // (line start, line end, rules) of the line being gathered.
        let mut cur: Option<(usize, usize, u32)> = None;
        // Search from one past each hit's start rather than its end, so a
        // trigger overlapping another (`Key` in `KeyJ…`, `eyJ`) is not missed.
        let mut from = 0;
        let mut seen = 0;
        while let Some(m) = self.triggers.find(aho_corasick::Input::new(text).range(from..)) {
            from = m.start() + 1;
            let mask = self.trigger_rules[m.pattern().as_usize()];
            seen |= mask;
            if let Some((ls, le, rules)) = cur.as_mut() {
                if m.start() < *le {
                    *rules |= mask;
                    continue;
                }
                self.run_line(text, *ls, *le, *rules, spans);
            }
            let ls = memrchr(b'\n', &bytes[..m.start()]).map_or(0, |p| p + 1);
            let le = memchr(b'\n', &bytes[m.start()..]).map_or(bytes.len(), |p| m.start() + p);
            cur = Some((ls, le, mask));
        }
        if let Some((ls, le, rules)) = cur {
            self.run_line(text, ls, le, rules, spans);
        }
        seen & self.pem_rules != 0
    }

    fn run_line(&self, text: &str, ls: usize, le: usize, rules: u32, spans: &mut Vec<Span>) {
        let line = &text[ls..le];
        let before = spans.len();
        for (i, rule) in self.rules.iter().enumerate() {
            if rules & (1 << i) == 0 {
                continue;
            }
            match rule.kind {
                RuleKind::Token { random } => {
                    for m in rule.re.find_iter(line) {
                        if !random || looks_random(m.as_str()) {
                            spans.push(Span::new(ls + m.start(), ls + m.end(), Style::Prefixed));
                        }
                    }
                }
                RuleKind::Group | RuleKind::PemInline => {
                    let style = if matches!(rule.kind, RuleKind::PemInline) {
                        Style::Pem
                    } else {
                        Style::Prefixed
                    };
                    each_capture(&rule.re, line, |locs| {
                        if let Some((s, e)) = locs.get(rule.g.v) {
                            spans.push(Span::new(ls + s, ls + e, style));
                        }
                    });
                }
                RuleKind::Assign => {
                    let g = rule.g;
                    each_capture(&rule.re, line, |locs| {
                        let Some((ns, ne)) = locs.get(g.n) else {
                            return;
                        };
                        let quoted_name = locs.get(g.q).is_some();
                        let ((vs, ve), bare) = match (locs.get(g.dq), locs.get(g.sq), locs.get(g.bare)) {
                            (Some(v), _, _) | (_, Some(v), _) => (v, false),
                            (_, _, Some(v)) => (v, true),
                            _ => return,
                        };
                        let (name, value) = (&line[ns..ne], &line[vs..ve]);
                        if bare {
                            // `{'token': secret}` or `token=get_token()`: code, not data.
                            let next = line.as_bytes().get(ve).copied();
                            if quoted_name
                                || matches!(next, Some(b'(' | b'[' | b'{'))
                                || value.eq_ignore_ascii_case(name)
                            {
                                return;
                            }
                        }
                        if bare && is_plain_word(value) && !is_env_name(name) {
                            // `passwd = hello`: a short ordinary word after a
                            // code- or prose-style name is not a credential.
                            return;
                        }
                        if value_is_secret(value, classify_name(name)) {
                            spans.push(Span::new(ls + vs, ls + ve, Style::Prefixed));
                        }
                    });
                }
            }
        }
        // A value masked earlier (before rendering) is not masked again.
        let mut i = before;
        while i < spans.len() {
            let sp = spans[i];
            if already_masked(text, sp.start, sp.end) {
                spans.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

/// `text[s..e]` is (part of) a mask written earlier: it contains `****`
/// and `[redacted` follows or is inside.
fn already_masked(text: &str, s: usize, e: usize) -> bool {
    let t = &text[s..e];
    t.contains("****") && (t.contains("[redacted") || text[e..].starts_with("[redacted"))
}

/// Calls `f` with the capture locations of each successive match of `re`
/// in `hay`, reusing one allocation.
fn each_capture(re: &Regex, hay: &str, mut f: impl FnMut(&regex::CaptureLocations)) {
    let mut locs = re.capture_locations();
    let mut at = 0;
    while at < hay.len() {
        let Some(m) = re.captures_read_at(&mut locs, hay, at) else {
            break;
        };
        f(&locs);
        if m.end() <= at {
            break;
        }
        at = m.end();
    }
}

/// A digit, or both upper- and lower-case letters: what random tokens have
/// and hyphenated words (`sk-learn-compatible-models`) do not.
fn looks_random(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().any(u8::is_ascii_digit)
        || (b.iter().any(u8::is_ascii_uppercase) && b.iter().any(u8::is_ascii_lowercase))
}

/// How secret a name looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameClass {
    /// Not a secret name (`max_tokens`, `author`, `token_type`, `PWD`).
    NotSecret,
    /// A generic key name (`key`, `sort_key`): masked only when the value
    /// looks random (8+ chars with letters and digits).
    Weak,
    /// A secret name: the value is masked. `password` also masks short
    /// numeric values.
    Strong {
        /// The name is a password's.
        password: bool,
    },
}

/// Last components that make a name describe a secret rather than hold one.
const DESCRIPTORS: &[&str] = &[
    "count",
    "counts",
    "type",
    "types",
    "len",
    "length",
    "size",
    "limit",
    "limits",
    "max",
    "min",
    "num",
    "id",
    "ids",
    "index",
    "idx",
    "name",
    "names",
    "file",
    "filename",
    "path",
    "dir",
    "url",
    "uri",
    "endpoint",
    "env",
    "var",
    "field",
    "fields",
    "prefix",
    "suffix",
    "format",
    "mode",
    "kind",
    "usage",
    "budget",
    "expires",
    "expiry",
    "expiration",
    "ttl",
    "enabled",
    "required",
    "valid",
    "policy",
    "scope",
    "scopes",
    "version",
    "provider",
    "class",
    "cls",
    "fn",
    "func",
    "method",
    "level",
    "dim",
    "dims",
    "shape",
    "rate",
    "ratio",
    "position",
    "pos",
    "offset",
    "available",
    "used",
    "remaining",
    "per",
    "hint",
    "label",
    "location",
    "store",
    "manager",
    "strategy",
    "rotation",
    "present",
    "set",
    "missing",
    "error",
    "errors",
    "exception",
    "warning",
    "expired",
    "exceeded",
    "sock",
    "socket",
];
/// First components that make a name a quantity (`max_tokens`).
const QUANTIFIERS: &[&str] = &["max", "min", "num", "n", "total", "avg", "mean"];
/// Components (or glued-word endings) that make a name secret.
const STRONG_EXACT: &[&str] = &[
    "secret",
    "secrets",
    "token",
    "cookie",
    "cookies",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "creds",
    "bearer",
    "passphrase",
];
const STRONG_SUFFIX: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "privatekey",
    "accesskey",
    "secretkey",
    "credential",
    "credentials",
    "cookie",
    "pwd",
];
const PASSWORD_WORDS: &[&str] = &["password", "passwd", "pwd", "passphrase"];
/// Qualifiers that make a `key` component secret (`api_key`, `private_key`).
const KEY_QUALIFIERS: &[&str] = &[
    "api",
    "private",
    "access",
    "secret",
    "signing",
    "encryption",
    "master",
    "license",
    "service",
    "account",
    "deploy",
    "ssh",
    "app",
    "webhook",
    "client",
    "auth",
    "session",
    "root",
    "admin",
    "consumer",
    "subscription",
    "sign",
    "hmac",
    "crypt",
    "decryption",
];

/// Splits a name into lower-case components at non-alphanumerics and
/// camelCase boundaries: `X-Auth-Token` → `x`, `auth`, `token`;
/// `apiKey` → `api`, `key`.
fn split_name(name: &str) -> Vec<String> {
    let mut comps = Vec::new();
    for part in name.split(|c: char| !c.is_ascii_alphanumeric()) {
        let mut cur = String::new();
        let mut prev_lower = false;
        for ch in part.chars() {
            if ch.is_ascii_uppercase() && prev_lower && !cur.is_empty() {
                comps.push(cur.to_ascii_lowercase());
                cur.clear();
            }
            prev_lower = ch.is_ascii_lowercase() || ch.is_ascii_digit();
            cur.push(ch);
        }
        if !cur.is_empty() {
            comps.push(cur.to_ascii_lowercase());
        }
    }
    comps
}

/// Classifies an assignment's name; see [`NameClass`].
pub(crate) fn classify_name(name: &str) -> NameClass {
    let comps = split_name(name);
    let (Some(first), Some(last)) = (comps.first(), comps.last()) else {
        return NameClass::NotSecret;
    };
    if DESCRIPTORS.contains(&last.as_str()) || (comps.len() > 1 && QUANTIFIERS.contains(&first.as_str())) {
        return NameClass::NotSecret;
    }
    // `PWD`/`OLDPWD` are the shell's working directories.
    if comps.len() == 1 && (first == "pwd" || first == "oldpwd") {
        return NameClass::NotSecret;
    }
    let password = comps
        .iter()
        .any(|c| PASSWORD_WORDS.iter().any(|w| c.ends_with(w)));
    let strong = password
        || comps
            .iter()
            .any(|c| STRONG_EXACT.contains(&c.as_str()) || STRONG_SUFFIX.iter().any(|w| c.ends_with(w)));
    if strong {
        return NameClass::Strong { password };
    }
    if let Some(k) = comps.iter().position(|c| c == "key" || c == "keys") {
        let env_style = name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if env_style || (k > 0 && KEY_QUALIFIERS.contains(&comps[k - 1].as_str())) {
            return NameClass::Strong { password: false };
        }
        return NameClass::Weak;
    }
    NameClass::NotSecret
}

/// Values that are never secrets whatever the name.
const STOP_VALUES: &[&str] = &[
    "none",
    "null",
    "nil",
    "true",
    "false",
    "undefined",
    "n/a",
    "na",
    "redacted",
    "hidden",
    "masked",
    "str",
    "string",
    "int",
    "integer",
    "float",
    "bool",
    "boolean",
    "bytes",
    "dict",
    "list",
    "tuple",
    "any",
    "optional",
    "object",
    "self",
    "required",
    "unset",
    "empty",
    "default",
    "yes",
    "no",
    "ok",
];

/// Longest bare word that [`is_plain_word`] lets through.
const PLAIN_WORD_MAX: usize = 7;

/// A short ordinary word: 1 to [`PLAIN_WORD_MAX`] ASCII letters, all
/// lower-case or capitalised (`hello`, `Hello`), so no digit, symbol or
/// inner capital. What is kept is exactly such a *bare* value after a name
/// that is not env-style ([`is_env_name`]): `passwd = hello`,
/// `token: expired`. Quoted values (`"password": "hello"`, data), values
/// after `UPPER_SNAKE` names (`export GITHUB_TOKEN=abcdef`, a shell
/// assignment), and anything with a digit, symbol, mixed case or 8+
/// letters stay masked.
fn is_plain_word(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= PLAIN_WORD_MAX
        && b.iter().all(u8::is_ascii_alphabetic)
        && b[1..].iter().all(u8::is_ascii_lowercase)
}

/// An environment-variable style name: upper-case letters, digits and `_`
/// (`PASSWORD`, `DB_PASSWD`, `GITHUB_TOKEN`).
fn is_env_name(name: &str) -> bool {
    name.bytes().any(|b| b.is_ascii_uppercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Whether an assignment's value is masked given its name's class.
fn value_is_secret(v: &str, class: NameClass) -> bool {
    let t = v.trim();
    if t.is_empty() || class == NameClass::NotSecret {
        return false;
    }
    if t.len() <= 12 && STOP_VALUES.iter().any(|s| t.eq_ignore_ascii_case(s)) {
        return false;
    }
    if t.contains("[redacted]") || t.chars().all(|c| matches!(c, '*' | '•' | 'x' | 'X' | '.')) {
        return false;
    }
    let placeholder = (t.starts_with('<') && t.ends_with('>'))
        || t.starts_with("${")
        || t.starts_with("{{")
        || (t.starts_with('$')
            && t.len() > 1
            && t[1..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if placeholder {
        return false;
    }
    match class {
        NameClass::Weak => {
            t.len() >= 8
                && t.bytes().any(|b| b.is_ascii_digit())
                && t.bytes().any(|b| b.is_ascii_alphabetic())
        }
        NameClass::Strong { password } => password || !(t.len() < 8 && t.bytes().all(|b| b.is_ascii_digit())),
        NameClass::NotSecret => false,
    }
}

/// Matcher for the exact secret values.
#[derive(Clone)]
enum Exact {
    None,
    Ac(AhoCorasick),
    /// Fallback if the automaton cannot be built (absurdly large sets).
    Naive(Vec<memmem::Finder<'static>>),
}

/// Masks secrets in text. Cheap to share: wrap it in an `Arc` and hand it to
/// every [`StreamCapture`](crate::StreamCapture) of a session. `Send + Sync`.
///
/// `Debug` prints counts, never values.
#[derive(Clone)]
pub struct Redactor {
    enabled: bool,
    patterns: Option<Patterns>,
    secrets: BTreeSet<String>,
    exact: Exact,
    max_secret_len: usize,
    max_multiline_secret_len: usize,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("enabled", &self.enabled)
            .field("patterns", &self.patterns.is_some())
            .field("secrets", &format_args!("<{} values>", self.secrets.len()))
            .field("max_secret_len", &self.max_secret_len)
            .finish()
    }
}

/// The forms of a secret that are matched: the value, its trimmed form, its
/// JSON/Python-escaped forms and its percent-encoded form (each kept only
/// if at least [`MIN_SECRET_LEN`] bytes).
fn secret_variants(v: &str) -> Vec<String> {
    let mut out = vec![v.to_owned()];
    let trimmed = v.trim();
    if trimmed != v {
        out.push(trimmed.to_owned());
    }
    let base = trimmed;
    let escape = |quote: char| {
        let mut s = String::with_capacity(base.len() + 8);
        for c in base.chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c == quote => {
                    s.push('\\');
                    s.push(c);
                }
                c => s.push(c),
            }
        }
        s
    };
    out.push(escape('"'));
    out.push(escape('\''));
    let mut pct = String::with_capacity(base.len() * 3);
    for b in base.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            pct.push(char::from(b));
        } else {
            pct.push_str(&format!("%{b:02X}"));
        }
    }
    out.push(pct);
    out.retain(|s| s.len() >= MIN_SECRET_LEN);
    out.sort();
    out.dedup();
    out
}

impl Redactor {
    /// Builds a redactor from `config`.
    ///
    /// # Errors
    /// [`CaptureError::Pattern`] if the built-in pattern set fails to
    /// compile (a bug, not an input error).
    pub fn new(config: RedactionConfig) -> Result<Self, CaptureError> {
        if !config.enabled {
            return Ok(Redactor::disabled());
        }
        let patterns = if config.patterns {
            Some(Patterns::get()?)
        } else {
            None
        };
        let mut r = Redactor {
            enabled: true,
            patterns,
            secrets: BTreeSet::new(),
            exact: Exact::None,
            max_secret_len: 0,
            max_multiline_secret_len: 0,
        };
        r.add_secrets(config.secrets);
        Ok(r)
    }

    /// A redactor that masks nothing: [`redact`](Self::redact) returns its
    /// input borrowed and streams pass text through unchanged.
    pub fn disabled() -> Self {
        Redactor {
            enabled: false,
            patterns: None,
            secrets: BTreeSet::new(),
            exact: Exact::None,
            max_secret_len: 0,
            max_multiline_secret_len: 0,
        }
    }

    /// Whether this redactor masks anything at all.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Number of distinct exact values matched (including the escaped and
    /// encoded variants of each registered secret).
    pub fn secret_count(&self) -> usize {
        self.secrets.len()
    }

    /// Registers exact secret values. Values shorter than
    /// [`MIN_SECRET_LEN`] (6) bytes are ignored — see there why. Each value
    /// is also matched trimmed, JSON/Python-escaped and percent-encoded.
    /// Has no effect on a disabled redactor. To add secrets to a shared
    /// redactor, use `Arc::make_mut` before handing the `Arc` out again
    /// (streams already running keep the redactor they were given).
    pub fn add_secrets(&mut self, values: impl IntoIterator<Item = String>) {
        if !self.enabled {
            return;
        }
        let before = self.secrets.len();
        for v in values {
            if v.len() < MIN_SECRET_LEN {
                continue;
            }
            self.secrets.extend(secret_variants(&v));
        }
        if self.secrets.len() == before {
            return;
        }
        self.max_secret_len = self.secrets.iter().map(String::len).max().unwrap_or(0);
        self.max_multiline_secret_len = self
            .secrets
            .iter()
            .filter(|s| s.contains('\n'))
            .map(String::len)
            .max()
            .unwrap_or(0);
        self.exact = match AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&self.secrets)
        {
            Ok(ac) => Exact::Ac(ac),
            Err(_) => Exact::Naive(
                self.secrets
                    .iter()
                    .map(|s| memmem::Finder::new(s.as_bytes()).into_owned())
                    .collect(),
            ),
        };
    }

    /// Whether `bytes` contain a registered secret (any of the forms
    /// [`add_secrets`](Self::add_secrets) matches) anywhere, as raw bytes:
    /// for binary payloads that cannot be masked, only refused. Patterns
    /// are not consulted. Always false for a disabled redactor.
    pub fn contains_secret(&self, bytes: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        match &self.exact {
            Exact::None => false,
            Exact::Ac(ac) => ac.is_match(bytes),
            Exact::Naive(finders) => finders.iter().any(|f| f.find(bytes).is_some()),
        }
    }

    /// Length in bytes of the longest exact value matched (0 if none). A
    /// stream holds back at most this many bytes of an unfinished long line
    /// (and at least [`MIN_HOLD`]).
    pub fn max_secret_len(&self) -> usize {
        self.max_secret_len
    }

    /// Masks every secret in `text` (a complete text: a traceback, a
    /// result's repr, display text). Returns `text` borrowed when nothing
    /// was masked. Multi-line PEM keys are handled as in a stream.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.enabled || text.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut spans = Vec::new();
        if self.collect(text, &mut spans) {
            let mut pem = PemState::default();
            pem_spans(text, 0, 0, text.len(), true, true, &mut pem, &mut spans);
        }
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        normalize(&mut spans);
        Cow::Owned(apply(text, 0, text.len(), &spans))
    }

    /// Spans of exact secrets and pattern matches in `text`, unsorted.
    /// Returns `false` only when `text` certainly holds no `-----BEGIN`
    /// (the pattern scan looked and found none), so the PEM scan of the
    /// same text can be skipped.
    pub(crate) fn collect(&self, text: &str, spans: &mut Vec<Span>) -> bool {
        self.collect_exact(text, spans);
        match &self.patterns {
            Some(p) => p.collect(text, spans),
            None => true,
        }
    }

    /// `text` with exact secret values masked (no patterns): the
    /// pre-rendering pass of a stream, one-shot.
    #[cfg(test)]
    pub(crate) fn redact_exact(&self, text: &str) -> String {
        let mut spans = Vec::new();
        if self.enabled {
            self.collect_exact(text, &mut spans);
        }
        normalize(&mut spans);
        apply(text, 0, text.len(), &spans)
    }

    /// Whether exact secret values are registered.
    pub(crate) fn has_exact(&self) -> bool {
        self.enabled && !matches!(self.exact, Exact::None)
    }

    /// Spans of exact secret values in `text`.
    pub(crate) fn collect_exact(&self, text: &str, spans: &mut Vec<Span>) {
        match &self.exact {
            Exact::None => {}
            Exact::Ac(ac) => {
                for m in ac.find_iter(text) {
                    spans.push(Span::new(m.start(), m.end(), Style::Prefixed));
                }
            }
            Exact::Naive(finders) => {
                for f in finders {
                    for p in f.find_iter(text.as_bytes()) {
                        spans.push(Span::new(p, p + f.needle().len(), Style::Prefixed));
                    }
                }
            }
        }
    }
}

/// Sorts spans and merges overlapping ones.
pub(crate) fn normalize(spans: &mut Vec<Span>) {
    if spans.len() < 2 {
        return;
    }
    spans.sort_unstable_by_key(|s| (s.start, s.end));
    let mut w = 0;
    for i in 1..spans.len() {
        let s = spans[i];
        let last = &mut spans[w];
        if s.start < last.end {
            last.end = last.end.max(s.end);
            last.style = match (last.style, s.style) {
                (Style::Pem, _) | (_, Style::Pem) => Style::Pem,
                (Style::Drop, _) | (_, Style::Drop) => Style::Drop,
                (Style::Plain, _) | (_, Style::Plain) => Style::Plain,
                _ => Style::Prefixed,
            };
        } else {
            w += 1;
            spans[w] = s;
        }
    }
    spans.truncate(w + 1);
}

/// Writes the replacement of `text` in `style` to `out`.
fn push_mask(out: &mut String, text: &str, style: Style) {
    match style {
        Style::Prefixed => {
            let mut it = text.char_indices();
            if text.len() >= PREFIX_MIN_CHARS && text.chars().nth(PREFIX_MIN_CHARS - 1).is_some() {
                let end = it.nth(PREFIX_CHARS).map_or(text.len(), |(b, _)| b);
                out.push_str(&text[..end]);
            }
            out.push_str(MASK);
        }
        Style::Plain => out.push_str(MASK),
        Style::Pem => out.push_str(PEM_MASK),
        Style::Drop => {}
    }
}

/// `text[from..to]` with the (sorted, merged) spans replaced. Spans that
/// start before `from` are masked without a prefix.
pub(crate) fn apply(text: &str, from: usize, to: usize, spans: &[Span]) -> String {
    let mut out = String::with_capacity(to - from + 64);
    let mut pos = from;
    for sp in spans {
        if sp.end <= from {
            continue;
        }
        if sp.start >= to {
            break;
        }
        let s = sp.start.max(from);
        let e = sp.end.min(to);
        out.push_str(&text[pos..s]);
        let style = if (s != sp.start || e != sp.end) && sp.style == Style::Prefixed {
            Style::Plain
        } else {
            sp.style
        };
        push_mask(&mut out, &text[s..e], style);
        pos = e;
    }
    out.push_str(&text[pos..to]);
    out
}

/// Line state of PEM private-key detection.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PemState {
    /// Inside a key: after a `BEGIN … PRIVATE KEY` line.
    active: bool,
    /// The mask line for this key's body was written.
    masked: bool,
}

fn is_pem_body(line: &str) -> bool {
    line.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        || line.starts_with("Proc-Type:")
        || line.starts_with("DEK-Info:")
}

fn is_pem_begin(line: &str) -> bool {
    line.contains("-----BEGIN") && line.contains("PRIVATE KEY-----") && !line.contains("-----END")
}

/// Adds spans that hide PEM private-key bodies among the lines of
/// `text[from..to]`. `at_line_start`: `from` starts a line; if not,
/// `text[line_from..from]` is the (already emitted) start of that line, used
/// to recognise a `BEGIN` line that arrived in pieces. `end_is_final`: text
/// ending at `to` without a newline is a complete last line.
///
/// Body lines (base64, or legacy `Proc-Type:`/`DEK-Info:` headers) after a
/// `BEGIN … PRIVATE KEY` line are hidden: the first becomes [`PEM_MASK`],
/// the others disappear. Any other line ends the block, so a stray `BEGIN`
/// line cannot hide the output that follows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pem_spans(
    text: &str,
    line_from: usize,
    from: usize,
    to: usize,
    at_line_start: bool,
    end_is_final: bool,
    pem: &mut PemState,
    spans: &mut Vec<Span>,
) {
    if !pem.active && memmem::find(&text.as_bytes()[line_from..to], PEM_BEGIN.as_bytes()).is_none() {
        return;
    }
    let bytes = text.as_bytes();
    let mut pos = from;
    let mut first = true;
    while pos < to {
        let (content_end, line_end, complete) = match memchr(b'\n', &bytes[pos..to]) {
            Some(p) => (pos + p, pos + p + 1, true),
            None => (to, to, end_is_final),
        };
        let starts_line = !first || at_line_start;
        if !complete {
            // Part of a long line: not a body line.
            pem.active = false;
        } else if starts_line && pem.active {
            let content = text[pos..content_end].trim_end_matches('\r');
            let t = content.trim();
            if content.contains("-----END") {
                pem.active = false;
            } else if t.is_empty() {
            } else if is_pem_body(t) {
                if pem.masked {
                    spans.push(Span::new(pos, line_end, Style::Drop));
                } else {
                    spans.push(Span::new(pos, content_end, Style::Pem));
                    pem.masked = true;
                }
            } else {
                pem.active = is_pem_begin(content);
                pem.masked = false;
            }
        } else {
            let start = if starts_line { pos } else { line_from };
            let line = text[start..content_end].trim_end_matches('\r');
            pem.active = is_pem_begin(line);
            pem.masked = false;
        }
        pos = line_end;
        first = false;
    }
}

/// Exact-value redaction of the decoded stream *before* terminal rendering.
///
/// Rendering can destroy a secret's shape (`secret\rXY` renders as
/// `XYcret`, which no longer matches), so exact values are masked in the raw
/// text first, and again after rendering (for values that rendering put
/// together, e.g. around colour escapes). Holds back at most
/// `max_secret_len() - 1` bytes after the last newline; nothing when no
/// exact values are registered.
#[derive(Debug, Default)]
pub(crate) struct RawExactStream {
    buf: String,
    spans: Vec<Span>,
}

impl RawExactStream {
    /// Bytes held (capacity), for memory accounting.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Takes decoded text, passes masked text that is final now to `emit`.
    pub(crate) fn process(&mut self, r: &Redactor, text: &str, fin: bool, emit: &mut impl FnMut(&str)) {
        if !r.has_exact() {
            if !text.is_empty() {
                emit(text);
            }
            return;
        }
        self.buf.push_str(text);
        let len = self.buf.len();
        let mut cut = len;
        if !fin {
            let nl = memrchr(b'\n', self.buf.as_bytes()).map_or(0, |p| p + 1);
            let tail = floor_boundary(&self.buf, len.saturating_sub(r.max_secret_len.saturating_sub(1)));
            cut = nl.max(tail);
            if r.max_multiline_secret_len > 0 {
                let lim = len.saturating_sub(r.max_multiline_secret_len - 1);
                cut = cut.min(floor_boundary(&self.buf, lim));
            }
        }
        self.spans.clear();
        r.collect_exact(&self.buf, &mut self.spans);
        normalize(&mut self.spans);
        for sp in &self.spans {
            if sp.start < cut && sp.end > cut {
                // Complete (a longer value would fit in the buffer too).
                cut = sp.end;
            }
        }
        if cut == 0 {
            return;
        }
        if self.spans.first().is_some_and(|sp| sp.start < cut) {
            let masked = apply(&self.buf, 0, cut, &self.spans);
            emit(&masked);
        } else {
            emit(&self.buf[..cut]);
        }
        self.buf.drain(..cut);
        if self.buf.capacity() > 4 * (64 * 1024) {
            self.buf.shrink_to(64 * 1024);
        }
    }
}

/// Streaming redaction of committed text; see the module docs.
///
/// `buf` holds `[0..ctx_len)`: already emitted text of the current line
/// (context for matching, never emitted again) and `[ctx_len..)`: committed
/// text not yet emitted.
#[derive(Debug, Default)]
pub(crate) struct RedactStream {
    buf: String,
    ctx_len: usize,
    pem: PemState,
    spans: Vec<Span>,
}

impl RedactStream {
    /// Bytes held (capacity), for memory accounting.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Takes newly committed text, returns the redacted text that is final
    /// now. With `fin`, everything held is emitted.
    pub(crate) fn process(&mut self, r: &Redactor, committed: String, fin: bool) -> String {
        if !r.enabled || (r.patterns.is_none() && !r.has_exact()) {
            return committed;
        }
        if self.buf.is_empty() && (fin || (committed.ends_with('\n') && r.max_multiline_secret_len == 0)) {
            // Fast path: whole lines, nothing held.
            return match self.redact_lines(r, &committed) {
                Some(masked) => masked,
                None => committed,
            };
        }
        self.buf.push_str(&committed);
        drop(committed);
        let len = self.buf.len();
        if len == self.ctx_len {
            return String::new();
        }
        let mut cut = if fin { len } else { self.cut_candidate(r) };
        self.spans.clear();
        let maybe_pem = r.collect(&self.buf, &mut self.spans);
        normalize(&mut self.spans);
        if !fin {
            for sp in &self.spans {
                if sp.end <= cut {
                    continue;
                }
                if sp.start >= cut {
                    break;
                }
                if sp.end < len {
                    // A complete match: emit it whole.
                    cut = sp.end;
                } else if len - sp.start <= HOLD_CAP {
                    // May still grow: hold it from its start.
                    cut = sp.start.max(self.ctx_len);
                }
                break;
            }
        }
        if cut <= self.ctx_len {
            return String::new();
        }
        let at_line_start = self.ctx_len == 0;
        if maybe_pem || self.pem.active {
            pem_spans(
                &self.buf,
                0,
                self.ctx_len,
                cut,
                at_line_start,
                fin && cut == len,
                &mut self.pem,
                &mut self.spans,
            );
        }
        normalize(&mut self.spans);
        let out = apply(&self.buf, self.ctx_len, cut, &self.spans);
        if fin && cut == len {
            self.buf.clear();
            self.ctx_len = 0;
        } else {
            let bytes = self.buf.as_bytes();
            let line_start = memrchr(b'\n', &bytes[..cut]).map_or(0, |p| p + 1);
            let keep_from = if line_start == cut {
                cut
            } else {
                line_start.max(floor_boundary(&self.buf, cut.saturating_sub(CTX_MAX)))
            };
            self.buf.drain(..keep_from);
            self.ctx_len = cut - keep_from;
        }
        if self.buf.capacity() > 4 * self.buf.len().max(64 * 1024) {
            self.buf.shrink_to(self.buf.len().max(64 * 1024));
        }
        out
    }

    /// Whether [`process_lines`](Self::process_lines) applies: nothing is
    /// held and no registered secret spans lines.
    pub(crate) fn takes_lines(&self, r: &Redactor) -> bool {
        self.buf.is_empty() && r.max_multiline_secret_len == 0
    }

    /// [`process`](Self::process) of whole lines (`text` ends in `\n`)
    /// when [`takes_lines`](Self::takes_lines): returns `text` itself when
    /// nothing in it is masked.
    pub(crate) fn process_lines<'a>(&mut self, r: &Redactor, text: &'a str) -> Cow<'a, str> {
        debug_assert!(self.takes_lines(r) && text.ends_with('\n'));
        if !r.enabled || (r.patterns.is_none() && !r.has_exact()) {
            return Cow::Borrowed(text);
        }
        match self.redact_lines(r, text) {
            Some(masked) => Cow::Owned(masked),
            None => Cow::Borrowed(text),
        }
    }

    /// Masks whole lines with nothing held; `None` when nothing is masked.
    fn redact_lines(&mut self, r: &Redactor, text: &str) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        self.spans.clear();
        if r.collect(text, &mut self.spans) || self.pem.active {
            pem_spans(text, 0, 0, text.len(), true, true, &mut self.pem, &mut self.spans);
        }
        if self.spans.is_empty() {
            return None;
        }
        normalize(&mut self.spans);
        Some(apply(text, 0, text.len(), &self.spans))
    }

    /// Where to cut pending text before looking at matches.
    fn cut_candidate(&self, r: &Redactor) -> usize {
        let bytes = self.buf.as_bytes();
        let len = bytes.len();
        let nl_cut = memrchr(b'\n', &bytes[self.ctx_len..]).map_or(self.ctx_len, |p| self.ctx_len + p + 1);
        let hold = r.max_secret_len.max(MIN_HOLD);
        let mut cut = nl_cut;
        if len - nl_cut > hold + RUN_MAX {
            // A long unfinished line: emit all but a tail, cut before a word.
            let c = floor_boundary(&self.buf, len - hold);
            let lower = nl_cut.max(c.saturating_sub(RUN_MAX));
            cut = match memrchr2(b' ', b'\t', &bytes[lower..c]) {
                Some(p) => lower + p + 1,
                None => floor_boundary(&self.buf, lower),
            };
        }
        if r.max_multiline_secret_len > 0 {
            let lim = floor_boundary(&self.buf, len.saturating_sub(r.max_multiline_secret_len - 1));
            cut = cut.min(lim).max(self.ctx_len);
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: &str = "sk-demo-3f9a1c7e5b2d4a6f8e0c";

    fn redactor(secrets: &[&str]) -> Redactor {
        Redactor::new(RedactionConfig {
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
            ..RedactionConfig::default()
        })
        .expect("redactor")
    }

    fn stream(r: &Redactor, pieces: &[&str]) -> String {
        let mut s = RedactStream::default();
        let mut out = String::new();
        for p in pieces {
            out.push_str(&s.process(r, (*p).to_owned(), false));
        }
        out.push_str(&s.process(r, String::new(), true));
        out
    }

    #[test]
    fn hk31_forms_are_masked_one_shot() {
        let r = redactor(&[DEMO]);
        for text in [
            format!("DEMO_TOKEN={DEMO}\n"),
            format!("{{'token': '{DEMO}'}}\n"),
            format!("{}{}\n", &DEMO[..10], &DEMO[10..]),
            format!("ValueError: bad token {DEMO}\n"),
        ] {
            let out = r.redact(&text);
            assert!(!out.contains(DEMO), "{out}");
            assert!(!out.contains(&DEMO[4..]), "{out}");
            assert!(out.contains("sk-d****[redacted]"), "{out}");
        }
    }

    #[test]
    fn hk31_value_split_across_pushes_is_masked() {
        let r = redactor(&[DEMO]);
        let text =
            format!("DEMO_TOKEN={DEMO}\n{{'token': '{DEMO}'}}\n{DEMO}\nValueError: bad token {DEMO}\n");
        for i in 0..=text.len() {
            let out = stream(&r, &[&text[..i], &text[i..]]);
            assert!(!out.contains(DEMO), "split {i}: {out}");
            assert!(!out.contains("3f9a1c7e5b"), "split {i}: {out}");
            assert_eq!(out, r.redact(&text), "split {i}");
        }
    }

    #[test]
    fn secret_registered_without_patterns_is_still_masked() {
        let r = Redactor::new(RedactionConfig {
            secrets: vec!["plainsecretvalue".into()],
            patterns: false,
            ..RedactionConfig::default()
        })
        .expect("redactor");
        assert_eq!(r.redact("x plainsecretvalue y"), "x plai****[redacted] y");
        assert_eq!(r.max_secret_len(), 16);
    }

    #[test]
    fn mask_keeps_prefix_only_for_long_values() {
        let r = redactor(&["short1", "exactly16chars!!"]);
        assert_eq!(r.redact("a short1 b"), "a ****[redacted] b");
        assert_eq!(r.redact("exactly16chars!!"), "exac****[redacted]");
    }

    #[test]
    fn short_secrets_are_ignored() {
        let r = redactor(&["abc", "12345"]);
        assert_eq!(r.secret_count(), 0);
        assert!(matches!(r.redact("abc 12345"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_and_trimmed_variants_are_masked() {
        let r = redactor(&["pa\"ss\\word9\n"]);
        assert!(!r.redact("x pa\"ss\\word9 y").contains("word9"));
        assert!(!r.redact(r#"{"p": "pa\"ss\\word9"}"#).contains("word9"));
        let r = redactor(&["p@ss w0rd!x"]);
        assert!(!r.redact("postgres://u:p%40ss%20w0rd%21x@h/db").contains("w0rd"));
    }

    #[test]
    fn provider_and_platform_tokens() {
        let r = redactor(&[]);
        let cases = [
            "sk-proj-AbCdEfGh1234567890ijklMNOP",
            "sk-ant-api03-abcDEF123456ghiJKL789",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "gho_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
            "ghs_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "AKIAIOSFODNN7EXAMPLE",
            "ASIAIOSFODNN7EXAMPLE",
            "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp",
            "AIzaSyA1234567890abcdefghijklmnopqrstuv",
            "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ];
        for tok in cases {
            let text = format!("value: {tok} end\n");
            let out = r.redact(&text);
            assert!(!out.contains(tok), "{tok} -> {out}");
            assert!(out.contains(&format!("{}****[redacted]", &tok[..4])), "{out}");
            assert!(out.ends_with(" end\n"), "{out}");
        }
    }

    #[test]
    fn pem_block_is_masked_multi_line_and_streamed() {
        let r = redactor(&[]);
        let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234567890abcdef\nQWERTYUIOPasdfghjkl+/0123456789==\n-----END RSA PRIVATE KEY-----\nafter\n";
        let expected =
            format!("-----BEGIN RSA PRIVATE KEY-----\n{PEM_MASK}\n-----END RSA PRIVATE KEY-----\nafter\n");
        assert_eq!(r.redact(key), expected);
        for i in 0..=key.len() {
            assert_eq!(stream(&r, &[&key[..i], &key[i..]]), expected, "split {i}");
        }
        let lines: Vec<&str> = key.split_inclusive('\n').collect();
        assert_eq!(stream(&r, &lines), expected);
    }

    #[test]
    fn stray_pem_begin_does_not_swallow_output() {
        let r = redactor(&[]);
        let text = "-----BEGIN PRIVATE KEY-----\nthis is not base64!\nmore text\n";
        assert_eq!(r.redact(text), text);
    }

    #[test]
    fn one_line_pem_in_json_is_masked() {
        let r = redactor(&[]);
        let text = r#"{"type": "x", "pk": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"}"#;
        let out = r.redact(text);
        assert!(!out.contains("MIIEvQ"), "{out}");
        assert!(out.contains(PEM_MASK));
    }

    #[test]
    fn url_credentials_mask_only_the_password() {
        let r = redactor(&[]);
        assert_eq!(
            r.redact("connect postgres://admin:hunter2pass@db:5432/app ok"),
            "connect postgres://admin:****[redacted]@db:5432/app ok"
        );
        assert_eq!(
            r.redact("see https://example.invalid/path"),
            "see https://example.invalid/path"
        );
    }

    #[test]
    fn authorization_headers() {
        let r = redactor(&[]);
        let out = r.redact("Authorization: Bearer abcdefghijklmnop1234567890\n");
        assert_eq!(out, "Authorization: Bearer abcd****[redacted]\n");
        let out = r.redact("authorization: Basic dXNlcjpwYXNz\n");
        assert_eq!(out, "authorization: Basic ****[redacted]\n");
        let out = r.redact("curl -H 'Authorization: token ghx123456' x\n");
        assert_eq!(out, "curl -H 'Authorization: token ****[redacted]' x\n");
    }

    #[test]
    fn secret_assignments() {
        let r = redactor(&[]);
        let cases = [
            ("PASSWORD=hunter2", "PASSWORD=****[redacted]"),
            ("DB_PASSWD: letmein!", "DB_PASSWD: ****[redacted]"),
            ("api_key = \"abc123\"", "api_key = \"****[redacted]\""),
            (
                "{\"client_secret\": \"s3cr3t-value\"}",
                "{\"client_secret\": \"****[redacted]\"}",
            ),
            (
                "{'access_token': 'tok-1234'}",
                "{'access_token': '****[redacted]'}",
            ),
            ("export GITHUB_TOKEN=abcdef", "export GITHUB_TOKEN=****[redacted]"),
            ("KEY=abcdef", "KEY=****[redacted]"),
            ("STRIPE_KEY=rk_test_abcdef", "STRIPE_KEY=****[redacted]"),
            (
                "Set-Cookie: sessionid=abc123; Path=/",
                "Set-Cookie: sess****[redacted]; Path=/",
            ),
            (
                "auth_credential := 'xyz987'",
                "auth_credential := '****[redacted]'",
            ),
            ("password: 1234", "password: ****[redacted]"),
            (
                "apiKey: 'abcdefghijklmnopqrstuvwxyz'",
                "apiKey: 'abcd****[redacted]'",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(r.redact(input), want, "{input}");
        }
    }

    #[test]
    fn harmless_assignments_and_words_are_kept() {
        let r = redactor(&[]);
        for text in [
            "max_tokens=100",
            "prompt_tokens: 12, completion_tokens: 30",
            "token_type=bearer",
            "author: John Smith",
            "{'key': 'value'}",
            "sort_key=name",
            "tokenizer: GPT2TokenizerFast",
            "password=None",
            "token: 12",
            "PWD=/home/user/project",
            "we use sk-learn-compatible-estimators-here",
            "if password == expected:",
            "    secret = os.environ['DEMO_TOKEN']",
            "print({'token': secret})",
            "token = get_token()",
            "api_key: str = field()",
            "the bearer of this letter",
            "KEY_COUNT=3",
            "password=<your-password>",
            "token=${GITHUB_TOKEN}",
            "KeyError: 'user_8f3a9b2c'",
            "SSH_AUTH_SOCK=/tmp/ssh-abc123/agent.42",
            "TOKENIZERS_PARALLELISM=false",
        ] {
            assert_eq!(r.redact(text), text, "{text}");
        }
    }

    #[test]
    fn contains_secret_finds_registered_values_in_bytes() {
        let r = redactor(&["s3cret-Value-42"]);
        let mut png = b"\x89PNG\r\n\x1a\n\0\xff".to_vec();
        assert!(!r.contains_secret(&png));
        png.extend_from_slice(b"tEXts3cret-Value-42\0");
        assert!(r.contains_secret(&png));
        assert!(r.contains_secret(b"{\"k\": \"s3cret-Value-42\"}"));
        assert!(!Redactor::disabled().contains_secret(b"s3cret-Value-42"));
        assert!(!redactor(&[]).contains_secret(b"s3cret-Value-42"));
    }

    #[test]
    fn short_plain_words_after_code_style_names_are_kept() {
        let r = redactor(&[]);
        for text in [
            "passwd = hello",
            "password = hello",
            "password: admin",
            "token: expired",
            "Your password = Secret",
            "db.password=blank",
            "secret = x",
        ] {
            assert_eq!(r.redact(text), text, "{text}");
        }
        // Still masked: a digit or symbol, mixed case, 8+ letters, quoted
        // (data), or after an env-style name.
        for (input, want) in [
            ("passwd = hello1", "passwd = ****[redacted]"),
            ("passwd = hel!o", "passwd = ****[redacted]"),
            ("passwd = heLLo", "passwd = ****[redacted]"),
            ("passwd = hellohello", "passwd = ****[redacted]"),
            ("password = \"hello\"", "password = \"****[redacted]\""),
            ("{'password': 'hello'}", "{'password': '****[redacted]'}"),
            ("PASSWD=hello", "PASSWD=****[redacted]"),
            ("passwd = 1234", "passwd = ****[redacted]"),
        ] {
            assert_eq!(r.redact(input), want, "{input}");
        }
    }

    #[test]
    fn weak_key_names_mask_random_values() {
        let r = redactor(&[]);
        assert_eq!(r.redact("{'key': 'a1b2c3d4e5f6'}"), "{'key': '****[redacted]'}");
        assert_eq!(r.redact("cache_key=user42x9"), "cache_key=****[redacted]");
    }

    #[test]
    fn name_classification() {
        assert_eq!(classify_name("DEMO_TOKEN"), NameClass::Strong { password: false });
        assert_eq!(classify_name("dbPassword"), NameClass::Strong { password: true });
        assert_eq!(
            classify_name("X-Auth-Token"),
            NameClass::Strong { password: false }
        );
        assert_eq!(
            classify_name("OPENAI_API_KEY"),
            NameClass::Strong { password: false }
        );
        assert_eq!(classify_name("api_key"), NameClass::Strong { password: false });
        assert_eq!(classify_name("primary_key"), NameClass::Weak);
        assert_eq!(classify_name("max_tokens"), NameClass::NotSecret);
        assert_eq!(classify_name("token_count"), NameClass::NotSecret);
        assert_eq!(classify_name("author"), NameClass::NotSecret);
        assert_eq!(classify_name("monkey"), NameClass::NotSecret);
    }

    #[test]
    fn disabled_redactor_changes_nothing() {
        let r = Redactor::disabled();
        let text = format!("PASSWORD=x {DEMO}");
        assert!(matches!(r.redact(&text), Cow::Borrowed(_)));
        let mut s = RedactStream::default();
        assert_eq!(s.process(&r, text.clone(), false), text);
        let r = Redactor::new(RedactionConfig {
            enabled: false,
            secrets: vec![DEMO.into()],
            patterns: true,
        })
        .expect("redactor");
        assert_eq!(r.redact(DEMO), DEMO);
    }

    #[test]
    fn nothing_to_mask_is_borrowed() {
        let r = redactor(&[DEMO]);
        assert!(matches!(r.redact("plain output\nline two\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn debug_output_hides_secrets() {
        let r = redactor(&[DEMO]);
        assert!(!format!("{r:?}").contains("3f9a"));
        let c = RedactionConfig {
            secrets: vec![DEMO.into()],
            ..RedactionConfig::default()
        };
        assert!(!format!("{c:?}").contains("3f9a"));
    }

    #[test]
    fn secret_across_wrapped_rows_is_held_and_masked() {
        // Long unfinished line arriving in pieces: the secret straddles
        // every possible cut.
        let r = redactor(&[DEMO]);
        let mut line = "y".repeat(10_000);
        line.push_str(DEMO);
        line.push_str(&"z".repeat(10_000));
        for piece in [1000, 4096, 8192, 7777] {
            let pieces: Vec<&str> = line
                .as_bytes()
                .chunks(piece)
                .map(|c| std::str::from_utf8(c).expect("ascii"))
                .collect();
            let out = stream(&r, &pieces);
            assert!(!out.contains(DEMO), "piece {piece}");
            assert_eq!(out, r.redact(&line));
        }
    }

    #[test]
    fn assignment_name_emitted_before_value_is_still_masked() {
        let r = redactor(&[]);
        let mut line = "y ".repeat(5_000);
        line.push_str("PASSWORD=hunter2hunter2 and more words ");
        line.push_str(&"w ".repeat(5_000));
        let at = line.find("hunter2").expect("present");
        let out = stream(&r, &[&line[..at], &line[at..]]);
        assert!(!out.contains("hunter2"), "leak");
    }

    #[test]
    fn multiline_secret_is_held_across_lines() {
        let secret = "line-one-secret\nline-two-secret";
        let r = redactor(&[secret]);
        let text = format!("a\n{secret}\nb\n");
        for i in 0..=text.len() {
            let out = stream(&r, &[&text[..i], &text[i..]]);
            assert!(!out.contains("line-two-secret"), "split {i}: {out}");
        }
    }
}
