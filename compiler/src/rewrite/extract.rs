//! Choosing a plan from the saturated e-graph: greedily per e-class
//! (egg's `Extractor`), or by an integer program over the whole DAG (the
//! `ilp` feature), and the alternatives each chosen operator had.

use super::cost::{node_time, RooflineCost};
use super::lang::{Node, Shapes};
use egg::{CostFunction, EGraph, Extractor, Id, Language, RecExpr};
use std::collections::HashMap;

#[cfg(feature = "ilp")]
struct LpTime {
    peak: f64,
    bw: f64,
}

#[cfg(feature = "ilp")]
impl egg::LpCostFunction<Node, Shapes> for LpTime {
    fn node_cost(&mut self, egraph: &EGraph<Node, Shapes>, _class: Id, enode: &Node) -> f64 {
        node_time(egraph, enode, self.peak, self.bw)
    }
}

/// The ILP-optimal plan and the e-class of each of its nodes.
#[cfg(feature = "ilp")]
pub fn extract_ilp(egraph: &EGraph<Node, Shapes>, root: Id, peak: f64, bw: f64) -> (RecExpr<Node>, Vec<Id>) {
    let best = egg::LpExtractor::new(egraph, LpTime { peak, bw }).solve(root);
    let mut classes: Vec<Id> = Vec::new();
    for node in best.as_ref() {
        let mapped = node.clone().map_children(|c| classes[usize::from(c)]);
        classes.push(egraph.lookup(mapped).expect("the plan is in the e-graph"));
    }
    (best, classes)
}

#[cfg(not(feature = "ilp"))]
pub fn extract_ilp(_: &EGraph<Node, Shapes>, _: Id, _: f64, _: f64) -> (RecExpr<Node>, Vec<Id>) {
    unreachable!("Extraction::from_env refuses `ilp` without the feature")
}

/// The cost of a term counting each distinct node once (the ILP's objective).
pub fn dag_cost(egraph: &EGraph<Node, Shapes>, term: &RecExpr<Node>, peak: f64, bw: f64) -> f64 {
    let mut classes: Vec<Id> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0.0;
    for node in term.as_ref() {
        let mapped = node.clone().map_children(|c| classes[usize::from(c)]);
        let class = egraph.lookup(mapped.clone()).expect("the term is in the e-graph");
        classes.push(class);
        if seen.insert(class) {
            total += node_time(egraph, &mapped, peak, bw);
        }
    }
    total
}

/// The e-nodes of each operator class of the chosen plan, with the cost of
/// the best plan below each by `cost` (the extractor's), cheapest first
/// (ties by name).
pub fn alternatives(
    egraph: &EGraph<Node, Shapes>,
    ex: &Extractor<RooflineCost, Node, Shapes>,
    mut cost: RooflineCost,
    classes: &[Id],
    names: &[Option<String>],
) -> Vec<(String, Vec<(String, f64)>)> {
    let mut out = Vec::new();
    for (class, name) in classes.iter().zip(names) {
        let nodes = &egraph[*class].nodes;
        if nodes.len() < 2 {
            continue;
        }
        let mut alts: Vec<(String, f64)> =
            nodes.iter().map(|n| (n.to_string(), cost.cost(n, |c| ex.find_best_cost(c)))).collect();
        alts.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let label = name.clone().unwrap_or_else(|| alts[0].0.clone());
        out.push((label, alts));
    }
    out
}

/// Build the best term below e-class `class`, remembering each node's class.
pub fn extract(
    ex: &Extractor<RooflineCost, Node, Shapes>,
    egraph: &EGraph<Node, Shapes>,
    class: Id,
    out: &mut RecExpr<Node>,
    classes: &mut Vec<Id>,
    memo: &mut HashMap<Id, Id>,
) -> Id {
    let class = egraph.find(class);
    if let Some(&id) = memo.get(&class) {
        return id;
    }
    let node = ex.find_best_node(class).clone();
    let children: Vec<Id> = node.children().iter().map(|&c| extract(ex, egraph, c, out, classes, memo)).collect();
    let mut extracted = children.into_iter();
    let id = out.add(node.map_children(|_| extracted.next().expect("one per child")));
    classes.push(class);
    memo.insert(class, id);
    id
}

/// The cost of the term as written, each distinct operator once: an
/// e-graph of the term alone, its one term costed as a DAG.
pub fn term_cost(term: &RecExpr<Node>, shapes: Shapes, peak: f64, bw: f64) -> f64 {
    let mut g = EGraph::new(shapes);
    g.add_expr(term);
    g.rebuild();
    dag_cost(&g, term, peak, bw)
}
