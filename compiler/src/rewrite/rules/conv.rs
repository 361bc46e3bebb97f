//! Convolution algorithms: a 1×1 convolution as a product per image (and,
//! under an unpadded average pool, on the pooled input), Winograd F(2×2,
//! 3×3) and F(4×4, 3×3) (Lavin & Gray 2016) where their rounding stays
//! within the accuracy asked for, and im2col in both orientations.

use super::super::lang::{Node, Shapes};
use super::super::Accuracy;
use super::{above_one, accurate_enough, filter_is, is_constant, winograd_fits, Condition};
use crate::nn::{Epilogue, NnOp, WinogradForm};
use egg::{rewrite as rw, Rewrite};

pub fn rules(accuracy: Accuracy) -> Vec<Rewrite<Node, Shapes>> {
    let im2col = accuracy.im2col;
    let im2col_allowed = move |_: &mut egg::EGraph<Node, Shapes>, _: egg::Id, _: &egg::Subst| im2col;
    let mut rules = vec![
        // A 1×1 convolution (no padding, stride 1, one group) is a matrix
        // product per image: Y[n] = W[:, :, 0, 0] · X[n].
        rw!("conv1x1-matmul"; "(conv2d ?x ?w 0 1 ?d 1)" => "(conv2d_1x1 ?x ?w)" if filter_is("?w", 1)),
        // The same with the bias added in the product's stage.
        rw!("conv1x1-bias-matmul";
            "(conv2d_bias ?x ?w ?b 0 1 ?d 1)" => "(conv2d_1x1_bias ?x ?w ?b)" if filter_is("?w", 1)),
        // Of stride s > 1: the same product on X[n, :, s·y, s·x] copied out.
        rw!("conv1x1-strided-matmul";
            "(conv2d ?x ?w 0 ?s ?d 1)" => "(conv2d_1x1_strided ?x ?w ?s)" if filter_is("?w", 1) if above_one("?s")),
        rw!("conv1x1-strided-bias-matmul";
            "(conv2d_bias ?x ?w ?b 0 ?s ?d 1)" => "(conv2d_1x1_strided_bias ?x ?w ?b ?s)"
            if filter_is("?w", 1) if above_one("?s")),
        // A 1×1 convolution is linear per pixel, so an unpadded average
        // pool of it (each window whole, k² pixels) is the convolution of
        // the pooled input: avg(W·x + b) = W·avg(x) + b, with k² times fewer
        // products where the pool comes first (DenseNet's transitions: a
        // tenth of the model's time computed at the full map, then averaged).
        rw!("pool-before-conv1x1";
            "(avg_pool2d (conv2d_1x1 ?x ?w) ?k ?s 0)" => "(conv2d_1x1 (avg_pool2d ?x ?k ?s 0) ?w)"),
        rw!("pool-before-conv1x1-bias";
            "(avg_pool2d (conv2d_1x1_bias ?x ?w ?b) ?k ?s 0)" => "(conv2d_1x1_bias (avg_pool2d ?x ?k ?s 0) ?w ?b)"),
    ];
    rules.extend(winograd(Epilogue::None, accuracy));
    rules.extend([
        // im2col: Y[n] = W' · cols(X[n]) with W' the filters as a K × (C·R·S)
        // matrix and cols the (C·R·S) × (Ho·Wo) matrix of patches (one group).
        rw!("conv-im2col"; "(conv2d ?x ?w ?p ?s ?d 1)" => "(conv2d_im2col ?x ?w ?p ?s ?d)" if im2col_allowed),
        // The same product turned around, Yᵀ[n] = cols(X[n])ᵀ · W'ᵀ, vectors
        // along the filters: only for constant filters, whose transposed copy
        // W'ᵀ is then made once rather than on every call.
        rw!("conv-im2col-t"; "(conv2d ?x ?w ?p ?s ?d 1)" => "(conv2d_im2col_t ?x ?w ?p ?s ?d)"
            if is_constant("?w") if im2col_allowed),
    ]);
    rules.extend(winograd(Epilogue::Bias, accuracy));
    rules.extend(winograd(Epilogue::BiasRelu, accuracy));
    rules
}

