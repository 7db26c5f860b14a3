//! Notebook parameters as papermill has them: values given on the command
//! line (`-p NAME VALUE`, typed as papermill's `_resolve_type` does) or in
//! a YAML/JSON file, written into the notebook as an assignment cell tagged
//! `injected-parameters` (see [`crate::Notebook::inject_parameters`]).
//!
//! The Python source of that cell is papermill's `PythonTranslator.codify`
//! output without black formatting: `# Parameters`, then one `NAME = VALUE`
//! line per parameter in order, each value spelt as papermill's translator
//! spells it (strings double-quoted with `unicode_escape`, floats as
//! Python's `repr`, `float('nan')`, `None`, `True`, lists and dicts).

use serde_json::Value;

/// The comment line papermill puts first in the injected cell.
pub const PARAMETERS_COMMENT: &str = "# Parameters";

/// A parameter's value.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer of any size, as its canonical decimal digits (`-12`).
    Int(String),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<ParamValue>),
    /// A mapping, keys in order.
    Dict(Vec<(String, ParamValue)>),
}

/// What is wrong with a parameter or a parameters file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// The name is not a Python identifier.
    #[error("parameter name {name:?} is not a Python identifier")]
    BadName {
        /// The name given.
        name: String,
    },
    /// The parameters file is not YAML (or JSON) or not a mapping.
    #[error("{origin}: {reason}")]
    BadFile {
        /// The file's path.
        origin: String,
        /// Why.
        reason: String,
    },
}

/// Parameters in the order given; setting a name again replaces its value
/// in place (as a Python dict's `update` does).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters {
    items: Vec<(String, ParamValue)>,
}

impl Parameters {
    /// No parameters.
    pub fn new() -> Self {
        Parameters::default()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The parameters in order.
    pub fn items(&self) -> &[(String, ParamValue)] {
        &self.items
    }

    /// Sets `name` to `value` (in place when already set).
    ///
    /// # Errors
    /// [`ParamError::BadName`] when `name` is not a Python identifier.
    pub fn set(&mut self, name: &str, value: ParamValue) -> Result<(), ParamError> {
        if !is_identifier(name) {
            return Err(ParamError::BadName { name: name.into() });
        }
        match self.items.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.items.push((name.to_string(), value)),
        }
        Ok(())
    }

    /// Sets every parameter of `other`, in its order.
    pub fn update(&mut self, other: Parameters) {
        for (name, value) in other.items {
            match self.items.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => self.items.push((name, value)),
            }
        }
    }

    /// Parameters from the text of a YAML or JSON file (JSON is YAML): a
    /// mapping of names to values; an empty document is no parameters.
    /// `origin` names the file in errors. Unlike papermill's PyYAML
    /// loader this reads YAML 1.2 (`yes`/`on` are strings); as with its
    /// `NoDatesSafeLoader`, dates stay strings.
    ///
    /// # Errors
    /// [`ParamError::BadFile`] for text that is not YAML or not a mapping,
    /// [`ParamError::BadName`] for a key that is not an identifier.
    pub fn from_yaml_str(text: &str, origin: &str) -> Result<Parameters, ParamError> {
        let bad = |reason: String| ParamError::BadFile {
            origin: origin.to_string(),
            reason,
        };
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut params = Parameters::new();
        match doc {
            serde_yaml_ng::Value::Null => {}
            serde_yaml_ng::Value::Mapping(m) => {
                for (k, v) in m {
                    let name = match k {
                        serde_yaml_ng::Value::String(s) => s,
                        other => return Err(bad(format!("a parameter name is not a string: {other:?}"))),
                    };
                    params.set(&name, from_yaml(v).map_err(bad)?)?;
                }
            }
            _ => return Err(bad("the parameters are not a mapping of names to values".into())),
        }
        Ok(params)
    }

    /// Parameters from a JSON object (the HTTP and MCP surfaces), in the
    /// object's key order as parsed.
    ///
    /// # Errors
    /// [`ParamError::BadName`] for a key that is not an identifier.
    pub fn from_json_object(obj: &serde_json::Map<String, Value>) -> Result<Parameters, ParamError> {
        let mut params = Parameters::new();
        for (k, v) in obj {
            params.set(k, ParamValue::from_json(v))?;
        }
        Ok(params)
    }

    /// The parameters as JSON (for `metadata.papermill.parameters`).
    pub fn to_json(&self) -> Value {
        Value::Object(self.items.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
    }

    /// The source of the injected cell for a Python notebook, as papermill
    /// writes it (without black): `# Parameters\n` then `NAME = VALUE\n`
    /// per parameter.
    pub fn python_source(&self) -> String {
        let mut s = format!("{PARAMETERS_COMMENT}\n");
        for (name, value) in &self.items {
            s.push_str(name);
            s.push_str(" = ");
            s.push_str(&value.to_python());
            s.push('\n');
        }
        s
    }
}

