//! User-facing diagnostics.
//!
//! Every layer of texc reports problems in user input as a [`Diagnostic`]: one
//! line of reason, a primary span, optional secondary spans and notes. They are
//! rendered with `codespan-reporting`, which prints `file:line:col` and the
//! offending source. Rendering is plain text (no colour) so it is
//! deterministic and snapshot-testable.

use crate::span::{FileId, SourceMap, Span};
use codespan_reporting::diagnostic as cs;
use codespan_reporting::files::{Error as FilesError, Files};
use codespan_reporting::term;
use std::ops::Range;

/// One problem in user input.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub message: String,
    /// The place the problem is, with a short label (may be empty).
    pub primary: Option<(Span, String)>,
    /// Other places worth showing (e.g. the conflicting declaration).
    pub secondary: Vec<(Span, String)>,
    pub notes: Vec<String>,
    /// A warning does not fail the command (`texc check` prints it and exits 0).
    pub warning: bool,
}

impl Diagnostic {
    pub fn error(message: impl Into<String>) -> Diagnostic {
        Diagnostic { message: message.into(), primary: None, secondary: Vec::new(), notes: Vec::new(), warning: false }
    }

    /// The same diagnostic as a warning.
    pub fn into_warning(mut self) -> Diagnostic {
        self.warning = true;
        self
    }

    /// An error at `span`, labelled with `label`.
    pub fn at(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::error(message).with_primary(span, "")
    }

    pub fn with_primary(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.primary = Some((span, label.into()));
        self
    }

    pub fn with_secondary(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.secondary.push((span, label.into()));
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Render as `error: …` followed by `┌─ file:line:col` and the source.
    pub fn render(&self, sources: &SourceMap) -> String {
        let d = if self.warning { cs::Diagnostic::warning() } else { cs::Diagnostic::error() };
        let mut d = d.with_message(&self.message);
        if let Some((span, label)) = &self.primary {
            d = d.with_label(cs::Label::primary(span.file, span.range()).with_message(label));
        }
        for (span, label) in &self.secondary {
            d = d.with_label(cs::Label::secondary(span.file, span.range()).with_message(label));
        }
        d = d.with_notes(self.notes.clone());
        let config = term::Config::default();
        match term::emit_into_string(&config, &Files_(sources), &d) {
            Ok(s) => s,
            // A span outside its file, or into a file of another session: still say something useful.
            Err(_) => format!("{}: {}\n", if self.warning { "warning" } else { "error" }, self.message),
        }
    }
}

/// A list of diagnostics; what every fallible front-end function returns.
pub type Diagnostics = Vec<Diagnostic>;

/// Render a list of diagnostics, one after the other.
pub fn render_all(diags: &[Diagnostic], sources: &SourceMap) -> String {
    diags.iter().map(|d| d.render(sources)).collect::<Vec<_>>().join("")
}

struct Files_<'a>(&'a SourceMap);

impl<'a> Files<'a> for Files_<'a> {
    type FileId = FileId;
    type Name = &'a str;
    type Source = &'a str;

    fn name(&'a self, id: FileId) -> Result<&'a str, FilesError> {
        Ok(&self.0.get(id).ok_or(FilesError::FileMissing)?.name)
    }

    fn source(&'a self, id: FileId) -> Result<&'a str, FilesError> {
        Ok(&self.0.get(id).ok_or(FilesError::FileMissing)?.text)
    }

    fn line_index(&'a self, id: FileId, byte_index: usize) -> Result<usize, FilesError> {
        Ok(self.0.get(id).ok_or(FilesError::FileMissing)?.line_col(byte_index).0 - 1)
    }

    fn line_range(&'a self, id: FileId, line_index: usize) -> Result<Range<usize>, FilesError> {
        let file = self.0.get(id).ok_or(FilesError::FileMissing)?;
        file.line_range(line_index).ok_or(FilesError::LineTooLarge { given: line_index, max: file.line_count() - 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::Span;

    /// A diagnostic spanned in a file another session loaded renders its message, not a panic.
    #[test]
    fn a_span_into_a_missing_file_still_renders() {
        let d = Diagnostic::at(Span::new(FileId(3), 0, 1), "`X` is bf16");
        assert_eq!(d.render(&SourceMap::new()), "error: `X` is bf16\n");
    }
}
