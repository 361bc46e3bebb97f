//! texc from Python: `texc.compile` runs the pipeline (`texc_pipeline::Pipeline`,
//! the same passes as the `texc` command) on a `.tex` file, `.tex` source
//! text or an `.onnx` model, and returns a [`Kernel`] that runs on NumPy
//! arrays, times itself and prints any stage of its compilation.
//!
//! Compiled CPU kernels read C-order arrays (and DLPack tensors) where they
//! are and write the arrays they return ([`Kernel::call_in_place`]); other
//! layouts and targets copy into texc's tensors and back. The GIL is
//! released while a kernel compiles and while it runs, so Python threads can
//! call kernels at once (compiled kernels are `Send + Sync`).
//! Problems in the input (source, sizes, knobs) raise `texc.TexcError` with
//! texc's rendered diagnostic; misuse (an unknown target or stage) raises
//! `ValueError`; arguments of the wrong type or shape raise `TypeError` or
//! `ValueError` naming the parameter.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    Element, IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;
use texc_codegen::Compiled;
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::{Program, ProgramParam};
use texc_compiler::Bindings;
use texc_pipeline::{Error, Options, Pipeline};
use texc_runtime::{DType, Data, Tensor};
use texc_schedules::tuning::db::Db;

mod cuda;
mod tune;

create_exception!(
    texc,
    TexcError,
    PyException,
    "A problem in what texc was given: the source (with file:line:col and an excerpt), an unknown kernel, \
     sizes that do not fit, an unknown knob. `str(e)` is texc's rendered diagnostic."
);

/// How compiling or running failed, rendered while the pipeline (and its
/// sources) still exist; becomes a Python exception once the GIL is held.
enum Failure {
    /// `TexcError`: texc's diagnostics, rendered with the source excerpts.
    Input(String),
    /// `ValueError`: texc was asked something it does not do.
    Usage(String),
}

impl Failure {
    fn of(pl: &Pipeline, e: Error) -> Failure {
        match e {
            Error::Input(d) => Failure::Input(pl.render(&d)),
            Error::Usage(m) => Failure::Usage(m),
        }
    }

    fn into_py(self) -> PyErr {
        match self {
            Failure::Input(text) => TexcError::new_err(text.trim_end().to_string()),
            Failure::Usage(m) => PyValueError::new_err(m),
        }
    }
}

/// Where a kernel's source is: a file, or text given to `compile`.
#[derive(Clone)]
enum Source {
    File(PathBuf),
    Text(String),
}

/// The name diagnostics give source text passed as a string.
const TEXT_NAME: &str = "<string>";

impl Source {
    /// `compile`'s first argument: a path (`os.PathLike`, or a one-line
    /// string naming a `.tex`/`.onnx` file or an existing file) or source text.
    fn of(x: &Bound<'_, PyAny>) -> PyResult<Source> {
        if let Ok(s) = x.cast::<PyString>() {
            let s = s.to_cow()?.into_owned();
            let one_line = !s.contains('\n');
            let named = s.ends_with(".tex") || s.ends_with(".onnx") || s.ends_with(".loops");
            if one_line && (named || std::path::Path::new(&s).is_file()) {
                return Source::file(PathBuf::from(s));
            }
            return Ok(Source::Text(s));
        }
        match x.extract::<PathBuf>() {
            Ok(p) => Source::file(p),
            Err(_) => Err(PyTypeError::new_err(format!(
                "compile: expected .tex source text or the path of a .tex or .onnx file, got {}",
                type_name(x)
            ))),
        }
    }

    fn file(p: PathBuf) -> PyResult<Source> {
        if texc_pipeline::is_loops_file(&p) {
            return Err(PyValueError::new_err(format!(
                "{}: the Python package compiles .tex and .onnx files; run .loops files with the texc command",
                p.display()
            )));
        }
        Ok(Source::File(p))
    }

    /// Parse and resolve it in `pl`: the module.
    fn load(&self, pl: &mut Pipeline) -> Result<usize, Error> {
        match self {
            Source::File(p) => pl.load(p),
            Source::Text(t) => pl.load_text(TEXT_NAME, t, None),
        }
    }
}

