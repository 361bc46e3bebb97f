//! `texc compile`: kernels compiled ahead of time into files — an object
//! (`.o`, several kernels linked into one relocatable object with `cc -r`),
//! a shared library (`.so`), or a GPU module (`.ptx`, `.cubin`) — each with
//! its C header. An ONNX model's weights are compiled into its library, with
//! the entry `texc_<kernel>_infer` that passes them.
//!
//! Invariant: every file is written beside its path and renamed over it, so
//! that a reader (or a concurrent texc) never sees half a file; temporary
//! files are removed on every path out.

use super::{Error, Pipeline};
use std::path::{Path, PathBuf};
use texc_compiler::target::TargetKind;
use texc_grammar::Diagnostic;
use texc_schedules::LoopFunc;

/// What [`Pipeline::write_library`] wrote besides the output.
pub struct Library {
    /// The C header, beside the output with the extension `.h`.
    pub header: PathBuf,
    /// Lines about the code (a GPU module's registers and spills per kernel).
    pub notes: Vec<String>,
}

fn fail(e: String) -> Error {
    Error::from(Diagnostic::error(e))
}

impl Pipeline {
    /// Whether `out` names a file this target's code can be written as, in
    /// a directory that exists (a usage error otherwise, before any work).
    pub fn check_library_path(&self, out: &Path) -> Result<(), Error> {
        let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
        if self.target().kind == TargetKind::Gpu {
            let formats = self.gpu_formats()?;
            if !formats.contains(&ext) {
                let listed: Vec<String> = formats.iter().map(|f| format!(".{f}")).collect();
                return Err(Error::Usage(format!(
                    "`-o {}`: for GPU target {} the output ends in {}",
                    out.display(),
                    self.target(),
                    listed.join(" or ")
                )));
            }
            return Ok(());
        }
        if ext != "o" && ext != "so" {
            return Err(Error::Usage(format!("`-o {}`: the output must end in .o or .so", out.display())));
        }
        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(fail(format!("cannot write {}: there is no directory {}", out.display(), dir.display())));
        }
        // A directory, socket or link to nothing is refused before compiling.
        texc_runtime::atomic::check_writable(out).map_err(|e| fail(format!("cannot write {}: {e}", out.display())))
    }

    /// Compile `funcs` into `out` (its extension says the form) and write
    /// its header beside it.
    pub fn write_library(&mut self, funcs: &[LoopFunc], out: &Path) -> Result<Library, Error> {
        self.check_library_path(out)?;
        let refs: Vec<&LoopFunc> = funcs.iter().collect();
        let (header, notes) = if self.target().kind == TargetKind::Gpu {
            self.write_gpu_module(&refs, out)?
        } else {
            (self.write_cpu_library(funcs, out)?, Vec::new())
        };
        let header_path = out.with_extension("h");
        texc_runtime::atomic::write(&header_path, header.as_bytes())
            .map_err(|e| fail(format!("cannot write {}: {e}", header_path.display())))?;
        Ok(Library { header: header_path, notes })
    }

    /// A GPU module as `out`'s format; returns its header and notes.
    fn write_gpu_module(&mut self, funcs: &[&LoopFunc], out: &Path) -> Result<(String, Vec<String>), Error> {
        let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
        let (text, header) = self.emit_gpu(funcs)?;
        let encoded = self.encode_gpu(&text, ext)?;
        texc_runtime::atomic::write(out, &encoded.bytes)
            .map_err(|e| fail(format!("cannot write {}: {e}", out.display())))?;
        Ok((header, encoded.notes))
    }

    /// Objects for a CPU, linked as `out` asks; returns the header.
    fn write_cpu_library(&mut self, funcs: &[LoopFunc], out: &Path) -> Result<String, Error> {
        let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
        let cannot = |e: std::io::Error| fail(format!("cannot write {}: {e}", out.display()));
        let refs: Vec<&LoopFunc> = funcs.iter().collect();
        let (objects, mut header) = self.emit_objects(&refs)?;
        let embedded = self.embed_weights(funcs, out)?;
        if let Some((_, declaration)) = &embedded {
            header = texc_codegen::header::with_declaration(&header, declaration);
        }
        if ext == "o" && objects.len() == 1 && embedded.is_none() {
            texc_runtime::atomic::write(out, &objects[0]).map_err(cannot)?;
            return Ok(header);
        }
        // Several objects become one relocatable object (`cc -r`) or a library.
        let linked = texc_runtime::atomic::temporary_beside(out);
        let mut parts = Vec::new();
        let mut written = Ok(());
        for obj in &objects {
            let part = texc_runtime::atomic::temporary_beside(&out.with_extension("o"));
            written = texc_runtime::atomic::write(&part, obj);
            parts.push(part);
            if written.is_err() {
                break;
            }
        }
        parts.extend(embedded.as_ref().map(|(o, _)| o.clone()));
        let status = written.map(|()| {
            std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args([if ext == "so" { "-shared" } else { "-r" }, "-o"])
                .arg(&linked)
                .args(&parts)
                // A library records the math library its kernels call (expf, erff, ...).
                .args(if ext == "so" { &["-lm"][..] } else { &[][..] })
                .status()
        });
        for p in &parts {
            let _ = std::fs::remove_file(p);
        }
        let status = status
            .map_err(cannot)?
            .map_err(|e| fail(format!("cannot run the C compiler to link {}: {e}", out.display())))?;
        if !status.success() {
            let _ = std::fs::remove_file(&linked);
            return Err(fail(format!("linking {} failed", out.display())));
        }
        texc_runtime::atomic::replace(&linked, out).map_err(cannot)?;
        Ok(header)
    }

    /// An ONNX model's weights compiled into its library, with the entry
    /// `texc_<kernel>_infer` that passes them: the object to link and the
    /// entry's declaration for the header. `None` for a `.tex` file.
    fn embed_weights(&mut self, funcs: &[LoopFunc], out: &Path) -> Result<Option<(PathBuf, String)>, Error> {
        let [f] = funcs else { return Ok(None) };
        if self.model_inputs().is_empty() {
            return Ok(None);
        }
        let weights = self.model_constants()?;
        let fail = |what: String| fail(format!("cannot write {}: {what}", out.display()));
        let bytes = |name: &str| {
            weights.get(name).and_then(|t| texc_runtime::AlignedBuf::from_tensor(t).ok()).map(|b| b.bytes().to_vec())
        };
        let blob_path = texc_runtime::atomic::temporary_beside(&out.with_extension("weights"));
        let c = texc_codegen::abi::CEntry::of(f);
        let e = texc_codegen::header::embedded_weights(f, &c, &bytes, &blob_path);
        let source = texc_runtime::atomic::temporary_beside(&out.with_extension("c")).with_extension("c");
        let object = texc_runtime::atomic::temporary_beside(&out.with_extension("o"));
        let compiled =
            std::fs::write(&blob_path, &e.blob).and_then(|()| std::fs::write(&source, &e.c_source)).and_then(|()| {
                std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                    .args(["-c", "-O2", "-fPIC", "-o"])
                    .arg(&object)
                    .arg(&source)
                    .status()
            });
        let _ = std::fs::remove_file(&blob_path);
        let _ = std::fs::remove_file(&source);
        match compiled {
            Ok(s) if s.success() => Ok(Some((object, e.declaration))),
            Ok(_) => Err(fail("the C compiler failed on the weights' entry".into())),
            Err(err) => Err(fail(err.to_string())),
        }
    }
}
