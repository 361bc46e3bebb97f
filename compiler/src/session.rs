//! Loading: a root file, its imports (files and the embedded standard
//! library), and per-file scopes of kernels. This is the *parse* pass;
//! resolution ([`crate::resolve::resolve_session`]) runs after it and fills
//! each module's kernels and facts.
//!
//! Invariants after [`Session::parse_root`] succeeds: every module is parsed,
//! import cycles are rejected, and each module's scope maps a kernel name to
//! its overloads (local kernels shadow imported ones of the same name).

pub use crate::kernel::KernelRef;
use crate::kernel::{Facts, KernelInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use texc_grammar::ast::{ImportPath, Item};
use texc_grammar::{Ast, Diagnostic, Diagnostics, SourceMap, Span};

/// The standard library, embedded so that `import std.nn;` works anywhere.
pub const STD_NN: &str = include_str!("../../std/nn.tex");

/// Largest source file texc reads (64 MiB). Reads stop there, so that a path
/// such as `/dev/zero` or a huge file is an error, not memory exhaustion.
pub const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// Read a source file, at most [`MAX_SOURCE_BYTES`] of it.
pub fn read_source(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_SOURCE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(std::io::Error::other(format!(
            "the file is larger than {} MiB, the most texc reads",
            MAX_SOURCE_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// One loaded file.
#[derive(Debug)]
pub struct Module {
    pub ast: Ast,
    pub path: Option<PathBuf>,
    /// Resolved kernels, in source order (filled by `resolve`).
    pub kernels: Vec<KernelInfo>,
    pub facts: Facts,
    /// Visible kernels by name: own kernels, else those of direct imports.
    pub scope: BTreeMap<String, Vec<KernelRef>>,
    /// Indices into `ast.items`: of the kernels, in order, and of the
    /// `schedule` blocks by the kernel they name (lookups stay O(1) in files
    /// of thousands of kernels).
    kernel_items: Vec<usize>,
    schedule_items: HashMap<String, Vec<usize>>,
}

impl Module {
    /// The AST of this module's kernel `i` (in source order).
    pub fn kernel_ast(&self, i: usize) -> &texc_grammar::ast::Kernel {
        match &self.ast.items[self.kernel_items[i]] {
            Item::Kernel(k) => k,
            _ => unreachable!("kernel_items index kernels"),
        }
    }

    /// The `schedule` blocks of this module for the kernel named `kernel`, in source order.
    pub fn schedules_of<'m>(&'m self, kernel: &str) -> impl Iterator<Item = &'m texc_grammar::ast::Schedule> + 'm {
        self.schedule_items.get(kernel).into_iter().flatten().map(|&i| match &self.ast.items[i] {
            Item::Schedule(s) => s,
            _ => unreachable!("schedule_items index schedules"),
        })
    }
}

#[derive(Debug, Default)]
pub struct Session {
    pub sources: SourceMap,
    pub modules: Vec<Module>,
    by_path: HashMap<PathBuf, usize>,
    std_module: Option<usize>,
}

impl Session {
    pub fn new() -> Session {
        Session::default()
    }

    /// Parse a file from disk with all its imports. Returns the module index.
    pub fn parse_root(&mut self, path: &Path) -> Result<usize, Diagnostics> {
        let text =
            read_source(path).map_err(|e| vec![Diagnostic::error(format!("cannot read `{}`: {e}", path.display()))])?;
        let text = String::from_utf8(text).map_err(|e| {
            vec![Diagnostic::error(format!(
                "`{}` is not valid UTF-8 (byte {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ))]
        })?;
        self.parse_text(&path.display().to_string(), &text, Some(path.to_path_buf()))
    }

    /// Parse source text (with its imports). `path` is used to find relative imports.
    pub fn parse_text(&mut self, name: &str, text: &str, path: Option<PathBuf>) -> Result<usize, Diagnostics> {
        let mut stack = Vec::new();
        self.load(name, text, path, &mut stack)
    }

    fn load(
        &mut self,
        name: &str,
        text: &str,
        path: Option<PathBuf>,
        stack: &mut Vec<PathBuf>,
    ) -> Result<usize, Diagnostics> {
        let file = self.sources.add(name, text);
        let ast = texc_grammar::parse(file, text).map_err(|d| vec![d])?;
        let canon = path.as_ref().map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()));
        if let Some(c) = &canon {
            stack.push(c.clone());
        }
        let mut imported = Vec::new();
        for item in &ast.items {
            let Item::Import(imp) = item else { continue };
            let m = match &imp.path {
                ImportPath::Module(parts) => {
                    let dotted: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
                    if dotted != ["std", "nn"] {
                        return Err(vec![Diagnostic::at(imp.span, format!("unknown module `{}`", dotted.join(".")))
                            .with_note(
                            "the standard library is `import std.nn;`; files are imported as `import \"path.tex\";`",
                        )]);
                    }
                    self.load_std(stack)?
                }
                ImportPath::File { path: rel, span } => self.load_import(rel, *span, canon.as_deref(), stack)?,
            };
            imported.push(m);
        }
        if canon.is_some() {
            stack.pop();
        }
        let scope = build_scope(self, self.modules.len() as u32, &ast, &imported);
        let mut kernel_items = Vec::new();
        let mut schedule_items: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, item) in ast.items.iter().enumerate() {
            match item {
                Item::Kernel(_) => kernel_items.push(i),
                Item::Schedule(s) => schedule_items.entry(s.kernel.name.clone()).or_default().push(i),
                _ => {}
            }
        }
        self.modules.push(Module {
            ast,
            path: canon.clone(),
            kernels: Vec::new(),
            facts: Facts::default(),
            scope,
            kernel_items,
            schedule_items,
        });
        let idx = self.modules.len() - 1;
        if let Some(c) = canon {
            self.by_path.insert(c, idx);
        }
        Ok(idx)
    }

    fn load_std(&mut self, stack: &mut Vec<PathBuf>) -> Result<usize, Diagnostics> {
        if let Some(m) = self.std_module {
            return Ok(m);
        }
        let m = self.load("<std>/nn.tex", STD_NN, None, stack)?;
        self.std_module = Some(m);
        Ok(m)
    }

    fn load_import(
        &mut self,
        rel: &str,
        span: Span,
        from: Option<&Path>,
        stack: &mut Vec<PathBuf>,
    ) -> Result<usize, Diagnostics> {
        let base = from.and_then(|p| p.parent()).map(Path::to_path_buf).unwrap_or_default();
        let path = base.join(rel);
        let canon =
            path.canonicalize().map_err(|e| vec![Diagnostic::at(span, format!("cannot import `{rel}`: {e}"))])?;
        if stack.contains(&canon) {
            return Err(vec![Diagnostic::at(span, format!("import cycle: `{}` imports itself", path.display()))]);
        }
        if let Some(&m) = self.by_path.get(&canon) {
            return Ok(m);
        }
        let text = read_source(&canon)
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8")
                })
            })
            .map_err(|e| vec![Diagnostic::at(span, format!("cannot import `{rel}`: {e}"))])?;
        self.load(&path.display().to_string(), &text, Some(canon), stack)
    }

    /// Whether a kernel comes from the embedded standard library.
    pub fn is_std(&self, k: KernelRef) -> bool {
        self.std_module == Some(k.module as usize)
    }

    pub fn module(&self, m: usize) -> &Module {
        &self.modules[m]
    }

    pub fn kernel(&self, k: KernelRef) -> &KernelInfo {
        &self.modules[k.module as usize].kernels[k.index as usize]
    }

    /// Find the kernel to run in module `m`: `name` if given, else the only one.
    pub fn entry_kernel(&self, m: usize, name: Option<&str>) -> Result<KernelRef, Diagnostic> {
        let module = &self.modules[m];
        let own: Vec<KernelRef> =
            (0..module.kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect();
        let file = &self.sources.file(module.ast.file).name;
        match name {
            Some(n) => {
                let found: Vec<KernelRef> = module.scope.get(n).cloned().unwrap_or_default();
                match found.len() {
                    1 => Ok(found[0]),
                    0 => {
                        let names: Vec<&str> = module.scope.keys().map(String::as_str).collect();
                        Err(Diagnostic::error(format!("{file}: no kernel named `{n}`")).with_note(format!(
                            "kernels here: {}",
                            if names.is_empty() { "none".into() } else { names.join(", ") }
                        )))
                    }
                    _ => Err(Diagnostic::error(format!(
                        "{file}: `{n}` names {} overloads; run a kernel of your own that calls it",
                        found.len()
                    ))),
                }
            }
            None => match own.len() {
                1 => Ok(own[0]),
                0 => Err(Diagnostic::error(format!("{file}: the file defines no kernel"))),
                _ => {
                    let names: Vec<&str> = own.iter().map(|k| self.kernel(*k).name.as_str()).collect();
                    Err(Diagnostic::error(format!(
                        "{file}: the file defines several kernels; choose one with --kernel"
                    ))
                    .with_note(format!("kernels: {}", names.join(", "))))
                }
            },
        }
    }
}

fn build_scope(s: &Session, me: u32, ast: &Ast, imported: &[usize]) -> BTreeMap<String, Vec<KernelRef>> {
    let mut scope: BTreeMap<String, Vec<KernelRef>> = BTreeMap::new();
    for &m in imported {
        for (i, k) in s.modules[m].ast.kernels().enumerate() {
            let r = KernelRef { module: m as u32, index: i as u32 };
            let e = scope.entry(k.name.name.clone()).or_default();
            if !e.contains(&r) {
                e.push(r);
            }
        }
    }
    let mut own: BTreeMap<String, Vec<KernelRef>> = BTreeMap::new();
    for (i, k) in ast.kernels().enumerate() {
        own.entry(k.name.name.clone()).or_default().push(KernelRef { module: me, index: i as u32 });
    }
    // Local kernels shadow imported overload sets of the same name.
    scope.extend(own);
    scope
}
