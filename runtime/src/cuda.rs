//! NVIDIA GPUs through the CUDA driver API (`cudarc`, loaded at run time):
//! the device, PTX modules, device buffers and launches.
//!
//! Besides buffers it owns, a call can run on memory the caller owns
//! ([`Device::launch_on`]: PyTorch's CUDA tensors through DLPack), ordered
//! on the caller's stream without waiting, as the caller's own work is.
//!
//! Nothing here links CUDA: [`device`] looks for the driver library when
//! first asked and says why there is no GPU when there is none, so texc
//! builds and runs everywhere and GPU tests skip with that reason.

use cudarc::driver::{result, sys};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::{Arc, OnceLock};

/// The first CUDA device of this machine, with its context and stream.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability times ten (90 for sm_90).
    pub sm: u32,
}

fn err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("CUDA: {what}: {e}")
}

/// The GPU texc launches on, or why there is none.
pub fn device() -> Result<&'static Device, String> {
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    DEVICE.get_or_init(open).as_ref().map_err(|e| e.clone())
}

fn open() -> Result<Device, String> {
    // SAFETY: only looks for the library (dlopen), calls nothing in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver on this machine (libcuda.so not found)".into());
    }
    let count = cudarc::driver::result::init()
        .and_then(|()| cudarc::driver::result::device::get_count())
        .map_err(err("initializing the driver"))?;
    if count < 1 {
        return Err("the CUDA driver sees no GPU".into());
    }
    let ctx = CudaContext::new(0).map_err(err("creating a context"))?;
    let (major, minor) = ctx.compute_capability().map_err(err("reading the compute capability"))?;
    let name = ctx.name().map_err(err("reading the device name"))?;
    let stream = ctx.default_stream();
    Ok(Device { ctx, stream, name, sm: (major * 10 + minor) as u32 })
}

/// A scalar kernel parameter, as the kernel declares it.
#[derive(Clone, Copy, Debug)]
pub enum ScalarArg {
    F64(f64),
    F32(f32),
    /// f16 and bf16, as their bits.
    B16(u16),
    I64(i64),
    I32(i32),
    /// i8, u8 and bool.
    B8(u8),
}

/// One launch: a kernel of the module and its grid and block.
pub struct Launch {
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory (more than 48 KiB needs the kernel's opt-in).
    pub dynamic_shared: u32,
}

/// A PTX module loaded on the device, with the launches of one texc kernel.
pub struct Module {
    launches: Vec<(CudaFunction, LaunchConfig)>,
}

/// Device buffers of one call, in the kernel's parameter order.
pub struct DeviceBuffers {
    bufs: Vec<CudaSlice<u8>>,
}

impl Device {
    /// Load `ptx` and find the kernel of each launch.
    pub fn load(&self, ptx: &str, launches: &[Launch]) -> Result<Module, String> {
        let m = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(err("loading the PTX"))?;
        let launches = launches
            .iter()
            .map(|l| {
                let f = m.load_function(&l.kernel).map_err(|e| format!("CUDA: kernel `{}`: {e}", l.kernel))?;
                if l.dynamic_shared > 48 * 1024 {
                    use cudarc::driver::sys::CUfunction_attribute_enum as A;
                    f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, l.dynamic_shared as i32)
                        .map_err(|e| {
                            format!("CUDA: kernel `{}`: {} bytes of shared memory: {e}", l.kernel, l.dynamic_shared)
                        })?;
                }
                let cfg = LaunchConfig {
                    grid_dim: tuple(l.grid),
                    block_dim: tuple(l.block),
                    shared_mem_bytes: l.dynamic_shared,
                };
                Ok((f, cfg))
            })
            .collect::<Result<_, String>>()?;
        Ok(Module { launches })
    }

    /// Copy host buffers to new device buffers.
    pub fn upload(&self, host: &[&[u8]]) -> Result<DeviceBuffers, String> {
        let bufs = host
            .iter()
            .map(|h| {
                // Zero-length tensors still get a (one-byte) buffer: kernels take a pointer.
                let data: &[u8] = if h.is_empty() { &[0] } else { h };
                self.stream.clone_htod(data).map_err(err("copying to the device"))
            })
            .collect::<Result<_, String>>()?;
        Ok(DeviceBuffers { bufs })
    }

