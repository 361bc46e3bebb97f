//! `texc import model.onnx -o model.tex`: arguments in, what
//! [`texc_pipeline::import::import_onnx`] wrote out.

use crate::args::ImportArgs;
use crate::commands::{out, parse_ints};
use texc_pipeline::Error;

pub fn import(a: &ImportArgs) -> Result<(), Error> {
    let dims = parse_ints("--dim", &a.dim)?;
    let i = texc_pipeline::import::import_onnx(&a.model, &a.output, a.kernel.clone(), dims)?;
    out(format_args!(
        "imported {}: kernel `{}`, {} nodes as {} statements\n  wrote {}\n  wrote {} ({} weights, {} parameters)\n",
        a.model.display(),
        i.kernel,
        i.nodes,
        i.statements,
        a.output.display(),
        i.weights_path.display(),
        i.weights,
        i.parameters
    ));
    Ok(())
}
