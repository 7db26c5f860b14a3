//! The percent format: a Python script whose cells start at `# %%` lines
//! (as written by Spyder, VS Code, PyCharm and jupytext).

/// The kind of a percent-format cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CellKind {
    Code,
    Markdown,
    Raw,
}

impl CellKind {
    /// The nbformat `cell_type`.
    pub(crate) fn cell_type(self) -> &'static str {
        match self {
            CellKind::Code => "code",
            CellKind::Markdown => "markdown",
            CellKind::Raw => "raw",
        }
    }
}

/// One cell of a percent-format script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PercentCell {
    pub(crate) kind: CellKind,
    /// Text after the marker (less the cell type and tags), if any.
    pub(crate) title: Option<String>,
    /// jupytext's `tags=["parameters", ...]` on the marker line.
    pub(crate) tags: Vec<String>,
    /// The cell's text, without the marker line, with no leading or
    /// trailing blank lines and no final newline.
    pub(crate) source: String,
}

/// Splits a percent-format script into cells.
///
/// * A line `# %%` (also `#%%`), optionally followed by a title, starts a
///   code cell. `[markdown]` (or `[md]`) or `[raw]` at the start or end of
///   the title makes it a markdown or raw cell instead; their lines lose
///   their comment prefix (`# `, or `#`).
/// * Text before the first marker is a code cell if it is not blank; a
///   jupytext YAML header (`# ---` … `# ---` at the top) is not part of it.
/// * Blank lines at either end of a cell are dropped. `\r\n` reads as `\n`;
///   a leading byte-order mark is ignored.
pub(crate) fn parse(text: &str) -> Vec<PercentCell> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n");
    let lines: Vec<&str> = text.split('\n').collect();

    let mut cells = Vec::new();
    let first_marker = lines
        .iter()
        .position(|l| marker_rest(l).is_some())
        .unwrap_or(lines.len());
    let preamble = strip_yaml_header(&lines[..first_marker]);
    if let Some(source) = trimmed_source(preamble.iter().map(|l| l.to_string())) {
        cells.push(PercentCell {
            kind: CellKind::Code,
            title: None,
            tags: Vec::new(),
            source,
        });
    }

    let mut i = first_marker;
    while i < lines.len() {
        let rest = marker_rest(lines[i]).unwrap_or_default();
        let (rest, tags) = split_tags(rest);
        let (kind, title) = parse_header(&rest);
        let end = lines[i + 1..]
            .iter()
            .position(|l| marker_rest(l).is_some())
            .map_or(lines.len(), |p| i + 1 + p);
        let body = lines[i + 1..end].iter().map(|l| match kind {
            CellKind::Code => l.to_string(),
            CellKind::Markdown | CellKind::Raw => uncomment(l).to_string(),
        });
        cells.push(PercentCell {
            kind,
            title,
            tags,
            source: trimmed_source(body).unwrap_or_default(),
        });
        i = end;
    }
    cells
}

/// For a cell marker line, the text after `%%`; `None` for other lines.
/// The marker must start the line: an indented `# %%` is a comment.
fn marker_rest(line: &str) -> Option<&str> {
    let after_hash = line.strip_prefix('#')?.trim_start_matches([' ', '\t']);
    let rest = after_hash.strip_prefix("%%")?;
    if rest.is_empty() || rest.starts_with([' ', '\t', '[']) {
        Some(rest)
    } else {
        None
    }
}

/// Takes jupytext's cell metadata `tags=[...]` (a JSON list of strings)
/// out of the text after `%%`: the rest, and the tags. Text that is not a
/// well-formed list stays in the title.
fn split_tags(rest: &str) -> (String, Vec<String>) {
    let Some(at) = rest.find("tags=[") else {
        return (rest.to_string(), Vec::new());
    };
    let list = &rest[at + "tags=".len()..];
    let mut stream = serde_json::Deserializer::from_str(list).into_iter::<Vec<String>>();
    match stream.next() {
        Some(Ok(tags)) => {
            let end = at + "tags=".len() + stream.byte_offset();
            (format!("{}{}", &rest[..at], &rest[end..]), tags)
        }
        _ => (rest.to_string(), Vec::new()),
    }
}

/// The cell kind and title from the text after `%%`.
fn parse_header(rest: &str) -> (CellKind, Option<String>) {
    let rest = rest.trim();
    let tags = [
        ("[markdown]", CellKind::Markdown),
        ("[md]", CellKind::Markdown),
        ("[raw]", CellKind::Raw),
    ];
    let mut kind = CellKind::Code;
    let mut title = rest;
    for (tag, tag_kind) in tags {
        if let Some(t) = rest.strip_prefix(tag) {
            kind = tag_kind;
            title = t;
            break;
        }
        if let Some(t) = rest.strip_suffix(tag) {
            kind = tag_kind;
            title = t;
            break;
        }
    }
    let title = title.trim();
    (kind, (!title.is_empty()).then(|| title.to_string()))
}

/// A markdown or raw line without its comment prefix.
fn uncomment(line: &str) -> &str {
    line.strip_prefix("# ")
        .or_else(|| line.strip_prefix('#'))
        .unwrap_or(line)
}

