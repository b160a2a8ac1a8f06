//! JSON lines, read one line at a time into one reused buffer.

use std::io::BufRead;

use serde::Deserialize;

use crate::PlanError;

/// The lines of a JSON-lines input; blank lines are skipped.
pub(crate) struct Lines<R> {
    reader: R,
    buf: String,
    line: u64,
    source_name: String,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(reader: R, source_name: &str) -> Self {
        Self {
            reader,
            buf: String::with_capacity(512),
            line: 0,
            source_name: source_name.to_owned(),
        }
    }

    /// The next non-blank line and its number, or `None` at the end.
    pub(crate) fn next_line(&mut self) -> Result<Option<(u64, &str)>, PlanError> {
        loop {
            self.buf.clear();
            self.line += 1;
            let n = self.reader.read_line(&mut self.buf).map_err(|e| {
                PlanError::line(
                    &self.source_name,
                    self.line,
                    None,
                    format!("cannot read: {e}"),
                )
            })?;
            if n == 0 {
                return Ok(None);
            }
            if !self.buf.trim().is_empty() {
                return Ok(Some((self.line, self.buf.trim_end())));
            }
        }
    }
}

/// Parses one JSON object, naming the field at fault on error.
pub(crate) fn parse<'de, T: Deserialize<'de>>(
    source_name: &str,
    line: u64,
    text: &'de str,
) -> Result<T, PlanError> {
    if !text.trim_start().starts_with('{') {
        return Err(PlanError::line(
            source_name,
            line,
            None,
            "not a JSON object: each line must be one {...} object",
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| {
            let path = e.path().to_string();
            (path, e.into_inner())
        })
        .and_then(|v| de.end().map(|()| v).map_err(|e| (String::new(), e)));
    value.map_err(|(path, inner)| {
        let mut reason = inner.to_string();
        // serde_json appends "at line 1 column N": the line is ours.
        if let Some(at) = reason.rfind(" at line ") {
            reason.truncate(at);
        }
        let mut field = (!path.is_empty() && path != ".").then_some(path);
        if let Some(rest) = reason.strip_prefix("unknown field `")
            && let Some((name, _)) = rest.split_once('`')
        {
            // The path already ends with the unknown key.
            if field.is_none() {
                field = Some(name.to_owned());
            }
            reason = match reason.split_once(", expected ") {
                Some((_, expected)) => format!("unknown field (expected {expected})"),
                None => "unknown field".to_owned(),
            };
        }
        if inner.is_syntax() || inner.is_eof() {
            field = None;
            reason = format!("not valid JSON: {reason} (column {})", inner.column());
        }
        PlanError::Line {
            source_name: source_name.to_owned(),
            line,
            field,
            reason,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Rec {
        user: Option<String>,
        n: Option<u64>,
        headers: Option<BTreeMap<String, String>>,
    }

    fn err(text: &str) -> String {
        parse::<Rec>("f", 4, text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_line_and_field() {
        assert_eq!(
            err(r#"{"user": 5}"#),
            r#"f: line 4: field "user": invalid type: integer `5`, expected a string"#
        );
        assert_eq!(
            err(r#"{"n": -1}"#),
            r#"f: line 4: field "n": invalid value: integer `-1`, expected u64"#
        );
        assert_eq!(
            err(r#"{"usr": "a"}"#),
            r#"f: line 4: field "usr": unknown field (expected one of `user`, `n`, `headers`)"#
        );
        assert_eq!(
            err(r#"{"headers": {"retry-after": 2}}"#),
            r#"f: line 4: field "headers.retry-after": invalid type: integer `2`, expected a string"#
        );
        assert!(err(r#"{"user": "a""#).starts_with("f: line 4: not valid JSON: "));
        assert!(err(r#"{"user": "a"} x"#).contains("trailing characters"));
        assert_eq!(
            err("[1]"),
            "f: line 4: not a JSON object: each line must be one {...} object"
        );
    }

    #[test]
    fn lines_are_numbered_and_blanks_skipped() {
        let mut l = Lines::new("a\n\n  \nb\r\n".as_bytes(), "x");
        assert_eq!(l.next_line().unwrap(), Some((1, "a")));
        assert_eq!(l.next_line().unwrap(), Some((4, "b")));
        assert_eq!(l.next_line().unwrap(), None);
    }
}