impl ParamValue {
    /// A `-p NAME VALUE` value typed as papermill's `_resolve_type` does:
    /// `True`, `False`, `None`; then whatever Python's `int()` accepts;
    /// then whatever `float()` accepts; otherwise the string itself.
    pub fn from_cli(value: &str) -> ParamValue {
        match value {
            "True" => ParamValue::Bool(true),
            "False" => ParamValue::Bool(false),
            "None" => ParamValue::None,
            _ => python_int(value)
                .map(ParamValue::Int)
                .or_else(|| python_float(value).map(ParamValue::Float))
                .unwrap_or_else(|| ParamValue::Str(value.to_string())),
        }
    }

    /// A JSON value as a parameter (an integer stays an integer).
    pub fn from_json(v: &Value) -> ParamValue {
        match v {
            Value::Null => ParamValue::None,
            Value::Bool(b) => ParamValue::Bool(*b),
            Value::Number(n) if n.is_i64() || n.is_u64() => ParamValue::Int(n.to_string()),
            Value::Number(n) => ParamValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => ParamValue::Str(s.clone()),
            Value::Array(a) => ParamValue::List(a.iter().map(ParamValue::from_json).collect()),
            Value::Object(o) => ParamValue::Dict(
                o.iter()
                    .map(|(k, v)| (k.clone(), ParamValue::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// The value as JSON (a non-finite float or an integer too large for
    /// JSON numbers becomes its Python spelling as a string).
    pub fn to_json(&self) -> Value {
        match self {
            ParamValue::None => Value::Null,
            ParamValue::Bool(b) => Value::Bool(*b),
            ParamValue::Int(digits) => digits
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| digits.parse::<u64>().map(Value::from))
                .unwrap_or_else(|_| Value::String(digits.clone())),
            ParamValue::Float(f) => serde_json::Number::from_f64(*f)
                .map_or_else(|| Value::String(self.to_python()), Value::Number),
            ParamValue::Str(s) => Value::String(s.clone()),
            ParamValue::List(l) => Value::Array(l.iter().map(ParamValue::to_json).collect()),
            ParamValue::Dict(d) => Value::Object(d.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }

    /// The value as papermill's `PythonTranslator.translate` spells it.
    pub fn to_python(&self) -> String {
        match self {
            ParamValue::None => "None".into(),
            ParamValue::Bool(true) => "True".into(),
            ParamValue::Bool(false) => "False".into(),
            ParamValue::Int(digits) => digits.clone(),
            ParamValue::Float(f) if f.is_nan() => "float('nan')".into(),
            ParamValue::Float(f) if f.is_infinite() && *f < 0.0 => "float('-inf')".into(),
            ParamValue::Float(f) if f.is_infinite() => "float('inf')".into(),
            ParamValue::Float(f) => python_float_repr(*f),
            ParamValue::Str(s) => python_str(s),
            ParamValue::List(l) => {
                let items: Vec<String> = l.iter().map(ParamValue::to_python).collect();
                format!("[{}]", items.join(", "))
            }
            ParamValue::Dict(d) => {
                let items: Vec<String> = d
                    .iter()
                    .map(|(k, v)| format!("{}: {}", python_str(k), v.to_python()))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }
}

/// The source of the injected cell for a notebook in `language` (as
/// [`crate::Notebook::language`] spells it), or `None` when there is no
/// translator for it. Python is papermill's `PythonTranslator` (see
/// [`Parameters::python_source`]).
pub fn parameters_source(language: &str, params: &Parameters) -> Option<String> {
    match language {
        "python" => Some(params.python_source()),
        _ => None,
    }
}

/// A YAML value as a parameter; the error says why it cannot be one.
fn from_yaml(v: serde_yaml_ng::Value) -> Result<ParamValue, String> {
    use serde_yaml_ng::Value as Y;
    Ok(match v {
        Y::Null => ParamValue::None,
        Y::Bool(b) => ParamValue::Bool(b),
        Y::Number(n) if n.is_i64() || n.is_u64() => ParamValue::Int(n.to_string()),
        Y::Number(n) => ParamValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        Y::String(s) => ParamValue::Str(s),
        Y::Sequence(items) => ParamValue::List(items.into_iter().map(from_yaml).collect::<Result<_, _>>()?),
        Y::Mapping(m) => {
            let mut d = Vec::with_capacity(m.len());
            for (k, v) in m {
                let key = match k {
                    Y::String(s) => s,
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => if b { "True" } else { "False" }.to_string(),
                    Y::Null => "None".to_string(),
                    other => return Err(format!("a mapping key is not a scalar: {other:?}")),
                };
                d.push((key, from_yaml(v)?));
            }
            ParamValue::Dict(d)
        }
        Y::Tagged(t) => from_yaml(t.value)?,
    })
}

/// Whether `name` is a Python identifier (letters, digits, `_`; not
/// starting with a digit) and not a keyword that cannot be assigned.
pub fn is_identifier(name: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
        "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
        "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
    ];
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && !KEYWORDS.contains(&name)
}

/// Removes Python's digit-group underscores (`1_000`): each must sit
/// between two digits. `None` when one does not.
fn strip_underscores(s: &str) -> Option<String> {
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let before = i.checked_sub(1).and_then(|j| b.get(j));
            let after = b.get(i + 1);
            if !(before.is_some_and(u8::is_ascii_digit) && after.is_some_and(u8::is_ascii_digit)) {
                return None;
            }
        }
    }
    Some(s.replace('_', ""))
}

/// What Python's `int(s)` gives for `s`, as canonical decimal digits, or
/// `None` when it raises `ValueError`: surrounding whitespace, a sign,
/// ASCII digits with single underscores between them.
fn python_int(s: &str) -> Option<String> {
    let t = s.trim();
    let (neg, digits) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit() || c == b'_') {
        return None;
    }
    let digits = strip_underscores(digits)?;
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), neg) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_string(),
    })
}

