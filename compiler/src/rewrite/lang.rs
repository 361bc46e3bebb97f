//! The e-graph's language and its analysis.
//!
//! A term is a program's operator graph: `std.nn` operators ([`NnOp`],
//! typed, children their arguments in parameter order), integer constants,
//! names (tensors, scalar arguments, non-integer constants), opaque
//! statements (a definition or a user kernel's call, known by its position
//! in the program) and one `plan` node whose children are the outputs.
//!
//! The analysis ([`Shapes`]) gives each e-class what the rules and the cost
//! model need: a tensor's shape or an integer, by each operator's shape rule
//! in the operator table (`crate::nn`).

use super::cost::{Model, Nominal};
use super::Calibration;
use crate::nn::{Info, NnOp, WinogradForm};
use egg::{define_language, Analysis, DidMerge, EGraph, Id, Symbol};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// An operator the e-graph does not look into: top-level statement `k` of
/// the program, copied as written into the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opaque(pub u32);

impl fmt::Display for Opaque {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "opaque#{}", self.0)
    }
}

impl FromStr for Opaque {
    type Err = ();

    fn from_str(s: &str) -> Result<Opaque, ()> {
        s.strip_prefix("opaque#").and_then(|k| k.parse().ok()).map(Opaque).ok_or(())
    }
}

define_language! {
    /// A node of the operator graph.
    pub enum Node {
        "plan" = Plan(Box<[Id]>),
        Int(i64),
        Op(NnOp, Box<[Id]>),
        Opaque(Opaque, Box<[Id]>),
        Name(Symbol),
    }
}

impl Node {
    /// A leaf for an argument written as `text`: an integer or a name.
    pub fn leaf(text: &str) -> Node {
        text.parse::<i64>().map_or_else(|_| Node::Name(Symbol::from(text)), Node::Int)
    }
}

/// What an opaque operator computes, as far as costs go.
#[derive(Clone, Debug, PartialEq)]
pub struct OpaqueInfo {
    pub shape: Vec<i64>,
    pub flops: f64,
    pub bytes: f64,
}

/// The e-graph's analysis, and what costs need to know of the program.
pub struct Shapes {
    /// Shapes of named leaves (the program's inputs).
    pub of: HashMap<String, Vec<i64>>,
    pub opaque: HashMap<Opaque, OpaqueInfo>,
    /// How fast the target's schedules run each operator.
    pub model: Model,
    /// Inputs whose values are fixed before the calls (an imported model's
    /// weights): stages that read only them run once (`crate::constants`), so
    /// forms that transform the weights at no cost per call may be chosen.
    pub constants: HashSet<String>,
    /// Operators of this family are made nearly free, so that extraction
    /// takes them wherever the rules allow: the tuner's `winograd=2|3|4`
    /// measures that Winograd form, not the cost model's pick.
    pub prefer: Option<WinogradForm>,
    /// Measured corrections of the estimates ([`Calibration`]).
    pub calibration: Calibration,
}

impl Default for Shapes {
    fn default() -> Shapes {
        Shapes {
            of: HashMap::new(),
            opaque: HashMap::new(),
            model: std::sync::Arc::new(Nominal),
            constants: HashSet::new(),
            prefer: None,
            calibration: Calibration::default(),
        }
    }
}

impl Shapes {
    /// The same facts without the tuner's preference (which only steers extraction).
    pub fn unpreferred(&self) -> Shapes {
        Shapes {
            of: self.of.clone(),
            opaque: self.opaque.clone(),
            model: self.model.clone(),
            constants: self.constants.clone(),
            prefer: None,
            calibration: self.calibration.clone(),
        }
    }
}

impl Analysis<Node> for Shapes {
    type Data = Info;

    fn make(egraph: &mut EGraph<Node, Self>, n: &Node, _id: Id) -> Info {
        let shape = match n {
            Node::Int(v) => return Info::Num(*v),
            Node::Name(s) => egraph.analysis.of.get(s.as_str()).cloned(),
            Node::Op(op, ch) => op.shape(&infos(egraph, ch)),
            Node::Opaque(k, _) => egraph.analysis.opaque.get(k).map(|o| o.shape.clone()),
            Node::Plan(_) => None,
        };
        shape.map_or(Info::Other, Info::Shape)
    }

    fn merge(&mut self, a: &mut Info, b: Info) -> DidMerge {
        if *a == Info::Other && b != Info::Other {
            *a = b;
            return DidMerge(true, false);
        }
        DidMerge(false, false)
    }
}

/// What the analysis knows of each child.
pub fn infos(egraph: &EGraph<Node, Shapes>, children: &[Id]) -> Vec<Info> {
    children.iter().map(|&c| egraph[c].data.clone()).collect()
}

/// Whether e-class `id` is a constant: a constant input, a number, or an
/// operator of constants (the folded filters of batch norm), looked at up
/// to three operators deep.
pub fn constant(g: &EGraph<Node, Shapes>, id: Id) -> bool {
    constant_within(g, id, 3)
}

/// [`constant`], looking `depth` operators deep (0: a constant input or a number).
pub fn constant_within(g: &EGraph<Node, Shapes>, id: Id, depth: u32) -> bool {
    use egg::Language;
    g[id].nodes.iter().any(|n| match n {
        Node::Int(_) => true,
        Node::Name(s) => g.analysis.constants.contains(s.as_str()) || s.as_str().parse::<f64>().is_ok(),
        n if n.is_leaf() => false,
        n => depth > 0 && n.children().iter().all(|&c| constant_within(g, c, depth - 1)),
    })
}