/// Drops a jupytext YAML header: `# ---` as the first line, up to the next
/// `# ---`, all lines comments.
fn strip_yaml_header<'a, 'b>(lines: &'a [&'b str]) -> &'a [&'b str] {
    if lines.first().map(|l| l.trim_end()) != Some("# ---") {
        return lines;
    }
    for (i, line) in lines.iter().enumerate().skip(1) {
        if !line.starts_with('#') {
            return lines;
        }
        if line.trim_end() == "# ---" {
            return &lines[i + 1..];
        }
    }
    lines
}

/// Joins lines without the blank lines at either end; `None` if all are
/// blank.
fn trimmed_source(lines: impl Iterator<Item = String>) -> Option<String> {
    let lines: Vec<String> = lines.collect();
    let first = lines.iter().position(|l| !l.trim().is_empty())?;
    let last = lines.iter().rposition(|l| !l.trim().is_empty())?;
    Some(lines[first..=last].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(source: &str) -> PercentCell {
        PercentCell {
            kind: CellKind::Code,
            title: None,
            tags: Vec::new(),
            source: source.into(),
        }
    }

    #[test]
    fn markers() {
        assert_eq!(marker_rest("# %%"), Some(""));
        assert_eq!(marker_rest("#%%"), Some(""));
        assert_eq!(marker_rest("# %% Load"), Some(" Load"));
        assert_eq!(marker_rest("# %%[markdown]"), Some("[markdown]"));
        assert_eq!(marker_rest("# %%time"), None);
        assert_eq!(marker_rest("# %%%"), None);
        assert_eq!(marker_rest("    # %%"), None);
        assert_eq!(marker_rest("x = 1  # %%"), None);
    }

    #[test]
    fn headers() {
        assert_eq!(parse_header(""), (CellKind::Code, None));
        assert_eq!(
            parse_header(" Load data "),
            (CellKind::Code, Some("Load data".into()))
        );
        assert_eq!(parse_header(" [markdown]"), (CellKind::Markdown, None));
        assert_eq!(
            parse_header(" [md] Intro"),
            (CellKind::Markdown, Some("Intro".into()))
        );
        assert_eq!(
            parse_header(" Intro [markdown]"),
            (CellKind::Markdown, Some("Intro".into()))
        );
        assert_eq!(parse_header(" [raw]"), (CellKind::Raw, None));
        assert_eq!(parse_header(" [sql]"), (CellKind::Code, Some("[sql]".into())));
    }

    #[test]
    fn jupytext_tags_are_read_from_the_marker() {
        let cells = parse(
            "# %% tags=[\"parameters\"]\nx = 1\n# %% Load [markdown] tags=[\"a\", \"b\"]\n# hi\n# %% tags=[1\n",
        );
        assert_eq!(cells[0].tags, vec!["parameters".to_string()]);
        assert_eq!(cells[0].title, None);
        assert_eq!(cells[1].kind, CellKind::Markdown);
        assert_eq!(cells[1].title.as_deref(), Some("Load"));
        assert_eq!(cells[1].tags, vec!["a".to_string(), "b".to_string()]);
        assert!(cells[2].tags.is_empty());
        assert_eq!(cells[2].title.as_deref(), Some("tags=[1"));
    }

    #[test]
    fn empty_and_blank_scripts_have_no_cells() {
        assert!(parse("").is_empty());
        assert!(parse("\n\n  \n").is_empty());
    }

    #[test]
    fn no_marker_is_one_code_cell() {
        assert_eq!(
            parse("import os\n\nprint(1)\n\n"),
            vec![code("import os\n\nprint(1)")]
        );
    }

    #[test]
    fn empty_marker_cell_is_kept() {
        assert_eq!(parse("# %%\n\n# %%\nx\n"), vec![code(""), code("x")]);
    }

    #[test]
    fn yaml_header_is_dropped() {
        let text = "# ---\n# jupyter:\n#   kernelspec:\n#     name: python3\n# ---\n\n# %%\nx = 1\n";
        assert_eq!(parse(text), vec![code("x = 1")]);
        // Not a header: code follows the opening line.
        let text = "# ---\nx = 1\n# ---\n";
        assert_eq!(parse(text), vec![code("# ---\nx = 1\n# ---")]);
    }

    #[test]
    fn markdown_lines_are_uncommented() {
        let cells = parse("# %% [markdown]\n# # Title\n#\n# text\n#no space\nplain\n");
        assert_eq!(cells.len(), 1);
        assert_eq!(cells[0].kind, CellKind::Markdown);
        assert_eq!(cells[0].source, "# Title\n\ntext\nno space\nplain");
    }

    #[test]
    fn bom_and_crlf() {
        let cells = parse("\u{feff}# %%\r\na = 1\r\n\r\n# %% [markdown]\r\n# hi\r\n");
        assert_eq!(cells.len(), 2);
        assert_eq!(cells[0], code("a = 1"));
        assert_eq!(cells[1].source, "hi");
    }
}
