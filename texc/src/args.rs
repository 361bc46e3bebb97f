//! Command-line syntax (clap). Values such as `--shape M=64,N=32` are parsed
//! in `commands`, so that their errors can name the flag and the bad part.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "texc", version, about = "texc: a tensor compiler for .tex kernels")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The .tex file (or a .loops file, or an ONNX model: .onnx).
    pub file: PathBuf,
    /// Kernel to use when the file defines several.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Shape symbol values: `--shape M=1024,N=512` (repeatable).
    #[arg(long, value_name = "NAME=SIZE,...")]
    pub shape: Vec<String>,
    /// Sizes of an ONNX model's symbolic input dimensions: `--dim batch=1` (repeatable).
    #[arg(long, value_name = "NAME=SIZE,...")]
    pub dim: Vec<String>,
    /// Compile-time constants: `--const pad=1,stride=2` (repeatable).
    #[arg(long = "const", value_name = "NAME=VALUE,...")]
    pub consts: Vec<String>,
    /// Target: interp, x86-avx2, x86-avx512, x86-avx2-vnni, x86-avx512-vnni, x86-avx512-amx, host, cranelift, nvptx-sm80, nvptx-sm90.
    #[arg(long, default_value = "interp")]
    pub target: String,
    /// Run the operator graph as written, without e-graph rewriting
    /// (compiled targets rewrite kernels that have no schedule of their own).
    #[arg(long)]
    pub no_rewrite: bool,
    /// Values of schedule tunables: `--knob ti=16,tj=32` (repeatable).
    #[arg(long, value_name = "NAME=VALUE,...")]
    pub knob: Vec<String>,
    /// Print the IR after every pass (or after the listed ones: `--dump-ir lower,legalize`) to stderr.
    #[arg(long, value_name = "PASSES", num_args = 0..=1, default_missing_value = "all")]
    pub dump_ir: Option<String>,
    /// Run the IR verifiers after every pass (debug builds always do).
    #[arg(long)]
    pub verify_ir: bool,
    /// Print the time of each compiler pass to stderr.
    #[arg(long)]
    pub time_passes: bool,
    /// Relative error accepted on float outputs, max |got - exact| / max |exact|: by
    /// `--check`, and by the rewriter, which uses Winograd only where its estimated
    /// error stays within it (default: 1e-5 for f32, 1e-2 for f16/bf16, 1e-12 for f64).
    #[arg(long, value_name = "REL")]
    pub tolerance: Option<f64>,
    /// No approximate rewrites (Winograd): rounding as in the program as written.
    #[arg(long)]
    pub exact: bool,
    /// The tuning database `run`, `bench` and `compile` take tuned knobs from, and `tune` writes
    /// (default: TEXC_TUNING_DB, else ~/.cache/texc/tuning.jsonl).
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Do not take tuned knobs from the tuning database.
    #[arg(long)]
    pub no_db: bool,
    /// Neither read nor write the compile cache of machine code (default: TEXC_CACHE_DIR, else
    /// $XDG_CACHE_HOME/texc/code, else ~/.cache/texc/code; TEXC_NO_CACHE=1 turns it off too).
    #[arg(long)]
    pub no_cache: bool,
    /// Most memory a run may allocate, like 512M or 8G (default: what the machine has available).
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// Input tensors or 0-d scalars: `--input A=a.npy` (repeatable); `--input f.npz`
    /// gives every array of a NumPy archive by its name, `--input A=f.npz` the one named A.
    #[arg(long, value_name = "NAME=FILE")]
    pub input: Vec<String>,
    /// Scalar values: `--scalar eps=1e-3` (repeatable).
    #[arg(long, value_name = "NAME=VALUE")]
    pub scalar: Vec<String>,
    /// Write an output: `--output C=c.npy` (repeatable); `--output f.npz` writes every
    /// output into one NumPy archive, `--output C=f.npz` just C.
    #[arg(long, value_name = "NAME=FILE")]
    pub output: Vec<String>,
    /// Seed for random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compare with the interpreter and print the relative error (max |got - exact| / max |exact|).
    #[arg(long)]
    pub check: bool,
    /// Run a GPU target's kernels on this CPU: each launch's blocks on the thread pool,
    /// each block's threads in order (checks GPU schedules without a GPU; not a benchmark of one).
    #[arg(long)]
    pub emulate_gpu: bool,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Timed runs (mean, standard deviation, min, median, p90, p99 and max are reported).
    #[arg(long, default_value_t = 20)]
    pub repeat: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Threads for parallel loops (default: TEXC_NUM_THREADS, else the machine's cores);
    /// more than the cores is allowed, the roofline is then that of all the cores.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Print one JSON object (times in ms, rates, bound, check) instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Also time each top-level loop nest alone (each compiled as a kernel of
    /// its own, run in order on the whole kernel's buffers): a model's layers,
    /// slowest first, with their share of the total and the GFLOP/s their
    /// code executes.
    #[arg(long)]
    pub profile: bool,
    /// For `texc tune`'s workers: once compiled, print `compiled` and wait
    /// for a line on standard input before timing (so that candidates
    /// compile together and are timed one at a time).
    #[arg(long, hide = true)]
    pub wait_to_time: bool,
}

