//! Models built here with the proto structs (no Python needed): the text the
//! importer writes for them, the errors it gives, and that no byte string
//! makes it panic. The numerical comparison with ONNX Runtime is in
//! `texc/tests/onnx_cli.rs`.

use crate::proto::*;
use crate::{import_bytes, OnnxError, Options};
use prost::Message;

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims.iter().map(|&d| Dimension { value: Some(DimensionValue::DimValue(d)) }).collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor { elem_type: data_type::FLOAT, shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

fn tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        name: name.into(),
        ..Default::default()
    }
}

fn ints_tensor(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![values.len() as i64],
        data_type: data_type::INT64,
        int64_data: values.to_vec(),
        name: name.into(),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: attribute_type::INTS, ints: v.to_vec(), ..Default::default() }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: attribute_type::STRING, s: v.as_bytes().to_vec(), ..Default::default() }
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: attribute_type::INT, i, ..Default::default() }
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("/{output}"),
        op_type: op.into(),
        attribute,
        ..Default::default()
    }
}

/// Conv → Relu → GlobalAveragePool → Flatten → Gemm, with a Reshape of an
/// initializer shape, over a [1, 2, 5, 5] input.
fn cnn() -> ModelProto {
    let w: Vec<f32> = (0..3 * 2 * 3 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
    let graph = GraphProto {
        name: "tiny.net".into(),
        node: vec![
            node("Conv", &["x", "w"], "c", vec![ints("pads", &[1, 1, 1, 1]), ints("kernel_shape", &[3, 3])]),
            node("Relu", &["c"], "r", vec![]),
            node("GlobalAveragePool", &["r"], "g", vec![]),
            node("Flatten", &["g"], "f", vec![int("axis", 1)]),
            node("Gemm", &["f", "fc", "fb"], "d", vec![int("transB", 1)]),
            node("Reshape", &["d", "shape"], "y", vec![]),
        ],
        initializer: vec![
            tensor("w", &[3, 2, 3, 3], &w),
            tensor("fc", &[4, 3], &[0.5, -0.25, 1.0, 2.0, 0.0, 1.5, -1.0, 0.25, 0.75, 0.1, 0.2, 0.3]),
            tensor("fb", &[4], &[0.1, 0.2, 0.3, 0.4]),
            ints_tensor("shape", &[1, 2, -1]),
        ],
        input: vec![value_info("x", &[1, 2, 5, 5])],
        output: vec![value_info("y", &[1, 2, 2])],
        ..Default::default()
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        producer_name: "texc".into(),
        graph: Some(graph),
        ..Default::default()
    }
}

fn import(m: &ModelProto) -> Result<crate::Imported, OnnxError> {
    import_bytes(&m.encode_to_vec(), "m.onnx", "m.npz", &Options::default())
}

#[test]
fn a_small_cnn_becomes_std_calls() {
    let im = import(&cnn()).expect("imports");
    let body: Vec<&str> = im.source.lines().skip_while(|l| !l.starts_with(')')).skip(1).collect();
    assert_eq!(
        body,
        [
            "    c = conv2d(x, w, pad = 1);",
            "    r = relu(c);",
            "    g = global_avg_pool2d(r);",
            "    f[i0 in 0..1, i1 in 0..3] = g[0, i1, 0, 0];",
            "    d = dense(f, fc, fb);",
            "    y[i0, i1, i2] = d[0, i1 * 2 + i2];",
            "}",
        ],
        "{}",
        im.source
    );
    assert!(im.source.contains("kernel tiny_net(\n    x: f32[1, 2, 5, 5],\n    w: f32[3, 2, 3, 3],"), "{}", im.source);
    assert!(im.source.contains(") -> y: f32[1, 2, 2] {"), "{}", im.source);
    // The shape initializer is read at import time, not passed.
    let names: Vec<&str> = im.weights.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["w", "fc", "fb"]);
    assert_eq!(im.parameters, 54 + 12 + 4);
    assert_eq!(import(&cnn()).expect("again").source, im.source, "the text is deterministic");
}

#[test]
fn a_weight_gemm_without_transb_is_transposed_at_import() {
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.node[4].attribute.clear();
    g.initializer[1] = tensor("fc", &[3, 4], &[0.5, -0.25, 1.0, 2.0, 0.0, 1.5, -1.0, 0.25, 0.75, 0.1, 0.2, 0.3]);
    let im = import(&m).expect("imports");
    assert!(im.source.contains("d = dense(f, fc_t, fb);"), "{}", im.source);
    let (_, t) = im.weights.iter().find(|(n, _)| n == "fc_t").expect("transposed weight");
    assert_eq!(t.shape, [4, 3]);
    let texc_runtime::Data::F32(v) = &t.data else { panic!("f32") };
    assert_eq!(&v[..3], &[0.5, 0.0, 0.75], "column 0 of fc is row 0 of fc_t");
}