    /// Copy device buffer `i` back into `out`.
    pub fn download(&self, b: &DeviceBuffers, i: usize, out: &mut [u8]) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        let view = b.bufs[i].slice(..out.len());
        self.stream.memcpy_dtoh(&view, out).map_err(err("copying from the device"))?;
        self.stream.synchronize().map_err(err("waiting for the copy"))
    }

    /// Run every launch of `m` in order on `b` and `scalars`, and wait for them.
    pub fn run(&self, m: &Module, b: &DeviceBuffers, scalars: &[ScalarArg]) -> Result<(), String> {
        for (f, cfg) in &m.launches {
            // A loop of no iterations bound to the grid or block: nothing to launch.
            let (g, t) = (cfg.grid_dim, cfg.block_dim);
            if [g.0, g.1, g.2, t.0, t.1, t.2].contains(&0) {
                continue;
            }
            let mut args = self.stream.launch_builder(f);
            for buf in &b.bufs {
                args.arg(buf);
            }
            for s in scalars {
                match s {
                    ScalarArg::F64(v) => args.arg(v),
                    ScalarArg::F32(v) => args.arg(v),
                    ScalarArg::B16(v) => args.arg(v),
                    ScalarArg::I64(v) => args.arg(v),
                    ScalarArg::I32(v) => args.arg(v),
                    ScalarArg::B8(v) => args.arg(v),
                };
            }
            // SAFETY: the parameters are the kernel's, in its order and types
            // (texc generated both), and every buffer has its tensor's size.
            unsafe { args.launch(*cfg) }.map_err(err("launching a kernel"))?;
        }
        self.stream.synchronize().map_err(err("running the kernels"))
    }
}

/// Device memory texc owns outside a call (a model's weights, kept on the
/// device between calls that run on the caller's memory); freed on drop.
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    /// Its device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let Ok(d) = device() {
            if let Ok(_current) = d.enter() {
                // SAFETY: allocated by `Device::keep` in this context, freed
                // once. Freeing waits for the work using it, so no call
                // still reads it.
                let _ = unsafe { result::free_sync(self.ptr) };
            }
        }
    }
}

/// Texc's context made current on this thread for a scope; the thread's
/// own (PyTorch's, of another device say) made current again after, so
/// that the caller's later CUDA calls go where they went before.
struct Current(Option<sys::CUcontext>);

impl Drop for Current {
    fn drop(&mut self) {
        if let Some(previous) = self.0 {
            // SAFETY: a context that was current on this thread before.
            let _ = unsafe { result::ctx::set_current(previous) };
        }
    }
}

/// One tensor of a call on the caller's memory ([`Device::launch_on`]).
#[derive(Clone, Copy, Debug)]
pub struct TensorMemory {
    /// The caller's device memory, or `None`: a temporary, allocated on the
    /// call's stream and freed after its launches.
    pub ptr: Option<u64>,
    pub bytes: usize,
    /// Zeroed on the stream before the launches (an output whose reads may
    /// precede its stores, as the buffers of `upload` are zeroed).
    pub zero: bool,
}

impl Device {
    /// Make texc's context current on this thread until the result drops.
    fn enter(&self) -> Result<Current, String> {
        let ours = self.ctx.cu_ctx();
        let previous = result::ctx::get_current().map_err(err("reading the current context"))?;
        if previous != Some(ours) {
            // SAFETY: the device's primary context, alive while `self` is.
            unsafe { result::ctx::set_current(ours) }.map_err(err("binding the context"))?;
        }
        Ok(Current(previous.filter(|&p| p != ours)))
    }