#[derive(Args, Debug, Clone)]
pub struct TuneArgs {
    #[command(flatten)]
    pub common: Common,
    /// Most candidates to measure (those already in the database count, and are not measured again).
    #[arg(long, default_value_t = 64)]
    pub trials: usize,
    /// Most seconds of tuning.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    pub time_budget: f64,
    /// Seed of the search.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Timed runs per candidate (the median is recorded).
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
    /// Untimed runs per candidate first.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Seconds a candidate may take to compile, and again to be measured, before its worker is killed.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    pub trial_timeout: f64,
    /// Candidates compiled at once, each by its worker (default: the machine's cores); they are
    /// measured one at a time, after all have compiled.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Print the winning schedule, ready to paste into the kernel's file.
    #[arg(long)]
    pub emit_schedule: bool,
    /// Draw the best time so far against the trials (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Measure only shard I of N of the candidate stream (`--shard 0/4`): shards of one
    /// seed and --trials measure disjoint candidates whose union is what one run measures;
    /// join their databases with `texc db merge`.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Search without the learned cost model (random points and mutations of the fastest only).
    #[arg(long)]
    pub no_model: bool,
}

#[derive(Args, Debug, Clone)]
pub struct DbArgs {
    /// list | show | merge | prune
    pub action: String,
    /// `show`: kernel names; `merge`: database files to merge.
    pub args: Vec<String>,
    /// The database (default: TEXC_TUNING_DB, else ~/.cache/texc/tuning.jsonl).
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// `merge`: the file to write.
    #[arg(short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// `prune`: also drop records of other texc versions.
    #[arg(long)]
    pub other_versions: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The .tex file to write; the weights go beside it, as an .npz archive of the same name.
    #[arg(short = 'o', value_name = "OUT.tex")]
    pub output: PathBuf,
    /// Sizes of symbolic input dimensions: `--dim batch=1` (repeatable).
    #[arg(long, value_name = "NAME=SIZE,...")]
    pub dim: Vec<String>,
    /// The kernel's name (default: the name of the .tex file).
    #[arg(long)]
    pub kernel: Option<String>,
}

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The f32 ONNX model.
    pub model: PathBuf,
    /// Calibration data: an .npz of arrays named after the model's inputs (one batch each, or a
    /// stack of batches along a new first axis), or a directory of .npy batches.
    #[arg(long, value_name = "DATA")]
    pub calibrate: PathBuf,
    /// The QDQ model to write.
    #[arg(short = 'o', value_name = "OUT.onnx")]
    pub output: PathBuf,
    /// How each activation's range is chosen: minmax, entropy (KL divergence, TensorRT's) or
    /// percentile[=P] (ONNX Runtime's, default 99.999).
    #[arg(long, default_value = "minmax", value_name = "METHOD")]
    pub method: String,
    /// Quantize weights per output channel (default: per tensor).
    #[arg(long)]
    pub per_channel: bool,
    /// Nodes left in f32 (by ONNX node name).
    #[arg(long, value_name = "NODE", num_args = 1..)]
    pub exclude: Vec<String>,
    /// Activations as i8 symmetric about 0 (default: u8 with a zero point).
    #[arg(long)]
    pub symmetric: bool,
    /// Weights in 7 bits, −64..=64 (ONNX Runtime's `reduce_range`): on CPUs without VNNI their
    /// products run on `vpmaddubsw`, which 8-bit weights could saturate.
    #[arg(long)]
    pub reduce_range: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Quantize an ONNX model to INT8 (QDQ) by calibration on sample inputs, with an accuracy report.
    Quantize(QuantizeArgs),
    /// Import an ONNX model: a .tex kernel of std.nn calls, one statement per node, and its weights (.npz).
    Import(ImportArgs),
    /// Parse and type/shape-check a file; diagnostics only.
    Check(Common),
    /// Print one compilation stage.
    Emit {
        #[command(flatten)]
        common: Common,
        /// ast, tir, graph, egraph, loops, llvm, asm, ptx, mlir.
        #[arg(long)]
        stage: String,
        /// With `--stage ast`: show every node's byte span in the source as `@start..end`.
        #[arg(long)]
        spans: bool,
    },
    /// Run a kernel on inputs from .npy files or seeded random data.
    Run(RunArgs),
    /// Time a kernel: time statistics, GFLOP/s, GB/s, share of the roofline bound (`--json` for scripts).
    Bench(BenchArgs),
    /// Autotune a kernel's schedule template: measure knob values in worker processes, record them in the tuning database.
    Tune(TuneArgs),
    /// The tuning database: `list`, `show KERNEL`, `merge A B -o OUT`, `prune`.
    Db(DbArgs),
    /// Compile ahead of time: an object (.o) or shared library (.so) and a C header.
    #[command(mut_arg("kernel", |a| a.help(
        "Kernels to compile, separated by commas: `--kernel a,b` (default: every kernel of the file)"
    ).value_name("NAME,...")))]
    Compile {
        #[command(flatten)]
        common: Common,
        /// The output: `out.o` or `out.so` (the header is written beside it as `out.h`).
        #[arg(short = 'o', value_name = "OUT.o|OUT.so")]
        output: Option<PathBuf>,
    },
    /// The plan that runs on the target: per operator FLOPs, bytes, operational intensity,
    /// roofline bound; per kernel FLOPs, parameters, bytes moved, peak memory.
    Analyze {
        #[command(flatten)]
        common: Common,
        /// Draw the roofline with every operator on it (SVG).
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Analyze the graph as written instead of the plan that runs on the target.
        #[arg(long)]
        as_written: bool,
    },
    /// The targets: backend, vector width, the caches and cores CPU default schedules are sized by,
    /// and whether the target runs on this machine (`TEXC_HOST_CACHES` sets `host`'s caches).
    Targets,
}
