//! A host kernel of several top-level loop nests compiled nest by nest:
//! what keeps a whole model's compile linear in its layers, and fast.
//!
//! 1. Each nest is extracted in canonical form (`texc_schedules::nest`):
//!    nests equal up to their buffers (same-shaped layers) share one key,
//!    and the key's SHA3 names the nest's function.
//! 2. Each distinct nest is looked up in the compile cache ([`crate::cache`])
//!    or compiled alone — a small module, optimized and turned into an
//!    object — on the thread pool's number of threads, each thread with its
//!    own LLVM context and target machine. Objects are collected in nest
//!    order, so the result does not depend on the thread count.
//! 3. The objects are linked into the process by one ORC LLJIT, which
//!    resolves the runtime's functions (thread pool, heap locals) to the
//!    runtime's own and everything else (libm) from the process.
//! 4. The kernel's entry ([`Entry::Nests`]) calls the nests in order, each
//!    with its tensors' buffers.
//!
//! Invariant: a nest's object is a function of its cache key alone (the
//! canonical nest, the target with its CPU, and texc's build).

use super::{cpu_spec, gen, llvm_err, machine, optimize, CpuSpec, R};
use crate::abi;
use crate::backend::{Artifact, Code, Entry, EntryFn, NestCall, NestStats};
use crate::cache::{self, Cache, Lookup};
use crate::CodegenError;
use inkwell::context::Context;
use inkwell::targets::FileType;
use llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use llvm_sys::orc2::lljit::*;
use llvm_sys::orc2::*;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use texc_compiler::target::Target;
use texc_schedules::nest::{self, Nest};
use texc_schedules::LoopFunc;

/// Whether `f` is compiled nest by nest: a host kernel of two or more
/// top-level nests, none with GPU statements (`TEXC_SPLIT=0` turns it off).
pub fn extract_all(f: &LoopFunc) -> Option<Vec<Nest>> {
    if f.body.len() < 2 || std::env::var_os("TEXC_SPLIT").is_some_and(|v| v == "0") {
        return None;
    }
    f.body.iter().map(|s| nest::extract(f, s, "")).collect()
}

/// The target as the cache keys it: name, CPU and features.
fn target_key(t: &Target, spec: &CpuSpec) -> String {
    format!("{} {} {}", t.name, spec.cpu, spec.features)
}

/// Compile `nests` (of a kernel for `t`) into one [`Code`].
pub(super) fn jit_nests(nests: Vec<Nest>, t: &Target) -> R<Code> {
    let spec = cpu_spec(t)?;
    let target = target_key(t, &spec);
    // Distinct nests in order of first appearance; each nest's index among them.
    let mut distinct: Vec<(String, usize)> = Vec::new();
    let mut of_nest = Vec::with_capacity(nests.len());
    let mut seen = std::collections::HashMap::new();
    for (i, n) in nests.iter().enumerate() {
        let key = cache::key(&[&n.key, &target]);
        let next = distinct.len();
        let d = *seen.entry(key.clone()).or_insert_with(|| {
            distinct.push((key, i));
            next
        });
        of_nest.push(d);
    }
    let cache = Cache::from_env();
    let objects = compile_distinct(&nests, &distinct, t, &spec, cache.as_ref())?;
    if let Some(c) = &cache {
        if objects.iter().any(|(_, cached)| !cached) {
            c.evict();
        }
    }
    let jit = Jit::new()?;
    for (obj, _) in &objects {
        jit.add_object(obj)?;
    }
    let mut entries = Vec::with_capacity(distinct.len());
    for (key, _) in &distinct {
        entries.push(jit.lookup(&abi::entry_name_of(&function_name(key)))?);
    }
    let calls: Vec<NestCall> = nests
        .into_iter()
        .zip(of_nest)
        .map(|(n, d)| NestCall { entry: entries[d], tensors: n.tensors.iter().map(|t| t.0 as usize).collect() })
        .collect();
    let cached = objects.iter().filter(|o| o.1).count();
    let nests = Some(NestStats { nests: calls.len(), distinct: distinct.len(), cached });
    Ok(Code { entry: Entry::Nests(calls), owner: Box::new(jit), nests })
}

/// The name of the function of the nest with cache key `key`.
fn function_name(key: &str) -> String {
    format!("nest_{}", &key[..32])
}

/// The object of each distinct nest (in `distinct`'s order), and whether
/// it came from the cache: looked up, or compiled on the pool's threads.
fn compile_distinct(
    nests: &[Nest],
    distinct: &[(String, usize)],
    t: &Target,
    spec: &CpuSpec,
    cache: Option<&Cache>,
) -> R<Vec<(Vec<u8>, bool)>> {
    let slots: Vec<Mutex<Option<R<(Vec<u8>, bool)>>>> = distinct.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some((key, first)) = distinct.get(i) else { break };
        let result = one(&nests[*first], key, t, spec, cache);
        let failed = result.is_err();
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        if failed {
            // Later nests need not compile: the first error in order is reported.
            next.fetch_add(distinct.len(), Ordering::Relaxed);
        }
    };
    let threads = texc_runtime::pool::num_threads().clamp(1, distinct.len().max(1));
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    let mut out = Vec::with_capacity(distinct.len());
    for slot in slots {
        match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(r) => out.push(r?),
            None => return Err(CodegenError::Backend("a nest was not compiled (an earlier one failed)".into())),
        }
    }
    Ok(out)
}

