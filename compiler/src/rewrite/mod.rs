//! Graph rewriting with an e-graph (`egg`): fusion, batch-norm folding and
//! convolution algorithms chosen by a roofline cost model, and the chosen
//! plan turned back into a `.tex` kernel that the rest of the compiler
//! specializes and checks.
//!
//! The operator graph of a specialized kernel (`Program::ops`) becomes one
//! term of [`Node`]s ([`lang`]): standard-library calls are typed operators
//! whose children are their arguments in parameter order (tensors,
//! constants as numbers, scalars as names or numbers); anything else —
//! definitions, calls of user kernels — is an opaque operator. Rewrites
//! ([`rules`], by topic) are directional, saturation is bounded
//! (iterations, nodes, time, backoff scheduler), and the cheapest term
//! ([`cost`]: the target's [`PerformanceModel`] over a roofline) is
//! extracted greedily or by an integer program ([`extract`]); [`print`]
//! writes the plan as `.tex` and as the `emit --stage egraph` report.

mod cost;
mod extract;
mod lang;
mod print;
mod rules;

pub use crate::nn::{Info, WinogradForm};
pub use cost::{Calibration, CalibrationSample, Model, Nominal, OpNode, PerformanceModel};
pub use lang::{Node, Opaque};
pub use print::print_plan;
pub use rules::rules;

use crate::nn::NnOp;
use crate::target::Target;
use crate::tir::{OpArg, Program, TensorId};
use egg::{Id, Language, RecExpr, Runner};
use extract::{alternatives, dag_cost, extract, extract_ilp, term_cost, Greedy};
use lang::{OpaqueInfo, Shapes};
use print::plan_source;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How the plan is chosen from the saturated e-graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extraction {
    /// Per e-class, the node whose plan is cheapest, each plan costed as a
    /// DAG: its distinct operators once (`extract::Greedy`).
    Greedy,
    /// An integer program over the whole DAG (egg's `LpExtractor` with CBC):
    /// shared subterms count once. Built with the cargo feature `ilp`.
    Ilp,
}

impl Extraction {
    /// By name: `greedy` or `ilp` (the latter only when built with the feature `ilp`).
    pub fn from_name(name: &str) -> Result<Extraction, String> {
        match name {
            "" | "greedy" => Ok(Extraction::Greedy),
            "ilp" if cfg!(feature = "ilp") => Ok(Extraction::Ilp),
            "ilp" => Err("this texc was built without ILP extraction; build it with `--features ilp` \
                          (needs CBC: apt install coinor-libcbc-dev)"
                .into()),
            _ => Err("expected `greedy` or `ilp`".into()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Extraction::Greedy => "greedy",
            Extraction::Ilp => "ilp",
        }
    }
}

/// The numerical error a user accepts from rewrites (`--tolerance`,
/// `--exact`), and which alternatives the rewriter may choose among. Most
/// rules compute the same sums in another order or place, whose rounding
/// is that of the computation as written. Winograd transforms amplify
/// rounding, increasingly with the reduction length, so they are applied
/// only where their error model ([`winograd_error`]) stays within the
/// tolerance, and never when approximate rewrites are off. The autotuner
/// narrows the alternatives (`winograd`, `im2col`) to measure each
/// rather than trust the cost model's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accuracy {
    /// Relative error accepted on f32 outputs, in the measure `run --check`
    /// uses: max |plan − exact| / max |exact|.
    pub tolerance: f64,
    /// Whether rewrites with amplified rounding error may be chosen at all.
    pub approximate: bool,
    /// Winograd in this form wherever it applies, and no other; `None`:
    /// any, as the cost model picks.
    pub winograd: Option<WinogradForm>,
    /// Whether convolutions may become im2col products.
    pub im2col: bool,
}

impl Default for Accuracy {
    /// The tolerance `run --check` applies to f32 outputs; every rewrite allowed.
    fn default() -> Accuracy {
        Accuracy { tolerance: 1e-5, approximate: true, winograd: None, im2col: true }
    }
}