fn type_name(x: &Bound<'_, PyAny>) -> String {
    x.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// A parameter the caller gives: a tensor, or a scalar (with its default, if any).
struct Param {
    name: String,
    dtype: DType,
    /// `None` for scalars.
    shape: Option<Vec<usize>>,
    default: Option<f64>,
}

/// A scalar parameter with a default may be left out of a call.
fn has_default(p: &Param) -> bool {
    p.shape.is_none() && p.default.is_some()
}

/// An output: its name, element type and shape.
struct Output {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
}

/// What runs: compiled code, or the interpreter (`target="interp"`).
enum Exec {
    Compiled(Box<Compiled>),
    Interp,
}

/// Everything a call needs, built by `compile` with the GIL released.
struct Built {
    name: String,
    sizes: Vec<(String, i64)>,
    /// The program as written: parameters, outputs, FLOPs, random inputs.
    written: Program,
    /// The caller's parameters, in order (an imported model's weights are not among them).
    params: Vec<Param>,
    outputs: Vec<Output>,
    /// Parameter names of what runs, in its order.
    run_params: Vec<String>,
    /// Arguments of what runs that the caller does not give: an imported
    /// model's weights and the constants folded from them.
    fixed: HashMap<String, Tensor>,
    exec: Exec,
    compile_s: f64,
    /// An imported model's inputs and outputs: (ONNX name, parameter or output name).
    onnx_names: Vec<(String, String)>,
    /// The knobs of the tuning database's record it was compiled with.
    tuned: Option<Vec<(String, i64)>>,
}

/// What `compile` was asked.
#[derive(Clone)]
struct Request {
    source: Source,
    kernel: Option<String>,
    target: String,
    bindings: Bindings,
    knobs: BTreeMap<String, i64>,
    /// Sizes of an ONNX model's symbolic dimensions (`load_onnx(dims=...)`).
    model_dims: Vec<(String, i64)>,
    /// The tuning database whose best record sets the knobs (`db=...`).
    db: Option<PathBuf>,
    /// Run a GPU target's kernels on this CPU (`emulate_gpu=True`).
    emulate_gpu: bool,
}

impl Request {
    /// The pipeline's options for this request (as the CLI sets them from its flags).
    fn options(&self) -> Result<Options, Failure> {
        let target = texc_pipeline::target(&self.target).map_err(|e| match e {
            Error::Usage(m) => Failure::Usage(m),
            Error::Input(_) => Failure::Usage(format!("unknown target `{}`", self.target)),
        })?;
        target.backend().map_err(|e| Failure::Usage(e.to_string()))?;
        let mut o = Options::from_env(target).map_err(Failure::Usage)?;
        for (name, &value) in &self.knobs {
            if let Some((_, values)) = texc_pipeline::PIPELINE_KNOBS.iter().find(|(n, _)| n == name) {
                if !values.contains(&value) {
                    let list: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                    return Err(Failure::Usage(format!("knob {name}={value}: expected one of {}", list.join(", "))));
                }
            }
        }
        o.knobs = self.knobs.clone();
        o.model_dims = self.model_dims.clone();
        o.emulate_gpu = self.emulate_gpu;
        Ok(o)
    }

    /// A pipeline with the source loaded: it and the kernel's module.
    fn load(&self) -> Result<(Pipeline, usize), Failure> {
        let mut pl = Pipeline::new(self.options()?);
        let m = self.source.load(&mut pl).map_err(|e| Failure::of(&pl, e))?;
        if self.kernel.is_none() {
            let kernels = &pl.session.module(m).kernels;
            if kernels.len() > 1 {
                let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
                return Err(Failure::Usage(format!(
                    "the source defines several kernels; choose one with kernel=... (kernels: {})",
                    names.join(", ")
                )));
            }
        }
        Ok((pl, m))
    }

    /// Compile: everything up to runnable code (or the interpreter's program).
    fn build(&self) -> Result<Built, Failure> {
        let (mut pl, m) = self.load()?;
        self.build_in(&mut pl, m).map_err(|e| Failure::of(&pl, e))
    }

    fn build_in(&self, pl: &mut Pipeline, m: usize) -> Result<Built, Error> {
        let k = pl.kernel(m, self.kernel.as_deref())?;
        let started = Instant::now();
        let tuned = match &self.db {
            Some(path) => pl.use_tuning_db(&Db::new(path), k, &self.bindings)?.knobs_of.map(|r| r.knobs),
            None => None,
        };
        let (written, exec, run_params, mut fixed) = if pl.target().is_compiled() {
            let (built, loops) = pl.build(k, &self.bindings)?;
            let compiled = pl.compile(&loops.legal)?;
            let fixed = pl.model_constants()?;
            (built.written, Exec::Compiled(Box::new(compiled)), loops.legal.p.param_names(), fixed)
        } else {
            let built = pl.program(k, &self.bindings)?;
            let run_params = built.written.param_names();
            (built.written, Exec::Interp, run_params, pl.model_inputs().clone())
        };
        fixed.retain(|n, _| run_params.contains(n));
        let weights = pl.model_inputs();
        let params = written
            .params
            .iter()
            .map(|q| match q {
                ProgramParam::Tensor(t) => {
                    let d = written.tensor(*t);
                    let shape = d.shape.iter().map(|&s| s as usize).collect();
                    Param { name: d.name.clone(), dtype: d.elem, shape: Some(shape), default: None }
                }
                ProgramParam::Scalar(s) => {
                    let d = &written.scalars[*s as usize];
                    Param { name: d.name.clone(), dtype: d.elem, shape: None, default: d.default }
                }
            })
            .filter(|p| !weights.contains_key(&p.name))
            .collect();
        let outputs = written
            .outputs
            .iter()
            .map(|&t| {
                let d = written.tensor(t);
                Output { name: d.name.clone(), dtype: d.elem, shape: d.shape.iter().map(|&s| s as usize).collect() }
            })
            .collect();
        Ok(Built {
            name: written.name.clone(),
            sizes: written.bindings.clone(),
            params,
            outputs,
            run_params,
            fixed,
            exec,
            written,
            compile_s: started.elapsed().as_secs_f64(),
            tuned,
            onnx_names: pl
                .model_names()
                .iter()
                .filter(|n| n.role != texc_pipeline::ModelRole::Weight)
                .map(|n| (n.onnx.clone(), n.ident.clone()))
                .collect(),
        })
    }
}

/// A compiled kernel. Call it on NumPy arrays: `kernel(A, B)` or
/// `kernel(A=a, B=b)`; it returns one array, or a tuple for several outputs.
#[pyclass(module = "texc", frozen)]
struct Kernel {
    request: Request,
    target: &'static str,
    b: Built,
    /// Tensor arguments copied because their memory could not be read as it is.
    copies: std::sync::atomic::AtomicU64,
    /// A model's weights on the device, copied there by the first call on
    /// CUDA tensors and kept for the next ones.
    device_weights: std::sync::OnceLock<HashMap<String, texc_runtime::cuda::DeviceMemory>>,
}

/// The NumPy dtype that carries a texc element type (bf16, which NumPy
/// lacks, travels as float32, as in texc's `.npy` files).
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "float32",
        // NumPy's names are PyTorch's for every other type.
        d => cuda::torch_name(d),
    }
}

fn shape_text(s: &[usize]) -> String {
    match s {
        [one] => format!("({one},)"),
        _ => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// The elements of an array of `T` (checked by the caller), in row-major
/// order. Arrays in another order, strided or unaligned (a `frombuffer` at
/// an odd offset) are first copied by NumPy into a new C-order array.
fn elements<T: Element + Clone>(x: &Bound<'_, PyUntypedArray>, name: &str) -> PyResult<Vec<T>> {
    let aligned = (x.data_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
    let contiguous;
    let x = if x.is_c_contiguous() && aligned {
        x
    } else {
        // `ndarray.copy()` is a new, aligned, C-order array.
        let c = x.call_method0("copy")?;
        contiguous = c.cast_into::<PyUntypedArray>()?;
        &contiguous
    };
    let a = x.cast::<PyArrayDyn<T>>().map_err(|e| PyTypeError::new_err(format!("argument `{name}`: {e}")))?;
    let ro = a.try_readonly().map_err(|e| PyValueError::new_err(format!("argument `{name}`: {e}")))?;
    Ok(ro.as_slice().map_err(|e| PyValueError::new_err(format!("argument `{name}`: {e}")))?.to_vec())
}

/// Argument `x` of tensor parameter `p` as a NumPy array, dtype and shape
/// checked: an ndarray, or an object with `__dlpack__` (a PyTorch CPU
/// tensor), seen through `numpy.from_dlpack` without a copy.
fn array_arg<'py>(
    p: &Param,
    shape: &[usize],
    sizes: &str,
    x: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let want = numpy_name(p.dtype);
    let viewed;
    let x = match x.cast::<PyUntypedArray>() {
        Ok(_) => x,
        Err(_) if x.hasattr("__dlpack__")? => {
            viewed = x.py().import("numpy")?.getattr("from_dlpack")?.call1((x,)).map_err(|e| {
                PyTypeError::new_err(format!(
                    "argument `{}`: cannot view the {} as a NumPy array through DLPack (a tensor on a GPU \
                     needs .cpu()): {e}",
                    p.name,
                    type_name(x)
                ))
            })?;
            &viewed
        }
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "argument `{}`: expected a numpy.ndarray (or a DLPack tensor) of {want} with shape {}, got {}",
                p.name,
                shape_text(shape),
                type_name(x)
            )))
        }
    };
    let a = x.cast::<PyUntypedArray>()?.clone();
    let got = a.dtype().str()?.to_string();
    let same = a.dtype().is_equiv_to(&numpy::PyArrayDescr::new(x.py(), want)?);
    if !same {
        return Err(PyTypeError::new_err(format!(
            "argument `{}`: expected dtype {want}{}, got {got} (convert with .astype(numpy.{want}))",
            p.name,
            if p.dtype == DType::BF16 { " (a bf16 parameter takes float32, rounded to bf16)" } else { "" },
        )));
    }
    if a.shape() != shape {
        return Err(PyValueError::new_err(format!(
            "argument `{}`: expected shape {}, got {}; the kernel is compiled for {sizes} (compile it again \
             for other sizes)",
            p.name,
            shape_text(shape),
            shape_text(a.shape()),
        )));
    }
    Ok(a)
}

