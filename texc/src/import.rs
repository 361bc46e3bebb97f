//! `texc import model.onnx -o model.tex`: the ONNX importer (`texc-onnx`)
//! writes the kernel's text and its weights beside it (`model.npz`); the text
//! is checked (parsed, resolved and specialized) before anything is written,
//! so an imported file always compiles.

use crate::args::ImportArgs;
use crate::commands::{out, parse_ints, usage};
use std::path::Path;
use texc_compiler::Bindings;
use texc_grammar::Diagnostic;
use texc_pipeline::{Error, Options, Pipeline};

pub fn import(a: &ImportArgs) -> Result<(), Error> {
    if a.output.extension().is_none_or(|e| e != "tex") {
        return Err(usage(format!("-o {}: expected a .tex file to write", a.output.display())));
    }
    let weights_path = a.output.with_extension("npz");
    let weights_name = file_name(&weights_path);
    // The kernel is named after the file written, unless --kernel says otherwise.
    let stem = a.output.file_stem().map(|s| s.to_string_lossy().into_owned());
    let kernel = a.kernel.clone().or(stem);
    let options = texc_onnx::Options { dims: parse_ints("--dim", &a.dim)?, kernel, base_dir: None };
    let shown = a.model.display().to_string();
    let imported = texc_onnx::import_file(&a.model, &weights_name, &options)
        .map_err(|e| Diagnostic::error(format!("{shown}: {e}")))?;
    check_imported(&a.output, &imported.source)?;
    let write_error = |path: &Path, e: String| Diagnostic::error(format!("cannot write {}: {e}", path.display()));
    texc_runtime::atomic::write_with(&a.output, |f| std::io::Write::write_all(f, imported.source.as_bytes()))
        .map_err(|e| write_error(&a.output, e.to_string()))?;
    let arrays: Vec<(&str, &texc_runtime::Tensor)> = imported.weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    texc_runtime::write_npz(&weights_path, &arrays).map_err(|e| write_error(&weights_path, e.to_string()))?;
    let statements = imported.source.lines().skip_while(|l| !l.starts_with(')')).count().saturating_sub(2);
    out(format_args!(
        "imported {shown}: kernel `{}`, {} nodes as {statements} statements\n  wrote {}\n  wrote {} ({} weights, {} parameters)\n",
        imported.kernel,
        imported.nodes,
        a.output.display(),
        weights_path.display(),
        imported.weights.len(),
        imported.parameters
    ));
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The imported text must compile: parse, resolve and specialize it.
fn check_imported(path: &Path, source: &str) -> Result<(), Error> {
    let mut pl = Pipeline::new(Options::new(texc_pipeline::target("interp")?));
    let internal = |pl: &Pipeline, e: Error| -> Error {
        let shown = pl.render_error(e);
        Diagnostic::error(format!("internal error: the imported text does not compile; please report it:\n{shown}"))
            .into()
    };
    let m = pl.load_text(&file_name(path), source, Some(path.to_path_buf())).map_err(|e| internal(&pl, e))?;
    let k = pl.kernel(m, None).map_err(|e| internal(&pl, e))?;
    let bindings = Bindings { shapes: vec![], consts: vec![], input_shapes: Default::default() };
    pl.specialize(k, &bindings).map_err(|e| internal(&pl, e))?;
    Ok(())
}