#[test]
fn what_is_not_imported_is_an_error_naming_the_node() {
    let err = |m: ModelProto| import(&m).expect_err("refused").to_string();
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[0].attribute.push(ints("strides", &[2, 1]));
    assert_eq!(err(m), "node `/c` (Conv): strides = [2, 1]: only equal values for both axes are supported");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[1].op_type = "Hardmax".into();
    assert_eq!(err(m), "node `/r` (Hardmax): operator `Hardmax` is not supported");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[1].attribute.push(int("alpha", 1));
    assert_eq!(err(m), "node `/r` (Relu): attribute `alpha` is not supported");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[2].input[0] = "nowhere".into();
    assert_eq!(err(m), "node `/g` (GlobalAveragePool): input `nowhere` is not defined before this node");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").output[0] = value_info("y", &[1, 4]);
    assert_eq!(err(m), "graph output `y` is declared [1, 4] but computes [1, 2, 2]");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node.push(node("Shape", &["x"], "s", vec![]));
    m.graph.as_mut().expect("graph").output.push(value_info("s", &[4]));
    assert_eq!(err(m), "graph output `s` is a constant: nothing to compute at run time");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").output[0].name = "fb".into();
    assert_eq!(err(m), "graph output `fb` is a constant: nothing to compute at run time");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[0].op_type = "ConvTranspose".into();
    assert_eq!(
        err(m),
        "node `/c` (ConvTranspose): input [1, 2, 5, 5] and weight [3, 2, 3, 3]: only 2-D transposed convolution \
         (NCHW input, weight [C, K, R, S]) is supported"
    );
    // Integer inputs: the indices of a Gather, or data of the operators that move, compare or pick
    // elements; an operator that computes on f32 only refuses them, naming their type.
    let with_ids = |elem: i32, use_as: &str| {
        let mut m = cnn();
        let g = m.graph.as_mut().expect("graph");
        let mut ids = value_info("ids", &[1, 3]);
        ids.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()).expect("a tensor").elem_type = elem;
        g.input.push(ids);
        let node = match use_as {
            "indices" => node("Gather", &["fb", "ids"], "e", vec![]),
            _ => node("Relu", &["ids"], "e", vec![]),
        };
        g.node.push(node);
        g.output.push(ValueInfoProto { name: "e".into(), ..Default::default() });
        import(&m).map(|i| i.source).map_err(|e| e.to_string())
    };
    let text = with_ids(data_type::INT64, "indices").expect("token ids index a table");
    assert!(text.contains("ids: i64[1, 3]") && text.contains("== i64(r0), fb[r0], 0.0)"), "{text}");
    assert!(with_ids(data_type::INT32, "indices").expect("int32 ids").contains("ids: i32[1, 3]"));
    assert_eq!(
        with_ids(data_type::INT64, "data").expect_err("refused"),
        "node `/e` (Relu): an input of elements of type i64: this operator is supported on f32 tensors"
    );
    assert_eq!(
        with_ids(data_type::DOUBLE, "indices").expect_err("refused"),
        "graph input `ids` has elements of type double: float (f32), int64, int32, uint8, int8 and bool inputs are supported"
    );
    // Range folds when its inputs are constants; a computed one is refused.
    let ranged = |limit: &str| {
        let mut m = cnn();
        let g = m.graph.as_mut().expect("graph");
        g.node[5].input[0] = "d2".into();
        g.node.insert(5, node("Range", &["zero", limit, "one"], "rng", vec![]));
        g.node.insert(6, node("Add", &["d", "rng"], "d2", vec![]));
        g.initializer.push(tensor("zero", &[], &[0.0]));
        g.initializer.push(tensor("four", &[], &[4.0]));
        g.initializer.push(tensor("one", &[], &[1.0]));
        import(&m).map(|i| i.source).map_err(|e| e.to_string())
    };
    let text = ranged("four").expect("a constant range folds");
    assert!(!text.contains("Range") && text.contains("d2"), "{text}");
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.node.insert(5, node("Range", &["zero", "x", "one"], "rng", vec![]));
    g.initializer.push(tensor("zero", &[], &[0.0]));
    g.initializer.push(tensor("one", &[], &[1.0]));
    assert_eq!(
        err(m),
        "node `/rng` (Range): start, limit and delta must be constants: a computed range's length depends on data"
    );
    // ConvTranspose's output_shape is the spatial shape (as ONNX Runtime reads it).
    let transposed = |shape: &[i64]| {
        let mut m = cnn();
        let g = m.graph.as_mut().expect("graph");
        g.node[0].op_type = "ConvTranspose".into();
        g.node[0].input[1] = "wt".into();
        g.node[0].attribute.push(ints("output_shape", shape));
        g.initializer.push(tensor("wt", &[2, 3, 3, 3], &[0.25; 54]));
        import(&m).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(transposed(&[5, 5]), Ok(()));
    assert_eq!(
        transposed(&[1, 3, 5, 5]),
        Err("node `/c` (ConvTranspose): output_shape = [1, 3, 5, 5]: only the spatial shape the padding gives, \
             [5, 5], is supported"
            .into())
    );
    // Resize forms that are refused rather than computed with other semantics.
    let resize = |opset: i64, inputs: &[&str], attrs: Vec<AttributeProto>| {
        let mut m = cnn();
        let g = m.graph.as_mut().expect("graph");
        g.node[1] = node("Resize", inputs, "r", attrs);
        g.initializer.push(tensor("scales", &[4], &[1.0, 1.0, 2.0, 2.0]));
        g.initializer.push(ints_tensor("sizes", &[1, 3, 10, 10]));
        m.opset_import[0].version = opset;
        err(m)
    };
    assert_eq!(
        resize(10, &["c", "scales"], vec![string("mode", "linear")]),
        "node `/r` (Resize): linear resizing with coordinate_transformation_mode = \"asymmetric\" and scales \
         [1.0, 1.0, 2.0, 2.0]: only half_pixel (PyTorch's bilinear, align_corners=False) of the spatial axes of an \
         NCHW tensor is supported"
    );
    assert_eq!(
        resize(18, &["c", "", "", "sizes"], vec![string("keep_aspect_ratio_policy", "not_larger")]),
        "node `/r` (Resize): keep_aspect_ratio_policy = \"not_larger\": only \"stretch\" is supported"
    );
    let mut m = cnn();
    m.opset_import[0].version = 3;
    assert_eq!(err(m), "opset 3 is not supported (7 to 23 are)");
    let mut m = cnn();
    m.graph.as_mut().expect("graph").node[1].domain = "com.microsoft".into();
    assert_eq!(err(m), "node `/r` (Relu): operators of domain `com.microsoft` are not supported");
    let mut m = cnn();
    let raw = &mut m.graph.as_mut().expect("graph").initializer[0].raw_data;
    *raw = raw.slice(..raw.len() - 1);
    assert_eq!(err(m), "initializer `w`: raw data of 215 bytes for 54 elements");
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.input[0]
        .r#type
        .as_mut()
        .and_then(|t| t.tensor_type.as_mut())
        .expect("tensor")
        .shape
        .as_mut()
        .expect("shape")
        .dim[0] = Dimension { value: Some(DimensionValue::DimParam("N".into())) };
    assert_eq!(err(m.clone()), "graph input `x` has a symbolic dimension `N`: give it a size with --dim N=SIZE");
    let sized = Options { dims: vec![("N".into(), 1)], kernel: None, base_dir: None };
    assert!(import_bytes(&m.encode_to_vec(), "m.onnx", "m.npz", &sized).is_ok());
    assert!(matches!(import_bytes(b"\x07\x07\x07", "m.onnx", "m.npz", &Options::default()), Err(OnnxError::Decode(_))));
}