/// An array as a tensor of parameter `p` (a copy): dtype and shape checked.
fn tensor_arg(p: &Param, shape: &[usize], sizes: &str, x: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let a = array_arg(p, shape, sizes, x)?;
    let (a, name) = (&a, &p.name);
    let data = match p.dtype {
        DType::F16 => Data::F16(elements::<half::f16>(a, name)?),
        DType::BF16 => Data::BF16(elements::<f32>(a, name)?.into_iter().map(half::bf16::from_f32).collect()),
        DType::F32 => Data::F32(elements::<f32>(a, name)?),
        DType::F64 => Data::F64(elements::<f64>(a, name)?),
        DType::I8 => Data::I8(elements::<i8>(a, name)?),
        DType::U8 => Data::U8(elements::<u8>(a, name)?),
        DType::I32 => Data::I32(elements::<i32>(a, name)?),
        DType::I64 => Data::I64(elements::<i64>(a, name)?),
        DType::Bool => Data::Bool(elements::<bool>(a, name)?),
    };
    Ok(Tensor { shape: shape.to_vec(), data })
}

trait DataPtr {
    /// The address of the array's first element.
    fn data_ptr(&self) -> *const u8;
}

impl DataPtr for Bound<'_, PyUntypedArray> {
    fn data_ptr(&self) -> *const u8 {
        // SAFETY: a live array object; its `data` field is its first element.
        unsafe { (*self.as_array_ptr()).fields.data as *const u8 }
    }
}

/// The memory of argument `x` of tensor parameter `p` (checked as
/// [`array_arg`] does), where the kernel can read it as it is: C order and
/// aligned to its elements (bf16 parameters take float32: never). `None`
/// when it must be copied.
fn memory_of(p: &Param, shape: &[usize], sizes: &str, x: &Bound<'_, PyAny>) -> PyResult<Option<(*const u8, usize)>> {
    let a = array_arg(p, shape, sizes, x)?;
    let ptr = a.data_ptr();
    let len = shape.iter().product::<usize>() * p.dtype.size();
    let aligned = (ptr as usize).is_multiple_of(p.dtype.size());
    Ok((p.dtype != DType::BF16 && a.is_c_contiguous() && aligned).then_some((ptr, len)))
}

/// A new zeroed array for an output: it, its memory and its size in bytes.
fn zeros(py: Python<'_>, dtype: DType, shape: &[usize]) -> PyResult<(Py<PyAny>, *mut u8, usize)> {
    fn of<T: Element>(py: Python<'_>, shape: &[usize]) -> (Py<PyAny>, *mut u8) {
        let a = PyArrayDyn::<T>::zeros(py, IxDyn(shape), false);
        let ptr = a.data() as *mut u8;
        (a.into_any().unbind(), ptr)
    }
    let (a, ptr) = match dtype {
        DType::F16 => of::<half::f16>(py, shape),
        DType::F32 => of::<f32>(py, shape),
        DType::F64 => of::<f64>(py, shape),
        DType::I8 => of::<i8>(py, shape),
        DType::U8 => of::<u8>(py, shape),
        DType::I32 => of::<i32>(py, shape),
        DType::I64 => of::<i64>(py, shape),
        DType::Bool => of::<bool>(py, shape),
        DType::BF16 => return Err(PyRuntimeError::new_err("internal error: a bf16 output has no NumPy dtype")),
    };
    Ok((a, ptr, shape.iter().product::<usize>() * dtype.size()))
}

/// PyTorch's current stream on CUDA device `device`, as the driver's
/// handle: through `torch._C._cuda_getCurrentRawStream` where PyTorch has
/// it (what Triton's launcher calls: an integer, no `Stream` object built
/// per call), else `torch.cuda.current_stream(device).cuda_stream`.
fn current_stream(torch: &Bound<'_, PyModule>, device: i64) -> PyResult<u64> {
    if let Ok(raw) = torch.getattr("_C").and_then(|c| c.getattr("_cuda_getCurrentRawStream")) {
        if let Ok(s) = raw.call1((device,)).and_then(|s| s.extract::<u64>()) {
            return Ok(s);
        }
    }
    torch.getattr("cuda")?.call_method1("current_stream", (device,))?.getattr("cuda_stream")?.extract()
}

/// A Python number as scalar parameter `p`: integers must be integral and in range.
fn scalar_arg(p: &Param, x: &Bound<'_, PyAny>) -> PyResult<f64> {
    let v: f64 = x.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "argument `{}`: expected a number ({} scalar), got {}",
            p.name,
            numpy_name(p.dtype),
            type_name(x)
        ))
    })?;
    match p.dtype.integer_range() {
        Some((lo, hi)) if v.fract() != 0.0 || !v.is_finite() || v < lo || v > hi => {
            Err(PyValueError::new_err(format!(
                "argument `{}`: {v} is not a valid {} value (the integers {lo} to {hi})",
                p.name,
                numpy_name(p.dtype)
            )))
        }
        _ => Ok(v),
    }
}

