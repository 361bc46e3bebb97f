//! NVIDIA GPUs through the CUDA driver API (`cudarc`, loaded at run time):
//! the device, PTX modules, device buffers and launches.
//!
//! Nothing here links CUDA: [`device`] looks for the driver library when
//! first asked and says why there is no GPU when there is none, so texc
//! builds and runs everywhere and GPU tests skip with that reason.

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

fn tuple(d: [u32; 3]) -> (u32, u32, u32) {
    (d[0], d[1], d[2])
}