/// Every byte string is imported or refused with an error; none panics.
/// (A deterministic mutation loop; `fuzz/` has the coverage-guided target.)
#[test]
fn mutated_models_never_panic() {
    let bytes = cnn().encode_to_vec();
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            match next() % 3 {
                0 => b[i] = next() as u8,
                1 => b.truncate(i.max(1)),
                _ => b.insert(i, next() as u8),
            }
        }
        match import_bytes(&b, "m.onnx", "m.npz", &Options::default()) {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} imported, {refused} refused");
}

/// Initializers stored in a file beside the model (what `torch.onnx.export`
/// writes for large models) are read from the model's directory; a location
/// outside it is refused.
#[test]
fn external_data_is_read_beside_the_model() {
    let dir = std::env::temp_dir().join(format!("texc-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let mut m = cnn();
    let w = &mut m.graph.as_mut().expect("graph").initializer[0];
    let bytes = std::mem::take(&mut w.raw_data);
    std::fs::write(dir.join("weights.bin"), [vec![0u8; 16], bytes.to_vec()].concat()).expect("write");
    w.data_location = 1;
    let entry = |k: &str, v: &str| StringStringEntryProto { key: k.into(), value: v.into() };
    w.external_data =
        vec![entry("location", "weights.bin"), entry("offset", "16"), entry("length", &bytes.len().to_string())];
    let path = dir.join("m.onnx");
    std::fs::write(&path, m.encode_to_vec()).expect("write");
    let external = crate::import_file(&path, "m.npz", &Options::default()).expect("imports");
    assert_eq!(external.weights, import(&cnn()).expect("inline").weights);

    m.graph.as_mut().expect("graph").initializer[0].external_data[0].value = "../weights.bin".into();
    std::fs::write(&path, m.encode_to_vec()).expect("write");
    let e = crate::import_file(&path, "m.npz", &Options::default()).expect_err("refused").to_string();
    assert_eq!(e, "initializer `w`: external data `../weights.bin` is outside the model's directory");
    m.graph.as_mut().expect("graph").initializer[0].external_data[0].value = "weights.bin".into();
    m.graph.as_mut().expect("graph").initializer[0].external_data[1].value = "17".into();
    std::fs::write(&path, m.encode_to_vec()).expect("write");
    let e = crate::import_file(&path, "m.npz", &Options::default()).expect_err("refused").to_string();
    assert!(e.contains("bytes 17..+216 beyond its 232 bytes"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 35, item 9: a graph output listed twice is refused by the
/// importer, naming the output (the front end refused the generated text,
/// at `m.onnx.tex:7:21`, a file that does not exist).
#[test]
fn a_graph_output_listed_twice_is_refused() {
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.output.push(g.output[0].clone());
    let e = import(&m).expect_err("refused").to_string();
    assert_eq!(e, "graph output `y` is listed twice");
}

/// The ONNX names of a kernel's parameters and outputs come back with the
/// identifiers the kernel calls them (torchvision's `input.1` and `191`).
#[test]
fn onnx_names_come_back_with_their_identifiers() {
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.input[0].name = "input.1".into();
    g.node[0].input[0] = "input.1".into();
    g.initializer[0].name = "conv1.weight".into();
    g.node[0].input[1] = "conv1.weight".into();
    g.output[0].name = "191".into();
    g.node[5].output[0] = "191".into();
    let im = import(&m).expect("imports");
    let names: Vec<(&str, &str, crate::Role)> =
        im.names.iter().map(|n| (n.onnx.as_str(), n.ident.as_str(), n.role)).collect();
    use crate::Role::*;
    assert_eq!(
        names,
        [
            ("input.1", "input_1", Input),
            ("conv1.weight", "conv1_weight", Weight),
            ("fc", "fc", Weight),
            ("fb", "fb", Weight),
            ("191", "t_191", Output),
        ]
    );
    assert!(im.source.contains(") -> t_191: f32[1, 2, 2] {"), "{}", im.source);
}

/// Property: whatever the model names its input, weight and output
/// (dots, slashes, digits first, keywords, the importer's own index names,
/// non-ASCII, names that sanitize alike), each comes back once, with a
/// distinct identifier, and the kernel's signature uses those identifiers.
#[test]
fn any_onnx_names_map_to_distinct_identifiers() {
    let pieces =
        ["input", ".", "1", "191", "/", "x", "kernel", "i0", "r1", "_", "é", "-", " ", "t_191", "onnx::", "Conv"];
    let mut state = 0x51_7cc1_b727_220au64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..300 {
        let mut names: Vec<String> = Vec::new();
        while names.len() < 3 {
            let n: String = (0..1 + next() % 4).map(|_| pieces[(next() % pieces.len() as u64) as usize]).collect();
            if !names.contains(&n) {
                names.push(n);
            }
        }
        let (x, w, y) = (&names[0], &names[1], &names[2]);
        let m = ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
            graph: Some(GraphProto {
                name: "g".into(),
                node: vec![node("Add", &[x, w], y, vec![])],
                initializer: vec![tensor(w, &[1, 4], &[1.0, 2.0, 3.0, 4.0])],
                input: vec![value_info(x, &[1, 4])],
                output: vec![value_info(y, &[1, 4])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let im = import(&m).unwrap_or_else(|e| panic!("{names:?}: {e}"));
        let got: Vec<&str> = im.names.iter().map(|n| n.onnx.as_str()).collect();
        assert_eq!(got, [x.as_str(), w, y], "{names:?}");
        let idents: std::collections::HashSet<&str> = im.names.iter().map(|n| n.ident.as_str()).collect();
        assert_eq!(idents.len(), 3, "distinct: {:?}", im.names);
        for n in &im.names {
            let ok = n.ident.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && n.ident.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            assert!(ok, "{:?}", n);
            assert!(im.source.contains(&format!("{}: f32[1, 4]", n.ident)), "{:?}\n{}", n, im.source);
        }
    }
}

/// A model in a fresh directory whose first initializer (`w`, 216 bytes)
/// is external data at `location`, with `weights.bin` holding it; the
/// directory, the model's path and `w`'s bytes.
fn external_model(name: &str, location: &str) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("texc-onnx-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("model")).expect("tmp");
    let mut m = cnn();
    let w = &mut m.graph.as_mut().expect("graph").initializer[0];
    let bytes = std::mem::take(&mut w.raw_data);
    std::fs::write(dir.join("model/weights.bin"), &bytes).expect("write");
    w.data_location = 1;
    w.external_data = vec![StringStringEntryProto { key: "location".into(), value: location.into() }];
    let path = dir.join("model/m.onnx");
    std::fs::write(&path, m.encode_to_vec()).expect("write");
    (dir, path, bytes.to_vec())
}

/// Set the location of `w`'s external data in the model at `path`.
fn relocate(path: &std::path::Path, location: &str) {
    let mut m = ModelProto::decode(std::fs::read(path).expect("read").as_slice()).expect("decode");
    m.graph.as_mut().expect("graph").initializer[0].external_data[0].value = location.into();
    std::fs::write(path, m.encode_to_vec()).expect("write");
}

/// Import `path` on a thread; `None` when it has not finished in 10 s (a
/// FIFO opened for reading waits for a writer: the test then fails instead
/// of hanging).
fn import_within(path: &std::path::Path) -> Option<Result<crate::Imported, String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(crate::import_file(&path, "m.npz", &Options::default()).map_err(|e| e.to_string()));
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
}

fn mkfifo(p: &std::path::Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

/// Issue 35, item 5: external data that is a FIFO beside the model is
/// refused at once (it blocked the import forever); so is a directory.
#[test]
fn external_data_that_is_not_a_regular_file_is_refused() {
    let (dir, path, _) = external_model("fifo", "weights.fifo");
    mkfifo(&dir.join("model/weights.fifo"));
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(
        e.starts_with("initializer `w`: external data ") && e.ends_with("weights.fifo is a FIFO, not a regular file"),
        "{e}"
    );
    std::fs::create_dir_all(dir.join("model/sub")).expect("dir");
    relocate(&path, "sub");
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(e.ends_with("sub is a directory, not a regular file"), "{e}");
    // A link to the FIFO is refused the same way.
    std::os::unix::fs::symlink("weights.fifo", dir.join("model/to-fifo.bin")).expect("symlink");
    relocate(&path, "to-fifo.bin");
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(e.ends_with("is a FIFO, not a regular file"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 35, item 6: the path external data resolves to, links followed,
/// must stay inside the model's directory: a link beside the model to
/// `/etc/passwd`, or a location through a linked directory, is refused; a
/// link that stays inside still reads.
#[test]
fn external_data_links_must_resolve_inside_the_models_directory() {
    let (dir, path, bytes) = external_model("links", "passwd");
    std::os::unix::fs::symlink("/etc/passwd", dir.join("model/passwd")).expect("symlink");
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(e.contains("external data `passwd` resolves to /etc/passwd, outside the model's directory"), "{e}");
    std::os::unix::fs::symlink("/etc", dir.join("model/etc")).expect("symlink");
    relocate(&path, "etc/passwd");
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(e.contains("external data `etc/passwd` resolves to /etc/passwd, outside"), "{e}");
    // A linked directory beside the model that points above it.
    std::fs::write(dir.join("secret.bin"), &bytes).expect("write");
    std::os::unix::fs::symlink("..", dir.join("model/up")).expect("symlink");
    relocate(&path, "up/secret.bin");
    let e = import_within(&path).expect("the import ends").expect_err("refused");
    assert!(e.contains("outside the model's directory"), "{e}");
    // Links that stay inside read as before.
    std::os::unix::fs::symlink("weights.bin", dir.join("model/alias.bin")).expect("symlink");
    std::os::unix::fs::symlink(".", dir.join("model/here")).expect("symlink");
    for location in ["alias.bin", "here/weights.bin", "here/here/alias.bin", "up/model/weights.bin"] {
        relocate(&path, location);
        let im = import_within(&path).expect("the import ends").unwrap_or_else(|e| panic!("{location}: {e}"));
        assert_eq!(im.weights, import(&cnn()).expect("inline").weights, "{location}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Property: whatever path of links, directories, FIFOs and files a
/// location names, the import ends, and it reads external data only when
/// the location resolves to a regular file inside the model's directory;
/// never the bytes of a file outside it.
#[test]
fn external_data_never_reads_outside_the_model_or_blocks() {
    let (dir, path, _) = external_model("paths", "weights.bin");
    let m = dir.join("model");
    // Outside: a file of the same size with other bytes.
    std::fs::write(dir.join("secret.bin"), vec![0x5a; 216]).expect("write");
    mkfifo(&m.join("fifo"));
    std::fs::create_dir_all(m.join("sub")).expect("dir");
    std::fs::write(m.join("sub/w.bin"), std::fs::read(m.join("weights.bin")).expect("read")).expect("write");
    let links = [
        ("in", "weights.bin"),
        ("out", "../secret.bin"),
        ("up", ".."),
        ("here", "."),
        ("abs", "/etc"),
        ("self", "self"),
        ("tofifo", "fifo"),
        ("sub/back", ".."),
        ("sub/escape", "../../secret.bin"),
    ];
    for (name, to) in links {
        std::os::unix::fs::symlink(to, m.join(name)).expect("symlink");
    }
    let parts = [
        ".",
        "sub",
        "up",
        "here",
        "in",
        "out",
        "abs",
        "self",
        "fifo",
        "tofifo",
        "weights.bin",
        "w.bin",
        "back",
        "escape",
        "secret.bin",
        "model",
        "passwd",
        "missing",
    ];
    let inline = import(&cnn()).expect("inline").weights;
    let root = m.canonicalize().expect("canonical");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut read, mut refused) = (0, 0);
    for _ in 0..300 {
        let n = 1 + next() % 4;
        let location: Vec<&str> = (0..n).map(|_| parts[(next() % parts.len() as u64) as usize]).collect();
        let location = location.join("/");
        relocate(&path, &location);
        let got = import_within(&path).unwrap_or_else(|| panic!("`{location}`: the import did not end"));
        let inside_file = m
            .join(&location)
            .canonicalize()
            .ok()
            .filter(|p| p.starts_with(&root))
            .and_then(|p| std::fs::metadata(p).ok())
            .is_some_and(|md| md.is_file());
        match got {
            Ok(im) => {
                assert!(inside_file, "`{location}` was read");
                assert_eq!(im.weights, inline, "`{location}`: the bytes of the file inside");
                read += 1;
            }
            Err(e) => {
                assert!(!inside_file || e.contains("raw data of"), "`{location}` refused: {e}");
                refused += 1;
            }
        }
    }
    assert!(read > 0 && refused > 0, "{read} read, {refused} refused");
    std::fs::remove_dir_all(&dir).ok();
}

/// The mutation loop over real models, for longer runs by hand:
/// `TEXC_ONNX_CORPUS=a.onnx:b.onnx TEXC_ONNX_MUTATIONS=100000 cargo test -p texc-onnx --release -- --ignored`.
#[test]
#[ignore]
fn mutated_corpus_models_never_panic() {
    let corpus = std::env::var("TEXC_ONNX_CORPUS").unwrap_or_default();
    let rounds: usize = std::env::var("TEXC_ONNX_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for path in corpus.split(':').filter(|p| !p.is_empty()) {
        let bytes = std::fs::read(path).expect("corpus file");
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..rounds {
            let mut b = bytes.clone();
            for _ in 0..1 + next() % 8 {
                let i = (next() % b.len() as u64) as usize;
                match next() % 4 {
                    0 => b[i] = next() as u8,
                    1 => b[i] ^= 1 << (next() % 8),
                    2 => b.truncate(i.max(1)),
                    _ => b.insert(i, next() as u8),
                }
            }
            match import_bytes(
                &b,
                "m.onnx",
                "m.npz",
                &Options { dims: vec![("batch".into(), 1)], ..Options::default() },
            ) {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
        }
        eprintln!("{path}: {ok} imported, {refused} refused");
    }
}

/// A graph over input `x` of `x_dims` with the given nodes and initializers, and output `y` (shape inferred).
fn graph_of(x_dims: &[i64], nodes: Vec<NodeProto>, initializer: Vec<TensorProto>) -> ModelProto {
    let mut m = cnn();
    let g = m.graph.as_mut().expect("graph");
    g.node = nodes;
    g.initializer = initializer;
    g.input = vec![value_info("x", x_dims)];
    g.output = vec![ValueInfoProto { name: "y".into(), ..Default::default() }];
    m
}

fn lstm_with(attrs: Vec<AttributeProto>, extra: &[&str], inits: Vec<TensorProto>) -> Result<String, String> {
    let mut inputs = vec!["x", "w", "r"];
    inputs.extend(extra);
    let mut n = node("LSTM", &inputs, "y", attrs);
    n.name = "/rnn/LSTM".into();
    let mut initializer = vec![tensor("w", &[1, 8, 3], &[0.1; 24]), tensor("r", &[1, 8, 2], &[0.2; 16])];
    initializer.extend(inits);
    import(&graph_of(&[4, 1, 3], vec![n], initializer)).map(|i| i.source).map_err(|e| e.to_string())
}

/// Issue 36: what the importer does not translate exactly is refused, naming the node.
#[test]
fn recurrent_forms_beyond_onnx_defaults_are_refused() {
    let text = lstm_with(vec![], &[], vec![]).expect("a plain LSTM imports");
    assert!(text.contains("sigmoid(") && text.contains("tanh("), "{text}");
    let strings = |name: &str, v: &[&str]| AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRINGS,
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    };
    lstm_with(vec![strings("activations", &["Sigmoid", "Tanh", "Tanh"])], &[], vec![])
        .expect("the defaults, spelled out");
    assert_eq!(
        lstm_with(vec![strings("activations", &["Sigmoid", "Relu", "Tanh"])], &[], vec![]).expect_err("refused"),
        "node `/rnn/LSTM` (LSTM): activations [\"Sigmoid\", \"Relu\", \"Tanh\"]: only the defaults [\"Sigmoid\", \
         \"Tanh\", \"Tanh\"] are supported"
    );
    assert_eq!(
        lstm_with(vec![int("layout", 1)], &[], vec![]).expect_err("refused"),
        "node `/rnn/LSTM` (LSTM): layout = 1: only 0 ([seq, batch, …]) is supported"
    );
    let clip = AttributeProto { name: "clip".into(), r#type: attribute_type::FLOAT, f: 3.0, ..Default::default() };
    assert!(lstm_with(vec![clip], &[], vec![]).expect_err("refused").contains("clip are not supported"));
    assert_eq!(
        lstm_with(vec![int("hidden_size", 3)], &[], vec![]).expect_err("refused"),
        "node `/rnn/LSTM` (LSTM): hidden_size 3 differs from W's 2"
    );
    let lens = |v: i64| ints_tensor("lens", &[v]);
    lstm_with(vec![], &["", "lens"], vec![lens(4)]).expect("full-length sequences");
    assert_eq!(
        lstm_with(vec![], &["", "lens"], vec![lens(3)]).expect_err("refused"),
        "node `/rnn/LSTM` (LSTM): sequence_lens [3]: only full-length sequences (4) are supported"
    );
}

/// Issue 36: shape subgraphs and masks of constants are computed at import
/// (ViT's `Where(Equal(shape, -1), 1, shape)` before an Expand); a bool
/// initializer used as data is a `bool` parameter; integer operators that
/// have no exact translation are refused.
#[test]
fn masks_and_shapes_of_constants_fold_and_inexact_forms_are_refused() {
    let mut mask = ints_tensor("mask", &[]);
    mask.data_type = data_type::BOOL;
    mask.dims = vec![2, 2];
    mask.raw_data = vec![1u8, 0, 1, 1].into();
    let nodes = vec![
        node("Equal", &["shape", "minus"], "eq", vec![]),
        node("Where", &["eq", "ones", "shape"], "fixed", vec![]),
        node("Expand", &["b", "fixed"], "e", vec![]),
        node("Where", &["mask", "x", "e"], "y", vec![]),
    ];
    let inits = vec![
        ints_tensor("shape", &[-1, 2]),
        ints_tensor("minus", &[-1, -1]),
        ints_tensor("ones", &[1, 1]),
        tensor("b", &[1, 1], &[0.5]),
        mask,
    ];
    let im = import(&graph_of(&[2, 2], nodes, inits)).expect("imports");
    // The shape [-1, 2] becomes [1, 2]: `e` is the expanded constant, a parameter.
    let wanted = ["mask: bool[2, 2]", "e: f32[1, 2]", "select(mask[i0, i1], x[i0, i1], e[0, i1])"];
    assert!(wanted.iter().all(|w| im.source.contains(w)), "{}", im.source);
    assert_eq!(im.source.matches(" = ").count(), 1, "one statement: the rest is computed at import\n{}", im.source);

    let refused = |nodes: Vec<NodeProto>, inits: Vec<TensorProto>| {
        import(&graph_of(&[2, 2], nodes, inits)).expect_err("refused").to_string()
    };
    let cast = |to: i32| node("Cast", &["x"], "c", vec![int("to", to as i64)]);
    assert_eq!(
        refused(vec![cast(data_type::INT64), node("Mod", &["c", "c"], "y", vec![int("fmod", 1)])], vec![]),
        "node `/y` (Mod): only the integer Mod with fmod = 0 is supported"
    );
    assert_eq!(refused(vec![cast(data_type::DOUBLE)], vec![]), "node `/c` (Cast): a cast to double is not supported");
    assert_eq!(
        refused(vec![cast(data_type::BOOL), node("Relu", &["c"], "y", vec![])], vec![]),
        "node `/y` (Relu): an input of elements of type bool: this operator is supported on f32 tensors"
    );
    let pads = || vec![ints_tensor("pads", &[0, 1, 0, 1])];
    import(&graph_of(&[2, 2], vec![node("Pad", &["x", "pads"], "y", vec![])], pads())).expect("constant padding");
    assert_eq!(
        refused(vec![node("Pad", &["x", "pads"], "y", vec![string("mode", "reflect")])], pads()),
        "node `/y` (Pad): mode = \"reflect\": only constant padding is supported"
    );
    let einsum = |eq: &str| node("Einsum", &["x", "w"], "y", vec![string("equation", eq)]);
    let w = || vec![tensor("w", &[2, 3], &[0.5; 6])];
    import(&graph_of(&[2, 2], vec![einsum("ij,jk->ik")], w())).expect("a product");
    assert_eq!(refused(vec![einsum("ij,ij->i")], w()), "node `/y` (Einsum): `j` has sizes 2 and 3");
    assert_eq!(refused(vec![einsum("ij,jk->iz")], w()), "node `/y` (Einsum): output letter `z` names no axis");
    assert_eq!(
        refused(vec![einsum("ijk,jk->ik")], w()),
        "node `/y` (Einsum): `ijk` does not name the 2 axes of its operand"
    );
}

// ---------------------------------------------------------------- quantized models

fn typed(name: &str, data_type: i32, dims: &[i64], raw_data: Vec<u8>) -> TensorProto {
    TensorProto { dims: dims.to_vec(), data_type, raw_data: raw_data.into(), name: name.into(), ..Default::default() }
}

fn scalar(name: &str, v: f32) -> TensorProto {
    tensor(name, &[], &[v])
}

fn u8s(name: &str, dims: &[i64], v: &[u8]) -> TensorProto {
    typed(name, data_type::UINT8, dims, v.to_vec())
}

fn i8s(name: &str, dims: &[i64], v: &[i8]) -> TensorProto {
    typed(name, data_type::INT8, dims, v.iter().map(|&x| x as u8).collect())
}

fn i32s(name: &str, dims: &[i64], v: &[i32]) -> TensorProto {
    typed(name, data_type::INT32, dims, v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// x → Q → DQ → Conv(DQ(w), DQ(bias)) → Relu → Q → DQ → y, as
/// `quantize_static` writes it (per-channel i8 weights, i32 bias at scale
/// `s_x · s_w`).
fn qdq_conv() -> ModelProto {
    let (sx, sw) = (0.02f32, [0.01f32, 0.005]);
    let w: Vec<i8> = (0..2 * 2 * 3 * 3).map(|i| ((i * 37) % 255 - 127) as i8).collect();
    let nodes = vec![
        node("QuantizeLinear", &["x", "sx", "zx"], "xq", vec![]),
        node("DequantizeLinear", &["xq", "sx", "zx"], "xd", vec![]),
        node("DequantizeLinear", &["w", "sw", "zw"], "wd", vec![int("axis", 0)]),
        node("DequantizeLinear", &["b", "sb"], "bd", vec![int("axis", 0)]),
        node("Conv", &["xd", "wd", "bd"], "c", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Relu", &["c"], "r", vec![]),
        node("QuantizeLinear", &["r", "sy", "zy"], "yq", vec![]),
        node("DequantizeLinear", &["yq", "sy", "zy"], "y", vec![]),
    ];
    let inits = vec![
        scalar("sx", sx),
        u8s("zx", &[], &[128]),
        i8s("w", &[2, 2, 3, 3], &w),
        tensor("sw", &[2], &sw),
        i8s("zw", &[2], &[0, 0]),
        i32s("b", &[2], &[100, -300]),
        tensor("sb", &[2], &[sx * sw[0], sx * sw[1]]),
        scalar("sy", 0.05),
        u8s("zy", &[], &[10]),
    ];
    graph_of(&[1, 2, 4, 4], nodes, inits)
}

#[test]
fn a_qdq_convolution_is_one_integer_product() {
    let text = import(&qdq_conv()).expect("imports").source;
    // The activation is quantized once and never dequantized for the product;
    // the product reads the padded integers; bias and zero-point correction
    // are one i32 vector, the requantization per channel; the Relu is the
    // lower bound of the saturation (the output's zero point, 10).
    assert!(text.contains("xq[i0 in 0..1, i1 in 0..2, i2 in 0..4, i3 in 0..4] = u8(clamp(round(f32(x[i0, i1, i2, i3] / 0.02)) + 128.0, 0.0, 255.0));"), "{text}");
    assert!(!text.contains("xd["), "the dequantized input is never written: {text}");
    assert!(
        text.contains("select(i2 >= 1 && i2 < 5 && i3 >= 1 && i3 < 5, xq[i0, i1, i2 - 1, i3 - 1], u8(128))"),
        "{text}"
    );
    assert!(
        text.contains("sum[r0 in 0..2, r1 in 0..3, r2 in 0..3](i32(yq_pad[i0, r0, i2 + r1, i3 + r2]) * i32(w[i1, r0, r1, r2])) + yq_bias[i1]"),
        "{text}"
    );
    assert!(text.contains("* yq_requant[i1])) + 10.0, 10.0, 255.0));"), "{text}");
    assert!(text.contains("yq_bias: i32[2]") && text.contains("w: i8[2, 2, 3, 3]"), "{text}");
    assert!(!text.contains("conv2d") && !text.contains("max("), "{text}");
    let m = qdq_conv();
    let imported = import(&m).expect("imports");
    let bias = imported.weights.iter().find(|(n, _)| n == "yq_bias").expect("the folded bias");
    // bias − z_x · Σ w, per output channel.
    let w = &m.graph.as_ref().expect("graph").initializer[2].raw_data;
    let sum0: i32 = w[..18].iter().map(|&b| b as i8 as i32).sum();
    match &bias.1.data {
        texc_runtime::Data::I32(b) => assert_eq!(b[0], 100 - 128 * sum0),
        other => panic!("{other:?}"),
    }
}

/// Q(DQ(q)) with the same parameters is q; a weight with a zero point runs
/// as the sum of the operands less their zero points.
#[test]
fn dq_q_pairs_cancel_and_other_zero_points_are_subtracted() {
    let mut m = qdq_conv();
    let g = m.graph.as_mut().expect("graph");
    g.initializer[4] = i8s("zw", &[2], &[3, -1]);
    g.node.push(node("QuantizeLinear", &["y", "sy", "zy"], "again", vec![]));
    g.node.push(node("DequantizeLinear", &["again", "sy", "zy"], "z", vec![]));
    g.output.push(ValueInfoProto { name: "z".into(), ..Default::default() });
    let text = import(&m).expect("imports").source;
    assert!(text.contains("(i32(w[i1, r0, r1, r2]) - yq_bzero[i1])"), "{text}");
    assert!(!text.contains("again["), "the pair cancels: {text}");
    assert!(text.contains("z[i0, i1, i2, i3] = f32(i32(yq[i0, i1, i2, i3]) - 10) * 0.05;"), "{text}");
}

/// Bad scales and zero points are errors naming the node; a DQ → Conv → Q
/// that cannot run in integers (an f32 bias) runs in f32 between them.
#[test]
fn bad_quantization_parameters_are_errors_naming_the_node() {
    let with = |f: &dyn Fn(&mut GraphProto)| {
        let mut m = qdq_conv();
        f(m.graph.as_mut().expect("graph"));
        import(&m).map(|i| i.source).map_err(|e| e.to_string())
    };
    for (bad, shown) in
        [(0.0f32, "scale 0"), (-0.5, "scale -0.5"), (f32::NAN, "scale NaN"), (f32::INFINITY, "scale inf")]
    {
        let e = with(&|g| g.initializer[0] = scalar("sx", bad)).expect_err("refused");
        assert!(
            e.contains(&format!("node `/xq` (QuantizeLinear): {shown}: a scale must be positive and finite")),
            "{e}"
        );
    }
    let e = with(&|g| g.initializer[3] = tensor("sw", &[2], &[0.01, -1.0])).expect_err("refused");
    assert!(e.contains("node `/wd` (DequantizeLinear): scale -1 (element 1): a scale must be positive"), "{e}");
    let e = with(&|g| g.initializer[1] = i32s("zx", &[], &[128])).expect_err("refused");
    assert!(e.contains("node `/xq` (QuantizeLinear): a zero point of type int32 or int64"), "{e}");
    let e = with(&|g| g.initializer[4] = u8s("zw", &[2], &[0, 0])).expect_err("refused");
    assert!(e.contains("node `/wd` (DequantizeLinear): a zero point of type u8 for an input of type i8"), "{e}");
    let e = with(&|g| g.initializer[4] = i8s("zw", &[3], &[0, 0, 0])).expect_err("refused");
    assert!(e.contains("node `/wd` (DequantizeLinear): a zero point of shape [3] for a scale of shape [2]"), "{e}");
    let e = with(&|g| g.initializer[3] = tensor("sw", &[3], &[0.1, 0.1, 0.1])).expect_err("refused");
    assert!(e.contains("node `/wd` (DequantizeLinear): 3 scales for axis 0 of size 2"), "{e}");
    let e = with(&|g| {
        g.initializer.push(i32s("zb", &[2], &[0, 5]));
        g.node[3].input = vec!["b".into(), "sb".into(), "zb".into()];
    })
    .expect_err("refused");
    assert!(e.contains("node `/bd` (DequantizeLinear): an int32 zero point must be 0"), "{e}");
    // An f32 bias: the pattern does not fit; f32 between DQ and Q.
    let text = with(&|g| {
        g.initializer[5] = tensor("b", &[2], &[0.1, 0.2]);
        g.node[3] = node("Identity", &["b"], "bd", vec![]);
    })
    .expect("imports");
    assert!(text.contains("conv2d_bias(xd, wd, b, pad = 1)") && text.contains("xd[i0 in 0..1"), "{text}");
}

#[test]
fn mutated_quantized_models_never_panic() {
    let bytes = qdq_conv().encode_to_vec();
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            match next() % 3 {
                0 => b[i] = next() as u8,
                1 => b.truncate(i.max(1)),
                _ => b.insert(i, next() as u8),
            }
        }
        match import_bytes(&b, "m.onnx", "m.npz", &Options::default()) {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} imported, {refused} refused");
}
