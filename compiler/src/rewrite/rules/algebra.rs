//! Algebra of tensors: transposes that cancel, products that distribute.

use super::super::lang::{Node, Shapes};
use egg::{rewrite as rw, Rewrite};

pub fn rules() -> Vec<Rewrite<Node, Shapes>> {
    vec![
        // Transposes that reverse the axes cancel: (Xᵀ)ᵀ = X (ranks 2 to 4).
        rw!("transpose-cancel"; "(transpose (transpose ?x 1 0) 1 0)" => "?x"),
        rw!("transpose-cancel-3"; "(transpose (transpose ?x 2 1 0) 2 1 0)" => "?x"),
        rw!("transpose-cancel-4"; "(transpose (transpose ?x 3 2 1 0) 3 2 1 0)" => "?x"),
        // Distributivity: A·B + A·C = A·(B + C), one matmul instead of two.
        rw!("matmul-distribute"; "(add (matmul ?a ?b) (matmul ?a ?c))" => "(matmul ?a (add ?b ?c))"),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::testing::{reaches, runner};
    use super::rules;

    egg::test_fn! { transpose_cancel, rules(), runner = runner(&[], &[]),
    "(relu (transpose (transpose x 1 0) 1 0))" => "(relu x)" }

    egg::test_fn! { transpose_cancel_3, rules(), runner = runner(&[], &[]),
    "(transpose (transpose x 2 1 0) 2 1 0)" => "x" }

    egg::test_fn! { transpose_cancel_4, rules(), runner = runner(&[], &[]),
    "(transpose (transpose x 3 2 1 0) 3 2 1 0)" => "x" }

    egg::test_fn! { matmul_distribute, rules(), runner = runner(&[], &[]),
    "(add (matmul a b) (matmul a c))" => "(matmul a (add b c))" }

    /// Two transposes that do not undo each other stay.
    #[test]
    fn other_permutations_do_not_cancel() {
        assert!(!reaches(runner(&[], &[]), &rules(), "(transpose (transpose x 1 2 0) 1 2 0)", "x"));
        assert!(!reaches(runner(&[], &[]), &rules(), "(add (matmul a b) (matmul c b))", "(matmul a (add b ?c))"));
    }
}
