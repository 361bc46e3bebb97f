//! The rewrite rules, by topic — [`fusion`] (batch norm, bias and
//! activation into convolutions), [`algebra`] (transposes, distributivity),
//! [`conv`] (convolution algorithms: 1×1 as products, Winograd, im2col) —
//! and the conditions they share.
//!
//! Every rule states its algebra where it is written and is directional:
//! the e-graph keeps both sides, extraction picks by cost. Each rule has an
//! egg-style test (`test_fn!`) next to it deriving its right-hand side from
//! its left, and the conditions that refuse it have tests of their own.

mod algebra;
mod conv;
mod fusion;

use super::lang::{constant_within, Node, Shapes};
use super::Accuracy;
use crate::nn::{Info, WinogradForm};
use egg::{EGraph, Id, Rewrite, Subst};

/// The rewrite rules, as `accuracy` allows them.
pub fn rules(accuracy: Accuracy) -> Vec<Rewrite<Node, Shapes>> {
    let mut rules = fusion::rules();
    rules.extend(algebra::rules());
    rules.extend(conv::rules(accuracy));
    rules
}

/// A rule's condition on the e-graph and the pattern's substitution.
type Condition = Box<dyn Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool + Send + Sync>;

fn var(name: &str) -> egg::Var {
    name.parse().expect("a pattern variable")
}

/// Whether pattern variable `name` is a constant input itself (a model's weights).
fn is_constant(name: &str) -> impl Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool {
    let v = var(name);
    move |g, _, subst| constant_within(g, subst[v], 0)
}

/// Whether `name` is a `size`×`size` filter bank (K, C, size, size).
fn filter_is(name: &str, size: i64) -> impl Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool {
    let v = var(name);
    move |g, _, subst| matches!(&g[subst[v]].data, Info::Shape(s) if s.len() == 4 && s[2] == size && s[3] == size)
}

/// Whether Winograd `form` on input `name` (N, C, H, W) stays within `accuracy` (and is allowed by it).
fn accurate_enough(
    name: &str,
    form: WinogradForm,
    accuracy: Accuracy,
) -> impl Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool {
    let v = var(name);
    move |g, _, subst| {
        accuracy.approximate
            && accuracy.winograd.is_none_or(|f| f == form)
            && matches!(&g[subst[v]].data, Info::Shape(s) if s.len() == 4 && super::winograd_error(form.tile(), s[1]) <= accuracy.tolerance)
    }
}

/// Whether `name` is a number above 1 (a stride).
fn above_one(name: &str) -> impl Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool {
    let v = var(name);
    move |g, _, subst| g[subst[v]].data.num().is_some_and(|n| n > 1)
}

/// Whether a 3×3 stride-1 convolution of image `x` (N, C, H, W) with
/// padding `pad` is one Winograd's forms compute: pad 0 or 1 (larger pads
/// make outputs of zeros' sums that are left direct) and an output of at
/// least one row and column. Sides that are not multiples of a tile are the
/// cost model's to weigh (the last tiles compute outputs past the image).
fn winograd_fits(x: &str, pad: &str) -> impl Fn(&mut EGraph<Node, Shapes>, Id, &Subst) -> bool {
    let (x, pad) = (var(x), var(pad));
    move |g, _, subst| match (&g[subst[x]].data, g[subst[pad]].data.num()) {
        (Info::Shape(s), Some(p @ 0..=1)) => s.len() == 4 && s[2] + 2 * p - 2 >= 1 && s[3] + 2 * p - 2 >= 1,
        _ => false,
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! What the rules' tests share: an e-graph runner that knows the shapes
    //! of the test's tensors.
    use super::super::lang::Shapes;
    use super::super::Node;
    use egg::{Runner, Searcher};

    /// A runner whose analysis knows `shapes` (name, shape) and treats
    /// `constants` as fixed inputs.
    pub fn runner(shapes: &[(&str, &[i64])], constants: &[&str]) -> Runner<Node, Shapes> {
        let mut s = Shapes::default();
        for (name, shape) in shapes {
            s.of.insert(name.to_string(), shape.to_vec());
        }
        s.constants = constants.iter().map(|c| c.to_string()).collect();
        Runner::new(s).with_iter_limit(8)
    }

    /// Whether any of `rules` rewrites `start` to something with `goal` in its e-class.
    pub fn reaches(r: Runner<Node, Shapes>, rules: &[egg::Rewrite<Node, Shapes>], start: &str, goal: &str) -> bool {
        let start: egg::RecExpr<Node> = start.parse().expect("a term");
        let goal: egg::Pattern<Node> = goal.parse().expect("a pattern");
        let r = r.with_expr(&start).run(rules);
        goal.search_eclass(&r.egraph, r.roots[0]).is_some()
    }
}
