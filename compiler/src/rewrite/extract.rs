//! Choosing a plan from the saturated e-graph: greedily per e-class
//! ([`Greedy`]), or by an integer program over the whole DAG (the `ilp`
//! feature), and the alternatives each chosen operator had.

use super::cost::node_time;
use super::lang::{Node, Shapes};
use egg::{EGraph, Id, Language, RecExpr};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

/// Per e-class, the cheapest node, a node's cost being the time of the
/// plan it heads counted as a DAG: its own time (`cost::node_time`) plus
/// that of every distinct class its operands' plans compute.
///
/// A sum over subtrees counts a tensor read twice (a residual, a
/// squeeze-and-excite scale, SiLU's `y · sigmoid(y)`, a DenseNet
/// concatenation) twice, and its operands four times: the sums doubled
/// per block (EfficientNet-B0 estimated at 2·10²⁰ µs), and the
/// microseconds between two forms of one layer vanished in their rounding.
/// Splitting a shared operand's cost among its readers still compounded
/// (×1.5 per SiLU or residual, ×4 per Inception block: each reader's plan
/// cost at least its operand's whole plan), so a deep network's
/// alternatives tied. Here each class's plan carries the set of classes it
/// computes (a bit per class, dropped once every node reading the class is
/// priced), and a node's cost adds to its dearest operand's plan only the
/// classes the others bring anew: the cost of a 400-block network's plan
/// is its estimated time, and alternatives compare by what differs.
///
/// A node never costs less than an operand's plan, so the classes settle in
/// order of cost, as in Dijkstra's algorithm (Knuth's generalization): the
/// cheapest unsettled class is final, and a node is priced once, when its
/// last operand settles. A plan therefore never reads a class from within
/// itself (its operands settled before it). Of nodes of equal cost, a class
/// keeps the one priced first (whose operands settled earliest).
pub struct Greedy {
    best: HashMap<Id, (f64, Node)>,
    /// Every node whose operands all have a plan: its cost over them.
    priced: HashMap<(Id, usize), f64>,
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

/// The classes a plan computes that take time (a leaf's or the root's
/// takes none, and is left out: costs are the same, and a weight's plan
/// allocates nothing), a bit per class by its dense index, the vector as
/// long as the highest one needs.
#[derive(Clone, Default)]
struct Classes(Vec<u64>);

impl Classes {
    fn insert(&mut self, k: usize) {
        if self.0.len() <= k / 64 {
            self.0.resize(k / 64 + 1, 0);
        }
        self.0[k / 64] |= 1 << (k % 64);
    }

    fn contains(&self, k: usize) -> bool {
        self.0.get(k / 64).is_some_and(|w| w & (1 << (k % 64)) != 0)
    }

    /// Add `other`'s classes; the sum of `time` over those new here.
    fn absorb(&mut self, other: &Classes, time: &[f64]) -> f64 {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        let mut added = 0.0;
        for (w, (mine, theirs)) in self.0.iter_mut().zip(&other.0).enumerate() {
            let mut new = theirs & !*mine;
            *mine |= theirs;
            while new != 0 {
                added += time[w * 64 + new.trailing_zeros() as usize];
                new &= new - 1;
            }
        }
        added
    }
}

/// The best offer so far for a class: its cost, the node (class, index)
/// and the classes its operands' plans compute.
type Offer = (f64, (Id, usize), Classes);

/// What extraction keeps while it runs.
struct Search<'a> {
    egraph: &'a EGraph<Node, Shapes>,
    peak: f64,
    bw: f64,
    /// Dense index of each class.
    index: HashMap<Id, usize>,
    /// Per class (dense), the time of its chosen node once settled.
    time: Vec<f64>,
    /// Per settled class, its plan's cost.
    settled: HashMap<Id, f64>,
    /// Per settled class, the classes its plan computes, while a node reading it is unpriced.
    plans: HashMap<Id, Classes>,
    /// Per class, how many of the nodes reading it are not priced yet.
    unpriced_readers: HashMap<Id, usize>,
    offers: HashMap<Id, Offer>,
    heap: BinaryHeap<(Reverse<Cost>, Id)>,
}

impl Search<'_> {
    /// The cost of `node`, whose distinct operands `operands` have plans, and the classes of its plan but its own.
    fn price(&self, node: &Node, operands: &[Id]) -> (f64, Classes) {
        let own = node_time(self.egraph, node, self.peak, self.bw);
        // The dearest operand's plan, then what the others add to it.
        let Some(&dearest) = operands.iter().max_by(|a, b| self.settled[a].total_cmp(&self.settled[b]).then(b.cmp(a)))
        else {
            return (own, Classes::default());
        };
        let mut classes = self.plans[&dearest].clone();
        let mut total = self.settled[&dearest];
        for o in operands.iter().filter(|&&o| o != dearest) {
            total += classes.absorb(&self.plans[o], &self.time);
        }
        (total + own, classes)
    }

    /// Offer a node for class `id`: kept if the class has no offer yet or
    /// this one costs less (an equal cost keeps the earlier node).
    fn offer(&mut self, id: Id, new: Offer) {
        let better = self.offers.get(&id).is_none_or(|old| new.0 < old.0);
        if better {
            self.heap.push((Reverse(Cost(new.0)), id));
            self.offers.insert(id, new);
        }
    }

    /// Class `id` is final with its best offer.
    fn settle(&mut self, id: Id) -> (f64, (Id, usize)) {
        let (cost, node, mut classes) = self.offers.remove(&id).expect("a class settles by an offer");
        let k = self.index[&id];
        self.time[k] = node_time(self.egraph, &self.egraph[node.0].nodes[node.1], self.peak, self.bw);
        if self.time[k] > 0.0 {
            classes.insert(k);
        }
        self.settled.insert(id, cost);
        if self.unpriced_readers.get(&id).is_some_and(|&n| n > 0) {
            self.plans.insert(id, classes);
        }
        (cost, node)
    }

    /// A node has been priced: its operands' plans are needed by one node less.
    fn priced(&mut self, operands: &[Id]) {
        for o in operands {
            let left = self.unpriced_readers.get_mut(o).expect("every read operand is counted");
            *left -= 1;
            if *left == 0 {
                self.plans.remove(o);
            }
        }
    }
}

