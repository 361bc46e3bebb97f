//! The chosen plan as text: a `.tex` kernel with one statement per
//! operator node, and the deterministic report of `texc emit --stage egraph`.

use super::lang::Node;
use super::Plan;
use crate::target::Target;
use crate::tir::Program;
use egg::{Language, RecExpr};
use std::collections::BTreeMap;
use std::fmt::Write;

/// A term as text with each subterm used more than once written once, as
/// `$n` (numbered in dependency order): printed as a tree, a graph with
/// residual connections doubles in size with every block.
fn shared_term(e: &RecExpr<Node>) -> (String, Vec<String>) {
    let nodes = e.as_ref();
    let mut uses = vec![0usize; nodes.len()];
    for n in nodes {
        for &c in n.children() {
            uses[usize::from(c)] += 1;
        }
    }
    let mut text: Vec<String> = Vec::with_capacity(nodes.len());
    let mut shared = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let s = if n.children().is_empty() {
            n.to_string()
        } else {
            let args: Vec<&str> = n.children().iter().map(|&c| text[usize::from(c)].as_str()).collect();
            format!("({n} {})", args.join(" "))
        };
        if uses[i] > 1 && !n.children().is_empty() {
            shared.push(s);
            text.push(format!("${}", shared.len()));
        } else {
            text.push(s);
        }
    }
    (text.pop().unwrap_or_default(), shared)
}

/// The chosen term as a `.tex` kernel: one statement per operator node.
pub fn plan_source(
    p: &Program,
    best: &RecExpr<Node>,
    original: &[Option<String>],
    header: &str,
    source_of: &dyn Fn(usize) -> String,
) -> String {
    let nodes = best.as_ref();
    let mut name: Vec<Option<String>> = vec![None; nodes.len()];
    let mut out = String::from(header);
    let root = nodes.len() - 1;
    // Which node produces each kernel output.
    let outputs: BTreeMap<usize, String> = nodes[root]
        .children()
        .iter()
        .zip(&p.outputs)
        .map(|(&c, &t)| (usize::from(c), p.tensor(t).name.clone()))
        .collect();
    let mut tmp = 0;
    for (i, n) in nodes.iter().enumerate().take(root) {
        let op = match n {
            Node::Op(op, _) => *op,
            Node::Opaque(k, _) => {
                let k = k.0 as usize;
                let _ = writeln!(out, "    {}", source_of(k));
                name[i] = Some(p.tensor(p.ops[k].outputs[0]).name.clone());
                continue;
            }
            leaf => {
                name[i] = Some(leaf.to_string());
                continue;
            }
        };
        let target = outputs.get(&i).cloned().or_else(|| original[i].clone()).unwrap_or_else(|| {
            tmp += 1;
            format!("_r{tmp}")
        });
        let args: Vec<String> =
            n.children().iter().map(|&c| name[usize::from(c)].clone().expect("children first")).collect();
        let _ = writeln!(out, "    {target} = {op}({});", args.join(", "));
        name[i] = Some(target);
    }
    // Outputs that are inputs or opaque results need a copy under their own name.
    for (&c, o) in &outputs {
        if name[c].as_deref() != Some(o.as_str()) {
            let _ = writeln!(out, "    {o} = {};", name[c].clone().expect("computed"));
        }
    }
    out.push_str("}\n");
    out
}

/// Deterministic report of a rewrite (`texc emit --stage egraph`).
pub fn print_plan(plan: &Plan, target: &Target, kept_original: Option<&str>) -> String {
    let (peak, bw) = (target.nominal.peak_gflops, target.nominal.bandwidth_gbs);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "egraph for {target}: plans costed by the {target} cost model (nominal machine {peak} GFLOP/s, {bw} GB/s)"
    );
    if plan.extraction == "none" {
        // `Plan::unchanged`: the e-graph never ran, so there are no figures to show.
        let why = kept_original.unwrap_or("not rewritten");
        let _ = writeln!(out, "  the e-graph did not run: {why}; the graph as written runs on {target}");
        return out;
    }
    let _ = writeln!(
        out,
        "  saturation: {} iterations, {} e-classes, {} e-nodes; {}",
        plan.iterations, plan.egraph_classes, plan.egraph_nodes, plan.stopped
    );
    let _ = writeln!(
        out,
        "  rules fired: {}",
        if plan.fired.is_empty() { "none".to_string() } else { plan.fired.join(", ") }
    );
    let _ = writeln!(
        out,
        "  estimated time: {:.3} µs as written, {:.3} µs chosen ({} extraction)",
        plan.original_cost / 1e3,
        plan.best_cost / 1e3,
        plan.extraction
    );
    let (root, shared) = shared_term(&plan.best);
    let _ = writeln!(out, "  chosen term: {root}");
    for (i, t) in shared.iter().enumerate() {
        let _ = writeln!(out, "    where ${} = {t}", i + 1);
    }
    if !plan.alternatives.is_empty() {
        let _ = writeln!(out, "  alternatives (estimated µs of the subgraph, cheapest first):");
        for (label, alts) in &plan.alternatives {
            let list: Vec<String> = alts.iter().take(4).map(|(op, c)| format!("{op} {:.3}", c / 1e3)).collect();
            let _ = writeln!(out, "    {label}: {}", list.join(", "));
        }
    }
    match kept_original {
        Some(why) => {
            let _ = writeln!(out, "  the graph as written is kept, and runs on {target}: {why}");
        }
        None => {
            let _ = writeln!(out, "  chosen plan (what runs on {target}):");
            for line in plan.display_source.lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}