/// A tensor as a NumPy array (bf16 as float32).
fn to_numpy(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    fn arr<T: Element>(py: Python<'_>, shape: Vec<usize>, v: Vec<T>) -> PyResult<Py<PyAny>> {
        let a = ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(a.into_pyarray(py).into_any().unbind())
    }
    let s = t.shape;
    match t.data {
        Data::F16(v) => arr(py, s, v),
        Data::BF16(v) => arr(py, s, v.into_iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
        Data::F32(v) => arr(py, s, v),
        Data::F64(v) => arr(py, s, v),
        Data::I8(v) => arr(py, s, v),
        Data::U8(v) => arr(py, s, v),
        Data::I32(v) => arr(py, s, v),
        Data::I64(v) => arr(py, s, v),
        Data::Bool(v) => arr(py, s, v),
    }
}

impl Kernel {
    /// The objects a call gives, by parameter name: every parameter without
    /// a default given once, positionally or by name.
    fn bind<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<HashMap<String, Bound<'py, PyAny>>> {
        let params = &self.b.params;
        let name = &self.b.name;
        if args.len() > params.len() {
            return Err(PyTypeError::new_err(format!(
                "kernel `{name}` takes {} arguments ({}), got {}",
                params.len(),
                self.signature(),
                args.len()
            )));
        }
        let mut given: HashMap<String, Bound<'py, PyAny>> = HashMap::new();
        for (p, x) in params.iter().zip(args.iter()) {
            given.insert(p.name.clone(), x);
        }
        if let Some(kw) = kwargs {
            for (k, x) in kw.iter() {
                let k: String = k.extract()?;
                let Some(p) = self.param_named(&k) else {
                    return Err(PyTypeError::new_err(format!(
                        "kernel `{name}` has no parameter `{k}` (its parameters: {})",
                        self.signature()
                    )));
                };
                if given.insert(p.name.clone(), x).is_some() {
                    return Err(PyTypeError::new_err(format!("kernel `{name}`: argument `{k}` is given twice")));
                }
            }
        }
        let missing: Vec<&str> = params
            .iter()
            .filter(|p| !given.contains_key(&p.name) && !has_default(p))
            .map(|p| p.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(PyTypeError::new_err(format!(
                "kernel `{name}` is missing argument{} {} (its parameters: {})",
                if missing.len() > 1 { "s" } else { "" },
                missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
                self.signature()
            )));
        }
        Ok(given)
    }

    /// The parameter a keyword names: its name, or for an imported model its
    /// ONNX name (`k(**{"input.1": x})`).
    fn param_named(&self, k: &str) -> Option<&Param> {
        let params = &self.b.params;
        params.iter().find(|p| p.name == k).or_else(|| {
            let ident = self.b.onnx_names.iter().find(|(onnx, _)| onnx == k).map(|(_, ident)| ident)?;
            params.iter().find(|p| &p.name == ident)
        })
    }

    /// The arguments a call gives, checked and converted, by parameter name.
    fn given(&self, bound: HashMap<String, Bound<'_, PyAny>>) -> PyResult<HashMap<String, Arg>> {
        let sizes = self.sizes_text();
        let mut given = HashMap::new();
        for (name, x) in bound {
            let p = self.b.params.iter().find(|p| p.name == name).expect("bound to a parameter");
            let arg = match &p.shape {
                Some(shape) => Arg::Tensor(tensor_arg(p, shape, &sizes, &x)?),
                None => Arg::Scalar(scalar_arg(p, &x)?),
            };
            given.insert(name, arg);
        }
        Ok(given)
    }

    /// Whether calls run on the arrays' memory ([`Kernel::call_in_place`]):
    /// host code, and no bf16 tensor (NumPy has none: they are converted).
    fn runs_in_place(&self) -> Option<&Compiled> {
        let Exec::Compiled(c) = &self.b.exec else { return None };
        let bf16 = |d: DType| d == DType::BF16;
        let any_bf16 = self.b.params.iter().any(|p| p.shape.is_some() && bf16(p.dtype))
            || self.b.outputs.iter().any(|o| bf16(o.dtype))
            || self.b.fixed.values().any(|t| bf16(t.dtype()));
        (c.runs_in_place() && !any_bf16).then_some(&**c)
    }

    /// A call without copies: arrays in the kernel's layout (C order, its
    /// dtype, aligned) are read where they are, the outputs are new arrays
    /// the kernel writes, and a model's weights are passed where texc keeps
    /// them. Other arguments (Fortran order, strided views) are copied.
    fn call_in_place<'py>(
        &self,
        py: Python<'py>,
        c: &Compiled,
        given: HashMap<String, Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let b = &self.b;
        let sizes = self.sizes_text();
        // What each parameter of the code reads: an array's memory (the array
        // kept alive by `given`), a converted copy, or texc's own tensor.
        enum Src<'a> {
            /// An array's memory: its address, bytes, dtype and shape.
            Memory(*const u8, usize, DType, &'a [usize]),
            Copy(Tensor),
            Fixed(&'a Tensor),
            Scalar(f64),
        }
        let mut srcs = Vec::with_capacity(b.run_params.len());
        for n in &b.run_params {
            let src = match (given.get(n), b.params.iter().find(|p| &p.name == n)) {
                (Some(x), Some(p)) => match &p.shape {
                    Some(shape) => match memory_of(p, shape, &sizes, x)? {
                        Some((ptr, len)) => Src::Memory(ptr, len, p.dtype, shape),
                        None => {
                            self.copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Src::Copy(tensor_arg(p, shape, &sizes, x)?)
                        }
                    },
                    None => Src::Scalar(scalar_arg(p, x)?),
                },
                _ => match b.fixed.get(n) {
                    Some(t) => Src::Fixed(t),
                    None => Src::Scalar(self.default_of(n)?),
                },
            };
            srcs.push(src);
        }
        fn tensor_ref(t: &Tensor) -> texc_codegen::ArgRef<'_> {
            texc_codegen::ArgRef::Tensor(texc_codegen::TensorRef {
                dtype: t.dtype(),
                shape: &t.shape,
                bytes: t.bytes(),
            })
        }
        let refs: Vec<texc_codegen::ArgRef<'_>> = srcs
            .iter()
            .map(|s| match s {
                Src::Memory(ptr, len, dtype, shape) => {
                    // SAFETY: `memory_of` checked that the array is C-contiguous
                    // with `len` bytes of this dtype at `ptr`; `given` keeps it
                    // alive until the call returns.
                    let bytes = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                    texc_codegen::ArgRef::Tensor(texc_codegen::TensorRef { dtype: *dtype, shape, bytes })
                }
                Src::Copy(t) => tensor_ref(t),
                Src::Fixed(t) => tensor_ref(t),
                Src::Scalar(v) => texc_codegen::ArgRef::Scalar(*v),
            })
            .collect();
        let mut arrays = Vec::with_capacity(b.outputs.len());
        let mut memory = Vec::with_capacity(b.outputs.len());
        for o in &b.outputs {
            let (a, ptr, len) = zeros(py, o.dtype, &o.shape)?;
            arrays.push(a);
            memory.push((ptr, len));
        }
        let mut outs: Vec<texc_codegen::TensorMut<'_>> = b
            .outputs
            .iter()
            .zip(&memory)
            .map(|(o, &(ptr, len))| texc_codegen::TensorMut {
                dtype: o.dtype,
                shape: &o.shape,
                // SAFETY: a new array of `len` bytes that nothing else refers to yet.
                bytes: unsafe { std::slice::from_raw_parts_mut(ptr, len) },
            })
            .collect();
        py.detach(|| c.run_in_place(&refs, &mut outs)).map_err(|e| TexcError::new_err(e.to_string()))?;
        Ok(arrays)
    }

    /// The first argument (in parameter order) that is a tensor on a CUDA
    /// device, and its device: such a call runs on device memory.
    fn first_on_gpu(&self, given: &HashMap<String, Bound<'_, PyAny>>) -> PyResult<Option<(String, i64)>> {
        for p in self.b.params.iter().filter(|p| p.shape.is_some()) {
            if let Some(x) = given.get(&p.name) {
                if let Some(device) = cuda::device_of(x)? {
                    return Ok(Some((p.name.clone(), device)));
                }
            }
        }
        Ok(None)
    }

    /// Where a call on CUDA tensors runs: this kernel's code loaded on
    /// texc's device (the device `first` is on), or why not.
    fn device_code(&self, first: &str, device: i64) -> PyResult<&Compiled> {
        let on_device = match &self.b.exec {
            Exec::Compiled(c) if c.runs_on_device() => Some(&**c),
            _ => None,
        };
        let Some(c) = on_device else {
            let how = if self.request.emulate_gpu { " in the CPU emulation (emulate_gpu=True)" } else { "" };
            return Err(PyTypeError::new_err(format!(
                "argument `{first}` is a tensor on a GPU (cuda:{device}), but kernel `{}` runs on this CPU (target \
                 `{}`{how}): pass host arrays (.cpu()), or compile it for a GPU target (nvptx-sm80, nvptx-sm90)",
                self.b.name, self.target
            )));
        };
        let ordinal = texc_runtime::cuda::device().map_err(PyRuntimeError::new_err)?.ordinal() as i64;
        if device != ordinal {
            return Err(PyValueError::new_err(format!(
                "argument `{first}` is on cuda:{device}; texc runs kernels on cuda:{ordinal}"
            )));
        }
        Ok(c)
    }

    /// A model's weights on the device (copied there by the first call that
    /// succeeds in it: a failure, out of memory say, is tried again next call).
    fn weights_on_device(&self) -> PyResult<&HashMap<String, texc_runtime::cuda::DeviceMemory>> {
        if let Some(kept) = self.device_weights.get() {
            return Ok(kept);
        }
        let copy = || -> Result<HashMap<_, _>, String> {
            let device = texc_runtime::cuda::device()?;
            self.b.fixed.iter().map(|(n, t)| Ok((n.clone(), device.keep(t.bytes())?))).collect()
        };
        let kept = copy().map_err(TexcError::new_err)?;
        // Two threads' first calls may both copy: one set is kept, the other freed.
        let _ = self.device_weights.set(kept);
        Ok(self.device_weights.get().expect("set above"))
    }

    /// A call on CUDA tensors (DLPack, `crate::cuda`): every tensor argument
    /// on texc's device, read where it is; the outputs new PyTorch tensors
    /// there; the launches queued on PyTorch's current stream of that
    /// device, not waited for (as PyTorch's own operations).
    fn call_on_device<'py>(
        &self,
        py: Python<'py>,
        given: HashMap<String, Bound<'py, PyAny>>,
        first: &str,
        device: i64,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let c = self.device_code(first, device)?;
        let b = &self.b;
        let torch = py.import("torch").map_err(|e| {
            PyTypeError::new_err(format!(
                "argument `{first}` is a tensor on a GPU: a GPU kernel's outputs are PyTorch CUDA tensors, and \
                 PyTorch cannot be imported: {e}"
            ))
        })?;
        let torch_device = format!("cuda:{device}");
        let stream = current_stream(&torch, device)?;
        let weights = self.weights_on_device()?;
        // Contiguous copies of strided tensors, alive until the call is queued.
        let mut kept = Vec::new();
        enum Src<'a> {
            Memory(u64, DType, &'a [usize]),
            Scalar(f64),
        }
        let mut srcs = Vec::with_capacity(b.run_params.len());
        for n in &b.run_params {
            let src = match (given.get(n), b.params.iter().find(|p| &p.name == n)) {
                (Some(x), Some(p)) => match &p.shape {
                    Some(shape) => {
                        Src::Memory(self.device_arg(p, shape, x, (first, device), &mut kept)?, p.dtype, shape)
                    }
                    None => Src::Scalar(scalar_arg(p, x)?),
                },
                _ => match (weights.get(n), b.fixed.get(n)) {
                    (Some(m), Some(t)) => Src::Memory(m.ptr(), t.dtype(), &t.shape),
                    _ => Src::Scalar(self.default_of(n)?),
                },
            };
            srcs.push(src);
        }
        let args: Vec<texc_codegen::DeviceArgRef<'_>> = srcs
            .iter()
            .map(|s| match *s {
                Src::Memory(ptr, dtype, shape) => {
                    texc_codegen::DeviceArgRef::Tensor(texc_codegen::DeviceTensorRef { ptr, dtype, shape })
                }
                Src::Scalar(v) => texc_codegen::DeviceArgRef::Scalar(v),
            })
            .collect();
        let mut arrays = Vec::with_capacity(b.outputs.len());
        let mut ptrs = Vec::with_capacity(b.outputs.len());
        for o in &b.outputs {
            let kwargs = PyDict::new(py);
            kwargs.set_item("dtype", torch.getattr(cuda::torch_name(o.dtype))?)?;
            kwargs.set_item("device", &torch_device)?;
            let t = torch.call_method("empty", (o.shape.clone(),), Some(&kwargs))?;
            ptrs.push(t.call_method0("data_ptr")?.extract::<u64>()?);
            arrays.push(t.unbind());
        }
        let outs: Vec<texc_codegen::DeviceTensorRef<'_>> = b
            .outputs
            .iter()
            .zip(&ptrs)
            .map(|(o, &ptr)| texc_codegen::DeviceTensorRef { ptr, dtype: o.dtype, shape: &o.shape })
            .collect();
        // SAFETY: each input is the memory DLPack describes for a tensor of
        // the parameter's dtype and shape on texc's device (`device_arg`),
        // kept alive by `given`/`kept` until the call returns and by its
        // owner's stream order after (see `crate::cuda`); the outputs are
        // new tensors of their dtype and shape there; `stream` is PyTorch's
        // current stream of that device.
        py.detach(|| unsafe { c.run_on_device(&args, &outs, stream) })
            .map_err(|e| TexcError::new_err(e.to_string()))?;
        drop(kept);
        Ok(arrays)
    }

    /// The device address of CUDA tensor `x` for tensor parameter `p`, its
    /// dtype, shape and device (`first`'s) checked; a strided PyTorch
    /// tensor, or one not starting on 16 bytes (a view at an offset), is
    /// copied first (counted in `copies`, kept in `kept`).
    fn device_arg<'py>(
        &self,
        p: &Param,
        shape: &[usize],
        x: &Bound<'py, PyAny>,
        (first, device): (&str, i64),
        kept: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<u64> {
        let name = &p.name;
        let want = cuda::torch_name(p.dtype);
        match cuda::device_of(x)? {
            Some(d) if d != device => {
                return Err(PyValueError::new_err(format!(
                    "argument `{name}` is on cuda:{d}, but `{first}` is on cuda:{device}: every tensor must be on \
                     the same GPU"
                )))
            }
            Some(_) => {}
            None => {
                return Err(PyTypeError::new_err(format!(
                    "argument `{name}`: expected a CUDA tensor of {want} with shape {} (argument `{first}` is on the \
                     GPU, so every tensor must be), got {}",
                    shape_text(shape),
                    type_name(x)
                )))
            }
        }
        let mut t = cuda::view(x, name)?;
        if t.dtype != Some(p.dtype) {
            return Err(PyTypeError::new_err(format!("argument `{name}`: expected dtype {want}, got {}", t.type_text)));
        }
        if t.shape != shape {
            return Err(PyValueError::new_err(format!(
                "argument `{name}`: expected shape {}, got {}; the kernel is compiled for {} (compile it again for \
                 other sizes)",
                shape_text(shape),
                shape_text(&t.shape),
                self.sizes_text()
            )));
        }
        let aligned = t.ptr.is_multiple_of(texc_codegen::DEVICE_ALIGNMENT);
        if !t.contiguous || !aligned {
            if !x.hasattr("clone")? {
                return Err(PyValueError::new_err(format!(
                    "argument `{name}`: a {} on the GPU that is {}; texc reads row-major tensors starting on {} bytes \
                     (copy it)",
                    type_name(x),
                    if t.contiguous { "a view at an offset" } else { "strided" },
                    texc_codegen::DEVICE_ALIGNMENT
                )));
            }
            // A new block of PyTorch's allocator, in row-major order.
            let kwargs = pyo3::types::PyDict::new(x.py());
            kwargs.set_item("memory_format", x.py().import("torch")?.getattr("contiguous_format")?)?;
            let c = x.call_method("clone", (), Some(&kwargs))?;
            t = cuda::view(&c, name)?;
            kept.push(c);
            self.copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(t.ptr)
    }

    /// The default of scalar parameter `n`.
    fn default_of(&self, n: &str) -> PyResult<f64> {
        let b = &self.b;
        let default = b.written.scalars.iter().find(|s| s.name == n).and_then(|s| s.default);
        default.ok_or_else(|| {
            PyRuntimeError::new_err(format!("internal error: no value for parameter `{n}` of `{}`", b.name))
        })
    }

    /// The arguments of what runs, in its order: the caller's, the fixed ones, scalar defaults.
    fn run_args(&self, mut given: HashMap<String, Arg>) -> PyResult<Vec<Arg>> {
        let b = &self.b;
        b.run_params
            .iter()
            .map(|n| {
                if let Some(a) = given.remove(n) {
                    return Ok(a);
                }
                if let Some(t) = b.fixed.get(n) {
                    return Ok(Arg::Tensor(t.clone()));
                }
                self.default_of(n).map(Arg::Scalar)
            })
            .collect()
    }

    /// `N=100, K=64`.
    fn sizes_text(&self) -> String {
        self.b.sizes.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
    }

    /// `A: float32 (5, 7), eps: float32 = 1e-05`.
    fn signature(&self) -> String {
        self.b
            .params
            .iter()
            .map(|p| match (&p.shape, p.default) {
                (Some(s), _) => format!("{}: {} {}", p.name, numpy_name(p.dtype), shape_text(s)),
                (None, Some(d)) => format!("{}: {} = {d:?}", p.name, numpy_name(p.dtype)),
                (None, None) => format!("{}: {}", p.name, numpy_name(p.dtype)),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Run on arguments in the order of what runs (GIL released by the caller).
    fn execute(&self, args: Vec<Arg>) -> Result<Vec<Tensor>, String> {
        match &self.b.exec {
            Exec::Compiled(c) => c.run(args).map_err(|e| e.to_string()),
            Exec::Interp => texc_pipeline::interpret(&self.b.written, args).map_err(|e| match e {
                Error::Input(d) => d.iter().map(|d| format!("error: {}", d.message)).collect::<Vec<_>>().join("\n"),
                Error::Usage(m) => m,
            }),
        }
    }

    /// Seeded random arguments for every parameter (as `texc bench` draws them).
    fn random_given(&self) -> PyResult<HashMap<String, Arg>> {
        let w = &self.b.written;
        let mut args = interp::bind_args(w, HashMap::new(), &[], 0).map_err(PyRuntimeError::new_err)?;
        texc_pipeline::domain::into_domain(w, &mut args, &[]);
        let names = w.param_names();
        Ok(names.into_iter().zip(args).filter(|(n, _)| self.b.params.iter().any(|p| &p.name == n)).collect())
    }
}

#[pymethods]
impl Kernel {
    /// Run the kernel on NumPy arrays (and numbers for scalar parameters),
    /// positionally in parameter order or by name. Returns one array, or a
    /// tuple of arrays for several outputs.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let given = self.bind(args, kwargs)?;
        let on_gpu = self.first_on_gpu(&given)?;
        let mut arrays = match (on_gpu, self.runs_in_place()) {
            (Some((name, device)), _) => self.call_on_device(py, given, &name, device)?,
            (None, Some(c)) => self.call_in_place(py, c, given)?,
            (None, None) => {
                let given = self.given(given)?;
                let tensors = given.values().filter(|a| matches!(a, Arg::Tensor(_))).count() as u64;
                self.copies.fetch_add(tensors, std::sync::atomic::Ordering::Relaxed);
                let run_args = self.run_args(given)?;
                let results = py.detach(|| self.execute(run_args)).map_err(TexcError::new_err)?;
                results.into_iter().map(|t| to_numpy(py, t)).collect::<PyResult<_>>()?
            }
        };
        if arrays.len() == 1 {
            return Ok(arrays.pop().expect("one output"));
        }
        Ok(PyTuple::new(py, arrays)?.into_any().unbind())
    }

    /// Stage `stage` of this kernel's compilation as text: one of `ast`,
    /// `tir`, `graph`, `egraph`, `loops`, `llvm`, `asm` (LLVM targets),
    /// `clif` (cranelift), `ptx` (GPU targets), `mlir`,
    /// `mlir-linalg` (builds with MLIR only).
    fn source(&self, py: Python<'_>, stage: &str) -> PyResult<String> {
        let r = &self.request;
        py.detach(|| {
            let (mut pl, m) = r.load()?;
            pl.emit_loaded(m, r.kernel.as_deref(), &r.bindings, stage).map_err(|e| Failure::of(&pl, e))
        })
        .map_err(Failure::into_py)
    }

    /// Compile the kernel ahead of time into `path` — `.o` or `.so` on a
    /// CPU target (`.ptx` or `.cubin` on a GPU target) — with its C header
    /// beside it (`.h`: the entry `texc_<kernel>_run`), as `texc compile -o`
    /// does. Returns the header's path.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<String> {
        let r = &self.request;
        py.detach(|| {
            let (mut pl, m) = r.load()?;
            let written = (|| {
                pl.require_compiled("`Kernel.save`")?;
                pl.check_library_path(&path)?;
                let k = pl.kernel(m, r.kernel.as_deref())?;
                let (_, loops) = pl.build(k, &r.bindings)?;
                pl.write_library(&[loops.legal], &path)
            })();
            written.map(|l| l.header.display().to_string()).map_err(|e| Failure::of(&pl, e))
        })
        .map_err(Failure::into_py)
    }

    /// Time the kernel: `warmup` calls, then `repeat` timed calls on the
    /// same buffers. With no arrays, on seeded random inputs (as `texc
    /// bench`). Returns times in ms (`mean_ms`, `std_dev_ms`, `min_ms`,
    /// `median_ms`, `p90_ms`, `p99_ms`, `max_ms`) and `runs`, `warmup`,
    /// `threads`, `compile_s`, `flops`, `bytes`, `gflops`, `gbs`.
    #[pyo3(signature = (*args, repeat = 100, warmup = 10, **kwargs))]
    fn bench<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        repeat: usize,
        warmup: usize,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        const MAX_RUNS: usize = 1_000_000;
        let Exec::Compiled(compiled) = &self.b.exec else {
            return Err(PyValueError::new_err(
                "bench times compiled code: compile for a compiled target (host, x86-avx2, cranelift, ...), not interp",
            ));
        };
        if repeat == 0 || repeat > MAX_RUNS {
            return Err(PyValueError::new_err(format!("repeat={repeat}: expected 1 to {MAX_RUNS} timed runs")));
        }
        if warmup > MAX_RUNS {
            return Err(PyValueError::new_err(format!("warmup={warmup}: expected at most {MAX_RUNS} runs")));
        }
        let given = match (args.is_empty(), kwargs.is_none_or(|k| k.is_empty())) {
            (true, true) => self.random_given()?,
            _ => self.given(self.bind(args, kwargs)?)?,
        };
        let run_args = self.run_args(given)?;
        let times = py
            .detach(|| -> Result<Vec<f64>, String> {
                let mut bufs = compiled.prepare(run_args).map_err(|e| e.to_string())?;
                for _ in 0..warmup {
                    compiled.call(&mut bufs).map_err(|e| e.to_string())?;
                }
                let mut times = Vec::with_capacity(repeat);
                for _ in 0..repeat {
                    let t0 = Instant::now();
                    compiled.call(&mut bufs).map_err(|e| e.to_string())?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                Ok(times)
            })
            .map_err(TexcError::new_err)?;
        let st = texc_pipeline::stats::Stats::of(&times);
        let counts = texc_compiler::cost::count(&self.b.written);
        let d = PyDict::new(py);
        for (n, v) in st.fields() {
            d.set_item(format!("{n}_ms"), v * 1e3)?;
        }
        d.set_item("runs", repeat)?;
        d.set_item("warmup", warmup)?;
        d.set_item("threads", texc_runtime::pool::num_threads())?;
        d.set_item("compile_s", self.b.compile_s)?;
        d.set_item("flops", counts.flops)?;
        d.set_item("int_ops", counts.int_ops)?;
        d.set_item("gops", counts.int_ops / st.median / 1e9)?;
        d.set_item("bytes", counts.bytes)?;
        d.set_item("gflops", counts.flops / st.median / 1e9)?;
        d.set_item("gbs", counts.bytes / st.median / 1e9)?;
        Ok(d)
    }

    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.b.name
    }

    /// The target it was compiled for.
    #[getter]
    fn target(&self) -> &'static str {
        self.target
    }

    /// The sizes it was specialized to: `{"M": 64, ...}`.
    #[getter]
    fn sizes(&self) -> BTreeMap<String, i64> {
        self.b.sizes.iter().cloned().collect()
    }

    /// The parameters a call takes, in order: `(name, dtype, shape)`, with
    /// `shape` `None` for scalars (dtype names as NumPy spells them).
    #[getter]
    fn params(&self) -> Vec<(String, &'static str, Option<Vec<usize>>)> {
        self.b.params.iter().map(|p| (p.name.clone(), numpy_name(p.dtype), p.shape.clone())).collect()
    }

    /// The outputs a call returns, in order: `(name, dtype, shape)`.
    #[getter]
    fn outputs(&self) -> Vec<(String, &'static str, Vec<usize>)> {
        self.b.outputs.iter().map(|o| (o.name.clone(), numpy_name(o.dtype), o.shape.clone())).collect()
    }

    /// Seconds compiling took (front end to machine code).
    #[getter]
    fn compile_s(&self) -> f64 {
        self.b.compile_s
    }

    /// The knobs it was compiled with: those given (`knobs=`), or the
    /// tuning database's best record's (`db=`); `{}` for the schedule's own.
    #[getter]
    fn knobs(&self) -> BTreeMap<String, i64> {
        match &self.b.tuned {
            Some(k) => k.iter().cloned().collect(),
            None => self.request.knobs.clone(),
        }
    }

    /// An imported model's inputs and outputs: `(ONNX name, name here)`
    /// (`params` and `outputs` use the names here; calls accept both).
    #[getter]
    fn onnx_names(&self) -> Vec<(String, String)> {
        self.b.onnx_names.clone()
    }

    /// How many array arguments calls have copied so far. Calls on compiled
    /// CPU code read arrays in C order of the parameter's dtype where they
    /// are (zero-copy); Fortran-order or strided arrays, bf16 parameters,
    /// the interpreter and GPU targets copy.
    #[getter]
    fn copies(&self) -> u64 {
        self.copies.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn __repr__(&self) -> String {
        format!("<texc.Kernel {}({}) for {} [{}]>", self.b.name, self.signature(), self.target, self.sizes_text())
    }
}

