//! Source files and byte spans.
//!
//! Every AST node, and every diagnostic, refers to source text through a
//! [`Span`]: a file id plus a half-open byte range. Spans are small (12 bytes)
//! so that side tables of them stay cheap.

use std::fmt;

/// Index of a file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A half-open byte range `[start, end)` in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span { file, start: start as u32, end: end as u32 }
    }

    /// The smallest span covering both `self` and `other` (same file).
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// One loaded source file.
#[derive(Debug)]
pub struct SourceFile {
    /// Name shown in diagnostics (a path, or `<std>/nn.tex` for embedded files).
    pub name: String,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    /// 1-based line and column of a byte offset (columns count characters).
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let line = match self.line_starts.binary_search(&offset) {
            Ok(l) => l,
            Err(l) => l - 1,
        };
        let start = self.line_starts[line];
        let end = offset.min(self.text.len());
        let col = self.text.get(start..end).map_or(end - start, |s| s.chars().count());
        (line + 1, col + 1)
    }

    /// Byte range of a 0-based line, including its newline.
    pub fn line_range(&self, line: usize) -> Option<std::ops::Range<usize>> {
        let start = *self.line_starts.get(line)?;
        let end = self.line_starts.get(line + 1).copied().unwrap_or(self.text.len());
        Some(start..end)
    }

    pub fn line_count(&self) -> usize {
        self.line_starts.len()
    }
}

/// All source files of one compilation, indexed by [`FileId`].
#[derive(Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        let text = text.into();
        // A line ends at `\n`, `\r\n`, or a lone `\r` (old Mac files).
        let b = text.as_bytes();
        let mut line_starts = vec![0];
        line_starts.extend(
            (0..b.len()).filter(|&i| b[i] == b'\n' || (b[i] == b'\r' && b.get(i + 1) != Some(&b'\n'))).map(|i| i + 1),
        );
        self.files.push(SourceFile { name: name.into(), text, line_starts });
        FileId(self.files.len() as u32 - 1)
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    /// The file `id`, if this map has it (a diagnostic may come from another session).
    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// `file:line:col` of the start of a span.
    pub fn location(&self, span: Span) -> String {
        let f = self.file(span.file);
        let (l, c) = f.line_col(span.start as usize);
        format!("{}:{}:{}", f.name, l, c)
    }

    /// The source text a span covers.
    pub fn snippet(&self, span: Span) -> &str {
        self.file(span.file).text.get(span.range()).unwrap_or("")
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file{}", self.0)
    }
}