/// Estimated relative error (max-norm, against the exact result) of
/// Winograd F(m×m, 3×3) computed in f32 over `channels` input channels:
/// `a·√C + b`, an envelope 1.2–1.5× above the worst of several seeds of
/// zero-mean uniform data (the worst case for relative error) at C = 16 to
/// 1024, measured with compiled code against the interpreter's direct
/// convolution; `winograd_error_model_is_an_upper_bound` in
/// `tests/tests/rewrite.rs` keeps it honest. (Measured F(4×4, 3×3): 6.1e-6
/// at C = 64, 1.06e-5 at C = 128, 2.25e-5 at C = 1024; F(2×2, 3×3):
/// 4.3e-7 at C = 64, 1.1e-6 at C = 1024; direct: 3.2e-6 at C = 1024.)
pub fn winograd_error(m: i64, channels: i64) -> f64 {
    let (a, b) = if m <= 2 { (5e-8, 1.5e-7) } else { (1e-6, 1.5e-6) };
    a * (channels.max(1) as f64).sqrt() + b
}

/// The result of rewriting a kernel.
pub struct Plan {
    /// The chosen term.
    pub best: RecExpr<Node>,
    /// Its cost as extraction saw it (the tuner's `winograd=2|4` makes that
    /// tile nearly free there: [`Shapes::prefer`]).
    pub best_cost: f64,
    /// Its cost by the model alone, in ns on the nominal machine.
    pub estimated_cost: f64,
    /// The cost of the graph as written.
    pub original_cost: f64,
    /// Rules that fired, in order of first use.
    pub fired: Vec<String>,
    /// The generated kernel, in `.tex`.
    pub source: String,
    /// The same with imports named as the user wrote them (for printing).
    pub display_source: String,
    pub egraph_classes: usize,
    pub egraph_nodes: usize,
    pub iterations: usize,
    /// Why saturation ended: `saturated` (no rule adds anything), or the
    /// bound it reached (`the iteration limit`, `the node limit`, `the time
    /// limit`: the plan was chosen from part of the search, and a time
    /// limit depends on the machine).
    pub stopped: String,
    /// For each operator of the chosen plan that had alternatives: its
    /// label and every alternative with its estimated cost in ns (the whole
    /// subgraph below it), cheapest first.
    pub alternatives: Vec<(String, Vec<(String, f64)>)>,
    /// `greedy` or `ilp`.
    pub extraction: &'static str,
}

impl Plan {
    /// A plan that keeps the graph as written, without running the e-graph.
    pub fn unchanged() -> Plan {
        Plan {
            best: RecExpr::default(),
            best_cost: 0.0,
            estimated_cost: 0.0,
            original_cost: 0.0,
            fired: Vec::new(),
            source: String::new(),
            display_source: String::new(),
            egraph_classes: 0,
            egraph_nodes: 0,
            iterations: 0,
            stopped: String::new(),
            alternatives: Vec::new(),
            extraction: "none",
        }
    }
}

/// Build the term of a program's operator graph. Returns the term and, per
/// tensor, the term node that computes it.
fn graph_term(p: &Program, shapes: &mut Shapes) -> (RecExpr<Node>, HashMap<TensorId, Id>) {
    let mut e = RecExpr::default();
    let mut node_of: HashMap<TensorId, Id> = HashMap::new();
    let leaf = |e: &mut RecExpr<Node>, name: &str| e.add(Node::leaf(name));
    for t in p.input_tensors() {
        let d = p.tensor(t);
        shapes.of.insert(d.name.clone(), d.shape.clone());
        node_of.insert(t, leaf(&mut e, &d.name));
    }
    for (i, op) in p.ops.iter().enumerate() {
        let representable =
            op.std_callee && op.outputs.len() == 1 && op.args.iter().all(|a| !matches!(a, OpArg::Scalar(None)));
        // A hand-written matmul or convolution is that operator.
        let recognized = if representable { None } else { crate::recognize::recognize(p, i) };
        let call = match &recognized {
            Some((op, args)) => Some((*op, args.as_slice())),
            None if representable => NnOp::from_name(&op.op).map(|nn| (nn, op.args.as_slice())),
            None => None,
        };
        let id = if let Some((nn, args)) = call {
            let mut children = Vec::new();
            for a in args {
                children.push(match a {
                    OpArg::Tensor(t) => node_of[t],
                    OpArg::Const(v) => leaf(&mut e, &v.to_string()),
                    OpArg::Scalar(Some(text)) => leaf(&mut e, text),
                    OpArg::Scalar(None) => unreachable!("checked"),
                });
            }
            e.add(Node::Op(nn, children.into()))
        } else {
            // Opaque: the statement itself, known by the tensor it defines.
            let flops = crate::cost::cost_of_stages(p, op.stages.clone());
            let bytes: f64 = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| p.tensor(t).len() as f64 * p.tensor(t).elem.size() as f64)
                .sum();
            let shape = p.tensor(op.outputs[0]).shape.clone();
            let k = Opaque(u32::try_from(i).expect("fewer than 2^32 statements"));
            shapes.opaque.insert(k, OpaqueInfo { shape, flops, bytes });
            let children: Vec<Id> = op.inputs.iter().map(|t| node_of[t]).collect();
            e.add(Node::Opaque(k, children.into()))
        };
        for &t in &op.outputs {
            node_of.insert(t, id);
        }
    }
    let outs: Vec<Id> = p.outputs.iter().map(|t| node_of[t]).collect();
    e.add(Node::Plan(outs.into()));
    (e, node_of)
}