/// Compile a kernel for `target` and return it, ready to call on NumPy arrays.
#[pyfunction]
#[pyo3(signature = (source_or_path, kernel = None, target = "host", shapes = None, consts = None, knobs = None, db = None,
                    emulate_gpu = false))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
fn compile(
    py: Python<'_>,
    source_or_path: &Bound<'_, PyAny>,
    kernel: Option<String>,
    target: &str,
    shapes: Option<BTreeMap<String, i64>>,
    consts: Option<BTreeMap<String, i64>>,
    knobs: Option<BTreeMap<String, i64>>,
    db: Option<PathBuf>,
    emulate_gpu: bool,
) -> PyResult<Kernel> {
    let request = Request::of(source_or_path, kernel, target, shapes, consts, knobs)?;
    if db.is_some() && !request.knobs.is_empty() {
        return Err(PyValueError::new_err("compile: give knobs= or db=, not both (the database chooses knobs)"));
    }
    Kernel::build(py, Request { db, emulate_gpu, ..request })
}

impl Request {
    /// What `compile` and `tune` are asked, checked.
    fn of(
        source_or_path: &Bound<'_, PyAny>,
        kernel: Option<String>,
        target: &str,
        shapes: Option<BTreeMap<String, i64>>,
        consts: Option<BTreeMap<String, i64>>,
        knobs: Option<BTreeMap<String, i64>>,
    ) -> PyResult<Request> {
        let source = Source::of(source_or_path)?;
        let shapes: Vec<(String, i64)> = shapes.unwrap_or_default().into_iter().collect();
        if let Some((n, v)) = shapes.iter().find(|(_, v)| *v < 0) {
            return Err(PyValueError::new_err(format!("shapes: `{n}={v}`: a size cannot be negative")));
        }
        let consts = consts.unwrap_or_default().into_iter().collect();
        let bindings = Bindings { shapes, consts, input_shapes: HashMap::new() };
        let knobs = knobs.unwrap_or_default();
        let target = target.to_string();
        Ok(Request { source, kernel, target, bindings, knobs, model_dims: Vec::new(), db: None, emulate_gpu: false })
    }
}