/// Winograd for 3×3, stride 1, pad 0 or 1, one group, any H and W (the
/// last tiles reach past the image; the cost model prices that):
/// Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A per tile — F(2×2, 3×3) with vectors along
/// the tiles (`f2`) or along the filters (`f2k`: small images, many
/// filters); F(4×4, 3×3) on 6×6 input tiles, 36 products per 4×4 tile
/// instead of 144. One rule per form, for convolutions with `epilogue`.
fn winograd(epilogue: Epilogue, accuracy: Accuracy) -> Vec<Rewrite<Node, Shapes>> {
    let (suffix, operands) = match epilogue {
        Epilogue::None => ("", "?x ?w"),
        Epilogue::Bias => ("-bias", "?x ?w ?b"),
        Epilogue::BiasRelu => ("-bias-relu", "?x ?w ?b"),
    };
    let direct = NnOp::Conv2d(epilogue);
    let forms = [("", WinogradForm::F2), ("-k", WinogradForm::F2k), ("-f4", WinogradForm::F4)];
    forms
        .into_iter()
        .map(|(name, form)| {
            let conditions: [Condition; 3] = [
                Box::new(filter_is("?w", 3)),
                Box::new(winograd_fits("?x", "?pad")),
                Box::new(accurate_enough("?x", form, accuracy)),
            ];
            let lhs: egg::Pattern<Node> = format!("({direct} {operands} ?pad 1 1 1)").parse().expect("a pattern");
            let rhs: egg::Pattern<Node> =
                format!("({} {operands} ?pad)", form.op(epilogue)).parse().expect("a pattern");
            let applier = egg::ConditionalApplier { condition: AllOf(conditions), applier: rhs };
            Rewrite::new(format!("conv3x3-winograd{name}{suffix}"), lhs, applier).expect("a valid rule")
        })
        .collect()
}

/// All of several conditions.
struct AllOf<const N: usize>([Condition; N]);