/// The cost model's estimate of `p`'s graph as written, in ns on
/// `target`'s nominal machine (uncorrected: what calibration measures).
pub fn written_cost(p: &Program, target: &Target, model: Model, constants: &HashSet<String>) -> f64 {
    let mut shapes = Shapes { model, constants: constants.clone(), ..Shapes::default() };
    let (term, _) = graph_term(p, &mut shapes);
    term_cost(&term, shapes, target.nominal.peak_gflops, target.nominal.bandwidth_gbs)
}

/// Rewrite the operator graph of `p` for `target`. `source_of` gives the
/// text of a statement (for opaque operators, copied into the new kernel);
/// `header` is the kernel's signature and imports; `model` says how fast
/// `target`'s schedules run each operator.
#[allow(clippy::too_many_arguments)]
pub fn rewrite(
    p: &Program,
    target: &Target,
    model: Model,
    header: &str,
    source_of: &dyn Fn(usize) -> String,
    extraction: Extraction,
    accuracy: Accuracy,
    constants: &HashSet<String>,
    calibration: &Calibration,
) -> Plan {
    let mut shapes = Shapes {
        model,
        constants: constants.clone(),
        prefer: accuracy.winograd,
        calibration: calibration.clone(),
        ..Shapes::default()
    };
    let (term, node_of) = graph_term(p, &mut shapes);
    // Bounds that grow with the model: a fixed 20 000 nodes stopped a
    // 400-block network's saturation part way (its later blocks kept
    // their convolutions as written; 100 blocks saturate at 2.5 nodes per
    // node of the term). The node bound, not the clock, should end it, so
    // that the plan is the same on any machine. Likewise the matches a
    // rule may make in one iteration before the scheduler bans it for a
    // while: a fixed 1 000 banned the rules that fire once per block of a
    // large model, which then took an iteration more (each a search of the
    // whole e-graph) for every doubling of its blocks.
    let size = term.as_ref().len();
    let runner = Runner::<Node, Shapes>::new(shapes)
        .with_expr(&term)
        .with_iter_limit(20)
        .with_node_limit(20_000.max(10 * size))
        .with_time_limit(Duration::from_secs(2).max(Duration::from_millis(size as u64)))
        .with_scheduler(egg::BackoffScheduler::default().with_initial_match_limit(1_000.max(size)))
        .run(&rules(accuracy));
    let (peak, bw) = (target.nominal.peak_gflops, target.nominal.bandwidth_gbs);
    let root = runner.roots[0];
    let egraph = &runner.egraph;
    let extractor = Greedy::new(egraph, peak, bw);
    let (best, classes, best_cost) = match extraction {
        Extraction::Greedy => {
            let mut best = RecExpr::default();
            let mut classes = Vec::new();
            let mut memo = HashMap::new();
            extract(&extractor, egraph, root, &mut best, &mut classes, &mut memo);
            let cost = dag_cost(egraph, &best, peak, bw);
            let priced = extractor.find_best_cost(egraph, root);
            debug_assert!(
                (priced - cost).abs() <= 1e-9 * cost.max(1.0),
                "extraction priced its plan at {priced} ns, which counts each operator once at {cost}"
            );
            (best, classes, cost)
        }
        Extraction::Ilp => {
            let (best, classes) = extract_ilp(egraph, root, peak, bw);
            let cost = dag_cost(egraph, &best, peak, bw);
            (best, classes, cost)
        }
    };
    // Tensors of the original graph keep their names where the plan computes them.
    // Term ids are not e-class ids: look each term node up in the e-graph.
    let mut class_of: Vec<Id> = Vec::new();
    for node in term.as_ref() {
        let mapped = node.clone().map_children(|c| class_of[usize::from(c)]);
        class_of.push(egraph.lookup(mapped).expect("the term is in the e-graph"));
    }
    let mut names: HashMap<Id, String> = HashMap::new();
    let mut tensors: Vec<(&TensorId, &Id)> = node_of.iter().collect();
    tensors.sort();
    for (&t, &id) in tensors {
        names.entry(egraph.find(class_of[usize::from(id)])).or_insert_with(|| p.tensor(t).name.clone());
    }
    let node_names: Vec<Option<String>> = classes.iter().map(|c| names.get(c).cloned()).collect();
    // Costs without the tuner's preference (which only steers extraction).
    let unpreferred = || egraph.analysis.unpreferred();
    let original_cost = match extraction {
        Extraction::Greedy => term_cost(&term, unpreferred(), peak, bw),
        Extraction::Ilp => dag_cost(egraph, &term, peak, bw),
    };
    let estimated_cost =
        if egraph.analysis.prefer.is_some() { term_cost(&best, unpreferred(), peak, bw) } else { best_cost };
    let mut fired = Vec::new();
    for it in &runner.iterations {
        let mut names: Vec<String> = it.applied.keys().map(|s| s.to_string()).collect();
        names.sort();
        for n in names {
            if !fired.contains(&n) {
                fired.push(n);
            }
        }
    }
    let source = plan_source(p, &best, &node_names, header, source_of);
    let alternatives = alternatives(egraph, &extractor, &classes, &node_names);
    Plan {
        extraction: extraction.name(),
        alternatives,
        display_source: source.clone(),
        best,
        best_cost,
        estimated_cost,
        original_cost,
        fired,
        source,
        egraph_classes: egraph.number_of_classes(),
        egraph_nodes: egraph.total_number_of_nodes(),
        iterations: runner.iterations.len(),
        stopped: stop_reason(runner.stop_reason.as_ref()),
    }
}