/// Import an ONNX model and compile it: a `Kernel` whose parameters are
/// the model's inputs (callable by their ONNX names as keywords) and whose
/// outputs are the model's; the weights stay inside the kernel.
#[pyfunction]
#[pyo3(signature = (path, target = "host", dims = None, knobs = None, emulate_gpu = false))]
fn load_onnx(
    py: Python<'_>,
    path: PathBuf,
    target: &str,
    dims: Option<BTreeMap<String, i64>>,
    knobs: Option<BTreeMap<String, i64>>,
    emulate_gpu: bool,
) -> PyResult<Kernel> {
    if path.extension().is_none_or(|e| e != "onnx") {
        return Err(PyValueError::new_err(format!("load_onnx: {}: expected an .onnx file", path.display())));
    }
    let model_dims: Vec<(String, i64)> = dims.unwrap_or_default().into_iter().collect();
    if let Some((n, v)) = model_dims.iter().find(|(_, v)| *v < 1) {
        return Err(PyValueError::new_err(format!("dims: `{n}={v}`: a dimension must be at least 1")));
    }
    let request = Request {
        source: Source::File(path),
        kernel: None,
        target: target.to_string(),
        bindings: Bindings::default(),
        knobs: knobs.unwrap_or_default(),
        model_dims,
        db: None,
        emulate_gpu,
    };
    Kernel::build(py, request)
}