    /// The device's ordinal: texc runs on the first device.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Copy `host` to new device memory that outlives calls (synchronous).
    pub fn keep(&self, host: &[u8]) -> Result<DeviceMemory, String> {
        let _current = self.enter()?;
        let bytes = host.len().max(1);
        // SAFETY: a new allocation of `bytes`, then `host.len()` bytes copied
        // into it; the memory is owned by the returned value alone.
        unsafe {
            let ptr = result::malloc_sync(bytes).map_err(err("allocating device memory"))?;
            let memory = DeviceMemory { ptr, bytes };
            if !host.is_empty() {
                result::memcpy_htod_sync(ptr, host).map_err(err("copying to the device"))?;
            }
            // From pageable memory the copy may return before its DMA lands;
            // a call on a non-blocking stream must not read it half copied.
            result::ctx::synchronize().map_err(err("waiting for the copy"))?;
            Ok(memory)
        }
    }

    /// Run every launch of `m` in order on `tensors` (one per kernel
    /// parameter, as [`Device::upload`]'s buffers) and `scalars`, on
    /// `stream` (a driver `CUstream` handle; 0 is the legacy default
    /// stream), then copy tensor `from` to the caller's memory `to` for
    /// each of `copies` (bytes). Returns once queued: the caller's later
    /// work on `stream` sees the results.
    ///
    /// # Safety
    /// Each `ptr` must be device memory of this context holding `bytes`,
    /// alive until the stream's work queued here is done, and `stream` a
    /// live stream of this context (or 0).
    pub unsafe fn launch_on(
        &self,
        m: &Module,
        tensors: &[TensorMemory],
        scalars: &[ScalarArg],
        stream: u64,
        copies: &[(usize, u64, usize)],
    ) -> Result<(), String> {
        let _current = self.enter()?;
        let stream = stream as sys::CUstream;
        let mut temps = Vec::new();
        let result = (|| {
            let mut ptrs = Vec::with_capacity(tensors.len());
            for t in tensors {
                let ptr = match t.ptr {
                    Some(p) => p,
                    None => {
                        let p = result::malloc_async(stream, t.bytes.max(1)).map_err(err("allocating a temporary"))?;
                        temps.push(p);
                        p
                    }
                };
                if t.zero {
                    result::memset_d8_async(ptr, 0, t.bytes, stream).map_err(err("zeroing a tensor"))?;
                }
                ptrs.push(ptr);
            }
            let mut values: Vec<u64> = ptrs.clone();
            values.extend(scalars.iter().map(|s| s.bits()));
            for (f, cfg) in &m.launches {
                let (g, t) = (cfg.grid_dim, cfg.block_dim);
                if [g.0, g.1, g.2, t.0, t.1, t.2].contains(&0) {
                    continue;
                }
                // The driver reads each parameter's size from the kernel's
                // signature, from the start of its slot: every slot is 8
                // bytes holding the value in its low bytes (little endian).
                let mut params: Vec<*mut std::ffi::c_void> =
                    values.iter_mut().map(|v| v as *mut u64 as *mut std::ffi::c_void).collect();
                result::launch_kernel(f.cu_function(), g, t, cfg.shared_mem_bytes, stream, &mut params)
                    .map_err(err("launching a kernel"))?;
            }
            for &(from, to, bytes) in copies {
                result::memcpy_dtod_async(to, ptrs[from], bytes, stream).map_err(err("copying an output"))?;
            }
            Ok(())
        })();
        for p in temps {
            // Stream-ordered: freed once the launches queued before are done.
            let _ = result::free_async(p, stream);
        }
        result
    }
}

impl ScalarArg {
    /// The value in the low bytes of a 64-bit slot, as a kernel parameter of its type.
    fn bits(&self) -> u64 {
        match *self {
            ScalarArg::F64(v) => v.to_bits(),
            ScalarArg::F32(v) => v.to_bits() as u64,
            ScalarArg::B16(v) => v as u64,
            ScalarArg::I64(v) => v as u64,
            ScalarArg::I32(v) => v as u32 as u64,
            ScalarArg::B8(v) => v as u64,
        }
    }
}

fn tuple(d: [u32; 3]) -> (u32, u32, u32) {
    (d[0], d[1], d[2])
}