/// Why a saturation run ended, in words for the report.
fn stop_reason(r: Option<&egg::StopReason>) -> String {
    match r {
        Some(egg::StopReason::Saturated) => "saturated".into(),
        Some(egg::StopReason::IterationLimit(n)) => format!("stopped at the iteration limit ({n})"),
        Some(egg::StopReason::NodeLimit(n)) => format!("stopped at the node limit ({n})"),
        Some(egg::StopReason::TimeLimit(s)) => {
            format!("stopped at the time limit ({s:.1} s; the plan may differ on another machine)")
        }
        Some(egg::StopReason::Other(why)) => format!("stopped: {why}"),
        None => "not run".into(),
    }
}

/// The name of the generated kernel that replaces kernel `name`: not
/// `name` itself, which would hide the operator of the same name it may
/// call (a kernel `conv2d` written by hand, rewritten as a call of
/// `std.nn`'s `conv2d`, called itself).
pub fn rewritten_name(name: &str) -> String {
    format!("rewritten_{name}")
}

/// The `import`s and signature of kernel `k`, as source text, for a
/// generated kernel that replaces it ([`rewritten_name`]).
fn kernel_header(s: &crate::Session, k: crate::KernelRef) -> String {
    let m = s.module(k.module as usize);
    let ast = m.kernel_ast(k.index as usize);
    let mut h = String::from("import std.nn;\n");
    if let Some(path) = &m.path {
        h.push_str(&format!("import \"{}\";\n", path.display()));
    }
    let params: Vec<&str> = ast.params.iter().map(|p| s.sources.snippet(p.span)).collect();
    let outs: Vec<&str> = ast.outputs.iter().map(|o| s.sources.snippet(o.span)).collect();
    let outs = if outs.len() == 1 { outs[0].to_string() } else { format!("({})", outs.join(", ")) };
    h.push_str(&format!("kernel {}({}) -> {} {{\n", rewritten_name(&ast.name.name), params.join(", "), outs));
    h
}

