//! An imported ONNX model's names on the command line. The kernel calls
//! the model's values by identifiers (`input.1` is `input_1`, `191` is
//! `t_191`); where the `.onnx` file itself is run, `--input` and `--output`
//! take either name, outputs are shown and archived under the model's, and
//! an unknown name's error lists the names there are.

use super::{Error, Pipeline};
use std::collections::HashMap;
use std::path::PathBuf;
use texc_grammar::Diagnostic;
use texc_onnx::{ModelName, Role};

/// An imported ONNX model: its file, the module of its text, and the ONNX
/// names of its kernel's parameters and outputs.
pub(crate) struct Model {
    pub(crate) path: PathBuf,
    pub(crate) module: usize,
    pub(crate) names: Vec<ModelName>,
}

impl Pipeline {
    /// The ONNX names of the imported model's parameters and outputs, with
    /// the identifiers its kernel calls them (empty without a model).
    pub fn model_names(&self) -> &[ModelName] {
        self.model.as_ref().map_or(&[], |m| &m.names)
    }

    /// The identifier of the model's parameter or output (`output`) that a
    /// command line names `given`: its ONNX name (`input.1`, first) or the
    /// identifier itself (`input_1`). `None` when it names none, or there
    /// is no model.
    pub fn model_ident(&self, given: &str, output: bool) -> Option<&str> {
        let role = |n: &&ModelName| (n.role == Role::Output) == output;
        let names = self.model_names();
        let by_onnx = names.iter().filter(role).find(|n| n.onnx == given);
        by_onnx.or_else(|| names.iter().filter(role).find(|n| n.ident == given)).map(|n| n.ident.as_str())
    }

    /// The ONNX name of the model's output `ident` (itself without a model).
    pub fn model_output_name<'a>(&'a self, ident: &'a str) -> &'a str {
        let names = self.model_names();
        names.iter().find(|n| n.role == Role::Output && n.ident == ident).map_or(ident, |n| &n.onnx)
    }

    /// Inputs and scalars named as the command line names them, renamed to
    /// the kernel's parameters: a model's ONNX names become identifiers.
    /// Two names of one parameter are an error.
    pub(crate) fn kernel_names<T>(&self, given: Vec<(String, T)>) -> Result<Vec<(String, T)>, Error> {
        let mut out: Vec<(String, T)> = Vec::new();
        let mut said: HashMap<String, String> = HashMap::new();
        for (n, v) in given {
            let ident = self.model_ident(&n, false).map_or_else(|| n.clone(), str::to_string);
            if let Some(first) = said.insert(ident.clone(), n.clone()) {
                return Err(Error::Usage(format!("`{first}` and `{n}` both name the parameter `{ident}`")));
            }
            out.push((ident, v));
        }
        Ok(out)
    }

    /// "`n` is not a parameter of kernel `k`", with the names it accepts.
    pub(crate) fn unknown_param(&self, n: &str, info: &texc_compiler::kernel::KernelInfo) -> Error {
        let Some(model) = &self.model else {
            let names: Vec<&str> = info.params.iter().map(|p| p.name.as_str()).collect();
            return Diagnostic::error(format!("`{n}` is not a parameter of kernel `{}`", info.name))
                .with_note(format!("its parameters: {}", names.join(", ")))
                .into();
        };
        let named = |n: &ModelName| {
            if n.onnx == n.ident {
                format!("`{}`", n.onnx)
            } else {
                format!("`{}` (or `{}`)", n.onnx, n.ident)
            }
        };
        let inputs: Vec<String> = model.names.iter().filter(|n| n.role == Role::Input).map(named).collect();
        let weights = model.names.iter().filter(|n| n.role == Role::Weight).count();
        let mut note = format!("its inputs: {}", if inputs.is_empty() { "none".into() } else { inputs.join(", ") });
        match weights {
            0 => {}
            1 => note += "; its weight may be given by name too",
            n => note += &format!("; its {n} weights may be given by name too"),
        }
        Diagnostic::error(format!("`{n}` is not an input of the model {}", model.path.display())).with_note(note).into()
    }
}
