//! `texc import model.onnx -o model.tex`: the ONNX importer (`texc-onnx`)
//! writes the kernel's text and its weights beside it (`model.npz`); the text
//! is checked (parsed, resolved and specialized) before anything is written,
//! so an imported file always compiles.

use super::{Error, Options, Pipeline};
use std::path::Path;
use texc_compiler::Bindings;
use texc_grammar::Diagnostic;

/// What [`import_onnx`] wrote.
pub struct Imported {
    pub kernel: String,
    /// ONNX nodes read, and the kernel's statements.
    pub nodes: usize,
    pub statements: usize,
    /// The weights' file (`.npz` beside the `.tex`), its arrays and their elements.
    pub weights_path: std::path::PathBuf,
    pub weights: usize,
    pub parameters: usize,
}

/// Import `model` as the kernel `kernel` (default: named after `output`)
/// into `output` (a `.tex` file) and its weights beside it; `dims` sizes
/// the model's symbolic input dimensions.
pub fn import_onnx(
    model: &Path,
    output: &Path,
    kernel: Option<String>,
    dims: Vec<(String, i64)>,
) -> Result<Imported, Error> {
    if output.extension().is_none_or(|e| e != "tex") {
        return Err(Error::Usage(format!("-o {}: expected a .tex file to write", output.display())));
    }
    let weights_path = output.with_extension("npz");
    let weights_name = file_name(&weights_path);
    let stem = output.file_stem().map(|s| s.to_string_lossy().into_owned());
    let options = texc_onnx::Options { dims, kernel: kernel.or(stem), base_dir: None };
    let shown = model.display().to_string();
    let imported = texc_onnx::import_file(model, &weights_name, &options)
        .map_err(|e| Diagnostic::error(format!("{shown}: {e}")))?;
    check_imported(output, &imported.source)?;
    let write_error = |path: &Path, e: String| Diagnostic::error(format!("cannot write {}: {e}", path.display()));
    texc_runtime::atomic::write_with(output, |f| std::io::Write::write_all(f, imported.source.as_bytes()))
        .map_err(|e| write_error(output, e.to_string()))?;
    let arrays: Vec<(&str, &texc_runtime::Tensor)> = imported.weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    texc_runtime::write_npz(&weights_path, &arrays).map_err(|e| write_error(&weights_path, e.to_string()))?;
    let statements = imported.source.lines().skip_while(|l| !l.starts_with(')')).count().saturating_sub(2);
    Ok(Imported {
        kernel: imported.kernel,
        nodes: imported.nodes,
        statements,
        weights_path,
        weights: imported.weights.len(),
        parameters: imported.parameters,
    })
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The imported text must compile: parse, resolve and specialize it.
fn check_imported(path: &Path, source: &str) -> Result<(), Error> {
    let mut pl = Pipeline::new(Options::new(crate::target("interp")?));
    let internal = |pl: &Pipeline, e: Error| -> Error {
        let shown = pl.render_error(e);
        Diagnostic::error(format!("internal error: the imported text does not compile; please report it:\n{shown}"))
            .into()
    };
    let m = pl.load_text(&file_name(path), source, Some(path.to_path_buf())).map_err(|e| internal(&pl, e))?;
    let k = pl.kernel(m, None).map_err(|e| internal(&pl, e))?;
    pl.specialize(k, &Bindings::default()).map_err(|e| internal(&pl, e))?;
    Ok(())
}