/// One distinct nest's object: from the cache, or compiled (and stored).
fn one(n: &Nest, key: &str, t: &Target, spec: &CpuSpec, cache: Option<&Cache>) -> R<(Vec<u8>, bool)> {
    if let Some(Lookup::Hit(obj)) = cache.map(|c| c.get(key)) {
        return Ok((obj, true));
    }
    let mut f = n.func.clone();
    f.p.name = function_name(key);
    let obj = object(&f, t, spec)?;
    if let Some(c) = cache {
        c.put(key, &obj);
    }
    Ok((obj, false))
}

/// A nest's module, optimized, as an object (its own context and target machine).
fn object(f: &LoopFunc, t: &Target, spec: &CpuSpec) -> R<Vec<u8>> {
    let tm = machine(t, spec)?;
    let cx = Context::create();
    let m = gen::build_module(&cx, f, spec, None)?;
    optimize(&m, &tm)?;
    let buf = tm.write_to_memory_buffer(&m, FileType::Object).map_err(llvm_err)?;
    Ok(buf.as_slice().to_vec())
}

/// An ORC LLJIT holding the nests' code.
struct Jit(LLVMOrcLLJITRef);

// SAFETY: after construction the JIT is only used to be dropped; its code
// may be called from any thread (as MCJIT's, see `super::Jitted`).
unsafe impl Send for Jit {}
unsafe impl Sync for Jit {}
impl Artifact for Jit {}

fn take_error(e: LLVMErrorRef) -> R<()> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: `e` is an error LLVM returned; the message is disposed after copying.
    let msg = unsafe {
        let m = LLVMGetErrorMessage(e);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        s
    };
    Err(llvm_err(format!("ORC: {msg}")))
}

impl Jit {
    fn new() -> R<Jit> {
        super::init_targets();
        let mut j: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: a null builder asks for the defaults (the host); on success `j` is owned by the result.
        take_error(unsafe { LLVMOrcCreateLLJIT(&mut j, std::ptr::null_mut()) })?;
        let jit = Jit(j);
        // SAFETY: `j` is a live LLJIT; the generator and the symbols' unit become the dylib's.
        unsafe {
            let dylib = LLVMOrcLLJITGetMainJITDylib(j);
            let mut g = std::ptr::null_mut();
            let prefix = LLVMOrcLLJITGetGlobalPrefix(j);
            take_error(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                &mut g,
                prefix,
                None,
                std::ptr::null_mut(),
            ))?;
            LLVMOrcJITDylibAddGenerator(dylib, g);
            let runtime: Vec<(&str, *const u8)> = std::iter::once((abi::PARALLEL_FOR, abi::runtime_parallel_for()))
                .chain(abi::runtime_local_memory())
                .collect();
            let mut pairs: Vec<LLVMOrcCSymbolMapPair> = runtime
                .iter()
                .map(|(name, addr)| {
                    let c = CString::new(*name).expect("no NUL in names");
                    LLVMOrcCSymbolMapPair {
                        Name: LLVMOrcLLJITMangleAndIntern(j, c.as_ptr()),
                        Sym: LLVMJITEvaluatedSymbol {
                            Address: *addr as u64,
                            Flags: LLVMJITSymbolFlags {
                                GenericFlags: (LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsExported as u8)
                                    | (LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsCallable as u8),
                                TargetFlags: 0,
                            },
                        },
                    }
                })
                .collect();
            let mu = LLVMOrcAbsoluteSymbols(pairs.as_mut_ptr(), pairs.len());
            take_error(LLVMOrcJITDylibDefine(dylib, mu))?;
        }
        Ok(jit)
    }

    fn add_object(&self, obj: &[u8]) -> R<()> {
        let name = CString::new("texc-nest").expect("no NUL");
        // SAFETY: the buffer is a copy LLVM owns (and `AddObjectFile` takes).
        unsafe {
            let buf = llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                obj.as_ptr() as *const libc::c_char,
                obj.len(),
                name.as_ptr(),
            );
            take_error(LLVMOrcLLJITAddObjectFile(self.0, LLVMOrcLLJITGetMainJITDylib(self.0), buf))
        }
    }

    fn lookup(&self, name: &str) -> R<EntryFn> {
        let c = CString::new(name).expect("no NUL in names");
        let mut addr = 0;
        // SAFETY: `self.0` is live; lookup links what the symbol needs.
        take_error(unsafe { LLVMOrcLLJITLookup(self.0, &mut addr, c.as_ptr()) })?;
        if addr == 0 {
            return Err(llvm_err(format!("ORC: no address for {name}")));
        }
        // SAFETY: the entry of every nest has `EntryFn`'s signature (see `gen`).
        Ok(unsafe { std::mem::transmute::<usize, EntryFn>(addr as usize) })
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        // SAFETY: the JIT is live and dropped once; its code is no longer called.
        let _ = take_error(unsafe { LLVMOrcDisposeLLJIT(self.0) });
    }
}