/// Rewrite kernel `k` (specialized as `original`) for `target`: the plan,
/// with its source as a `.tex` kernel that replaces `k` (imports and
/// signature copied from `k`), shown with the file name the user knows.
#[allow(clippy::too_many_arguments)]
pub fn rewrite_kernel(
    s: &crate::Session,
    k: crate::KernelRef,
    original: &Program,
    target: &Target,
    model: Model,
    extraction: Extraction,
    accuracy: Accuracy,
    constants: &HashSet<String>,
    calibration: &Calibration,
) -> Plan {
    let header = kernel_header(s, k);
    let source_of = |i: usize| s.sources.snippet(original.ops[i].span).to_string();
    let mut plan = rewrite(original, target, model, &header, &source_of, extraction, accuracy, constants, calibration);
    let m = s.module(k.module as usize);
    if let Some(path) = &m.path {
        let shown = &s.sources.file(m.ast.file).name;
        plan.display_source =
            plan.source.replace(&format!("import \"{}\";", path.display()), &format!("import \"{shown}\";"));
    }
    // Shown under the name the user knows; where the body calls the
    // operator of that name, a comment says which one it is.
    let name = &m.kernel_ast(k.index as usize).name.name;
    let header = format!("kernel {}(", rewritten_name(name));
    let note = match plan.display_source.contains(&format!("= {name}(")) {
        true => {
            format!("# `{name}` below calls std.nn's `{name}`; this kernel compiles as `{}`\n", rewritten_name(name))
        }
        false => String::new(),
    };
    plan.display_source = plan.display_source.replacen(&header, &format!("{note}kernel {name}("), 1);
    plan
}

#[cfg(test)]
mod tests {
    use super::{Calibration, CalibrationSample};

    /// A node takes the geometric mean of its operator's samples of a size
    /// within 4× of its estimate; others are left as the model has them.
    #[test]
    fn calibration_applies_to_nearby_sizes_of_an_operator() {
        let s = |op: &str, estimated_ns: f64, factor: f64| CalibrationSample { op: op.into(), estimated_ns, factor };
        let cal = Calibration { samples: vec![s("conv2d", 1e6, 2.0), s("conv2d", 3e6, 8.0), s("matmul", 1e6, 0.5)] };
        assert!((cal.factor("conv2d", 1.5e6) - 4.0).abs() < 1e-9, "both samples: √(2·8)");
        assert!((cal.factor("conv2d", 0.3e6) - 2.0).abs() < 1e-9, "the near one only");
        assert_eq!(cal.factor("conv2d", 1e8), 1.0, "none near");
        assert_eq!(cal.factor("conv2d_winograd_f2", 1e6), 1.0, "another operator");
        assert!((cal.factor("matmul", 1e6) - 0.5).abs() < 1e-9);
    }
}

#[cfg(test)]
mod stop_tests {
    use super::stop_reason;
    use egg::StopReason;

    /// The report says whether the plan saw the whole search, and which
    /// bound cut it short (a time limit: the plan depends on the machine).
    #[test]
    fn stop_reasons_name_the_bound() {
        assert_eq!(stop_reason(Some(&StopReason::Saturated)), "saturated");
        assert_eq!(stop_reason(Some(&StopReason::NodeLimit(80_000))), "stopped at the node limit (80000)");
        assert_eq!(stop_reason(Some(&StopReason::IterationLimit(20))), "stopped at the iteration limit (20)");
        assert!(stop_reason(Some(&StopReason::TimeLimit(2.0))).contains("may differ on another machine"));
        assert_eq!(stop_reason(None), "not run");
    }
}
