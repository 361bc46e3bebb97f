//! Choosing a plan from the saturated e-graph: greedily per e-class
//! ([`Greedy`]), or by an integer program over the whole DAG (the `ilp`
//! feature), and the alternatives each chosen operator had.

use super::cost::{node_time, RooflineCost};
use super::lang::{Node, Shapes};
use egg::{CostFunction, EGraph, Id, Language, RecExpr};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

/// Per e-class, the cheapest node by a cost that is at least each of its
/// operands' (`RooflineCost`): the costs of the fixpoint egg's `Extractor`
/// reaches, found in one pass.
///
/// egg's `Extractor` sweeps every class until no cost falls; a sweep in its
/// class order settles only part of a deep chain, so a model of N layers
/// took about N sweeps of N classes (a 200-block network spent 3.4 s here).
/// Because a node never costs less than an operand, the classes settle in
/// order of cost, as in Dijkstra's algorithm (Knuth's generalization to
/// such functions): the cheapest unsettled class is final, and a node is
/// priced once, when its last operand settles.
///
/// Of nodes of equal cost, a class keeps the one priced first (whose
/// operands settled earliest), as egg's sweeps keep the first one found —
/// ties are not rare: a deep network's costs grow large enough (a block of
/// squeeze-and-excite reads its input three ways) that a fused
/// `conv2d_bias` and a `bias_add` of the plain convolution round to the
/// same cost, and the plan has one operator less with the first. That
/// node's operands all settled before its class, so the plan never reads
/// a class from within itself.
pub struct Greedy {
    best: HashMap<Id, (f64, Node)>,
}

/// A cost ordered totally, for the heap.
#[derive(PartialEq)]
struct Cost(f64);

impl Eq for Cost {}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The best offer so far for a class: its cost and the node (class, index).
type Offer = (f64, (Id, usize));

impl Greedy {
    pub fn new(egraph: &EGraph<Node, Shapes>, mut cost: RooflineCost) -> Greedy {
        let mut ids: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        ids.sort();
        // Per (class, node): its distinct operands not yet settled; per
        // operand, the nodes that read it.
        let mut waiting: HashMap<(Id, usize), usize> = HashMap::new();
        let mut readers: HashMap<Id, Vec<(Id, usize)>> = HashMap::new();
        let mut offers: HashMap<Id, Offer> = HashMap::new();
        let mut heap = BinaryHeap::new();
        for &id in &ids {
            for (i, node) in egraph[id].nodes.iter().enumerate() {
                let mut operands: Vec<Id> = node.children().iter().map(|&c| egraph.find(c)).collect();
                operands.sort();
                operands.dedup();
                for &c in &operands {
                    readers.entry(c).or_default().push((id, i));
                }
                if operands.is_empty() {
                    let c = cost.cost(node, |_| unreachable!("a leaf has no operands"));
                    offer(&mut offers, &mut heap, id, (c, (id, i)));
                } else {
                    waiting.insert((id, i), operands.len());
                }
            }
        }
        let mut settled: HashMap<Id, f64> = HashMap::new();
        let mut best = HashMap::new();
        while let Some((Reverse(Cost(c)), id)) = heap.pop() {
            let (now, (class, i)) = offers[&id];
            if settled.contains_key(&id) || now.to_bits() != c.to_bits() {
                continue;
            }
            settled.insert(id, c);
            best.insert(id, (c, egraph[class].nodes[i].clone()));
            for &(reader, i) in readers.get(&id).map_or(&[][..], |r| r.as_slice()) {
                let left = waiting.get_mut(&(reader, i)).expect("every read operand is counted");
                *left -= 1;
                if *left == 0 && !settled.contains_key(&reader) {
                    let node = &egraph[reader].nodes[i];
                    let c = cost.cost(node, |o| settled[&egraph.find(o)]);
                    offer(&mut offers, &mut heap, reader, (c, (reader, i)));
                }
            }
        }
        Greedy { best }
    }

    /// The cheapest node of `class`, which must have a plan.
    pub fn find_best_node(&self, egraph: &EGraph<Node, Shapes>, class: Id) -> &Node {
        &self.best[&egraph.find(class)].1
    }

    /// The cost of `class`'s cheapest plan, which must exist.
    pub fn find_best_cost(&self, egraph: &EGraph<Node, Shapes>, class: Id) -> f64 {
        self.best[&egraph.find(class)].0
    }
}

/// Offer a node for class `id`: kept if the class has no offer yet or this
/// one costs less (an equal cost keeps the earlier node).
fn offer(offers: &mut HashMap<Id, Offer>, heap: &mut BinaryHeap<(Reverse<Cost>, Id)>, id: Id, new: Offer) {
    let better = offers.get(&id).is_none_or(|old| new.0 < old.0);
    if better {
        offers.insert(id, new);
        heap.push((Reverse(Cost(new.0)), id));
    }
}

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
    ex: &Greedy,
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
            nodes.iter().map(|n| (n.to_string(), cost.cost(n, |c| ex.find_best_cost(egraph, c)))).collect();
        alts.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let label = name.clone().unwrap_or_else(|| alts[0].0.clone());
        out.push((label, alts));
    }
    out
}

/// Build the best term below e-class `class`, remembering each node's class.
pub fn extract(
    ex: &Greedy,
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
    let node = ex.find_best_node(egraph, class).clone();
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