impl<const N: usize> egg::Condition<Node, Shapes> for AllOf<N> {
    fn check(&self, egraph: &mut egg::EGraph<Node, Shapes>, eclass: egg::Id, subst: &egg::Subst) -> bool {
        self.0.iter().all(|c| c(egraph, eclass, subst))
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::Accuracy;
    use super::super::testing::{reaches, runner};
    use super::rules;

    const X: (&str, &[i64]) = ("x", &[1, 16, 8, 8]);
    const W3: (&str, &[i64]) = ("w", &[32, 16, 3, 3]);
    const W1: (&str, &[i64]) = ("w", &[32, 16, 1, 1]);

    egg::test_fn! { conv1x1_matmul, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(conv2d x w 0 1 1 1)" => "(conv2d_1x1 x w)" }

    egg::test_fn! { conv1x1_bias_matmul, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(conv2d_bias x w b 0 1 1 1)" => "(conv2d_1x1_bias x w b)" }

    egg::test_fn! { conv1x1_strided_matmul, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(conv2d x w 0 2 1 1)" => "(conv2d_1x1_strided x w 2)" }

    egg::test_fn! { conv1x1_strided_bias_matmul, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(conv2d_bias x w b 0 3 1 1)" => "(conv2d_1x1_strided_bias x w b 3)" }

    egg::test_fn! { pool_before_conv1x1, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(avg_pool2d (conv2d x w 0 1 1 1) 2 2 0)" => "(conv2d_1x1 (avg_pool2d x 2 2 0) w)" }

    egg::test_fn! { pool_before_conv1x1_bias, rules(Accuracy::default()), runner = runner(&[X, W1], &[]),
    "(avg_pool2d (conv2d_bias x w b 0 1 1 1) 3 2 0)" => "(conv2d_1x1_bias (avg_pool2d x 3 2 0) w b)" }

    egg::test_fn! { conv_im2col, rules(Accuracy::default()), runner = runner(&[X, W3], &[]),
    "(conv2d x w 1 2 1 1)" => "(conv2d_im2col x w 1 2 1)" }

    egg::test_fn! { conv_im2col_t, rules(Accuracy::default()), runner = runner(&[X, W3], &["w"]),
    "(conv2d x w 1 2 1 1)" => "(conv2d_im2col_t x w 1 2 1)" }

    egg::test_fn! { conv3x3_winograd, rules(Accuracy::default()), runner = runner(&[X, W3], &[]),
    "(conv2d x w 1 1 1 1)" => "(conv2d_winograd_f2 x w 1)", "(conv2d_winograd_f2k x w 1)", "(conv2d_winograd_f4 x w 1)" }

    egg::test_fn! { conv3x3_unpadded_winograd, rules(Accuracy::default()), runner = runner(&[X, W3], &[]),
    "(conv2d x w 0 1 1 1)" => "(conv2d_winograd_f2 x w 0)", "(conv2d_winograd_f2k x w 0)", "(conv2d_winograd_f4 x w 0)" }

    egg::test_fn! { conv3x3_winograd_bias, rules(Accuracy::default()), runner = runner(&[X, W3], &[]),
    "(conv2d_bias x w b 1 1 1 1)"
    => "(conv2d_winograd_f2_bias x w b 1)", "(conv2d_winograd_f2k_bias x w b 1)", "(conv2d_winograd_f4_bias x w b 1)" }

    egg::test_fn! { conv3x3_winograd_bias_relu, rules(Accuracy::default()), runner = runner(&[X, W3], &[]),
    "(conv2d_bias_relu x w b 1 1 1 1)"
    => "(conv2d_winograd_f2_bias_relu x w b 1)", "(conv2d_winograd_f2k_bias_relu x w b 1)",
       "(conv2d_winograd_f4_bias_relu x w b 1)" }

    /// What each rule's conditions refuse.
    #[test]
    fn conditions_refuse() {
        let all = || rules(Accuracy::default());
        // 3×3 filters are not 1×1; non-constant filters get no transposed im2col.
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 0 1 1 1)", "(conv2d_1x1 x w)"));
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_im2col_t x w 1 1 1)"));
        // Stride 1 is conv2d_1x1's; padded or 3×3 convolutions have no strided 1×1 form.
        assert!(!reaches(runner(&[X, W1], &[]), &all(), "(conv2d x w 0 1 1 1)", "(conv2d_1x1_strided x w 1)"));
        assert!(!reaches(runner(&[X, W1], &[]), &all(), "(conv2d x w 1 2 1 1)", "(conv2d_1x1_strided x w 2)"));
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 0 2 1 1)", "(conv2d_1x1_strided x w 2)"));
        // A padded pool averages zeros the convolution's bias would not be added to.
        assert!(!reaches(
            runner(&[X, W1], &[]),
            &all(),
            "(avg_pool2d (conv2d_bias x w b 0 1 1 1) 2 2 1)",
            "(conv2d_1x1_bias (avg_pool2d x 2 2 1) w b)"
        ));
        // Grouped convolutions have no im2col form.
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 1 1 1 2)", "(conv2d_im2col x w 1 1 1)"));
        // Images of any size have every form (7×7: tiles past the image);
        // stride 2 is not Winograd's, nor is an empty image.
        let x7: (&str, &[i64]) = ("x", &[1, 16, 7, 7]);
        assert!(reaches(runner(&[x7, W3], &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f2 x w 1)"));
        assert!(reaches(runner(&[x7, W3], &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f4 x w 1)"));
        let x0: (&str, &[i64]) = ("x", &[1, 16, 0, 7]);
        assert!(!reaches(runner(&[x0, W3], &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f2 x w 1)"));
        // Unpadded, a 2-row image has no output row; 3 rows have one.
        let x2: (&str, &[i64]) = ("x", &[1, 16, 2, 7]);
        assert!(!reaches(runner(&[x2, W3], &[]), &all(), "(conv2d x w 0 1 1 1)", "(conv2d_winograd_f2 x w 0)"));
        let x3: (&str, &[i64]) = ("x", &[1, 16, 3, 7]);
        assert!(reaches(runner(&[x3, W3], &[]), &all(), "(conv2d x w 0 1 1 1)", "(conv2d_winograd_f2 x w 0)"));
        // Padding beyond 1 (outputs larger than the image) is left direct.
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 2 1 1 1)", "(conv2d_winograd_f2 x w 2)"));
        assert!(!reaches(runner(&[X, W3], &[]), &all(), "(conv2d x w 1 2 1 1)", "(conv2d_winograd_f2 x w 1)"));
        // Exact arithmetic asked for: no Winograd, and no im2col when refused.
        let exact = Accuracy { approximate: false, im2col: false, ..Accuracy::default() };
        assert!(!reaches(runner(&[X, W3], &[]), &rules(exact), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f2 x w 1)"));
        assert!(!reaches(runner(&[X, W3], &[]), &rules(exact), "(conv2d x w 1 1 1 1)", "(conv2d_im2col x w 1 1 1)"));
        // F(4×4) over 1024 channels rounds beyond the default tolerance.
        let deep: [(&str, &[i64]); 2] = [("x", &[1, 1024, 8, 8]), ("w", &[8, 1024, 3, 3])];
        assert!(!reaches(runner(&deep, &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f4 x w 1)"));
        assert!(reaches(runner(&deep, &[]), &all(), "(conv2d x w 1 1 1 1)", "(conv2d_winograd_f2 x w 1)"));
    }
}