impl Greedy {
    pub fn new(egraph: &EGraph<Node, Shapes>, peak: f64, bw: f64) -> Greedy {
        let mut ids: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        ids.sort();
        let index: HashMap<Id, usize> = ids.iter().enumerate().map(|(k, &id)| (id, k)).collect();
        let mut search = Search {
            egraph,
            peak,
            bw,
            time: vec![0.0; ids.len()],
            index,
            settled: HashMap::new(),
            plans: HashMap::new(),
            unpriced_readers: HashMap::new(),
            offers: HashMap::new(),
            heap: BinaryHeap::new(),
        };
        // Per (class, node): its distinct operands, and how many are not
        // settled yet; per operand, the nodes that read it.
        let mut operands_of: HashMap<(Id, usize), Vec<Id>> = HashMap::new();
        let mut waiting: HashMap<(Id, usize), usize> = HashMap::new();
        let mut readers: HashMap<Id, Vec<(Id, usize)>> = HashMap::new();
        let mut priced = HashMap::new();
        for &id in &ids {
            for (i, node) in egraph[id].nodes.iter().enumerate() {
                let mut operands: Vec<Id> = node.children().iter().map(|&c| egraph.find(c)).collect();
                operands.sort();
                operands.dedup();
                for &c in &operands {
                    readers.entry(c).or_default().push((id, i));
                    *search.unpriced_readers.entry(c).or_default() += 1;
                }
                if operands.is_empty() {
                    let (c, classes) = search.price(node, &[]);
                    priced.insert((id, i), c);
                    search.offer(id, (c, (id, i), classes));
                } else {
                    waiting.insert((id, i), operands.len());
                    operands_of.insert((id, i), operands);
                }
            }
        }
        let mut best = HashMap::new();
        while let Some((Reverse(Cost(c)), id)) = search.heap.pop() {
            let current = search.offers.get(&id).is_some_and(|o| o.0.to_bits() == c.to_bits());
            if search.settled.contains_key(&id) || !current {
                continue;
            }
            let (c, (class, i)) = search.settle(id);
            best.insert(id, (c, egraph[class].nodes[i].clone()));
            for &(reader, i) in readers.get(&id).map_or(&[][..], |r| r.as_slice()) {
                let left = waiting.get_mut(&(reader, i)).expect("every read operand is counted");
                *left -= 1;
                if *left > 0 {
                    continue;
                }
                // Priced even where its class has settled: the report of
                // alternatives shows it, unless it reads its own class back
                // (a plan through it would be a cycle).
                let operands = &operands_of[&(reader, i)];
                let (c, classes) = search.price(&egraph[reader].nodes[i], operands);
                if !classes.contains(search.index[&reader]) {
                    priced.insert((reader, i), c);
                }
                search.priced(operands);
                if !search.settled.contains_key(&reader) {
                    search.offer(reader, (c, (reader, i), classes));
                }
            }
        }
        Greedy { best, priced }
    }

    /// The cheapest node of `class`, which must have a plan.
    pub fn find_best_node(&self, egraph: &EGraph<Node, Shapes>, class: Id) -> &Node {
        &self.best[&egraph.find(class)].1
    }

    /// The cost of `class`'s cheapest plan, which must exist.
    pub fn find_best_cost(&self, egraph: &EGraph<Node, Shapes>, class: Id) -> f64 {
        self.best[&egraph.find(class)].0
    }

    /// The cost of node `i` of `class` over its operands' plans, where they all have one.
    fn node_cost(&self, class: Id, i: usize) -> Option<f64> {
        self.priced.get(&(class, i)).copied()
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
/// the plan each heads over its operands' chosen plans (the extractor's),
/// cheapest first (ties by name).
pub fn alternatives(
    egraph: &EGraph<Node, Shapes>,
    ex: &Greedy,
    classes: &[Id],
    names: &[Option<String>],
) -> Vec<(String, Vec<(String, f64)>)> {
    let mut out = Vec::new();
    for (&class, name) in classes.iter().zip(names) {
        let class = egraph.find(class);
        let nodes = &egraph[class].nodes;
        if nodes.len() < 2 {
            continue;
        }
        let mut alts: Vec<(String, f64)> =
            (0..nodes.len()).filter_map(|i| ex.node_cost(class, i).map(|c| (nodes[i].to_string(), c))).collect();
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
