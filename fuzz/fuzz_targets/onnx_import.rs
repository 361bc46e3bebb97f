//! Any bytes given as an ONNX model are imported or refused with an error:
//! the importer never panics, and what it imports compiles (parses,
//! resolves and specializes).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let options = texc_onnx::Options { dims: vec![("N".into(), 1)], kernel: None, base_dir: None };
    if let Ok(imported) = texc_onnx::import_bytes(data, "fuzz.onnx", "fuzz.npz", &options) {
        let mut pl = texc_pipeline::Pipeline::new(texc_pipeline::Options::new(
            texc_pipeline::target("interp").expect("interp is a target"),
        ));
        let m = pl.load_text("fuzz.tex", &imported.source, None).expect("imported text parses and resolves");
        let k = pl.kernel(m, None).expect("one kernel");
        let b = texc_compiler::Bindings { shapes: vec![], consts: vec![], input_shapes: Default::default() };
        pl.specialize(k, &b).expect("imported text specializes");
    }
});