impl Kernel {
    fn build(py: Python<'_>, request: Request) -> PyResult<Kernel> {
        let built = py.detach(|| request.build()).map_err(Failure::into_py)?;
        let target = texc_pipeline::target(&request.target).map(|t| t.name).unwrap_or("?");
        Ok(Kernel { request, target, b: built, copies: Default::default(), device_weights: Default::default() })
    }
}

/// texc's native module; the package `texc` re-exports it.
/// Run parallel loops on `n` threads from now on, in every kernel of this
/// process (as `TEXC_NUM_THREADS` does at start-up); `ValueError` outside
/// 1 to 1024. More threads than cores share them.
#[pyfunction]
fn set_num_threads(n: i64) -> PyResult<()> {
    let threads = usize::try_from(n).unwrap_or(0);
    texc_runtime::pool::set_num_threads(threads)
        .map_err(|e| PyValueError::new_err(format!("set_num_threads({n}): {e}")))
}

/// The threads parallel loops run on.
#[pyfunction]
fn num_threads() -> usize {
    texc_runtime::pool::num_threads()
}

/// The thread count of the kernels this Python thread calls from now on
/// (0: the process's); returns the previous one. `texc.threads(n)`, the
/// context manager, is the way to use it.
#[pyfunction]
fn _set_call_threads(n: i64) -> PyResult<usize> {
    let threads = usize::try_from(n).map_err(|_| PyValueError::new_err(format!("threads({n}): expected 1 to 1024")))?;
    texc_runtime::pool::set_call_threads(threads).map_err(|e| PyValueError::new_err(format!("threads({n}): {e}")))
}

#[pymodule]
fn _texc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(load_onnx, m)?)?;
    m.add_function(wrap_pyfunction!(tune::tune, m)?)?;
    m.add_function(wrap_pyfunction!(tune::db, m)?)?;
    m.add_function(wrap_pyfunction!(tune::default_db, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_set_call_threads, m)?)?;
    m.add_class::<Kernel>()?;
    m.add("TexcError", m.py().get_type::<TexcError>())?;
    m.add("STAGES", texc_pipeline::emit::STAGES.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
