//! Finding CUDA's offline tools: `ptxas` (PTX to a cubin), libdevice (the
//! math library GPU kernels link) and `nvdisasm` (a cubin's machine code).
//! None needs a GPU.
//!
//! Where texc looks, first match wins: `$TEXC_CUDA_DIR`, `$CUDA_HOME`,
//! `$CUDA_PATH`, `/usr/local/cuda`, `ptxas` on `PATH` (its toolkit), and the
//! PyPI wheel `nvidia-cuda-nvcc-cu12` of `python3` (what
//! `scripts/bootstrap.sh` installs). A toolkit directory holds `bin/ptxas`
//! and `nvvm/libdevice/libdevice.10.bc`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Toolkit directories to search, in order.
fn roots() -> &'static [PathBuf] {
    static ROOTS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut out: Vec<PathBuf> = ["TEXC_CUDA_DIR", "CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(std::env::var_os)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .collect();
        out.push("/usr/local/cuda".into());
        if let Some(dir) = on_path("ptxas").and_then(|p| p.parent()?.parent().map(Path::to_path_buf)) {
            out.push(dir);
        }
        out.extend(python_wheel());
        out
    })
}

fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// The directory of the `nvidia-cuda-nvcc-cu12` wheel, if `python3` has it.
fn python_wheel() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])"])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    out.status.success().then(|| PathBuf::from(dir.trim()))
}

fn find(rel: &str) -> Option<PathBuf> {
    roots().iter().map(|r| r.join(rel)).find(|p| p.is_file())
}

/// `ptxas`, if a CUDA toolkit (or the nvcc wheel) is installed.
pub fn ptxas() -> Option<PathBuf> {
    find("bin/ptxas")
}

/// libdevice's bitcode, if a CUDA toolkit (or the nvcc wheel) is installed.
pub fn libdevice() -> Option<PathBuf> {
    find("nvvm/libdevice/libdevice.10.bc")
}

/// `nvdisasm` (cubin to SASS), if installed: a toolkit's, or the PyPI
/// wheel `nvidia-cuda-nvdisasm` (which installs under `nvidia/cu13`).
pub fn nvdisasm() -> Option<PathBuf> {
    find("bin/nvdisasm").or_else(|| {
        let out = Command::new("python3")
            .args(["-c", "import nvidia, os; print('\\n'.join(os.path.join(p, 'cu13', 'bin', 'nvdisasm') for p in nvidia.__path__))"])
            .output()
            .ok()?;
        String::from_utf8(out.stdout).ok()?.lines().map(PathBuf::from).find(|p| p.is_file())
    })
}

/// The SASS of a cubin (`nvdisasm`), for checking which instructions a kernel uses.
pub fn disassemble(cubin: &[u8]) -> Result<String, String> {
    let tool = nvdisasm().ok_or_else(|| format!("`nvdisasm` not found: {}", searched()))?;
    let dir = tempdir()?;
    let path = dir.join("kernel.cubin");
    std::fs::write(&path, cubin).map_err(|e| format!("writing {}: {e}", path.display()))?;
    let out = Command::new(&tool).arg(&path).output().map_err(|e| format!("running {}: {e}", tool.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if !out.status.success() {
        return Err(format!("nvdisasm failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where texc looked, for messages.
pub fn searched() -> String {
    let dirs: Vec<String> = roots().iter().map(|p| p.display().to_string()).collect();
    format!("looked in {} (set TEXC_CUDA_DIR, or `python3 -m pip install nvidia-cuda-nvcc-cu12`)", dirs.join(", "))
}

/// What `ptxas -v` says of one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// `ptxas`'s warnings and performance advisories of the kernel (codes
    /// C75xx: waits or fences it injected around `wgmma` operations, or
    /// operations it serialized).
    pub warnings: Vec<String>,
}

/// Assemble PTX for `sm` (e.g. `sm_90`) with `ptxas`: the cubin and the
/// resources of each kernel, or `ptxas`'s complaint.
pub fn assemble(ptx: &str, sm: &str) -> Result<(Vec<u8>, Vec<KernelResources>), String> {
    let tool = ptxas().ok_or_else(|| format!("`ptxas` not found: {}", searched()))?;
    let dir = tempdir()?;
    let (input, output) = (dir.join("kernel.ptx"), dir.join("kernel.cubin"));
    std::fs::write(&input, ptx).map_err(|e| format!("writing {}: {e}", input.display()))?;
    let out = Command::new(&tool)
        .arg(format!("-arch={sm}"))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()));
    let result = out.and_then(|out| {
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        if !out.status.success() {
            return Err(format!("ptxas failed for {sm}:\n{log}"));
        }
        let cubin = std::fs::read(&output).map_err(|e| format!("reading {}: {e}", output.display()))?;
        Ok((cubin, resources(&log)))
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn tempdir() -> Result<PathBuf, String> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("texc-ptxas-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Parse `ptxas -v`: "Compiling entry function 'k' for 'sm_90'", then
/// "N bytes spill stores, M bytes spill loads" and "Used R registers".
fn resources(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let i = line.find(word)?;
        line[..i].split_whitespace().last()?.parse().ok()
    };
    // (Advisories name their function, and may come before it is compiled.)
    let mut advisories: Vec<(Option<String>, String)> = Vec::new();
    for line in log.lines() {
        if line.contains("ptxas warning") || line.contains("(C75") {
            let text = line.split_once(':').map_or(line, |(_, r)| r).trim().to_string();
            let named = line.split("function '").nth(1).and_then(|r| r.split('\'').next()).map(str::to_string);
            advisories.push((named, text));
        } else if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources { kernel, ..Default::default() });
        } else if let Some(k) = out.last_mut() {
            if let Some(n) = number_before(line, "bytes spill stores") {
                k.spill_stores = n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                k.spill_loads = n;
            }
            if let Some(n) = line.split("Used ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok()) {
                k.registers = n;
            }
        }
    }
    for (named, text) in advisories {
        let at = named.and_then(|n| out.iter().position(|k| k.kernel == n)).or(out.len().checked_sub(1));
        if let Some(i) = at {
            out[i].warnings.push(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'add_k0' for 'sm_90'\n\
                   ptxas info    : Function properties for add_k0\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 10 registers, 380 bytes cmem[0]\n\
                   ptxas info    : (C7517) warpgroup.wait is injected in around line 412 by compiler to allow \
                   use of registers defined by GMMA in function 'mm_k1'\n\
                   ptxas info    : Compiling entry function 'mm_k1' for 'sm_90a'\n\
                   ptxas info    : Used 96 registers, 380 bytes cmem[0]\n";
        let warned = "(C7517) warpgroup.wait is injected in around line 412 by compiler to allow use of registers \
                      defined by GMMA in function 'mm_k1'"
            .to_string();
        assert_eq!(
            resources(log),
            vec![
                KernelResources {
                    kernel: "add_k0".into(),
                    registers: 10,
                    spill_stores: 4,
                    spill_loads: 12,
                    warnings: vec![]
                },
                KernelResources { kernel: "mm_k1".into(), registers: 96, warnings: vec![warned], ..Default::default() },
            ]
        );
    }
}
