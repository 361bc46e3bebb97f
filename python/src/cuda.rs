//! CUDA tensors through DLPack: a kernel compiled for a GPU target (and
//! loaded on the device, not emulated) runs on device memory its caller's
//! framework owns — PyTorch's CUDA tensors, or any object with
//! `__dlpack__` and `__dlpack_device__` on `kDLCUDA` — without copies.
//!
//! Invariants: a tensor is read where DLPack says it is (its data pointer
//! plus byte offset) only if it is C-contiguous on texc's device with the
//! parameter's dtype and shape; a capsule is read and never consumed (its
//! producer's destructor still frees it; the object passed keeps the memory
//! alive, and the launches are ordered on PyTorch's current stream, so
//! memory PyTorch frees after the call is reused only after they ran).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::ffi::c_void;
use texc_runtime::DType;

/// `DLDeviceType::kDLCUDA`.
const KDL_CUDA: i64 = 2;

// DLPack's C structs (dlpack.h, the unversioned `DLManagedTensor` that
// `__dlpack__()` without `max_version` returns in a "dltensor" capsule).
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    /// Null for a compact row-major tensor.
    strides: *const i64,
    byte_offset: u64,
}

/// A tensor in device memory, as DLPack describes it.
pub struct CudaTensor {
    /// The address of its first element.
    pub ptr: u64,
    /// `None`: a DLPack type texc has no dtype for (named in `type_text`).
    pub dtype: Option<DType>,
    pub type_text: String,
    pub shape: Vec<usize>,
    /// Row-major without gaps (strides of dimensions of one element ignored).
    pub contiguous: bool,
}

/// The CUDA device `x` is on, by its `__dlpack_device__()`, or `None` for
/// anything else (host arrays, numbers, objects without DLPack).
pub fn device_of(x: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    // NumPy arrays (every host call's arguments) without asking Python.
    if x.cast::<numpy::PyUntypedArray>().is_ok() || !x.hasattr("__dlpack_device__")? {
        return Ok(None);
    }
    let (kind, id): (i64, i64) = x.call_method0("__dlpack_device__")?.extract()?;
    Ok((kind == KDL_CUDA).then_some(id))
}

/// `x`'s memory and type through its DLPack capsule (`x.__dlpack__()`).
pub fn view(x: &Bound<'_, PyAny>, name: &str) -> PyResult<CudaTensor> {
    // PyTorch refuses to export a tensor that requires grad (or has its
    // conjugate bit set): say which argument, and what to do.
    let capsule = x.call_method0("__dlpack__").map_err(|e| {
        let hint = if x.getattr("requires_grad").and_then(|r| r.extract::<bool>()).unwrap_or(false) {
            " (it requires grad: pass x.detach())"
        } else {
            ""
        };
        PyTypeError::new_err(format!("argument `{name}`: cannot be read through DLPack{hint}: {e}"))
    })?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err(format!("argument `{name}`: its __dlpack__() returned no DLPack capsule")))?;
    let managed = capsule.pointer_checked(Some(c"dltensor"))?;
    // SAFETY: a "dltensor" capsule holds a `DLManagedTensor`, whose first
    // field is the `DLTensor`; the capsule (and so the struct and its shape
    // and strides arrays) is alive while `capsule` is, and no Python code
    // runs while it is read.
    let t = unsafe { &*(managed.as_ptr() as *const DLTensor) };
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("argument `{name}`: ndim < 0")))?;
    let read = |p: *const i64| -> Vec<i64> {
        if p.is_null() || ndim == 0 {
            return Vec::new();
        }
        // SAFETY: DLPack's shape and (non-null) strides hold `ndim` entries.
        unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec()
    };
    let shape = read(t.shape);
    if shape.iter().any(|&d| d < 0) {
        return Err(PyValueError::new_err(format!("argument `{name}`: a negative dimension in {shape:?}")));
    }
    let strides = read(t.strides);
    let contiguous = strides.is_empty() || {
        let mut want = 1i64;
        let mut ok = true;
        for (&d, &s) in shape.iter().zip(&strides).rev() {
            ok &= d == 1 || s == want;
            want *= d;
        }
        ok
    };
    let (dtype, type_text) = dtype(&t.dtype);
    Ok(CudaTensor {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        dtype,
        type_text,
        shape: shape.iter().map(|&d| d as usize).collect(),
        contiguous,
    })
}

/// texc's dtype for a DLPack type (one lane), and the type's name.
fn dtype(t: &DLDataType) -> (Option<DType>, String) {
    let d = match (t.code, t.bits, t.lanes) {
        (2, 16, 1) => Some(DType::F16),
        (4, 16, 1) => Some(DType::BF16),
        (2, 32, 1) => Some(DType::F32),
        (2, 64, 1) => Some(DType::F64),
        (0, 8, 1) => Some(DType::I8),
        (1, 8, 1) => Some(DType::U8),
        (0, 32, 1) => Some(DType::I32),
        (0, 64, 1) => Some(DType::I64),
        (6, 8, 1) => Some(DType::Bool),
        _ => None,
    };
    let text = match d {
        Some(d) => torch_name(d).to_string(),
        None => format!("DLPack type (code {}, {} bits, {} lanes)", t.code, t.bits, t.lanes),
    };
    (d, text)
}

/// PyTorch's name of a dtype (`torch.<name>`).
pub fn torch_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}