/// What Python's `float(s)` gives for `s`, or `None` when it raises:
/// surrounding whitespace, a sign, decimal digits with an optional point
/// and exponent (underscores between digits), `inf`, `infinity`, `nan`
/// in any case.
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        let v = if lower == "nan" { f64::NAN } else { f64::INFINITY };
        return Some(if t.starts_with('-') { -v } else { v });
    }
    if body.is_empty()
        || !body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'_' | b'+' | b'-'))
    {
        return None;
    }
    // Rust's parser takes the same decimal syntax once underscores are
    // checked and removed (it refuses what Python refuses: `1e`, `.`, `e5`).
    let cleaned = strip_underscores(t)?;
    cleaned
        .parse::<f64>()
        .ok()
        .filter(|_| body.bytes().any(|c| c.is_ascii_digit()))
}

/// Python's `repr` of a finite float: the shortest digits that round-trip,
/// in fixed notation when the decimal exponent is in -4..16 (always with a
/// fractional part, `1.0`), else scientific with a signed two-digit or
/// longer exponent (`1e+16`, `1.5e-05`).
fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: `-1.2345e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let m = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.unsigned_abs())
    }
}

/// A string as papermill's `translate_escaped_str` writes it: Python's
/// `unicode_escape` codec, then `"` escaped, in double quotes.
fn python_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_values_are_typed_as_papermill_does() {
        use ParamValue::*;
        assert_eq!(ParamValue::from_cli("True"), Bool(true));
        assert_eq!(ParamValue::from_cli("true"), Str("true".into()));
        assert_eq!(ParamValue::from_cli("None"), None);
        assert_eq!(ParamValue::from_cli("12"), Int("12".into()));
        assert_eq!(ParamValue::from_cli(" +0012 "), Int("12".into()));
        assert_eq!(ParamValue::from_cli("-0"), Int("0".into()));
        assert_eq!(ParamValue::from_cli("1_000"), Int("1000".into()));
        assert_eq!(ParamValue::from_cli("1__0"), Str("1__0".into()));
        assert_eq!(
            ParamValue::from_cli("123456789012345678901234567890"),
            Int("123456789012345678901234567890".into())
        );
        assert_eq!(ParamValue::from_cli("0.5"), Float(0.5));
        assert_eq!(ParamValue::from_cli("1e3"), Float(1000.0));
        assert_eq!(ParamValue::from_cli(".5"), Float(0.5));
        assert_eq!(ParamValue::from_cli("-Infinity"), Float(f64::NEG_INFINITY));
        assert!(matches!(ParamValue::from_cli("nan"), Float(f) if f.is_nan()));
        assert_eq!(ParamValue::from_cli("1e"), Str("1e".into()));
        assert_eq!(ParamValue::from_cli("."), Str(".".into()));
        assert_eq!(ParamValue::from_cli("0x10"), Str("0x10".into()));
        assert_eq!(ParamValue::from_cli(""), Str("".into()));
        assert_eq!(ParamValue::from_cli("abc"), Str("abc".into()));
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (f, s) in [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (1e15, "1000000000000000.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (1e300, "1e+300"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn strings_escape_as_unicode_escape() {
        assert_eq!(
            python_str("a\"b'c\\d\ne\u{7f}é€😀"),
            "\"a\\\"b'c\\\\d\\ne\\x7f\\xe9\\u20ac\\U0001f600\""
        );
    }

    #[test]
    fn names_must_be_identifiers() {
        let mut p = Parameters::new();
        assert!(p.set("alpha_1", ParamValue::None).is_ok());
        assert!(p.set("ä", ParamValue::None).is_ok());
        for bad in ["", "1a", "a-b", "x; import os", "class"] {
            assert_eq!(
                p.set(bad, ParamValue::None),
                Err(ParamError::BadName { name: bad.into() })
            );
        }
    }

    #[test]
    fn yaml_keeps_order_and_later_values_replace_in_place() {
        let mut p =
            Parameters::from_yaml_str("b: 1\na: [1, 2.5, x, null]\nc: {k: true}\n", "f.yaml").expect("yaml");
        let mut cli = Parameters::new();
        cli.set("b", ParamValue::from_cli("two")).expect("name");
        cli.set("z", ParamValue::from_cli("3")).expect("name");
        p.update(cli);
        assert_eq!(
            p.python_source(),
            "# Parameters\nb = \"two\"\na = [1, 2.5, \"x\", None]\nc = {\"k\": True}\nz = 3\n"
        );
        assert!(Parameters::from_yaml_str("", "f").expect("empty").is_empty());
        assert!(matches!(
            Parameters::from_yaml_str("- 1\n", "f"),
            Err(ParamError::BadFile { .. })
        ));
        assert!(matches!(
            Parameters::from_yaml_str("a: [", "f"),
            Err(ParamError::BadFile { .. })
        ));
    }
}
